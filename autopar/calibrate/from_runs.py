"""Fit a hardware profile's free parameters to measured training runs (`autopar calibrate --from-runs`).

What is fitted is a declared table (FREE_PARAMETERS): each entry names a multiplicative scale on one group of
profile values (the GEMM curve's plateau, the attention kernels' plateaus, a link's collective bandwidths, the
elementwise traffic, the host's per-kernel cost), its bounds, its prior width, and which runs exercise it. The
starting point — the prior — is the bundled profile, itself fitted to public microbenchmarks
(benchmarks/fit_microbench.py); a run that does not inform a parameter leaves it there. Adding a parameter is one
entry; a parameter whose values are not in the base profile is skipped and said so.

The fit (regularised least squares; the same Levenberg–Marquardt as `autopar profile fit`, autopar.calibrate.fit.
least_squares) minimises

    Σ_runs (log(predicted / measured) / RUN_SIGMA)²  +  Σ_parameters (log(scale) / prior_sigma)²

over the log scales. Each run is priced by the cost model itself (costmodels.steptime.step_time_s) at the layout
it ran (`autopar.runs.choose_plan` at the bundled profile, for knobs a run leaves open). One evaluation of the
model costs tens of milliseconds, so the model is not differenced inside the minimiser: it is linearised in the
log scales around the prior (a forward difference per parameter and exercising run: the Jacobian), the minimiser
works on that log-linear model, the model is evaluated at the result, and each run's Jacobian row is corrected by
Broyden's rank-one update from what it saw (Broyden 1965, Math. Comp. 19(92)) for up to OUTER_ITERATIONS rounds;
the reported residuals are always the model's own at the fitted profile.

Runs with the same inputs (model, cluster shape, training; `same_inputs_groups`) are priced in one vectorised model
call per trial profile, whatever their layouts.

What the fit says about itself:
- residuals per run, before (bundled) and after (fitted);
- a leave-one-out error: each run predicted by the fit made without it and without the runs the model cannot tell
  from it (`same_run_groups`; grouped PRESS residuals of the problem linearised at the fitted profile: exact for
  that linear model, Woodbury on its normal matrix);
- the validation rule: the fit is adopted only if those leave-one-out predictions have a smaller RMS log error than
  the bundled profile's predictions of the same runs (which saw none of them); otherwise every parameter keeps its
  bundled value and the first warning says why (`RunsFit.adopted`, docs/calibrate_from_runs.md);
- which parameters the runs inform (the information JᵀJ/RUN_SIGMA² they give against the prior's 1/prior_sigma²),
  and a warning for parameters they cannot tell apart: the correlation of the estimates from the data alone
  ((JᵀJ)⁻¹ over the informed parameters; |correlation| ≥ CORRELATION_WARNING), and the condition number of the
  scaled JᵀJ — e.g. runs all at one tp, whose GEMM time and TP communication scale together.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from costmodels.errors import InputError

if TYPE_CHECKING:
    from autopar.runs import MeasuredRun
    from costmodels.hardware import HardwareProfile
    from costmodels.plan import Plan

RUN_SIGMA = 0.05
"""The spread of a run's log step time the fit allows (5%): run-to-run noise plus what the model cannot express
for one run. It weighs the runs against the prior: a parameter moves by its prior width when about
(prior_sigma / RUN_SIGMA)² runs of full sensitivity ask for it."""

DIFFERENCE_STEP = 0.05
"""The forward-difference step of the Jacobian in log scale (+5%): large enough to step over the kinks of the
model's max/overlap terms, small enough to stay local."""

OUTER_ITERATIONS = 3
"""Rounds of (minimise the linearised problem, evaluate the model, Broyden-correct the rows)."""

CONVERGED = 0.005
"""Relative decrease of the objective (promised by the linearised model, or found by the model) below which the
outer rounds stop: a round costs one model evaluation per run."""

CORRELATION_WARNING = 0.95
"""|correlation| of two parameter estimates (from the runs alone) at which the runs are said not to separate them."""

CONDITION_WARNING = 1e4
"""Condition number of the scaled information matrix of the informed parameters at which the fit warns."""

INFORMED_RATIO = 1.0
"""A parameter is informed by the runs when their information about it is at least the prior's (the data weigh
as much as the microbenchmarks); below it the prior dominates and the value barely moves."""

MAX_JOBS = 8
"""Most worker processes a fit starts (the evaluations of one fit are a few hundred to a few thousand)."""

TEXT_SECTION = "calibration_from_runs"
"""The fitted profile's own section: what it was fitted to and how well (see autopar.calibrate.runs_profile)."""

