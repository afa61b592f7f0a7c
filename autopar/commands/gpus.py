"""`autopar gpus`: the bundled hardware profiles (memory, peak FLOP/s, links, GPUs per node)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autopar.commands import add_json_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gpus", help="list the bundled GPU profiles",
        description="The bundled hardware profiles (costmodels/profiles/*.yaml): HBM, dense peak FLOP/s per "
                    "precision, NVLink and InfiniBand bandwidth per GPU per direction, GPUs per node. Pass a "
                    "name or alias to --gpu, or your own calibrated file to --profile.")
    add_json_argument(parser)
    parser.set_defaults(run=run)


def profile_rows() -> list[dict[str, Any]]:
    """One row per bundled profile, in base units (bytes, FLOP/s, bytes/s)."""
    from costmodels.hardware import bundled_profile_names, load_profile

    rows = []
    for name in bundled_profile_names():
        profile = load_profile(name)
        rows.append({
            "name": profile.name, "display_name": profile.display_name, "aliases": list(profile.aliases),
            "hbm_bytes": profile.hbm_bytes, "hbm_bandwidth_bytes_per_s": profile.hbm_bandwidth_bytes_per_s,
            "peak_flops_per_s": dict(profile.peak_flops_per_s), "gpus_per_node": profile.gpus_per_node,
            "nvlink_domain_size": profile.nvlink_domain_size,
            "links": {kind: {"nominal_bandwidth_bytes_per_s": link.nominal_bandwidth_bytes_per_s,
                             "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "alpha_s": link.alpha_s}
                      for kind, link in profile.links.items()},
        })
    return rows


def _node_cell(row: dict[str, Any]) -> str:
    """GPUs per node, and the NVLink domain where it spans nodes (GB200 NVL72: '4, NVLink 72')."""
    node, domain = row["gpus_per_node"], row["nvlink_domain_size"]
    return str(node) if domain == node else f"{node}, NVLink {domain}"


def run(args: argparse.Namespace) -> int:
    rows = profile_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from costmodels.units import GIB

    table = Table(title="Bundled GPU profiles (dense peak; link bandwidth per GPU per direction, nominal)",
                  title_justify="left")
    for column, justify in (("name", "left"), ("GPU", "left"), ("HBM", "right"), ("bf16 TFLOP/s", "right"),
                            ("fp8 TFLOP/s", "right"), ("NVLink GB/s", "right"), ("IB Gb/s", "right"),
                            ("GPUs/node", "right"), ("aliases", "left")):
        table.add_column(column, justify=justify)
    for row in rows:
        peak = row["peak_flops_per_s"]
        table.add_row(row["name"], row["display_name"], f"{row['hbm_bytes'] / GIB:g} GiB",
                      f"{peak['bf16'] / 1e12:g}", f"{peak['fp8'] / 1e12:g}" if "fp8" in peak else "-",
                      f"{row['links']['nvlink']['nominal_bandwidth_bytes_per_s'] / 1e9:g}",
                      f"{row['links']['ib']['nominal_bandwidth_bytes_per_s'] * 8 / 1e9:g}",
                      _node_cell(row), ", ".join(row["aliases"]))
    Console(highlight=False, width=None if sys.stdout.isatty() else 140).print(table)
    return 0
