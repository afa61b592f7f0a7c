"""The report document: `ParetoFront.to_dict()` plus what a reader needs to trust and reuse it.

Every report format (JSON, CSV, Markdown, HTML) renders this one dict, so they never disagree. Its JSON form is
described by the JSON Schema autopar/schemas/front.schema.json (`autopar.results.SCHEMA_VERSION`; bump it when a
field changes meaning or disappears, and say so in the schema's description). Added on top of `to_dict()`:

- `schema_version`, `generator` (autopar and its version);
- `hardware`: the whole hardware profile the numbers come from (peak FLOP/s, links, memory overheads) with the
  provenance of every value;
- `assumptions`: the modelling assumptions in plain sentences;
- `solver.status`: 'optimal' (front proven complete), 'time_limit' (best found) or 'not_searched' (one
  estimated plan);
- per point: `rank` (0 = fastest) and `megatron_flags`, the Megatron-LM flags of the plan;
  `pipeline_model_parallel_layout`, the layout string of a plan with a per-stage layout (else null).

Non-finite numbers (a cost term that came out infinite) become null, so the file stays valid JSON.
"""

from __future__ import annotations

import math
from typing import Any

from autopar.remedies import Remedy
from autopar.results import SCHEMA_VERSION, ParetoFront, describe_inputs, generator
from costmodels.hardware import HardwareProfile
from costmodels.scoring import Estimate
from costmodels.specs import PipelineSchedule
from costmodels.units import GIB

SCHEMA_RESOURCE = "front.schema.json"
DISPATCHER_TEXT = {"alltoall": "NCCL all-to-all (one copy per routed expert)",
                   "deepep": "DeepEP (one copy per destination rank: once per node over InfiniBand, fanned out "
                             "over NVLink)"}
EXPERT_GEMM_TEXT = {"cublas": "a cuBLAS GEMM per expert (Transformer Engine's GroupedLinear)",
                    "grouped": "one grouped kernel over the local experts (torch._grouped_mm)",
                    "loop": "a Python loop over the experts, each an eager MLP on the tokens routed to it (Hugging "
                            "Face's eager MoE blocks, DeepSpeed-MoE)"}


def hardware_block(profile: HardwareProfile) -> dict[str, Any]:
    return {
        "name": profile.name,
        "display_name": profile.display_name,
        "hbm_bytes": profile.hbm_bytes,
        "hbm_bandwidth_bytes_per_s": profile.hbm_bandwidth_bytes_per_s,
        "peak_flops_per_s": dict(profile.peak_flops_per_s),
        "gemm_efficiency": dict(profile.gemm_efficiency),
        "links": {kind: {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "alpha_s": link.alpha_s,
                         "nominal_bandwidth_bytes_per_s": link.nominal_bandwidth_bytes_per_s}
                  for kind, link in profile.links.items()},
        "memory_overheads_bytes": dict(profile.memory_overheads_bytes),
        "gpus_per_node": profile.gpus_per_node,
        "source_path": profile.source_path,
        "provenance": dict(profile.provenance),
    }


LOSS_TEXT = {"fused": "is fused (no fp32 logits kept).", "unfused": "keeps an fp32 copy of the logits.",
             "xentropy": "runs apex's xentropy kernel (one kernel each way, no fp32 logits kept)."}
"""What the inputs say of each TrainingSpec.cross_entropy kernel."""


def assumptions(front: ParetoFront) -> list[str]:
    """The modelling assumptions behind every number of the report, as sentences (DESIGN.md §4)."""
    cluster, training, model = front.cluster, front.training, front.model
    lines = [
        f"Usable memory per GPU is (1 - headroom {cluster.headroom:g}) x {cluster.profile.hbm_bytes / GIB:g} GiB = "
        f"{cluster.memory_limit_bytes / GIB:.1f} GiB; the peak of a plan is that of its fullest pipeline stage.",
        ("Mixed precision as in Megatron-LM: bf16 weights, fp32 gradients and Adam states (18 bytes per parameter "
         if training.grad_reduce_in_fp32 else
         "Mixed precision as in Megatron-LM with --grad-reduce-in-bf16: bf16 weights and gradients (reduced over "
         "data parallel in bf16), fp32 Adam states (16 bytes per parameter ")
        + "without sharding); zero 1 shards the optimizer states, 2 also the gradients, 3 also the weights over DP."
        + (" The decoder layers' weights are fp8 parameters (--fp8-param-gather): Transformer Engine's fp8 layouts "
           "in place of the bf16 copy, all-gathered over DP in fp8"
           + (" (in bf16 by the distributed optimizer, zero 1)" if training.fp8_recipe.value == "mxfp8" else "") + "."
           if training.fp8_param_gather else ""),
        f"GEMMs run in {training.precision.value}"
        + (f" ({training.fp8_recipe.value} scaling: Transformer Engine's casts priced at HBM bandwidth, SP "
           "all-gathers in fp8)" if training.precision.value == "fp8" else "") + "; attention "
        + ("uses a fused kernel (no s x s score matrix kept)" if training.flash_attention
           else "keeps the s x s score matrix")
        + "; the loss " + LOSS_TEXT[training.cross_entropy.value],
        "Step time is the sum of the named terms shown; collectives follow an alpha-beta model per link "
        "(NVLink inside a node, InfiniBand between nodes) with the hardware profile's calibrated values.",
        "Throughput counts model FLOPs without recomputation (MFU); hardware TFLOP/s counts recomputed work too.",
    ]
    if model.moe is not None:
        routing = ("dropless routing" if training.moe_capacity_factor is None
                   else f"capacity factor {training.moe_capacity_factor:g}")
        lines.append(f"MoE: {routing}, busiest expert rank at {training.moe_imbalance_factor:g}x the balanced load, "
                     f"tokens dispatched by {DISPATCHER_TEXT[training.moe_dispatcher.value]}, the experts' GEMMs "
                     f"run as {EXPERT_GEMM_TEXT[training.expert_gemm.value]}.")
    return lines