UNINFORMED_RATIO = 0.01
"""Below this information ratio a parameter is kept exactly at the prior (the runs say nothing about it)."""


# ---- the parameter table -----------------------------------------------------------------------------------------

def _always(run: "MeasuredRun") -> bool:
    return True


def _fp8_run(run: "MeasuredRun") -> bool:
    return run.training.precision.value == "fp8"


def _fused_attention(run: "MeasuredRun") -> bool:
    return bool(run.training.flash_attention)


def _grouped_experts(run: "MeasuredRun") -> bool:
    return run.model.is_moe and run.training.expert_gemm.value == "grouped"


def _multi_gpu(run: "MeasuredRun") -> bool:
    return run.cluster.num_gpus > 1


def _spans_nvlink_domains(run: "MeasuredRun") -> bool:
    return run.cluster.num_gpus > run.cluster.nvlink_domain_gpus


def _experts_across_nodes(run: "MeasuredRun") -> bool:
    return run.model.is_moe and _spans_nvlink_domains(run)


IB_RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
"""The collectives the InfiniBand ring parameter scales (`ib_collective_efficiency`); all-to-all has its own."""


@dataclass(frozen=True)
class FreeParameter:
    """One fitted scale: every value at `paths` in the profile is multiplied by it (then capped at `ceilings`)."""

    name: str
    paths: tuple[str, ...]
    """Dotted profile paths (as in the YAML and in `provenance`); `*` matches within one key (fnmatch)."""
    what: str
    prior_sigma: float
    """Width of the prior on log(scale): how far the cluster may plausibly sit from the microbenchmark value."""
    bounds: tuple[float, float] = (0.25, 4.0)
    ceilings: Mapping[str, float] = field(default_factory=dict)
    """Path pattern -> largest value allowed after scaling (a fraction of a peak or of a line rate is at most 1)."""
    exercised: Callable[["MeasuredRun"], bool] = _always
    """Whether a run's step time can depend on the parameter at all (the model reads the values only for such
    runs): a shortcut that saves the model evaluations whose derivative is zero by construction."""


FREE_PARAMETERS: tuple[FreeParameter, ...] = (
    FreeParameter("gemm_efficiency", ("compute.gemm_efficiency.peak_fraction",),
                  "bf16 GEMM efficiency: the plateau of the GEMM curve (costmodels.compute.gemm_efficiency)",
                  prior_sigma=0.10, ceilings={"*": 1.0}),
    FreeParameter("fp8_gemm_efficiency", ("compute.gemm_efficiency.fp8_peak_fraction",),
                  "fp8 GEMM efficiency: the plateau of the fp8 GEMM curve", prior_sigma=0.10, ceilings={"*": 1.0},
                  exercised=_fp8_run),
    FreeParameter("attention_efficiency", ("compute.gemm_efficiency.attention_*_peak_fraction",
                                           "compute.gemm_efficiency.attention_peak_fraction"),
                  "fused-attention efficiency: the plateau of every attention kernel's curve (forward and backward)",
                  prior_sigma=0.15, ceilings={"*": 1.0}, exercised=_fused_attention),
    FreeParameter("grouped_gemm_efficiency", ("compute.gemm_efficiency.grouped_peak_fraction",),
                  "grouped expert-GEMM efficiency (costmodels.moe_kernels roofline)", prior_sigma=0.15,
                  ceilings={"*": 1.0}, exercised=_grouped_experts),
    FreeParameter("nvlink_collective_efficiency", ("links.nvlink.bandwidth_efficiency",
                                                   "collectives.nvlink.*.busbw_gb_per_s"),
                  "NVLink collective bandwidth: the link's efficiency and every measured collective's bus bandwidth",
                  prior_sigma=0.20, ceilings={"links.*.bandwidth_efficiency": 1.0}, exercised=_multi_gpu),
    FreeParameter("ib_collective_efficiency", ("links.ib.bandwidth_efficiency",
                                               *(f"collectives.ib.{kind}.busbw_gb_per_s" for kind in IB_RING_KINDS)),
                  "InfiniBand collective bandwidth: the link's efficiency (what a collective without measured "
                  "points runs at, all-to-all too where the profile measured none) and every measured ring "
                  "collective's (all-reduce, all-gather, reduce-scatter, send/recv) bus bandwidth", prior_sigma=0.25,
                  ceilings={"links.*.bandwidth_efficiency": 1.0}, exercised=_spans_nvlink_domains),
    FreeParameter("ib_all_to_all_efficiency", ("collectives.ib.all_to_all.busbw_gb_per_s",),
                  "InfiniBand all-to-all bus bandwidth (the expert dispatch between nodes): measured apart from the "
                  "ring collectives, since every rank sends to every other at once (NCCL's p2p path, not its "
                  "rings) and a fabric's congestion hits the two differently", prior_sigma=0.25,
                  exercised=_experts_across_nodes),
    FreeParameter("elementwise_traffic", ("elementwise.traffic_per_activation_byte",),
                  "elementwise HBM traffic per byte of stored activation (costmodels.compute)", prior_sigma=0.30),
    FreeParameter("host_kernel_cost", ("host.*_us",),
                  "the host's time per launch on every path (the profile's `host:` section, costmodels.host): one "
                  "scale, the CPU's and software stack's speed", prior_sigma=0.50),
)
"""The profile values a fit to measured runs may change. Spec-sheet values (peak FLOP/s, HBM, line rates) and the
curves' shapes (half-saturation sizes) stay as measured by the microbenchmarks."""


