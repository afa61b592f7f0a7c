"""`autopar calibrate`: measure this machine (or, under torchrun, this cluster) and write a hardware profile; or fit
the profile to training runs a team has already measured.

    autopar calibrate --from-runs runs.csv train.log ... --gpu h100 --out my_cluster.yaml   # no torch, seconds
    autopar calibrate --out my_cluster.yaml [--quick] [--base-gpu h100]
    autopar calibrate --allow-cpu --out cpu.yaml --quick        # no GPU: tests the pipeline on this CPU
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m autopar.calibrate --out my_cluster.yaml

`--from-runs` reads autopar's run format (CSV, docs/run_format.md) and Megatron-LM, NeMo and torchtitan training logs
(autopar.run_logs) and fits the profile's free parameters to their step times (autopar.calibrate.from_runs;
docs/calibrate_from_runs.md); it needs no torch. For the microbenchmarks, torch is an optional extra: without it this command says how to install it and exits 2. torch is imported only
here, inside `run`, and only by this command. Without a CUDA GPU it exits 2 too, unless `--allow-cpu` asks to
measure the CPU (a pipeline test: the profile is named `cpu-<host>-calibrated` and marked `device: cpu`).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys

INSTALL_HINT = "pip install 'autopar[calibrate]'"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)


def byte_size(text: str) -> int:
    """'1048576', '64K', '256MiB', '1G' -> bytes (K/M/G are powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size in bytes like 65536, 64K or 256MiB, got {text!r}")
    value, unit = float(match.group(1)), (match.group(2) or "b").lower()
    scale = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit[0]]
    size = int(value * scale)
    if size < 8:
        raise argparse.ArgumentTypeError(f"must be at least 8 bytes, got {text!r}")
    return size


