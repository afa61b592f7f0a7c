"""What autopar answers with: a `ParetoFront` of `Estimate`s (one per plan), and the inputs block of every document.

Both are plain frozen data in base units (bytes, seconds); `to_dict()` gives the JSON-ready form that every report
format and the CLI's `--json` share. `Estimate` (one plan, costmodels.scoring) is built by `autopar.estimate`, the
front by `autopar.solve`. Formatting for people lives in autopar/report; nothing here formats text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from costmodels import compute, params
from costmodels.scoring import Estimate
from costmodels.specs import ClusterSpec, CrossEntropyKernel, ModelSpec, TrainingSpec
from costmodels.units import whole_bytes

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


def describe_inputs(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict[str, Any]:
    """The inputs-and-assumptions block every document starts with (JSON, reports, the terminal header)."""
    profile = cluster.profile
    model_info: dict[str, Any] = {
        "name": model.name, "source": model.source, "hidden_size": model.hidden_size,
        "num_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size, "total_params": params.total_params(model),
        "active_params": params.active_params(model), "dropout": model.dropout,
    }
    if model.moe is not None:
        model_info["moe"] = {"num_experts": model.moe.num_experts, "top_k": model.moe.top_k,
                             "expert_ffn_hidden_size": model.moe.expert_ffn_hidden_size,
                             "num_shared_experts": model.moe.num_shared_experts,
                             "first_dense_layers": model.moe.first_dense_layers}
    return {
        "model": model_info,
        "cluster": {"gpu": profile.name, "gpu_display_name": profile.display_name, "num_gpus": cluster.num_gpus,
                    "gpus_per_node": cluster.gpus_per_node, "num_nodes": cluster.num_nodes,
                    "nvlink_domain_gpus": cluster.nvlink_domain_gpus, "hbm_bytes": whole_bytes(profile.hbm_bytes), "headroom": cluster.headroom,
                    "memory_limit_bytes": whole_bytes(cluster.memory_limit_bytes), "profile_source": profile.source_path,
                    "sustained_clock_fraction": profile.sustained_clock_fraction,
                    "streaming_multiprocessors": profile.streaming_multiprocessors,
                    "compute_capability": profile.compute_capability or None,
                    "profile_provenance": dict(profile.provenance)},
        "training": {"seq_len": training.seq_len, "global_batch_size": training.global_batch_size,
                     "precision": training.precision.value,
                     "fp8_recipe": training.fp8_scaling.value if training.fp8_scaling else None,
                     "flash_attention": training.flash_attention,
                     "attention_kernel": training.attention_kernel.value,
                     "attention_kernel_runs": compute.attention_kernel_runs(profile, training),
                     "cross_entropy": training.cross_entropy.value,
                     "fused_cross_entropy": training.cross_entropy is not CrossEntropyKernel.UNFUSED,
                     "pipeline_schedule": training.pipeline_schedule.value,
                     "moe_capacity_factor": training.moe_capacity_factor,
                     "moe_dispatcher": training.moe_dispatcher.value,
                     "expert_gemm": training.expert_gemm.value,
                     "grad_reduce_in_fp32": training.grad_reduce_in_fp32,
                     "fp8_param_gather": training.fp8_param_gather,
                     "engine": training.engine.value,
                     "launch": training.launch.value,
                     "cuda_graph_modules": list(training.cuda_graph_modules),
                     "cuda_graph_full_iteration": training.cuda_graph_full_iteration,
                     "cuda_graph_impl": training.cuda_graph_impl,
                     "dataloader_attention_mask": training.dataloader_attention_mask,
                     "fused_kernels": training.fused_kernels,
                     "zero3_serial_fetch": training.zero3_serial_fetch,
                     "zero3_moe_leaf": training.zero3_moe_leaf,
                     "sac_saves_all_to_all": training.sac_saves_all_to_all,
                     "offload_modules": list(training.offload_modules),
                     "offload_fraction": training.offload_fraction,
                     "tokens_per_step": training.tokens_per_step,
                     "overlap": {"overlap_grad_reduce": training.overlap_grad_reduce,
                                 "overlap_param_gather": training.overlap_param_gather,
                                 "tp_comm_overlap": training.tp_comm_overlap,
                                 "moe_a2a_overlap": training.moe_a2a_overlap,
                                 "overlap_p2p_comm": training.overlap_p2p_comm,
                                 "nccl_ctas": training.nccl_ctas}},
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