def parameter_named(name: str) -> FreeParameter:
    for parameter in FREE_PARAMETERS:
        if parameter.name == name:
            return parameter
    raise KeyError(name)


# ---- profile paths -----------------------------------------------------------------------------------------------

def resolved_paths(data: Mapping[str, Any], parameter: FreeParameter) -> list[str]:
    """The concrete dotted paths of `parameter` present in profile YAML data (collectives: one path per point,
    `collectives.<link>.<kind>[<i>].busbw_gb_per_s`)."""
    out = []
    for pattern in parameter.paths:
        section, _, rest = pattern.partition(".")
        if section == "collectives":
            link, kind_pattern, key = rest.split(".")
            kinds = (data.get("collectives") or {}).get(link) or {}
            for kind in sorted(kinds):
                if fnmatch.fnmatchcase(kind, kind_pattern):
                    out += [f"collectives.{link}.{kind}[{i}].{key}" for i in range(len(kinds[kind] or []))]
            continue
        *parents, leaf = pattern.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            out += [".".join((*parents, key)) for key in node if fnmatch.fnmatchcase(str(key), leaf)
                    and isinstance(node[key], (int, float)) and not isinstance(node[key], bool)]
    return out


def _ceiling(parameter: FreeParameter, path: str) -> float:
    caps = [cap for pattern, cap in parameter.ceilings.items() if fnmatch.fnmatchcase(path.rpartition(".")[2], pattern)
            or fnmatch.fnmatchcase(path, pattern)]
    return min(caps) if caps else math.inf


def _get(data: Mapping[str, Any], path: str) -> float:
    node: Any = data
    for part in _parts(path):
        node = node[part]
    return float(node)


def _set(data: dict, path: str, value: float) -> None:
    parts = _parts(path)
    node: Any = data
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def _parts(path: str) -> list[Any]:
    parts: list[Any] = []
    for word in path.split("."):
        name, _, index = word.partition("[")
        parts.append(name)
        if index:
            parts.append(int(index.rstrip("]")))
    return parts


def scaled_values(data: Mapping[str, Any], scales: Mapping[str, float],
                  parameters: Sequence[FreeParameter] = FREE_PARAMETERS) -> dict[str, tuple[float, float]]:
    """path -> (before, after) for every value the scales change (after capped at the parameter's ceiling)."""
    out = {}
    for parameter in parameters:
        scale = scales.get(parameter.name, 1.0)
        if scale == 1.0:
            continue
        for path in resolved_paths(data, parameter):
            before = _get(data, path)
            out[path] = (before, min(before * scale, max(before, _ceiling(parameter, path))))
    return out


