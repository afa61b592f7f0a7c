"""`autopar solve MODEL --gpus N`: every Pareto-optimal layout (step time vs peak memory per GPU), fastest first.

Prints the inputs and assumptions, then the front as a table (plan, step time, tokens/s, MFU, peak memory);
`--json` prints the ParetoFront document instead. `--gpus 64-512` solves a range of GPU counts and keeps the plans
no other beats on step time, memory and GPU count together (the scaling front).

Exit codes: 0 a front was found; 1 nothing fits (the conflicting rules and the nearest plan are printed);
2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from autopar.commands import (
    add_cluster_arguments,
    add_json_argument,
    add_model_argument,
    add_relax_argument,
    add_training_arguments,
    integer,
    number,
    shown_value,
)


def gpu_count_or_range(text: str) -> int | tuple[int, int]:
    """`N` or `LO-HI` (a scaling front over GPU counts)."""
    from costmodels.limits import MAX_NUM_GPUS

    if "-" in text.strip().lstrip("-"):
        low, _, high = text.partition("-")
        low_n, high_n = integer(low, "num_gpus", MAX_NUM_GPUS), integer(high, "num_gpus", MAX_NUM_GPUS)
        if low_n < 1 or high_n < low_n:
            raise argparse.ArgumentTypeError(f"expected LO-HI with 1 <= LO <= HI, got {shown_value(text)}")
        return (low_n, high_n)
    return integer(text, "num_gpus", MAX_NUM_GPUS)


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    from autopar.search.refine import DEFAULT_CPSAT_SEARCHES, DEFAULT_FRONT_STRUCTURES, DEFAULT_NEAR_STRUCTURES

    group = parser.add_argument_group("search")
    group.add_argument("--fix", action="append", default=[], metavar="KNOB=V",
                       help="pin a knob (tp, pp, vpp, cp, ep, etp, mbs, sp, recompute, recompute_layers, "
                            "recompute_modules, zero, first_stage_layers, last_stage_layers); repeatable, e.g. "
                            "--fix tp=4 --fix sp=true --fix recompute_modules=layernorm,moe_act")
    group.add_argument("--max", action="append", default=[], metavar="KNOB=V", help="upper bound on a knob; repeatable")
    group.add_argument("--min", action="append", default=[], metavar="KNOB=V", help="lower bound on a knob; repeatable")
    add_relax_argument(parser)
    group.add_argument("--framework", default=None, metavar="FRAMEWORK",
                       help="the framework that runs the step: search only the plans it can run (megatron, nemo, "
                            "bridge, verl, torchtitan, deepspeed, pytorch, llmc; autopar/export/capabilities.py) and "
                            "price them as its engine runs them (its launches and host synchronisations), so the "
                            "front is the one it can launch")
    group.add_argument("--time-limit", type=number, default=None, metavar="SECONDS",
                       help="stop searching after this long and show the front found so far (marked not proven); "
                            "the oracle searches on until one plan fits")
    group.add_argument("--jobs", type=integer, default=None, metavar="N",
                       help="processes the search runs in (default 8, never more than the CPUs this process may "
                            "use; Linux only, elsewhere 1): a large search shares its batches among them, the same "
                            "front")
    group.add_argument("--top", type=integer, default=None, metavar="K", help="show only the K fastest front points")
    group.add_argument("--solver", choices=("auto", "cpsat", "oracle"), default="auto",
                       help="CP-SAT model or exhaustive oracle; auto = the oracle (faster for this cost model); same front")
    group.add_argument("--layouts", action=argparse.BooleanOptionalAction, default=True,
                       help="refine the front with per-stage pipeline layouts (layers per virtual stage, searched "
                            "exactly: chain DP / CP-SAT) for its pipelined structures and the near-front ones that "
                            "could overtake it, within --layouts-budget, and recompute it (default on; "
                            "--no-layouts: the uniform front only)")
    group.add_argument("--layouts-budget", type=number, default=None, metavar="SECONDS",
                       help="wall-clock time the layout refinement may take; default: a fixed amount of work (the "
                            f"{DEFAULT_FRONT_STRUCTURES} fastest front structures and {DEFAULT_NEAR_STRUCTURES} "
                            f"near-front ones, at most {DEFAULT_CPSAT_SEARCHES} interleaved (CP-SAT), about "
                            "half a second; the same front on every run)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "solve", help="the Pareto front of layouts (step time vs memory)",
        description="Search every layout (tp, sp, pp, vpp, uneven first/last stages, cp, ep, etp, mbs, recompute, "
                    "zero) under the guide's rules and print the Pareto-optimal ones, fastest first.",
        epilog="exit codes: 0 front found, 1 nothing fits (conflicting rules printed), 2 bad input")
    add_model_argument(parser)
    add_cluster_arguments(parser)
    for action in parser._actions:                     # --gpus also takes a range LO-HI here
        if action.dest == "num_gpus":
            action.type = gpu_count_or_range
            action.help = "number of GPUs, or a range LO-HI for the scaling front; default one node"
    add_training_arguments(parser)
    add_search_arguments(parser)
    add_json_argument(parser)
    from autopar.commands.output_flags import add_output_arguments  # F: --out, --emit, --pick

    add_output_arguments(parser)
    for action in parser._actions:                     # here --emit also chooses the plans searched
        if action.dest == "emit":
            action.help = (f"{action.help}. Here it also searches only the plans FRAMEWORK can run, as --framework FRAMEWORK does "
                           "(the two must agree), and prints the config of the fastest")
    parser.set_defaults(run=run)


def controls_from_args(args: argparse.Namespace):
    from autopar.search.solve import controls_from
    from autopar.search.space import parse_assignments

    minimum = parse_assignments(args.min, "min")
    maximum = parse_assignments(args.max, "max")
    bounds = {k: (minimum.get(k), maximum.get(k)) for k in set(minimum) | set(maximum)}
    return controls_from(args.fix, bounds, args.relax), bounds


def run(args: argparse.Namespace) -> int:
    from autopar.commands import specs_from_args
    from autopar.commands.output_flags import report_stream, validate_output_arguments
    from autopar.errors import Infeasible
    from autopar.search.solve import solve, solve_scaling
    from costmodels.errors import InputError
    from costmodels.rules import active_rules

    validate_output_arguments(args)               # bad --emit/--out/--pick: exit 2 before any solving
    from autopar.export.capabilities import framework_rules
    from autopar.export.names import framework_name

    if args.framework:                             # bad --framework: exit 2 before any solving
        args.framework = framework_name(args.framework, field="framework")
    framework_note = framework_from_emit(args)
    _, bounds = controls_from_args(args)          # bad --fix/--max/--relax before the model loads
    active_rules(args.relax)
    if args.top is not None and args.top < 1:
        raise InputError("top", f"must be >= 1, got {args.top}")
    if args.layouts_budget is not None and not (args.layouts_budget > 0 and args.layouts_budget < float("inf")):
        raise InputError("layouts_budget", f"must be a positive number of seconds, got {args.layouts_budget!r}")
    if args.layouts_budget is not None and not args.layouts:
        raise InputError("layouts_budget", "--layouts-budget is the layout search's time, and --no-layouts turns "
                                           "that search off; drop one of them")
    gpu_range = args.num_gpus if isinstance(args.num_gpus, tuple) else None
    if gpu_range is not None:
        args.num_gpus = gpu_range[1]
    model, cluster, training = specs_from_args(args)
    if args.jobs is not None and args.jobs < 1:
        raise InputError("jobs", f"must be >= 1, got {args.jobs}")
    options = dict(fix=args.fix, bounds=bounds, relax=tuple(args.relax), time_limit_s=args.time_limit,
                   solver=args.solver, jobs=args.jobs,
                   extra_rules=framework_rules(args.framework) if args.framework else ())
    bar = ProgressBar(sys.stderr)
    if framework_note:
        print(f"autopar: note: {framework_note}", file=sys.stderr)
    cpsat_import = CpsatPrefetch.start(args, gpu_range)
    try:
        if gpu_range is not None:
            front = solve_scaling(model, cluster, training, gpu_range, progress=bar, **options)
        else:
            front = solve(model, cluster, training, progress=lambda fraction: bar(fraction, "plans"), **options)
    except Infeasible as infeasible:
        if args.json:  # one JSON document on stdout in every outcome; the explanation also goes to stderr
            print(json.dumps({"status": "infeasible", "message": infeasible.message,
                              "conflicting_rules": list(infeasible.rules), "details": list(infeasible.details)},
                             indent=2))
        raise
    finally:
        bar.close()
        if cpsat_import is not None:
            cpsat_import.join()
    front = refine_with_layouts(args, front, gpu_range,
                                cpsat_failure=cpsat_import.failure if cpsat_import is not None else None)
    if args.top is not None:
        import dataclasses

        front = dataclasses.replace(front, points=front.points[: args.top])
    if getattr(args, "emit", None):   # a --pick past the front is bad input before any table is printed
        from autopar.commands.output_flags import chosen_point

        chosen_point(front, getattr(args, "pick", 0))
    if args.json:  # the same schema-validated document as --out front.json (autopar/schemas/front.schema.json)
        from autopar.report import render

        print(render(front, "json"), end="")
    else:
        print_front(front, stream=report_stream(args), gpu_range=gpu_range)  # --emit: the table goes to stderr
    from autopar.commands.output_flags import write_outputs

    write_outputs(args, front)
    return 0


FRAMEWORK_TITLES = {"megatron": "Megatron-LM", "nemo": "NeMo 2", "bridge": "Megatron-Bridge", "verl": "verl",
                    "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}
"""How the notes name each framework of autopar.export.names.FRAMEWORKS."""


def framework_from_emit(args: argparse.Namespace) -> "str | None":
    """`--emit FW` searches under FW's rules, as `--framework FW` does (a user who names the framework wants the
    best plan it runs, not the fastest plan of all and a refusal): sets args.framework and returns the one-line note
    that says so (None when --emit is absent or --framework was given too). `--framework` and `--emit` naming two
    frameworks is bad input."""
    from costmodels.errors import InputError

    emit = getattr(args, "emit", None)
    if not emit:
        return None
    if args.framework and args.framework != emit:
        raise InputError("emit", f"--emit {emit} and --framework {args.framework} name two frameworks; the config "
                                 "is written for the framework the search ran under: give one of them, or the same "
                                 "one twice")
    if args.framework:
        return None
    args.framework = emit
    return (f"--emit {emit}: searching only the plans {FRAMEWORK_TITLES.get(emit, emit)} can run "
            f"(as --framework {emit}); the config is written for the fastest of them")


class CpsatPrefetch:
    """Import ortools' CP-SAT module (about 0.3 s, pandas with it) on a second thread while the uniform search runs,
    when the layout refinement that may call CP-SAT will run: on a machine with a second core the import then adds
    no wall time. A failed import (a low `ulimit -v` stops its shared objects from mapping) is kept, not printed
    from the thread: `failure` names it once the thread is joined, and the layout refinement is then skipped with a
    note."""

    def __init__(self) -> None:
        import threading

        self.failure: "str | None" = None
        self.thread = threading.Thread(target=self._load, name="cpsat-import", daemon=True)

    @classmethod
    def start(cls, args: argparse.Namespace, gpu_range) -> "CpsatPrefetch | None":
        """The running import, or None where no layout refinement will run (--no-layouts, a scaling front)."""
        if not getattr(args, "layouts", True) or gpu_range is not None:
            return None
        prefetch = cls()
        prefetch.thread.start()
        return prefetch

    def _load(self) -> None:
        import importlib

        try:
            importlib.import_module("ortools.sat.python.cp_model")
        except (ImportError, OSError, MemoryError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else ""
            self.failure = f"{type(exc).__name__}: {reason[:160]}"

    def join(self) -> None:
        self.thread.join()


def refine_with_layouts(args: argparse.Namespace, front, gpu_range, cpsat_failure: "str | None" = None):
    """The front refined with per-stage layouts (autopar.search.refine), unless --no-layouts, a scaling front, or
    CP-SAT could not be loaded (`cpsat_failure`); the front's notes say which."""
    import dataclasses

    from autopar.export import takes_layouts
    from autopar.export.capabilities import framework_rules
    from autopar.search.refine import refine_front

    if not getattr(args, "layouts", True):
        return dataclasses.replace(front, notes=tuple(front.notes) + ("layouts: not searched (--no-layouts)",))
    if gpu_range is not None:
        return dataclasses.replace(front, notes=tuple(front.notes) + (
            "layouts: not searched on a scaling front (solve one GPU count to refine it with layouts)",))
    if cpsat_failure is not None:
        return dataclasses.replace(front, notes=tuple(front.notes) + (
            f"layouts: not searched: ortools' CP-SAT could not be loaded ({cpsat_failure}; a low `ulimit -v`?); "
            "the front is the uniform one",))
    if args.framework and not takes_layouts(args.framework):
        return dataclasses.replace(front, notes=tuple(front.notes) + (
            f"layouts: not searched: {args.framework} cannot express a per-stage pipeline layout",))
    controls, _ = controls_from_args(args)
    return refine_front(front, budget_s=args.layouts_budget, controls=controls,
                        extra_rules=framework_rules(args.framework) if args.framework else ())[0]


