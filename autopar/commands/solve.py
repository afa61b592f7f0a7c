"""`autopar solve`."""
# PLACEHOLDER: owner will replace

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("solve", help="(not available yet)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print("autopar: error: solve is not available yet", file=sys.stderr)
    return 2