def apply_to_profile(profile: "HardwareProfile", data: Mapping[str, Any],
                     changes: Mapping[str, tuple[float, float]]) -> "HardwareProfile":
    """`profile` (parsed from `data`) with the changed values, built directly on the dataclasses (fast: the fit
    builds one per trial point). tests/test_calibrate_from_runs.py checks it against parsing the changed YAML."""
    from costmodels.hardware import CollectivePoint

    gemm = dict(profile.gemm_efficiency)
    links = dict(profile.links)
    collectives = {link: dict(kinds) for link, kinds in profile.collectives.items()}
    extra = {key: (dict(value) if isinstance(value, dict) else value) for key, value in profile.extra.items()}
    host = profile.host_costs
    for path, (before, after) in changes.items():
        parts = _parts(path)
        if parts[:2] == ["compute", "gemm_efficiency"]:
            gemm[parts[2]] = after
        elif parts[0] == "links" and parts[2] == "bandwidth_efficiency":
            spec = links[parts[1]]
            links[parts[1]] = dataclasses.replace(spec, bandwidth_bytes_per_s=spec.nominal_bandwidth_bytes_per_s * after)
        elif parts[0] == "collectives":
            link, kind, index = parts[1], parts[2], parts[3]
            stated = (data["collectives"][link][kind] or [])[index]
            points = list(collectives[link][kind])
            # the parser keeps the points sorted by group size: find this one by its stated values
            target = next(i for i, p in enumerate(points) if p.group_size == int(stated["group_size"])
                          and math.isclose(p.alpha_s, float(stated["alpha_us"]) * 1e-6, rel_tol=1e-9)
                          and math.isclose(p.bus_bandwidth_bytes_per_s, float(stated["busbw_gb_per_s"]) * 1e9,
                                           rel_tol=1e-9))
            points[target] = CollectivePoint(points[target].group_size, points[target].alpha_s, after * 1e9)
            collectives[link][kind] = tuple(points)
        elif parts[0] == "host" and len(parts) == 2:            # costmodels.host: µs in the YAML, s here
            host = dataclasses.replace(host, **{parts[1][:-len("_us")] + "_s": after * 1e-6})
        elif parts[0] in extra and isinstance(extra[parts[0]], dict) and len(parts) == 2:
            extra[parts[0]][parts[1]] = after
        else:
            raise AssertionError(f"profile path {path} has no field in HardwareProfile")
    return dataclasses.replace(profile, gemm_efficiency=gemm, links=links, collectives=collectives, extra=extra,
                               host_costs=host)


# ---- the fit -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParameterFit:
    parameter: FreeParameter
    scale: float
    information_ratio: float
    """The runs' information about log(scale) over the prior's: ≥ INFORMED_RATIO informed, < UNINFORMED_RATIO
    kept at the prior."""
    runs_exercising: int
    at_bound: bool = False
    rejected: bool = False
    """The whole fit was not adopted (RunsFit.adopted): the parameter keeps its prior value."""

    @property
    def status(self) -> str:
        if self.information_ratio < UNINFORMED_RATIO:
            return "kept (the runs do not inform it)"
        if self.rejected:
            return "kept (the fit did not predict left-out runs better than the bundled profile)"
        if self.information_ratio < INFORMED_RATIO:
            return "weakly informed (the prior dominates)"
        return "fitted" + (" (at its bound)" if self.at_bound else "")


@dataclass(frozen=True)
class RunResidual:
    run: "MeasuredRun"
    plan: "Plan"
    measured_s: float
    prior_s: float
    fitted_s: float
    leave_one_out_s: float

    def error(self, predicted: float) -> float:
        return predicted / self.measured_s - 1.0


@dataclass(frozen=True)
class RunsFit:
    base: "HardwareProfile"
    profile: "HardwareProfile"
    """The fitted profile (in memory)."""
    changes: Mapping[str, tuple[float, float]]
    """path -> (before, after) of every changed value."""
    parameters: tuple[ParameterFit, ...]
    skipped: tuple[str, ...]
    """Parameters of the table whose values the base profile does not have, with why."""
    residuals: tuple[RunResidual, ...]
    warnings: tuple[str, ...]
    elapsed_s: float
    model_evaluations: int
    adopted: bool = True
    """Whether the fit passed the validation rule: its leave-one-out RMS log error below the bundled profile's on
    the same runs. When not, `profile` is the base and every parameter is kept."""
    leave_one_out_check: tuple[float, float] = (0.0, 0.0)
    """(RMS log error of the fit's leave-one-out predictions, of the bundled profile's), the rule's two sides."""
    model_calls: int = 0
    """Vectorised cost-model calls the evaluations took (runs with the same inputs share one per profile)."""

    def rms(self, attribute: str) -> float:
        return float(np.sqrt(np.mean([r.error(getattr(r, attribute)) ** 2 for r in self.residuals])))

    def mape(self, attribute: str) -> float:
        return float(np.mean([abs(r.error(getattr(r, attribute))) for r in self.residuals]))


def default_jobs() -> int:
    """Worker processes for the model evaluations: the machine's CPUs, at most MAX_JOBS."""
    return max(1, min(MAX_JOBS, os.cpu_count() or 1))


DESCRIPTIVE_MODEL_FIELDS = ("name", "source")
"""ModelSpec fields the cost model does not read (they name the model in messages)."""


