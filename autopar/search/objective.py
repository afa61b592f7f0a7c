"""The integer objectives both solvers rank plans by, built from the cost model's named terms.

The cost model (costmodels.memory, costmodels.steptime) gives every term as its own vectorised function and
declares the plan knobs each depends on (`TERM_KNOBS`). Terms with nested knob sets are summed into *groups*, one
integer table per group in the CP-SAT model; the oracle rounds the very same groups, so both solvers rank plans by
identical integers:

- memory_units = max over the candidate worst pipeline ranks (costmodels.memory.candidate_worst_stages) of
  Σ_groups ceil(group bytes / 1 MiB); rounded up, so a plan that fits in units fits in bytes.
- time_units = F · Σ_{pipelined groups} round(group s / 1 µs) + S · Σ_{other groups} round(group s / 1 µs), in units
  of 1 µs / S with S = 2^16, where the pipelined groups hold the per-step compute, tp_comm, cp_comm and ep_comm
  terms and F = round(S · (1 + bubble / m)) is the pipeline factor: under 1F1B costmodels.steptime states
  pp_bubble = bubble_microbatch_equivalents(pp, vpp) × (compute + tp_comm + cp_comm + ep_comm) / m, so
  step time = (1 + bubble/m) · Σ pipelined + Σ others; the CP-SAT model forms that product of two variables instead
  of tabulating pp_bubble over all its knobs. Under a zero-bubble schedule (costmodels.pipeline.bubble_is_proportional
  False), and under --overlap-moe-expert-parallel-comm for an MoE model (the bubble's unpaired chunks keep the
  whole all-to-all that ep_comm discounts), pp_bubble is an ordinary group like the others, F = S and there are no
  pipelined groups.

Tolerance (what "equal within rounding" means): a group is off by at most 0.5 µs (time) or 1 MiB (memory), the
pipeline factor by 2^-17 relative, so |time_units·1µs/S − step_time_s| <= n_groups·0.5 µs·(1 + bubble/m) +
2^-17 × step time, and 0 <= memory_units·1 MiB − peak bytes < n_groups MiB. Every number shown to users comes
from the float model (costmodels.evaluate); the integers only decide the front and its order.

No silent overflow (int64): every conversion goes through float64 and saturates at a named cap instead of wrapping.
- A memory group saturates at MEMORY_GROUP_UNITS_MAX (1 EiB), far above any GPU's memory (the profile's HBM is
  bounded by costmodels.limits.MAX_HBM_GIB), so a saturated plan never fits: "fits" in units implies fits in bytes,
  exactly as the float model (autopar.estimate) decides it.
- A time group saturates at TIME_GROUP_UNITS_MAX µs (about 2.2 years) and a plan's total at TIME_UNITS_MAX; plans past
  it rank as ties (autopar.search.solve notes when a front point's step time is beyond `TIME_RANKING_LIMIT_S`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from dataclasses import dataclass

import numpy as np

from costmodels import memory, pipeline, steptime
from costmodels.plan import PLAN_FIELDS, PlanArrays, num_microbatches
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec
from costmodels.structure import STRUCTURE_FIELDS, per_knobs, per_structure

TIME_UNIT_S = 1e-6
PIPELINE_FACTOR_SCALE = 2**16
MEMORY_UNIT_BYTES = 2**20

MEMORY_GROUP_UNITS_MAX = 2**40
"""1 EiB in MiB units: a group past it is stored as this (and the plan cannot fit any GPU)."""
TIME_GROUP_UNITS_MAX = 2**46
"""About 2.2 years in µs: a time group past it is stored as this."""
TIME_UNITS_MAX = 2**62
"""A plan's total time units saturate here (int64 holds 2^63 - 1)."""
PIPELINE_FACTOR_MAX = 2**40
"""The pipeline factor saturates here (S · (1 + bubble/m) with bubble/m up to the layer count is far below)."""
TIME_RANKING_LIMIT_S = min(TIME_GROUP_UNITS_MAX * TIME_UNIT_S, TIME_UNITS_MAX * TIME_UNIT_S / (2 * 2**16))
"""Step times below this are ranked exactly (within the tolerance above); longer ones may rank as ties."""

