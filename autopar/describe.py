"""The inputs-and-assumptions block every output starts with (terminal, JSON, reports), as plain data."""

from __future__ import annotations

from typing import Any

from costmodels import params
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec


def describe_inputs(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict[str, Any]:
    profile = cluster.profile
    model_info: dict[str, Any] = {
        "name": model.name, "source": model.source, "hidden_size": model.hidden_size,
        "num_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size, "total_params": params.total_params(model),
        "active_params": params.active_params(model),
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
                    "hbm_bytes": profile.hbm_bytes, "headroom": cluster.headroom,
                    "memory_limit_bytes": cluster.memory_limit_bytes, "profile_source": profile.source_path,
                    "profile_provenance": dict(profile.provenance)},
        "training": {"seq_len": training.seq_len, "global_batch_size": training.global_batch_size,
                     "precision": training.precision.value, "flash_attention": training.flash_attention,
                     "fused_cross_entropy": training.fused_cross_entropy,
                     "moe_capacity_factor": training.moe_capacity_factor,
                     "tokens_per_step": training.tokens_per_step},
    }