def same_inputs_groups(runs: Sequence["MeasuredRun"]) -> list[int]:
    """For each run, the index of the first run the cost model prices with the same inputs: the same model (its
    name aside), cluster shape and training (the profile aside: the fit substitutes its own). Such runs differ at
    most in their layouts, so one vectorised model call prices them all (costmodels.steptime is vectorised over
    plans; each plan's value does not depend on the others in the call)."""
    def inputs(run: "MeasuredRun") -> tuple:
        model = tuple(getattr(run.model, f.name) for f in dataclasses.fields(run.model)
                      if f.name not in DESCRIPTIVE_MODEL_FIELDS)
        cluster = run.cluster
        return model, run.training, (cluster.num_gpus, cluster.gpus_per_node, cluster.nvlink_domain)

    keys = [inputs(run) for run in runs]
    buckets: dict[str, list[int]] = {}
    out = []
    for i, key in enumerate(keys):
        candidates = buckets.setdefault(repr(key), [])          # repr buckets; == decides (repr may abbreviate)
        same = next((j for j in candidates if keys[j] == key), None)
        if same is None:
            candidates.append(i)
            same = i
        out.append(same)
    return out


def same_run_groups(runs: Sequence["MeasuredRun"], plans: Sequence["Plan"]) -> list[list[int]]:
    """Runs the cost model cannot tell apart (the same inputs and the same layout: re-measurements of one job, or
    jobs that differ only in what autopar does not read), grouped, in order of their first run."""
    shapes = same_inputs_groups(runs)
    groups: dict[tuple, list[int]] = {}
    for i, (shape, plan) in enumerate(zip(shapes, plans)):
        groups.setdefault((shape, plan), []).append(i)
    return list(groups.values())


def _price(task: tuple) -> list[list[float]]:
    """Step times of `task` = (runs, profiles, items): each item (run index, profile index, plans) prices those plans
    of that run's inputs on that profile in one vectorised call. Module-level so a worker process can run it
    (ProcessPoolExecutor pickles it with its arguments)."""
    from costmodels.plan import PlanArrays
    from costmodels.steptime import step_time_s

    runs, profiles, items = task
    out = []
    for run_index, profile_index, plans in items:
        run = runs[run_index]
        cluster = dataclasses.replace(run.cluster, profile=profiles[profile_index])
        out.append([float(t) for t in step_time_s(run.model, cluster, run.training, PlanArrays.from_plans(plans))])
    return out


class _Pricer:
    """Step times of the runs at their plans on trial profiles, in `jobs` processes; counts the evaluations (one per
    run and profile asked for) and the model calls (runs with the same inputs share one vectorised call per profile,
    `same_inputs_groups`)."""

    def __init__(self, runs: Sequence["MeasuredRun"], plans: Sequence["Plan"], jobs: int) -> None:
        self.runs = list(runs)
        self.plans = list(plans)
        self.jobs = jobs
        self.shapes = same_inputs_groups(self.runs)
        self.evaluations = 0
        self.calls = 0
        self._pool = None

    def step_times(self, requests: Sequence[tuple[int, "HardwareProfile"]]) -> np.ndarray:
        """[step time of run i on profile] for each (i, profile) request, in order."""
        self.evaluations += len(requests)
        profiles: list = []
        index_of: dict[int, int] = {}
        calls: dict[tuple[int, int], dict] = {}            # (shape, profile) -> {plan: position in the call}
        where = []
        for run_index, profile in requests:
            if id(profile) not in index_of:
                index_of[id(profile)] = len(profiles)
                profiles.append(_without_provenance(profile))
            call = (self.shapes[run_index], index_of[id(profile)])
            plans = calls.setdefault(call, {})
            plans.setdefault(self.plans[run_index], len(plans))
            where.append((call, plans[self.plans[run_index]]))
        items = [(shape, profile_index, list(plans)) for (shape, profile_index), plans in calls.items()]
        self.calls += len(items)
        values = dict(zip(calls, self._run(profiles, items)))
        return np.array([values[call][position] for call, position in where])

    def _run(self, profiles: list, items: list[tuple[int, int, list]]) -> list[list[float]]:
        """The items' step times, here or split over `jobs` processes (each task carries only its runs)."""
        if self.jobs <= 1 or len(items) < 2 * self.jobs:
            return _price((self.runs, profiles, items))
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        chunks = [list(range(c, len(items), self.jobs)) for c in range(self.jobs)]
        tasks = []
        for chunk in chunks:
            run_ids = sorted({items[k][0] for k in chunk})
            local = {run: position for position, run in enumerate(run_ids)}
            tasks.append(([self.runs[r] for r in run_ids], profiles,
                          [(local[items[k][0]], items[k][1], items[k][2]) for k in chunk]))
        if self._pool is None:             # started once per fit, on the first batch worth the processes
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=context)
        out: list = [None] * len(items)
        for chunk, values in zip(chunks, self._pool.map(_price, tasks)):
            for k, value in zip(chunk, values):
                out[k] = value
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _without_provenance(profile: "HardwareProfile") -> "HardwareProfile":
    """The profile as the model reads it: provenance and other text travel to the workers for nothing."""
    extra = {key: value for key, value in profile.extra.items() if key not in ("calibration", TEXT_SECTION)}
    return dataclasses.replace(profile, provenance={}, extra=extra)


