"""The model / cluster / training lines every command prints first (solve, estimate and explain word their inputs
the same way), from the inputs block of every document (`autopar.results.describe_inputs`)."""

from __future__ import annotations

from autopar.report.units import format_count, format_gib
from autopar.results import describe_inputs
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec


def inputs_header(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> list[tuple[str, str]]:
    """The model / cluster / training lines every command prints first, as (label, text) pairs (plain text).

    One wording for all commands: DESIGN.md §1 names (seq_len, ...), parameter counts as '70.6B', the limit as
    'limit X GiB per GPU (1 - headroom of HBM)'.
    """
    info = describe_inputs(model, cluster, training)
    m, c, t = info["model"], info["cluster"], info["training"]
    size = f"{format_count(m['total_params'])} params"
    if m["active_params"] != m["total_params"]:
        size += f" ({format_count(m['active_params'])} active)"
    attention = "MLA" if model.mla is not None else f"{m['num_kv_heads']} KV"
    shape = (f"{m['num_layers']} layers, hidden {m['hidden_size']}, {m['num_attention_heads']} heads "
             f"({attention}), ffn {m['ffn_hidden_size']}, vocab {m['vocab_size']}")
    if "moe" in m:
        shape += f", {m['moe']['num_experts']} experts top-{m['moe']['top_k']}"
    if m["dropout"]:
        shape += f", dropout {m['dropout']:g}"
    nodes = f"{c['num_nodes']} node{'s' if c['num_nodes'] > 1 else ''} of {c['gpus_per_node']}"
    if c.get("nvlink_domain_gpus", c["gpus_per_node"]) != c["gpus_per_node"]:   # GB200 NVL72: NVLink spans nodes
        nodes += f", NVLink domains of {c['nvlink_domain_gpus']}"
    cluster_text = (f"{c['num_gpus']} × {c['gpu_display_name']} ({nodes}), limit {format_gib(c['memory_limit_bytes'])} "
                    f"per GPU ({1 - c['headroom']:.0%} of {format_gib(c['hbm_bytes'], 0)} HBM)"
                    f"{_sustained_clock_text(c)} [{c['profile_source']}]")
    training_text = (f"seq_len {t['seq_len']}, global batch {t['global_batch_size']} "
                     f"({format_count(t['tokens_per_step'])} tokens), {t['precision']}"
                     f"{' (' + t['fp8_recipe'] + ' scaling)' if t.get('fp8_recipe') else ''}"
                     f"{', fp8 parameters' if t.get('fp8_param_gather') else ''}, "
                     f"flash attention {_attention_text(t)}, "
                     f"cross entropy {t['cross_entropy']}, pipeline schedule {t.get('pipeline_schedule', '1f1b')}, "
                     f"gradients reduced in {'fp32' if t.get('grad_reduce_in_fp32', True) else 'bf16'}")
    if training.offload_modules:
        share = f" ({training.offload_fraction:g} of their groups)" if training.offload_fraction != 1.0 else ""
        training_text += f", activations of {', '.join(training.offload_modules)} offloaded to the host{share}"
    if model.moe is not None:
        routing = ("dropless" if training.moe_capacity_factor is None
                   else f"capacity factor {training.moe_capacity_factor:g}")
        training_text += (f", MoE {routing}, imbalance {training.moe_imbalance_factor:g}, "
                          f"dispatcher {training.moe_dispatcher.value}, expert GEMMs {training.expert_gemm.value}")
    training_text += f"; overlap: {overlap_summary(training)}; engine {engine_summary(training)}"
    return [("model", f"{m['name']}: {size}; {shape}"), ("cluster", cluster_text), ("training", training_text)]


def _sustained_clock_text(c: dict) -> str:
    """', GEMMs and attention at the sustained clock (0.80 × burst)' where the profile throttles them, else ''."""
    fraction = c.get("sustained_clock_fraction", 1.0)
    return f", GEMMs and attention at the sustained clock ({fraction:.2f} × burst)" if fraction < 1.0 else ""


def _attention_text(t: dict) -> str:
    """'on (cudnn, auto)' / 'on (fa2)' / 'off': the kernel the core is priced as and what was asked for."""
    if not t["flash_attention"]:
        return "off"
    runs, asked = t.get("attention_kernel_runs", "fused"), t.get("attention_kernel", "auto")
    return f"on ({runs}{', auto' if asked == 'auto' else ''})"


ENGINE_NAMES = {"megatron": "Megatron-Core + Transformer Engine", "torchtitan": "torchtitan (FSDP2)",
                "deepspeed": "DeepSpeed", "pytorch": "plain PyTorch", "native": "CUDA C (llm.c)"}


def engine_summary(training: TrainingSpec) -> str:
    """The engine and launch path priced (costmodels.engines): 'Megatron-Core + Transformer Engine, eager launches'."""
    if training.launch.value == "cuda_graph":
        modules = "the whole iteration" if training.cuda_graph_full_iteration else (
            f"{', '.join(training.cuda_graph_modules) or 'whole layers'}, {training.cuda_graph_impl}")
        launch = f"CUDA graphs ({modules})"
    elif training.launch.value == "compile":
        launch = "torch.compile'd blocks"
    else:
        launch = "eager launches"
    extras = (", fused kernels" if training.fused_kernels else "") + \
        (", ZeRO-3 fetch as DeepSpeed < 0.6" if training.zero3_serial_fetch else "") + \
        (", each expert linear fetched on its own" if training.engine.value == "deepspeed"
         and not training.zero3_moe_leaf else "") + \
        (", selective = per-op SAC" if training.engine.value == "torchtitan" else "") + \
        (" (all-to-alls recomputed)" if training.engine.value == "torchtitan" and not training.sac_saves_all_to_all
         else "")
    return f"{ENGINE_NAMES[training.engine.value]}, {launch}{extras}"


def overlap_summary(training: TrainingSpec) -> str:
    """The communication overlaps the step time assumes, by their Megatron-Core switch names."""
    switches = (("grad reduce", training.overlap_grad_reduce), ("param gather", training.overlap_param_gather),
                ("TP comm", training.tp_comm_overlap), ("EP all-to-all", training.moe_a2a_overlap),
                ("P2P of interleaved plans", training.overlap_p2p_comm))
    on = [name for name, value in switches if value]
    text = ", ".join(on) + " (others off)" if on else "none (see --overlap-grad-reduce ...)"
    # ZeRO-2/3 and the CP ring overlap whatever the switches say, so the CTA count always applies
    ctas = (f"an overlapped NCCL collective holds {training.nccl_ctas} SMs" if training.nccl_ctas
            else "overlapped NCCL collectives priced free (--nccl-ctas 0)")
    return f"{text}; {ctas}"
