"""`autopar explain`."""
# PLACEHOLDER: owner will replace

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("explain", help="(not available yet)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print("autopar: error: explain is not available yet", file=sys.stderr)
    return 2