def fit_profile_to_runs(runs: Sequence["MeasuredRun"], base: "HardwareProfile", base_data: Mapping[str, Any],
                        parameters: Sequence[FreeParameter] = FREE_PARAMETERS, jobs: int = 1,
                        validate: bool = True) -> RunsFit:
    """Fit the table's parameters to `runs` (all on `base`'s GPU); `base_data` is `base`'s YAML data; the model
    evaluations run in `jobs` processes (the result does not depend on it). With `validate` (always, but for a
    diagnosis of how far the scales can go in-sample: benchmarks/fit_runs.py) the fit is adopted only if it passes
    the validation rule (`RunsFit.adopted`)."""
    from autopar.runs import candidate_plans, choose_plan

    started = time.perf_counter()
    if not runs:
        raise InputError("from-runs", "no runs to fit")
    active, skipped = [], []
    for parameter in parameters:
        if resolved_paths(base_data, parameter):
            active.append(parameter)
        else:
            skipped.append(f"{parameter.name}: {', '.join(parameter.paths)} not in profile {base.name} (the model "
                           "does not read it from this profile)")
    plans: list = []
    chosen: dict[int, float] = {}
    for run in runs:
        candidates = candidate_plans(run)
        if not candidates:
            raise InputError("from-runs", f"{run.where}: no buildable layout matches what the run states")
        if len(candidates) == 1:                 # the run states its whole layout: priced below with the rest
            plans.append(candidates[0])
        else:                                    # knobs left open: the fastest layout that fits, at the prior
            choice = choose_plan(run, dataclasses.replace(run.cluster, profile=base))
            plans.append(choice.plan)
            chosen[len(plans) - 1] = choice.step_s       # its step time at the prior: the same value priced again
    pricer = _Pricer(runs, plans, jobs)
    try:
        return _fit(runs, base, base_data, active, skipped, plans, pricer, chosen, started, validate)
    finally:
        pricer.close()


