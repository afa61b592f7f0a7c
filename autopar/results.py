"""What autopar answers with: an `Estimate` for one plan, a `ParetoFront` of estimates.

Both are plain frozen data in base units (bytes, seconds); `to_dict()` gives the JSON-ready form that every report
format and the CLI's `--json` share. Built by `autopar.estimate` (one plan) and `autopar.solve` (the front).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from costmodels.plan import DEFAULT_RECOMPUTE_MODULES, Plan, Recompute, RecomputeModule
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

GIB = 1024**3

SCHEMA_VERSION = 1
"""Version of the JSON documents autopar writes (`--json`, `--out x.json`; autopar/schemas/front.schema.json)."""


def generator() -> dict[str, str]:
    """Who wrote a JSON document: {'name': 'autopar', 'version': ...}."""
    from importlib import metadata  # slow to import: only when a document is written

    try:
        version = metadata.version("autopar")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"name": "autopar", "version": version}


def whole_number(value: float) -> "int | float":
    """An integral count as an int (JSON '512', not '512.0'); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def whole_bytes(value: float) -> "int | float":
    """Bytes rounded to a whole byte, as an int; non-finite values unchanged (reports turn them into null)."""
    return int(round(value)) if math.isfinite(value) else value


@dataclass(frozen=True)
class StageMemory:
    """Memory of one GPU on one pipeline rank, by named term (they sum to total_bytes)."""

    stage: int
    layers: float
    """Decoder layers on this rank."""
    terms_bytes: dict[str, float]

    @property
    def total_bytes(self) -> float:
        return sum(self.terms_bytes.values())

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "layers": whole_number(float(self.layers)),
                "total_bytes": whole_bytes(self.total_bytes),
                "terms_bytes": {term: whole_bytes(value) for term, value in self.terms_bytes.items()}}


def recompute_module_names(plan: Plan) -> list[str]:
    """The modules selective recompute re-runs (Megatron-Core --recompute-modules); [] without selective."""
    if plan.recompute is not Recompute.SELECTIVE:
        return []
    return RecomputeModule.names(plan.recompute_modules or DEFAULT_RECOMPUTE_MODULES)


def plan_to_dict(plan: Plan, num_gpus: int) -> dict[str, Any]:
    """A plan with its derived sizes, in DESIGN.md §1 names."""
    return {"tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "cp": plan.cp, "ep": plan.ep, "etp": plan.etp,
            "dp": plan.dp(num_gpus), "edp": plan.edp(num_gpus), "mbs": plan.mbs, "sp": plan.sp,
            "recompute": plan.recompute.label, "recompute_layers": plan.recompute_layers,
            "recompute_modules": recompute_module_names(plan), "zero": plan.zero,
            "first_stage_layers": plan.first_stage_layers, "last_stage_layers": plan.last_stage_layers}


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one plan: memory per stage, step time by term, throughput, rule violations."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    plan: Plan
    num_microbatches: float
    stages: tuple[StageMemory, ...]
    """Every pipeline rank, in order."""
    worst_stage: int
    time_terms_s: dict[str, float]
    """Named step-time terms; they sum to step_time_s."""
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    violations: tuple[str, ...] = ()
    """Names of the rules this plan breaks (memory included); empty when feasible."""

    @property
    def dp(self) -> int:
        return self.plan.dp(self.cluster.num_gpus)

    @property
    def peak_memory_bytes(self) -> float:
        return self.stages[self.worst_stage].total_bytes

    @property
    def memory_limit_bytes(self) -> float:
        return self.cluster.memory_limit_bytes

    @property
    def step_time_s(self) -> float:
        return sum(self.time_terms_s.values())

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_limit_bytes

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": plan_to_dict(self.plan, self.cluster.num_gpus),
            "num_gpus": self.cluster.num_gpus,
            "label": self.plan.short(),
            "num_microbatches": whole_number(float(self.num_microbatches)),
            "peak_memory_bytes": whole_bytes(self.peak_memory_bytes),
            "memory_limit_bytes": whole_bytes(self.memory_limit_bytes),
            "fits": self.fits,
            "worst_stage": self.worst_stage,
            "stages": [s.to_dict() for s in self.stages],
            "step_time_s": self.step_time_s,
            "time_terms_s": dict(self.time_terms_s),
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "violations": list(self.violations),
        }


@dataclass(frozen=True)
class ParetoFront:
    """Feasible plans that no other feasible plan beats on every objective, fastest first."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    points: tuple[Estimate, ...]
    proven_optimal: bool
    """False when a time limit stopped the search before the front was proven complete."""
    rules: tuple[str, ...]
    """Names of the rules that were enforced."""
    relaxed_rules: tuple[str, ...] = ()
    solver: str = "cpsat"
    solve_time_s: float = 0.0
    search_space_size: int = 0
    notes: tuple[str, ...] = field(default=())

    def __iter__(self) -> Iterator[Estimate]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    def __getitem__(self, index: int) -> Estimate:
        return self.points[index]

    def to_dict(self) -> dict[str, Any]:
        from autopar.describe import describe_inputs  # inputs/assumptions block shared by all reports

        return {
            "schema_version": SCHEMA_VERSION,
            "generator": generator(),
            "inputs": describe_inputs(self.model, self.cluster, self.training),
            "solver": {"name": self.solver, "proven_optimal": self.proven_optimal,
                       "solve_time_s": self.solve_time_s, "search_space_size": self.search_space_size},
            "rules": list(self.rules),
            "relaxed_rules": list(self.relaxed_rules),
            "notes": list(self.notes),
            "points": [p.to_dict() for p in self.points],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)