def megatron_flags(estimate: Estimate) -> list[str]:
    """The plan's Megatron-LM parallelism, batch, recompute and precision flags, as argv words; a pipelined plan
    under a zero-bubble schedule gets the flags of the Megatron-LM fork that runs it (upstream has none, and
    `--emit megatron` refuses it)."""
    from autopar.export.capabilities import zero_bubble_fork_flags
    from autopar.export.megatron import batch_flags, memory_flags, overlap_flags, parallelism_flags

    words: list[str] = []
    for flag, value in (parallelism_flags(estimate) + batch_flags(estimate) + memory_flags(estimate)
                        + overlap_flags(estimate)):
        words.append(flag)
        if value is not None:
            words.append(value)
    schedule = estimate.training.pipeline_schedule
    if estimate.plan.pp > 1 and schedule is not PipelineSchedule.ONE_F_ONE_B:
        words += zero_bubble_fork_flags(schedule, estimate.plan.pp)
    return words


def layout_string(estimate: Estimate) -> str | None:
    """The plan's per-stage layout as Megatron-Core writes it (--pipeline-model-parallel-layout; NeMo 2 and
    Megatron-Bridge take the same string), None for a plan without one."""
    if not estimate.plan.layout:
        return None
    from autopar.megatron_args import format_megatron_layout

    return format_megatron_layout(estimate.plan.layout, estimate.model.num_mtp_layers)


def finite_or_none(value: Any) -> Any:
    """Recursively replace NaN and ±inf by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars that slipped through
        return finite_or_none(value.item())
    return value


def report_document(front: ParetoFront) -> dict[str, Any]:
    """The report as plain JSON-ready data (validated against autopar/schemas/front.schema.json in the tests)."""
    base = front.to_dict()
    points = []
    for rank, (estimate, point) in enumerate(zip(front.points, base["points"])):
        points.append({"rank": rank, **point, "megatron_flags": megatron_flags(estimate),
                       "pipeline_model_parallel_layout": layout_string(estimate)})
    solver = dict(base["solver"])
    solver["status"] = ("optimal" if front.proven_optimal
                        else "not_searched" if front.solver == "estimate" else "time_limit")
    document = {
        "schema_version": SCHEMA_VERSION,
        "generator": base["generator"],
        "inputs": base["inputs"],
        "hardware": hardware_block(front.cluster.profile),
        "assumptions": assumptions(front),
        "solver": solver,
        "rules": base["rules"],
        "relaxed_rules": base["relaxed_rules"],
        "notes": base["notes"],
        "points": points,
    }
    return finite_or_none(document)


def front_of_one(estimate: Estimate, note: str = "a single plan, estimated (not searched)") -> ParetoFront:
    """A one-point 'front' around an estimate, so `autopar estimate --out` shares the report formats."""
    return ParetoFront(model=estimate.model, cluster=estimate.cluster, training=estimate.training,
                       points=(estimate,), proven_optimal=False, rules=(), solver="estimate", notes=(note,))


def load_schema() -> dict[str, Any]:
    """The shipped JSON Schema of `report_document` output."""
    import json
    from importlib import resources

    text = (resources.files("autopar") / "schemas" / SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)


def estimate_document(result: Estimate, fixes: "tuple[Remedy, ...]", reasons: dict[str, str]) -> dict[str, Any]:
    """`autopar estimate --json`: the inputs block, the estimate, why each rule is broken, and the remedies."""
    return {"schema_version": SCHEMA_VERSION, "generator": generator(),
            "inputs": describe_inputs(result.model, result.cluster, result.training), **result.to_dict(),
            "violation_reasons": {rule: reasons.get(rule, "peak memory exceeds the limit")
                                  for rule in result.violations},
            "remedies": [fix.to_dict(result.cluster.num_gpus) for fix in fixes]}