def _fit(runs: Sequence["MeasuredRun"], base: "HardwareProfile", base_data: Mapping[str, Any],
         active: list[FreeParameter], skipped: list[str], plans: list, pricer: _Pricer, chosen: dict[int, float],
         started: float, validate: bool) -> RunsFit:
    """fit_profile_to_runs once the plans are chosen (`chosen`: the prior step times the choice already priced):
    the Jacobian, the rounds, the leave-one-out, the validation rule, the warnings."""
    from autopar.calibrate.fit import least_squares

    to_price = [i for i in range(len(runs)) if i not in chosen]
    priced = dict(zip(to_price, pricer.step_times([(i, base) for i in to_price])))
    prior_s = [chosen[i] if i in chosen else float(priced[i]) for i in range(len(runs))]
    measured = np.array([run.measured_step_s for run in runs])
    n, p = len(runs), len(active)
    exercised = np.array([[parameter.exercised(run) for parameter in active] for run in runs], dtype=bool)

    def profile_at(log_scales: np.ndarray) -> tuple["HardwareProfile", dict]:
        changes = scaled_values(base_data, {q.name: math.exp(v) for q, v in zip(active, log_scales)}, active)
        return apply_to_profile(base, base_data, changes), changes

    # the Jacobian of log(step) in the log scales at the prior, by forward differences
    anchor = np.zeros(p)
    log_t = np.log(np.array(prior_s))
    jacobian = np.zeros((n, p))
    trials = [profile_at(DIFFERENCE_STEP * np.eye(p)[j])[0] for j in range(p)]
    cells = [(int(i), j) for j in range(p) for i in np.flatnonzero(exercised[:, j])]
    stepped = pricer.step_times([(i, trials[j]) for i, j in cells])
    for (i, j), value in zip(cells, stepped):
        jacobian[i, j] = (math.log(value) - log_t[i]) / DIFFERENCE_STEP
    prior_jacobian = jacobian.copy()
    sigmas = np.array([q.prior_sigma for q in active])
    bounds_log = np.array([[math.log(q.bounds[0]), math.log(q.bounds[1])] for q in active])
    information = (prior_jacobian ** 2).sum(axis=0) / RUN_SIGMA ** 2 * sigmas ** 2
    keep = information >= UNINFORMED_RATIO

    fitted_columns = np.flatnonzero(keep)
    names = [active[j].name for j in fitted_columns]

    def solve(anchor: np.ndarray, log_t_anchor: np.ndarray, jacobian: np.ndarray) -> np.ndarray:
        """The minimiser of the linearised problem around `anchor` (log scales), in the table's bounds."""
        weight = RUN_SIGMA / sigmas[fitted_columns]
        rows = jacobian[:, fitted_columns]

        def predict(params: Mapping[str, float]) -> np.ndarray:
            theta = np.log(np.array([params[name] for name in names]))
            runs_part = np.exp(log_t_anchor + rows @ (theta - anchor[fitted_columns]))
            return np.concatenate([runs_part, np.exp(weight * theta)])

        observed = np.concatenate([measured, np.ones(len(names))])
        bounds = {name: (math.exp(bounds_log[j, 0]), math.exp(bounds_log[j, 1]))
                  for name, j in zip(names, fitted_columns)}
        guesses = [{name: math.exp(anchor[j]) for name, j in zip(names, fitted_columns)},
                   {name: 1.0 for name in names}]
        result = least_squares(predict, observed, guesses, bounds=bounds)
        theta = np.zeros(p)
        theta[fitted_columns] = np.log(np.array([result.params[name] for name in names]))
        return theta

    theta, theta_log_t = anchor, log_t
    best_cost = _cost(log_t, measured, theta, sigmas)
    for _ in range(OUTER_ITERATIONS if names else 0):
        candidate = solve(theta, theta_log_t, jacobian)
        promised = _cost(theta_log_t + jacobian @ (candidate - theta), measured, candidate, sigmas)
        if best_cost - promised <= CONVERGED * best_cost:
            break                           # the linearised model promises nothing worth a model evaluation
        trial, _ = profile_at(candidate)
        trial_log_t = np.log(pricer.step_times([(i, trial) for i in range(n)]))
        delta = candidate - theta
        # Broyden: each run's row absorbs what the model did along the step it was not predicted to do
        surprise = (trial_log_t - theta_log_t) - jacobian @ delta
        jacobian = jacobian + np.outer(surprise, delta) / float(delta @ delta)
        cost = _cost(trial_log_t, measured, candidate, sigmas)
        if cost >= best_cost:
            break
        converged = best_cost - cost <= CONVERGED * best_cost
        theta, theta_log_t, best_cost = candidate, trial_log_t, cost
        if converged:
            break
    fitted_s = np.exp(theta_log_t)
    loo_s = _leave_one_out(theta, theta_log_t, jacobian, measured, sigmas, keep,
                           same_run_groups(runs, plans))
    warnings = separation_warnings(prior_jacobian, active, information)

    # the validation rule: the fit is adopted only if it predicts the runs it was not fitted to better than the
    # bundled profile (which saw none of them) does
    check = (_rms_log_error(loo_s, measured), _rms_log_error(np.array(prior_s), measured))
    adopted = bool(check[0] < check[1]) if names and validate else True
    if not adopted:
        warnings.insert(0, f"the fit is not adopted: it predicts each run from the others (leave-one-out) with an "
                           f"RMS error of {check[0]:.1%}, no better than the bundled profile's {check[1]:.1%}, so the "
                           "bundled values are kept: what the scales learn from some runs does not carry over to the "
                           "rest (see the residuals per run)")
        theta, fitted_s, loo_s = anchor, np.array(prior_s), np.array(prior_s)
    fitted_profile, changes = profile_at(theta) if adopted else (base, {})

    fits = tuple(ParameterFit(q, math.exp(theta[j]), float(information[j]), int(exercised[:, j].sum()),
                              bool(adopted and keep[j] and (theta[j] <= bounds_log[j, 0] + 1e-6 or
                                                            theta[j] >= bounds_log[j, 1] - 1e-6)),
                              rejected=not adopted)
                 for j, q in enumerate(active))
    residuals = tuple(RunResidual(run, plan, float(m), float(b), float(f), float(l))
                      for run, plan, m, b, f, l in zip(runs, plans, measured, prior_s, fitted_s, loo_s))
    return RunsFit(base=base, profile=fitted_profile, changes=changes, parameters=fits, skipped=tuple(skipped),
                   residuals=residuals, warnings=tuple(warnings), elapsed_s=time.perf_counter() - started,
                   model_evaluations=pricer.evaluations + len(chosen), adopted=adopted,
                   leave_one_out_check=check, model_calls=pricer.calls)