def _positive_int(text: str) -> int:
    from autopar.commands import integer

    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="measure GEMMs and collectives here and write a hardware profile (needs torch), or fit "
                          "the profile to runs already measured (--from-runs)",
        description="Microbenchmarks through torch and torch.distributed (NCCL on GPUs, gloo on CPU): GEMM "
                    "throughput over transformer shapes (bf16, and fp8 where supported), all-reduce, all-gather, "
                    "reduce-scatter, all-to-all and send/recv from 1 KiB up (intra-node and inter-node links "
                    "separately), and memory overheads on GPUs. Fits the cost model's alpha, bandwidth and "
                    "GEMM-efficiency parameters and writes a profile for `solve/estimate --profile FILE`. Run it "
                    "directly (one process) or under torchrun on every node: torchrun --nnodes 2 "
                    "--nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m autopar.calibrate "
                    "--out my_cluster.yaml. With --from-runs FILE... --gpu NAME it measures nothing: it fits the "
                    "profile's free parameters (GEMM, attention and collective efficiencies, elementwise traffic) to "
                    "the step times of runs a team already has (run-format CSV, Megatron-LM / NeMo / torchtitan "
                    "logs; docs/calibrate_from_runs.md).",
        epilog=f"the microbenchmarks need torch: {INSTALL_HINT}; --from-runs does not")
    parser.add_argument("--from-runs", nargs="+", default=None, metavar="FILE",
                        help="fit the profile to measured runs instead of microbenchmarking: run-format CSV files "
                             "(docs/run_format.md) and Megatron-LM / NeMo / torchtitan training logs; needs --gpu")
    parser.add_argument("--gpu", default=None, metavar="NAME",
                        help="with --from-runs: the GPU the runs ran on (a bundled profile name, e.g. h100); its "
                             "bundled profile is the prior and the base of the fitted file")
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="with --from-runs: the model of the training logs (preset, config.json, cached HF id), "
                             "instead of the shape each log prints (checked against it)")
    parser.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                        help="with --from-runs: processes for the model evaluations; default the CPUs, at most 8")
    parser.add_argument("--out", default="calibrated-profile.yaml", metavar="FILE",
                        help="profile YAML to write (atomically, on rank 0); default calibrated-profile.yaml")
    parser.add_argument("--quick", action="store_true",
                        help="fewer GEMM shapes, every 4th message size, fewer runs (minutes -> seconds)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="on a machine without a CUDA GPU, measure the CPU instead of refusing: for testing the "
                             "calibration pipeline; the numbers describe this CPU, not a GPU (the profile is named "
                             "cpu-<host>-calibrated, and --profile refuses it without --allow-cpu-profile); no "
                             "effect where a GPU is found")
    parser.add_argument("--base-gpu", default=None, metavar="NAME",
                        help="bundled profile for what is not measured (spec sheet, unmeasured links); default "
                             "from the detected GPU, a100-80gb on a CPU run (--allow-cpu)")
    parser.add_argument("--max-bytes", type=byte_size, default=None, metavar="SIZE",
                        help="largest collective message (e.g. 64K, 256MiB); default 256MiB on GPUs, 16MiB on CPU")
    parser.add_argument("--min-bytes", type=byte_size, default=1024, metavar="SIZE",
                        help="smallest collective message; default 1KiB")
    parser.add_argument("--warmup", type=_positive_int, default=None, metavar="N",
                        help="untimed runs before each measurement; default 5 (2 with --quick)")
    parser.add_argument("--iters", type=_positive_int, default=None, metavar="N",
                        help="timed runs per measurement (median and IQR kept); default 20 (5 with --quick)")
    parser.add_argument("--ranks-per-node", type=_positive_int, default=None, metavar="N",
                        help="ranks per node when the launcher does not say (default: torchrun's GROUP_RANK, "
                             "else the host name)")
    parser.add_argument("--timeout-s", type=_positive_int, default=600, metavar="S",
                        help="give up when a rank has not answered for this long; default 600")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.from_runs is not None:
        return run_from_runs(args)
    for flag, value in (("--gpu", args.gpu), ("--model", args.model), ("--jobs", args.jobs)):
        if value is not None:
            print(f"autopar: error: {flag}: only with --from-runs (the microbenchmarks take --base-gpu)",
                  file=sys.stderr)
            return 2
    if importlib.util.find_spec("torch") is None:
        print(f"autopar: error: calibrate needs torch, which is not installed; install it with: {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    import os
    from pathlib import Path

    from autopar.calibrate.profile_file import check_output_path
    from costmodels.hardware import resolve_gpu_name

    # cheap checks first, before torch loads and ranks meet: a typo costs a second, not a rendezvous
    if args.base_gpu is not None:
        resolve_gpu_name(args.base_gpu)
    if os.environ.get("RANK", "0") == "0":  # rank 0 writes the profile; other nodes may not see its directory
        check_output_path(args.out)

    from autopar.calibrate.runner import CalibrateOptions, run_calibration

    options = CalibrateOptions(out=Path(args.out), quick=args.quick, base_gpu=args.base_gpu,
                               max_bytes=args.max_bytes, min_bytes=args.min_bytes, warmup=args.warmup,
                               iters=args.iters, ranks_per_node=args.ranks_per_node, timeout_s=args.timeout_s,
                               allow_cpu=args.allow_cpu)
    return run_calibration(options)


MIN_RUNS = 3
"""Fewest runs a fit accepts: below it no parameter is determined beyond its prior, and no leave-one-out exists."""


def run_from_runs(args: argparse.Namespace) -> int:
    """`autopar calibrate --from-runs FILE... --gpu NAME --out FILE`: read, fit, write, report."""
    from autopar.calibrate.from_runs import default_jobs, fit_profile_to_runs
    from autopar.calibrate.profile_file import check_output_path, write_atomically
    from autopar.calibrate.runs_profile import bundled_profile_data, fitted_profile_text
    from autopar.run_logs import read_runs
    from costmodels.errors import InputError
    from costmodels.hardware import load_profile, resolve_gpu_name

    if args.gpu is None:
        raise InputError("gpu", "--from-runs needs --gpu NAME, the GPU the runs ran on (e.g. --gpu h100)")
    base_name = resolve_gpu_name(args.gpu)
    out = check_output_path(args.out)
    model = None
    if args.model is not None:
        from autopar.models import load_model

        model = load_model(args.model)
    runs = read_runs(list(args.from_runs), base_name, model)
    if len(runs) < MIN_RUNS:
        raise InputError("from-runs", f"{len(runs)} run(s) in {', '.join(args.from_runs)}: a fit needs at least "
                                      f"{MIN_RUNS} (each one a row or a log), better ten or more that differ in layout")
    fit = fit_profile_to_runs(runs, load_profile(base_name), bundled_profile_data(base_name),
                              jobs=args.jobs or default_jobs())
    text = fitted_profile_text(fit, bundled_profile_data(base_name), [str(f) for f in args.from_runs])
    write_atomically(out, text)
    sys.stdout.write(render_fit(fit, str(out)))
    return 0


def render_fit(fit, out: str) -> str:
    """The fit as the terminal shows it: parameters, changed values, residuals per run, leave-one-out, warnings."""
    lines = [f"wrote {out}: {fit.base.name} fitted to {len(fit.residuals)} measured runs "
             f"({fit.elapsed_s:.1f} s, {fit.model_evaluations} model evaluations)", "", "parameters:"]
    for q in fit.parameters:
        lines.append(f"  {q.parameter.name:<30} ×{q.scale:<8.4g} {q.status}; information {q.information_ratio:.3g}× "
                     f"the prior's, {q.runs_exercising} runs exercise it")
    lines += [f"  {skipped}" for skipped in fit.skipped]
    lines += ["", "changed values (before -> after):"]
    lines += [f"  {path}: {before:.6g} -> {after:.6g}" for path, (before, after) in fit.changes.items()] or \
        ["  none"]
    lines += ["", f"{'run':<44} {'plan':<28} {'measured s':>11} {'bundled':>8} {'fitted':>8} {'LOO':>8}"]
    for r in fit.residuals:
        lines.append(f"{(r.run.source + ' ' + r.run.run_id)[:44]:<44} {r.plan.short()[:28]:<28} "
                     f"{r.measured_s:>11.4g} {r.error(r.prior_s):>+8.1%} {r.error(r.fitted_s):>+8.1%} "
                     f"{r.error(r.leave_one_out_s):>+8.1%}")
    lines += ["", f"MAPE: bundled {fit.mape('prior_s'):.1%}, fitted {fit.mape('fitted_s'):.1%}, "
                  f"leave-one-out {fit.mape('leave_one_out_s'):.1%}"]
    loo, bundled = fit.leave_one_out_check
    lines.append(f"validation: leave-one-out RMS error {loo:.1%} against the bundled profile's {bundled:.1%}: "
                 + ("fit adopted" if fit.adopted else "fit NOT adopted, the bundled values are kept"))
    lines += [f"warning: {warning}" for warning in fit.warnings]
    return "\n".join(lines) + "\n"
