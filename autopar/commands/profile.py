"""`autopar profile show|fit`: read a hardware profile against the bundled one; refit stored measurements.

    autopar profile show my_cluster.yaml [--json] [--against h100]
    autopar profile fit my_cluster.yaml --out refit.yaml [--base-gpu h100]     # no torch needed

Both refuse a damaged file whole (exit 2, one line naming the file and the field): invalid YAML, missing or
non-numeric fields, NaN or infinite values, measurements that do not add up (q1 > median, a 1-rank collective).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from autopar.commands import add_json_argument

if TYPE_CHECKING:
    from autopar.calibrate.calibration_section import CalibrationSection


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile", help="show a (calibrated) hardware profile against the bundled one, or refit it",
        description="Inspect hardware profiles: `show` summarises a profile (a calibrated file or a bundled GPU "
                    "name) and compares it with the bundled profile of the same GPU; `fit` refits the cost "
                    "model's parameters to the raw measurements stored in a calibrated profile.")
    actions = parser.add_subparsers(dest="profile_action", metavar="ACTION", parser_class=type(parser))
    actions.required = True

    show = actions.add_parser("show", help="summarise a profile and compare it with the bundled one",
                              description="Where and when it was measured, achieved link bandwidth against the "
                                          "spec sheet and the bundled profile, alpha, GEMM efficiency, memory "
                                          "overheads, fit residuals, and what was not measured.")
    show.add_argument("file", metavar="FILE", help="profile YAML (e.g. from `autopar calibrate`) or a bundled GPU name")
    show.add_argument("--against", default=None, metavar="GPU",
                      help="bundled profile to compare with; default the calibration's base profile")
    add_json_argument(show)
    show.set_defaults(run=run_show)

    fit = actions.add_parser("fit", help="refit a calibrated profile from its stored measurements (no torch)",
                             description="Refit alpha, bandwidth and the GEMM-efficiency parameters to the raw "
                                         "measurements of a calibrated profile (or of a bare calibration section "
                                         "file) and write a new profile, e.g. against another base GPU.")
    fit.add_argument("file", metavar="FILE", help="calibrated profile, or a YAML file holding a calibration section")
    fit.add_argument("--out", required=True, metavar="FILE", help="profile YAML to write")
    fit.add_argument("--base-gpu", default=None, metavar="NAME",
                     help="bundled profile for the spec sheet and what was not measured; default the stored base")
    fit.set_defaults(run=run_fit)
    parser.set_defaults(run=lambda args: (parser.print_help(sys.stderr), 2)[1])


def run_show(args: argparse.Namespace) -> int:
    from autopar.calibrate.compare import render_text, summarise
    from costmodels.hardware import load_profile, read_text_file, safe_yaml_load

    summary = summarise(load_profile(args.file), against=args.against)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        sys.stdout.write(render_text(summary))
    return 0


def run_fit(args: argparse.Namespace) -> int:
    import datetime as dt

    from autopar.calibrate.profile_file import RunInfo, build_profile_text, check_output_path, write_atomically
    from costmodels.errors import InputError
    from costmodels.hardware import resolve_gpu_name

    out = check_output_path(args.out)
    section = _read_section(args.file)
    base = resolve_gpu_name(args.base_gpu or section.base_profile)
    reason = f"--base-gpu {args.base_gpu}" if args.base_gpu else section.base_profile_reason
    run = section.run
    info = RunInfo(measured_at_utc=section.measured_at_utc, hostnames=tuple(run["hostnames"]),
                   device_name=run["device_name"], world_size=run["world_size"], nodes=run["nodes"],
                   ranks_per_node=run["ranks_per_node"], torch_version=run["torch_version"], backend=run["backend"],
                   settings=dict(section.settings))
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    notes = (*section.notes, f"refitted by `autopar profile fit` at {now} from {args.file}")
    if not section.measurements.gemm and not section.measurements.collectives:
        raise InputError("measurements", f"{args.file} holds no GEMM or collective measurement to fit")
    text, fit, all_notes = build_profile_text(base, reason, section.measurements, info, notes)
    write_atomically(out, text)
    print(f"wrote {out}")
    if fit.gemm is not None:
        print("  GEMM efficiency: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.gemm.params.items())
              + f" (rms residual {fit.gemm.rms_relative_residual:.1%})")
    for link, result in fit.links.items():
        print(f"  {link}: alpha {result.params['alpha_s'] * 1e6:.3g} µs, "
              f"{result.params['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s (rms residual "
              f"{result.rms_relative_residual:.1%})")
    for point_fit in fit.collective_points:
        unit = "nodes" if point_fit.link == "ib" else "GPUs"
        regimes = "; ".join(f"{p.alpha_s * 1e6:.3g} µs + {p.bus_bandwidth_bytes_per_s / 1e9:.3g} GB/s busbw"
                            for p in point_fit.regimes)
        print(f"  {point_fit.link} {point_fit.kind} {point_fit.group_size} {unit}: {regimes} "
              f"(rms residual {point_fit.result.rms_relative_residual:.1%})")
    return 0


def _read_section(path: str) -> "CalibrationSection":
    """A calibrated profile's section, or a bare section file's; InputError when the file is neither."""
    from pathlib import Path

    import yaml

    from autopar.calibrate.calibration_section import calibration_section_from_dict, read_calibration_section
    from costmodels.errors import InputError
    from costmodels.hardware import load_profile, read_text_file, safe_yaml_load

    text = read_text_file(Path(path), "measurements")
    try:
        data = safe_yaml_load(text, str(path), "measurements")
    except yaml.YAMLError as exc:
        raise InputError("measurements", f"{path} is not readable YAML ({exc.__class__.__name__}); fix the "
                                         "syntax or calibrate again") from None
    if isinstance(data, dict) and "schema_version" in data:
        section = read_calibration_section(load_profile(path))
        if section is None:
            raise InputError("measurements", f"{path} is a profile without a calibration section; nothing to refit "
                                             "(run `autopar calibrate` to measure)")
        return section
    if isinstance(data, dict) and "measurements" in data:
        return calibration_section_from_dict(data, path)
    raise InputError("measurements", f"{path} is neither a calibrated profile nor a calibration section "
                                     "(a mapping with a `measurements` key); nothing to refit")