def _rms_log_error(predicted_s: np.ndarray, measured_s: np.ndarray) -> float:
    """Root-mean-square of log(predicted / measured): the fit's own measure of error (its objective's)."""
    return float(np.sqrt(np.mean(np.log(predicted_s / measured_s) ** 2)))


def _cost(log_t: np.ndarray, measured: np.ndarray, theta: np.ndarray, sigmas: np.ndarray) -> float:
    """The objective: squared run residuals over RUN_SIGMA² plus the prior's."""
    residual = (log_t - np.log(measured)) / RUN_SIGMA
    return float(residual @ residual + ((theta / sigmas) ** 2).sum())


def _leave_one_out(theta: np.ndarray, log_t: np.ndarray, jacobian: np.ndarray, measured: np.ndarray,
                   sigmas: np.ndarray, keep: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Each run's step time predicted by the fit made without it — and without the runs the model cannot tell
    from it (`same_run_groups`: a re-measurement left in would predict it) — from the fit linearised at the fitted
    profile: the PRESS residuals (Allen 1974, Technometrics 16(1)) of the ridge problem with normal matrix
    M = JᵀJ + Λ, by groups: removing the rows G moves the log scales by M⁻¹J_Gᵀ(I − H_GG)⁻¹r_G (Woodbury), so
    their residuals become (I − H_GG)⁻¹r_G, H = JM⁻¹Jᵀ the hat matrix (for one run rᵢ/(1 − hᵢ)). Exact for the
    linearised model; no model evaluation."""
    columns = np.flatnonzero(keep)
    if columns.size == 0:
        return np.exp(log_t)
    j = jacobian[:, columns] / RUN_SIGMA
    inverse = np.linalg.inv(j.T @ j + np.diag(1.0 / sigmas[columns] ** 2))
    residual = log_t - np.log(measured)
    left_out = np.empty_like(residual)
    for group in groups:
        rows = j[list(group)]
        hat = rows @ inverse @ rows.T
        left_out[list(group)] = np.linalg.lstsq(np.eye(len(group)) - hat, residual[list(group)], rcond=None)[0]
    return measured * np.exp(left_out)


def separation_warnings(jacobian: np.ndarray, parameters: Sequence[FreeParameter],
                        information: np.ndarray) -> list[str]:
    """Warnings for parameters the runs cannot tell apart: from the data-only information matrix F = JᵀJ of the
    informed parameters, scaled to unit diagonal; the estimates' covariance is F⁻¹ (pseudo-inverse where F is
    singular), their correlation (F⁻¹)ⱼₖ/√((F⁻¹)ⱼⱼ(F⁻¹)ₖₖ): ±1 when the runs move only a combination of the two."""
    informed = np.flatnonzero(information >= INFORMED_RATIO)
    if informed.size < 2:
        return []
    j = jacobian[:, informed]
    normal = j.T @ j
    scale = np.sqrt(np.diag(normal))
    scaled = normal / np.outer(scale, scale)
    eigenvalues, eigenvectors = np.linalg.eigh(scaled)
    condition = eigenvalues[-1] / max(eigenvalues[0], 1e-300)
    names = [parameters[k].name for k in informed]
    warnings = []
    inverse = np.linalg.pinv(scaled)
    for a in range(len(informed)):
        for b in range(a + 1, len(informed)):
            denominator = math.sqrt(max(inverse[a, a] * inverse[b, b], 1e-300))
            correlation = inverse[a, b] / denominator
            if abs(correlation) >= CORRELATION_WARNING or not math.isfinite(correlation):
                warnings.append(f"the runs cannot separate {names[a]} and {names[b]}: their effects on the step "
                                f"times are collinear (correlation of the estimates {correlation:+.2f}); their split "
                                "follows the prior (the microbenchmark values) — add runs that vary what tells them "
                                "apart (e.g. other tp, micro-batch or sequence length)")
    if condition >= CONDITION_WARNING and not warnings:
        weakest = eigenvectors[:, 0]
        involved = [names[k] for k in np.argsort(-np.abs(weakest)) if abs(weakest[k]) >= 0.3]
        warnings.append(f"the runs barely constrain the combination of {', '.join(involved)} (condition number "
                        f"{condition:.3g}); that combination follows the prior")
    return warnings