BUBBLE_TERM = "pp_bubble"
PIPELINED_TERMS = ("compute", "tp_comm", "cp_comm", "ep_comm", "host")
"""The terms pp_bubble scales (costmodels.steptime.TERM_KNOBS docstring)."""
PIPELINE_FACTOR_KNOBS = ("tp", "cp", "pp", "vpp", "mbs")
"""bubble_microbatch_equivalents reads (pp, vpp); num_microbatches reads (tp, cp, pp, mbs)."""

SPLIT_KNOBS = ("pp", "first_stage_layers", "last_stage_layers")

DEFERRED_TERM = "host"
"""The pipelined term `time_bound_units` leaves out (the host timeline, the costliest to price) and
`time_units_finish` prices for the plans a search keeps."""


@dataclass(frozen=True)
class TermGroup:
    """Terms summed before rounding; `knobs` is the union of their knob sets (Plan field order)."""

    knobs: tuple[str, ...]
    terms: tuple[str, ...]


@dataclass(frozen=True)
class ObjectiveStructure:
    pipelined_time_groups: tuple[TermGroup, ...]
    other_time_groups: tuple[TermGroup, ...]
    factored: bool
    """True when pp_bubble is formed as (pipeline factor − 1) × Σ pipelined (else it is an ordinary term: the
    zero-bubble schedules, and the MoE all-to-all overlap, whose bubble takes the undiscounted all-to-all)."""
    stage_memory_groups: tuple[TermGroup, ...]
    """Terms that differ between pipeline ranks (evaluated on each candidate worst rank)."""
    shared_memory_groups: tuple[TermGroup, ...]
    """Terms equal on every rank (including the fixed overheads, knobs ())."""


def ordered(knobs: Iterable[str]) -> tuple[str, ...]:
    wanted = set(knobs)
    return tuple(k for k in PLAN_FIELDS if k in wanted)


def group_terms(term_knobs: Mapping[str, tuple[str, ...]]) -> tuple[TermGroup, ...]:
    """Each term joins the largest group whose knob set contains its own (deterministic: by size, then name)."""
    sets = sorted({ordered(k) for k in term_knobs.values()}, key=lambda s: (-len(s), s))
    members: dict[tuple[str, ...], list[str]] = {}
    for term, knobs in term_knobs.items():
        mine = set(knobs)
        home = next(s for s in sets if mine <= set(s))
        members.setdefault(home, []).append(term)
    return tuple(TermGroup(knobs=s, terms=tuple(members[s])) for s in sets if s in members)


def _probe_plan() -> PlanArrays:
    return PlanArrays.from_columns(tp=np.ones(1, dtype=np.int64))