class ProgressBar:
    """A rich progress bar on stderr for a search that runs longer than `delay_s`; silent when stderr is not a
    terminal (pipes, files, CI logs) and for quick searches. Called as `bar(fraction, label)`; `close()` clears it."""

    def __init__(self, stream, delay_s: float = 1.0) -> None:
        import time

        self.enabled = hasattr(stream, "isatty") and stream.isatty()
        self.stream = stream
        self.delay_s = delay_s
        self.started = time.monotonic()
        self.progress = None
        self.task = None

    def __call__(self, fraction: float, label: str) -> None:
        import time

        if not self.enabled:
            return
        if self.progress is None:
            if time.monotonic() - self.started < self.delay_s:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("searching {task.description}"), BarColumn(),
                                     TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                     console=Console(file=self.stream), transient=True)
            self.progress.start()
            self.task = self.progress.add_task(label, total=1.0)
        self.progress.update(self.task, completed=min(max(fraction, 0.0), 1.0), description=label)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def print_front(front, stream=None, gpu_range: "tuple[int, int] | None" = None) -> None:
    """The inputs and assumptions, then the front as a table, fastest first. A scaling front (`gpu_range`) names
    the range on the cluster line and has a GPUs column."""
    from rich.console import Console

    from autopar.report.header import inputs_header
    from autopar.report.terminal import front_table, print_header_line

    console = Console(file=stream if stream is not None else sys.stdout, width=140, highlight=False)
    for label, text in inputs_header(front.model, front.cluster, front.training):
        if label == "cluster" and gpu_range is not None:
            per_gpu = text[text.index(", limit"):] if ", limit" in text else ""
            text = (f"{gpu_range[0]:,}-{gpu_range[1]:,} GPUs (scaling front) of {front.cluster.profile.display_name}"
                    f"{per_gpu}")
        print_header_line(console, label, text)
    relaxed = f"; relaxed: {', '.join(front.relaxed_rules)}" if front.relaxed_rules else ""
    print_header_line(console, "rules", f"{', '.join(front.rules)}{relaxed}")
    print_header_line(console, "search", f"{front.search_space_size:,} candidate plans, solver {front.solver}, "
                                         f"{front.solve_time_s:.2f} s, "
                                         f"{'optimal' if front.proven_optimal else 'NOT proven optimal'}")
    for note in front.notes:
        print_header_line(console, "note", note)
    count = len(front.points)
    console.print(front_table(front, title=f"Pareto front: {count} plan{'s' if count != 1 else ''}, fastest first",
                              scaling=gpu_range is not None))