def objective_structure(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> ObjectiveStructure:
    """Group the cost model's terms (names as the term functions return them for this model and cluster)."""
    probe = _probe_plan()
    with np.errstate(all="ignore"):
        time_names = tuple(steptime.step_time_terms_s(model, cluster, training, probe))
        memory_names = tuple(memory.memory_terms_bytes(model, cluster, training, probe, 0))
    time_knobs = {name: tuple(steptime.TERM_KNOBS.get(name, PLAN_FIELDS)) for name in time_names}
    # the bubble is (p-1)/v x the worst stage's micro-batch time with its whole EP all-to-all (the warmup and cooldown
    # chunks run unpaired), while under --overlap-moe-expert-parallel-comm the ep_comm term carries the overlap's
    # discount: Σ pipelined / m no longer gives the bubble's micro-batch time, so the bubble is a term of its own
    ep_overlap = training.moe_a2a_overlap and model.is_moe
    factored = BUBBLE_TERM in time_knobs and all(t in time_knobs for t in PIPELINED_TERMS) \
        and pipeline.bubble_is_proportional(training) and not ep_overlap
    if factored:
        del time_knobs[BUBBLE_TERM]
    pipelined = {t: k for t, k in time_knobs.items() if factored and t in PIPELINED_TERMS}
    others = {t: k for t, k in time_knobs.items() if t not in pipelined}

    stage_terms, shared_terms, widened_terms = {}, {}, {}
    for name in memory_names:
        knobs = tuple(memory.term_knobs(name, training))
        if name in getattr(memory, "STAGE_INDEPENDENT_TERMS", frozenset()) or not knobs:
            shared_terms[name] = knobs
        elif knobs != tuple(memory.term_knobs(name)):
            # the gradients of an engine that frees them read nearly every knob (memory.term_knobs): a group of
            # their own, so the terms of few knobs keep their small groups (and the structure bound its weights)
            widened_terms[name] = knobs
        else:
            stage_terms[name] = knobs
    return ObjectiveStructure(
        pipelined_time_groups=group_terms(pipelined) if pipelined else (),
        other_time_groups=group_terms(others) if others else (),
        factored=factored,
        stage_memory_groups=(group_terms(stage_terms) if stage_terms else ())
        + (group_terms(widened_terms) if widened_terms else ()),
        shared_memory_groups=group_terms(shared_terms) if shared_terms else (),
    )


# ---- rounding (shared by the oracle and the CP-SAT tables) ---------------------------------------------------

def saturating_int64(values: np.ndarray, cap: int) -> np.ndarray:
    """float64 -> int64; values above `cap`, +inf and NaN (a term the model cannot evaluate) are stored as `cap`, so
    such a plan never fits and never ranks ahead of a real one."""
    values = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        clipped = np.where(np.isnan(values) | (values > cap), float(cap), values)
    return clipped.astype(np.int64)


def time_group_units(terms: Mapping[str, np.ndarray], group: TermGroup) -> np.ndarray:
    seconds = sum(np.asarray(terms[t], dtype=float) for t in group.terms)
    return saturating_int64(np.rint(seconds / TIME_UNIT_S), TIME_GROUP_UNITS_MAX)


def memory_group_units(terms: Mapping[str, np.ndarray], group: TermGroup) -> np.ndarray:
    total = sum(np.asarray(terms[t], dtype=float) for t in group.terms)
    return saturating_int64(np.ceil(total / MEMORY_UNIT_BYTES), MEMORY_GROUP_UNITS_MAX)


def pipeline_factor_units(cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """round(S · (1 + bubble_microbatch_equivalents / num_microbatches))."""
    bubble = pipeline.bubble_microbatch_equivalents(plans)
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    return saturating_int64(np.rint(PIPELINE_FACTOR_SCALE * (1.0 + bubble / microbatches)), PIPELINE_FACTOR_MAX)


def memory_stage_roles(model: ModelSpec, plans: PlanArrays, num_roles: int) -> list[np.ndarray]:
    """The candidate worst ranks as `num_roles` fixed roles: role 0 is rank 0, the last role rank pp-1, role j in
    between is candidate_worst_stages' j-th rank (rank 0 where a plan has fewer candidates)."""
    candidates = memory.candidate_worst_stages(model, plans)
    middle = candidates[1:-1]
    roles = [candidates[0]]
    for j in range(1, num_roles - 1):
        roles.append(middle[j - 1] if j - 1 < len(middle) else np.zeros(len(plans), dtype=np.int64))
    roles.append(candidates[-1])
    return roles


def time_units(structure: ObjectiveStructure, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
               terms: Mapping[str, np.ndarray]) -> np.ndarray:
    others = sum((time_group_units(terms, g) for g in structure.other_time_groups), np.zeros(len(plans), np.int64))
    if structure.factored:
        pipelined = sum((time_group_units(terms, g) for g in structure.pipelined_time_groups),
                        np.zeros(len(plans), np.int64))
        factor = pipeline_factor_units(cluster, training, plans)
    else:
        pipelined = factor = np.zeros(len(plans), np.int64)
    return combined_time_units(factor, pipelined, others)


def combined_time_units(factor: np.ndarray, pipelined: np.ndarray, others: np.ndarray) -> np.ndarray:
    """F · Σ pipelined + S · Σ others, saturating at TIME_UNITS_MAX. Non-decreasing in each argument (all >= 0)."""
    scale = PIPELINE_FACTOR_SCALE
    # The product can pass int64: decide in float64 which plans saturate, compute the others exactly in int64.
    as_float = factor.astype(float) * pipelined.astype(float) + float(scale) * others.astype(float)
    over = ~(as_float < TIME_UNITS_MAX)
    with np.errstate(over="ignore"):
        exact = np.where(over, 0, factor) * np.where(over, 0, pipelined) + scale * np.where(over, 0, others)
    return np.where(over, TIME_UNITS_MAX, exact)


def memory_units(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 plans: PlanArrays, only_knobs: set[str] | None = None) -> np.ndarray:
    """Peak memory in MiB units. With `only_knobs`, only the groups whose knobs lie within it are counted: a lower
    bound on the full value (every memory term is >= 0), used by the oracle to skip plans that cannot fit."""
    def counted(groups):
        return [g for g in groups if only_knobs is None or set(g.knobs) <= only_knobs]

    stage_groups, shared_groups = counted(structure.stage_memory_groups), counted(structure.shared_memory_groups)
    names = {t for g in stage_groups + shared_groups for t in g.terms}
    candidates = memory.candidate_worst_stages(model, plans)
    best = None
    shared = None
    for stage in candidates:
        terms = memory.memory_terms_bytes(model, cluster, training, plans, stage, only=names)
        if shared is None:
            shared = sum((memory_group_units(terms, g) for g in shared_groups), np.zeros(len(plans), np.int64))
        per_stage = sum((memory_group_units(terms, g) for g in stage_groups), np.zeros(len(plans), np.int64))
        best = per_stage if best is None else np.maximum(best, per_stage)
    return best + shared


# ---- group by group, each group once per distinct value of its knobs (the oracle) -------------------------------

STAGE_KNOBS = ("pp", "first_stage_layers", "last_stage_layers")
"""What the candidate ranks (costmodels.memory.candidate_worst_stages, costmodels.steptime.candidate_stages) read."""


ROW_BLOCK = 8192
"""Plans priced at once by `in_row_blocks`: the step-time terms run a few thousand array operations per call (the
host timeline most), and at 8192 float64 rows an array (64 KiB) stays in cache and below the allocator's mmap
threshold, where each operation costs about half as much per row as at 20,000 rows (measured on this project's
machine)."""


def in_row_blocks(plans: PlanArrays, price: "Callable[[PlanArrays], Any]") -> Any:
    """`price(plans)` (an array, or a tuple of arrays, per plan), computed on blocks of at most ROW_BLOCK plans and
    joined: the same values, row by row."""
    if len(plans) <= ROW_BLOCK:
        return price(plans)
    blocks = [price(plans.take(slice(start, start + ROW_BLOCK))) for start in range(0, len(plans), ROW_BLOCK)]
    if isinstance(blocks[0], tuple):
        return tuple(np.concatenate(parts) for parts in zip(*blocks))
    return np.concatenate(blocks)


def group_units_sum(terms: Mapping[str, np.ndarray], groups: "tuple[TermGroup, ...]", n: int) -> np.ndarray:
    """Σ time_group_units over `groups`; a term `terms` leaves out counts 0."""
    zero = np.zeros(n)
    return sum((time_group_units({t: terms.get(t, zero) for t in g.terms}, g) for g in groups),
               np.zeros(n, np.int64))


@dataclass(frozen=True)
class TimeBound:
    """A lower bound on time_units, from the pipelined groups priced without the deferred term (the host timeline,
    the costliest to price) and the other groups at their floor (`other_floor_units`): rint is monotone and every
    term >= 0, so the units of the groups that hold the deferred term, priced without it, are a lower bound, and so
    is F · Σ pipelined + S · the floor (combined_time_units is non-decreasing in each). `time_units_finish` prices
    the rest for the plans a search keeps."""

    units: np.ndarray
    """The lower bound on each plan's time_units."""
    rest_units: np.ndarray
    """Σ units of the pipelined groups without the deferred term (exact)."""
    deferred_low_units: np.ndarray
    """Σ units of the pipelined groups that hold the deferred term, priced without it (a lower bound)."""
    factor: np.ndarray
    """The pipeline factor F (pipeline_factor_units)."""

    def take(self, rows: np.ndarray) -> "TimeBound":
        return TimeBound(self.units[rows], self.rest_units[rows], self.deferred_low_units[rows], self.factor[rows])

    @staticmethod
    def concatenate(bounds: "list[TimeBound]") -> "TimeBound":
        return TimeBound(*(np.concatenate([getattr(b, name) for b in bounds])
                           for name in ("units", "rest_units", "deferred_low_units", "factor")))


def _pipelined_knobs(names: "Iterable[str]") -> tuple[str, ...]:
    """The knobs the named step-time terms read, and those that choose the candidate stages: the plans differing
    only in other knobs share their values (costmodels.structure.per_knobs)."""
    return ordered({k for t in names for k in steptime.TERM_KNOBS.get(t, PLAN_FIELDS)} | set(STAGE_KNOBS))


def _deferred_groups(structure: ObjectiveStructure) -> "tuple[TermGroup, ...]":
    return tuple(g for g in structure.pipelined_time_groups if DEFERRED_TERM in g.terms)


def time_bound_units(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec,
                     training: TrainingSpec, plans: PlanArrays) -> TimeBound:
    """The lower bound `TimeBound` of every plan: the pipelined groups (per-stage compute and the TP/CP/EP
    collectives, every knob but zero) without the deferred term, once per distinct combination of the knobs they
    read when `plans` carries a structure index (costmodels.structure), times the pipeline factor, plus the other
    groups' floor (`other_floor_units`). Under a schedule with no pipeline factor (zero-bubble: every group is an
    `other` group) the floor alone."""
    zeros = np.zeros(len(plans), np.int64)
    floor_units = other_floor_units(structure, model, cluster, training, plans)
    if not structure.factored:
        return TimeBound(combined_time_units(zeros, zeros, floor_units), zeros, zeros, zeros)
    deferred = _deferred_groups(structure)
    rest = tuple(g for g in structure.pipelined_time_groups if g not in deferred)
    bound_names = tuple(t for g in structure.pipelined_time_groups for t in g.terms if t != DEFERRED_TERM)

    def bound_units(sub: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
        terms = steptime.step_time_terms_s(model, cluster, training, sub, only=bound_names)
        return group_units_sum(terms, rest, len(sub)), group_units_sum(terms, deferred, len(sub))

    rest_units, deferred_low = per_knobs(plans, _pipelined_knobs(bound_names),
                                         lambda sub: in_row_blocks(sub, bound_units))
    factor = pipeline_factor_units(cluster, training, plans)
    return TimeBound(combined_time_units(factor, rest_units + deferred_low, floor_units), rest_units, deferred_low,
                     factor)


def other_floor_units(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec,
                      training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """A lower bound on Σ units of the other groups: the gradient sync at its floor (costmodels.steptime.
    dp_comm_floor_s, without the micro-batch compute it overlaps), every other term at 0 (the p2p transfers and the
    optimizer step: milliseconds beside a gradient sync that can take seconds)."""
    if not any("dp_comm" in g.terms for g in structure.other_time_groups):
        return np.zeros(len(plans), np.int64)
    return per_knobs(plans, FLOOR_KNOBS, lambda sub: group_units_sum(
        {"dp_comm": steptime.dp_comm_floor_s(model, cluster, training, sub)}, structure.other_time_groups,
        len(sub)))


FLOOR_KNOBS = ordered(set(steptime.TERM_KNOBS["optimizer"]) | {"mbs"})
"""What `other_floor_units` reads: the structure knobs (the optimizer's, with the candidate stages: pp and the split)
and the micro-batch count (tp, cp, pp, mbs) that dp_comm_floor_s reads."""


def time_units_finish(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec,
                      training: TrainingSpec, plans: PlanArrays, bound: TimeBound) -> np.ndarray:
    """The time_units of `plans` (the same integers as `time_units` on the full terms), given their `bound`: the
    pipelined groups that hold the deferred term, priced whole, and the other groups (gradient sync, p2p,
    optimizer)."""
    pipelined = bound.rest_units + bound.deferred_low_units
    deferred = _deferred_groups(structure) if structure.factored else ()
    if deferred and len(plans):
        names = tuple(t for g in deferred for t in g.terms)
        pipelined = bound.rest_units + per_knobs(plans, _pipelined_knobs(names), lambda sub: in_row_blocks(
            sub, lambda block: group_units_sum(steptime.step_time_terms_s(model, cluster, training, block,
                                                                          only=names), deferred, len(block))))
    others = np.zeros(len(plans), np.int64)
    names = tuple(t for g in structure.other_time_groups for t in g.terms)
    if names and len(plans):
        terms = steptime.step_time_terms_s(model, cluster, training, plans, only=names)
        others = sum((time_group_units(terms, g) for g in structure.other_time_groups), others)
    return combined_time_units(bound.factor, pipelined, others)


def memory_units_by_group(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec,
                          training: TrainingSpec, plans: PlanArrays, within: "set[str] | None" = None) -> np.ndarray:
    """memory_units, each group evaluated once per structure (groups of structure knobs alone) or once per distinct
    value of its knobs on every candidate rank at once (costmodels.structure); the same integers as
    `memory_units`. With `within`, only the groups that read only those knobs, each once per distinct value of its
    knobs (the same integers as memory_units(only_knobs=within)): the oracle's pass over the structures, whose base
    is the structures themselves, and where most groups read a few of them (the weights: tp, pp, cp, zero and the
    split, not vpp, ep or etp)."""
    candidates = memory.candidate_worst_stages(model, plans)

    def evaluate(sub: PlanArrays, group: TermGroup, stage) -> np.ndarray:
        return memory_group_units(memory.memory_terms_bytes(model, cluster, training, sub, stage, only=group.terms),
                                  group)

    def group_units(group: TermGroup, ranks: int) -> list[np.ndarray]:
        """The group's units on the first `ranks` candidate ranks."""
        if within is None and set(group.knobs) <= set(STRUCTURE_FIELDS):
            key = ("memory_group_units", id(model), id(cluster), id(training), group.terms)
            knobs = ordered(set(group.knobs) | set(STAGE_KNOBS))
            return [per_structure(plans, key, lambda p, s: evaluate(p, group, s), stage, knobs=knobs)
                    for stage in candidates[:ranks]]
        # the candidate ranks read only STAGE_KNOBS, which the dedup keeps: `sub` has as many of them as `plans`
        return per_knobs(plans, ordered(set(group.knobs) | set(STAGE_KNOBS)),
                         lambda sub: [evaluate(sub, group, stage)
                                      for stage in memory.candidate_worst_stages(model, sub)[:ranks]])

    def counted(groups: "tuple[TermGroup, ...]") -> "list[TermGroup]":
        return [g for g in groups if within is None or set(g.knobs) <= within]

    shared = sum((group_units(g, 1)[0] for g in counted(structure.shared_memory_groups)),
                 np.zeros(len(plans), np.int64))
    per_stage = [group_units(g, len(candidates)) for g in counted(structure.stage_memory_groups)]
    best = np.zeros(len(plans), np.int64)      # every group's units are >= 0
    for j in range(len(candidates)):
        best = np.maximum(best, sum((units[j] for units in per_stage), np.zeros(len(plans), np.int64)))
    return best + shared


def objectives(structure: ObjectiveStructure, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               plans: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(time_units, memory_units) of every plan."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        terms = steptime.step_time_terms_s(model, cluster, training, plans)
        return (time_units(structure, cluster, training, plans, terms),
                memory_units(structure, model, cluster, training, plans))


def memory_limit_units(memory_limit_bytes: float) -> int:
    """Largest whole number of MiB that fits under the limit."""
    return int(np.floor(memory_limit_bytes / MEMORY_UNIT_BYTES))


def time_units_to_s(units: np.ndarray | int) -> np.ndarray:
    return np.asarray(units, dtype=float) * TIME_UNIT_S / PIPELINE_FACTOR_SCALE
