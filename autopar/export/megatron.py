"""Megatron-LM command-line flags for one plan.

Flag names are Megatron-LM's own, from NVIDIA/Megatron-LM megatron/training/arguments.py:
`_add_distributed_args` (--tensor-model-parallel-size, --pipeline-model-parallel-size,
--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, --decoder-first-pipeline-num-layers,
--decoder-last-pipeline-num-layers, --context-parallel-size, --use-distributed-optimizer, --sequence-parallel),
`_add_moe_args` (--expert-model-parallel-size, --expert-tensor-parallel-size, --num-experts, --moe-router-topk,
--moe-ffn-hidden-size, --moe-shared-expert-intermediate-size, --moe-layer-freq; the router's --moe-router-* flags and
--moe-apply-probs-on-input, generated from TransformerConfig's fields: export.common.mcore_router_fields), `_add_training_args`
(--micro-batch-size, --global-batch-size, --recompute-granularity, --recompute-method, --recompute-num-layers),
`_add_distributed_args` again (--overlap-grad-reduce, --overlap-param-gather) and ModelParallelConfig
(--tp-comm-overlap, --overlap-moe-expert-parallel-comm): off by default, written when the user set them for the step
time (TrainingSpec overlap options), where they apply; see export.common.data_parallel_overlap and
model_parallel_overlap), --no-overlap-p2p-communication (on by default for the interleaved schedule; written when
the user turned it off, export.common.pipeline_p2p_overlap), --moe-token-dispatcher-type /
--moe-flex-dispatcher-backend (always for a MoE model, export.common.moe_dispatcher_fields),
--moe-expert-capacity-factor (where the estimate caps the experts, export.common.moe_capacity_fields),
`_add_mixed_precision_args` (--bf16; --reuse-grad-buf-for-mxfp8-param-ag), `_add_transformer_engine_args` (--fp8-format,
--fp8-recipe, --fp8-param-gather: fp8 parameters as priced, export.common.fp8_param_fields), `_add_network_size_args`
(--num-layers, --hidden-size, ..., --rotary-base, --rotary-percent, --use-rope-scaling, --rope-scaling-factor,
--qk-layernorm). `validate_args` there fixes two rules followed here: an uneven split with
interleaving must use --num-virtual-stages-per-pipeline-rank, and the three virtual-pipeline flags are exclusive.
Megatron-FSDP (ZeRO-2/3): --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads|optim_grads_params,
as in Megatron-LM's Megatron-FSDP quick start (megatron/core/distributed/fsdp/README.md).

`autopar.megatron_args.parse_megatron_args` reads this output back into the same plan (tested round trip).
"""

from __future__ import annotations

from autopar.export.capabilities import TARGET_VERSIONS, require_runnable
from autopar.export.common import (MEGATRON_EXPERT_GEMM, LaunchConfig, data_parallel_overlap, expert_gemm_note,
                                   flash_version_note, fp8_param_fields, gradient_reduce_dtype, is_uneven, loss_fusion,
                                   loss_kernel_note, mcore_cuda_graph_fields, mcore_offload_fields,
                                   mcore_recompute_fields, mcore_router_fields, megatron_attention_backend,
                                   model_parallel_overlap, moe_capacity_fields, moe_dispatcher_fields, router_note,
                                   one_line, pipeline_p2p_overlap, pipeline_slots, plan_caption)
from costmodels.scoring import Estimate
from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding, Precision

SOURCES = ("NVIDIA/Megatron-LM megatron/training/arguments.py",
           "NVIDIA/Megatron-LM megatron/core/distributed/fsdp/README.md (Megatron-FSDP flags)")

ZERO_SHARDING_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP's --data-parallel-sharding-strategy for ZeRO-2 and ZeRO-3 ('optim' would be ZeRO-1, which the
distributed optimizer already is)."""

Flag = tuple[str, "str | None"]


def parallelism_flags(estimate: Estimate) -> list[Flag]:
    plan, model = estimate.plan, estimate.model
    flags: list[Flag] = [("--tensor-model-parallel-size", str(plan.tp)),
                         ("--pipeline-model-parallel-size", str(plan.pp))]
    embedding_slot, loss_slot = pipeline_slots(model.num_layers, plan)
    if plan.layout:   # excludes every other split and virtual-pipeline flag (arguments.py validate_args asserts so)
        from autopar.megatron_args import format_megatron_layout

        flags.append(("--pipeline-model-parallel-layout", format_megatron_layout(plan.layout, model.num_mtp_layers)))
    elif embedding_slot or loss_slot:   # Megatron asserts these exclude --decoder-first/last-pipeline-num-layers
        if embedding_slot:
            flags.append(("--account-for-embedding-in-pipeline-split", None))
        if loss_slot:
            flags.append(("--account-for-loss-in-pipeline-split", None))
    elif is_uneven(plan):
        if plan.first_stage_layers:
            flags.append(("--decoder-first-pipeline-num-layers", str(plan.first_stage_layers)))
        if plan.last_stage_layers:
            flags.append(("--decoder-last-pipeline-num-layers", str(plan.last_stage_layers)))
    if plan.vpp > 1 and not plan.layout:        # with a layout, the layout's stage count gives vpp
        flags.append(_virtual_pipeline_flag(model, estimate))
    if plan.sp:
        flags.append(("--sequence-parallel", None))
    flags.append(("--context-parallel-size", str(plan.cp)))
    if model.is_moe or plan.ep > 1 or plan.etp != plan.tp:
        flags.append(("--expert-model-parallel-size", str(plan.ep)))
        flags.append(("--expert-tensor-parallel-size", str(plan.etp)))
    return flags


def _virtual_pipeline_flag(model: ModelSpec, estimate: Estimate) -> Flag:
    """--num-layers-per-virtual-pipeline-stage for an even split (every Megatron version has it); an uneven split
    needs --num-virtual-stages-per-pipeline-rank (arguments.py validate_args asserts so)."""
    plan = estimate.plan
    chunks = plan.pp * plan.vpp
    if not is_uneven(plan) and model.num_layers % chunks == 0:
        return ("--num-layers-per-virtual-pipeline-stage", str(model.num_layers // chunks))
    return ("--num-virtual-stages-per-pipeline-rank", str(plan.vpp))


def overlap_flags(estimate: Estimate) -> list[Flag]:
    """The overlap switches the step time assumed (TrainingSpec options), where they apply to the plan: the launched
    job then overlaps what the estimate hid (Megatron-LM leaves all of them off unless asked)."""
    switches = {**data_parallel_overlap(estimate), **model_parallel_overlap(estimate), **loss_fusion(estimate)}
    flags: list[Flag] = [("--" + name.replace("_", "-"), None) for name, on in switches.items() if on]
    # the interleaved schedule's P2P overlap is on by default in Megatron-LM: written only to turn it off
    if pipeline_p2p_overlap(estimate).get("overlap_p2p_comm") is False:
        flags.append(("--no-overlap-p2p-communication", None))
    backend = megatron_attention_backend(estimate)
    if backend is not None:  # the attention kernel the step time priced (auto: Megatron-Core's default, not written)
        flags.append(("--attention-backend", backend))
    # the MoE token dispatcher the step time priced (export.common.moe_dispatcher_fields)
    flags += [("--" + name.replace("_", "-"), value) for name, value in moe_dispatcher_fields(estimate).items()
              if estimate.model.is_moe]
    # the expert capacity the step time priced (export.common.moe_capacity_fields; dropless when absent)
    flags += [("--" + name.replace("_", "-"), repr(float(value)))
              for name, value in moe_capacity_fields(estimate).items()]
    # the CUDA graphs the launches were priced with (Megatron-LM's default impl is none: written only when priced)
    graphs = mcore_cuda_graph_fields(estimate.training)
    if graphs["cuda_graph_impl"] != "none":
        flags.append(("--cuda-graph-impl", str(graphs["cuda_graph_impl"])))
        if graphs["cuda_graph_modules"]:
            flags.append(("--cuda-graph-modules", " ".join(graphs["cuda_graph_modules"])))
        if graphs["cuda_graph_impl"] == "full_iteration":   # validate_args: 'should be set with full_iteration'
            flags.append(("--no-check-for-nan-in-loss-and-grad", None))
    if not estimate.training.dataloader_attention_mask:   # the loader's masks as priced (cuda_graph_loader_batches)
        flags.append(("--no-create-attention-mask-in-dataloader", None))
    # the fine-grained activation offloading the memory was priced with (TransformerConfig fields as flags)
    offload = mcore_offload_fields(estimate.training)
    if offload:
        flags += [("--fine-grained-activation-offloading", None),
                  ("--offload-modules", " ".join(str(m) for m in offload["offload_modules"]))]
        if "activation_offload_fraction" in offload:
            flags.append(("--activation-offload-fraction", repr(float(offload["activation_offload_fraction"]))))
    return flags


def batch_flags(estimate: Estimate) -> list[Flag]:
    training = estimate.training
    max_positions = max(estimate.model.max_position_embeddings, training.seq_len)
    return [("--micro-batch-size", str(estimate.plan.mbs)),
            ("--global-batch-size", str(training.global_batch_size)),
            ("--seq-length", str(training.seq_len)),
            ("--max-position-embeddings", str(max_positions))]


def memory_flags(estimate: Estimate) -> list[Flag]:
    """Recomputation, optimizer sharding and precision."""
    plan = estimate.plan
    flags: list[Flag] = []
    recompute = mcore_recompute_fields(plan)
    for field in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        if recompute[field] is not None:
            flags.append(("--" + field.replace("_", "-"), str(recompute[field])))
    if recompute["recompute_modules"]:
        flags.append(("--recompute-modules", " ".join(recompute["recompute_modules"])))
    if plan.zero >= 1:
        flags.append(("--use-distributed-optimizer", None))
    in_fp32 = gradient_reduce_dtype(estimate)["grad_reduce_in_fp32"]
    if plan.zero <= 1 and not in_fp32:   # the distributed optimizer / DDP: Megatron-LM's bf16 default is fp32
        flags.append(("--grad-reduce-in-bf16", None))
    if plan.zero >= 2:   # Megatron-FSDP reads its own dtype, whose default 'auto' is the parameters' bf16
        flags += [("--use-megatron-fsdp", None),
                  ("--data-parallel-sharding-strategy", ZERO_SHARDING_STRATEGY[plan.zero]),
                  ("--megatron-fsdp-main-grads-dtype", "fp32" if in_fp32 else "bf16"),
                  ("--no-gradient-accumulation-fusion", None),
                  ("--ckpt-format", "fsdp_dtensor")]
    flags.append(("--bf16", None))
    if estimate.training.precision is Precision.FP8:   # Megatron-Core's TransformerConfig.fp8 / fp8_recipe
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", estimate.training.fp8_recipe.value)]
    # fp8 parameters as priced (off is Megatron-LM's default): --fp8-param-gather sets TransformerConfig.fp8_param and
    # DistributedDataParallelConfig.fp8_param_gather; MXFP8 gathers them through the gradient buffer at zero <= 1
    params = fp8_param_fields(estimate)
    if params.get("fp8_param_gather"):
        flags.append(("--fp8-param-gather", None))
    if params.get("reuse_grad_buf_for_mxfp8_param_ag"):
        flags.append(("--reuse-grad-buf-for-mxfp8-param-ag", None))
    return flags


def model_flags(model: ModelSpec) -> list[Flag]:
    """The model's shape, so the command builds the model the estimate describes (check against your recipe)."""
    flags: list[Flag] = [("--num-layers", str(model.num_layers)), ("--hidden-size", str(model.hidden_size)),
                         ("--ffn-hidden-size", str(model.ffn_hidden_size)),
                         ("--num-attention-heads", str(model.num_attention_heads))]
    if model.mla is None and model.num_kv_heads != model.num_attention_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", str(model.num_kv_heads))]
    if model.mla is None and model.head_dim * model.num_attention_heads != model.hidden_size:
        flags.append(("--kv-channels", str(model.head_dim)))
    if model.mlp is MlpKind.GATED:
        flags.append(("--swiglu", None))
    elif model.mlp is MlpKind.SQUARED_RELU:
        flags.append(("--squared-relu", None))                      # Nemotron-4: relu(x)^2, no gate
    flags.append(("--normalization", "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm"))
    flags.append(("--position-embedding-type", position_embedding_type(model)))
    flags += rope_flags(model)
    if model.qk_layernorm:
        flags.append(("--qk-layernorm", None))
    if model.qk_l2_norm:
        flags.append(("--qk-l2-norm", None))
    if model.nope_layer_interval and model.num_layers % model.nope_layer_interval == 0:   # TransformerConfig asserts
        flags.append(("--no-rope-freq", str(model.nope_layer_interval)))                # the interval divides them
    if model.sliding_window:
        # --window-size (left, right) and --window-attn-skip-freq 2: one full layer after each window layer (GPT-OSS).
        # Hugging Face's window counts the query's own token (mask kv > q - window): left = window - 1, as
        # Megatron-Bridge's GPT-OSS bridge writes it
        flags.append(("--window-size", f"({model.sliding_window - 1},0)"))
        full_layers = model.num_layers - model.sliding_window_layers
        if full_layers:
            flags.append(("--window-attn-skip-freq", str(round(model.num_layers / full_layers))))
    # Megatron-LM defaults both to 0.1: written always, so a model trained without dropout gets none (and none of
    # the masks the memory estimate left out)
    dropout = f"{model.dropout:.10g}"
    flags += [("--attention-dropout", dropout), ("--hidden-dropout", dropout)]
    if not model.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not model.linear_bias:
        flags.append(("--disable-bias-linear", None))
    if model.qkv_bias and not model.linear_bias:
        flags.append(("--add-qkv-bias", None))
    if model.moe is not None:
        moe = model.moe
        flags += [("--num-experts", str(moe.num_experts)), ("--moe-router-topk", str(moe.top_k)),
                  ("--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)),
                  ("--moe-grouped-gemm", None)]   # export.common.mcore_moe_fields
        flags += [("--" + name.replace("_", "-"), None if value is True else _number(value) if isinstance(value, float)
                   else str(value)) for name, value in mcore_router_fields(model).items()]
        if moe.num_shared_experts:
            flags.append(("--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)))
        pattern = _moe_layer_pattern(model)
        if pattern is not None:
            flags.append(("--moe-layer-freq", pattern))
    if model.mla is not None:
        mla = model.mla
        flags += [("--multi-latent-attention", None), ("--kv-lora-rank", str(mla.kv_lora_rank)),
                  ("--qk-head-dim", str(mla.qk_nope_head_dim)), ("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)),
                  ("--v-head-dim", str(mla.v_head_dim))]
        if mla.q_lora_rank:
            flags.append(("--q-lora-rank", str(mla.q_lora_rank)))
    if model.num_mtp_layers:
        flags.append(("--mtp-num-layers", str(model.num_mtp_layers)))
    return flags


MEGATRON_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_positions": 8192}
"""What --use-rope-scaling applies besides its factor: Megatron-Core's Llama 3.1 frequency scaling with these fixed
(megatron/core/models/common/embeddings/rotary_pos_embedding.py RotaryEmbedding._apply_scaling defaults)."""
MLA_YARN_FIXED = {"original_max_positions": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
"""MLATransformerConfig's yarn fields no Megatron-LM flag sets (megatron/core/transformer/transformer_config.py:
original_max_position_embeddings, beta_fast, beta_slow); its rope_type is yarn unless --rope-type rope."""


def _number(value: float) -> str:
    """A float flag value without losing digits (2.5, 0.707, 1e-05)."""
    return repr(float(value)) if float(value) != int(value) else str(int(value))


def position_embedding_type(model: ModelSpec) -> str:
    """--position-embedding-type: Megatron-Core has no ALiBi ('none' builds the same parameters: BLOOM's biases are
    not trained weights); yarn-scaled RoPE outside MLA is its own type ('yarn', GPTModel's yarn branch)."""
    if model.position_embedding is PositionEmbedding.ROPE:
        yarn = model.rope is not None and model.rope.scaling == "yarn" and model.mla is None
        return "yarn" if yarn else "rope"
    return {PositionEmbedding.LEARNED: "learned_absolute", PositionEmbedding.ALIBI: "none"}[model.position_embedding]


def rope_flags(model: ModelSpec) -> list[Flag]:
    """The rotary settings as Megatron-LM takes them: --rotary-base (its default is 10000), --rotary-percent for
    partial rotary, Llama 3.1 scaling as --use-rope-scaling / --rope-scaling-factor, and yarn: under MLA the
    scaling factor and attention scales of MLATransformerConfig's yarn (--rotary-scaling-factor, --mscale,
    --mscale-all-dim; --rope-type rope for an MLA model without yarn), elsewhere the yarn position type's
    (argument_utils._apply_yarn_config_from_args: those three and --yarn-original-max-position-embeddings,
    --yarn-beta-fast, --yarn-beta-slow, --no-yarn-correction-range-round-to-int). Other scalings: `rope_note`."""
    rope = model.rope
    if rope is None or model.position_embedding is not PositionEmbedding.ROPE:
        return []
    flags: list[Flag] = [("--rotary-base", f"{rope.theta:.0f}")]
    if rope.rotary_fraction < 1.0:
        flags.append(("--rotary-percent", _number(rope.rotary_fraction)))
    if rope.scaling == "llama3":
        flags += [("--use-rope-scaling", None), ("--rope-scaling-factor", _number(rope.factor))]
    if rope.scaling == "yarn":
        flags += [("--rotary-scaling-factor", _number(rope.factor)), ("--mscale", _number(rope.mscale)),
                  ("--mscale-all-dim", _number(rope.mscale_all_dim))]
        if model.mla is None:
            flags += [("--yarn-original-max-position-embeddings", str(rope.original_max_positions)),
                      ("--yarn-beta-fast", _number(rope.beta_fast)), ("--yarn-beta-slow", _number(rope.beta_slow))]
            if not rope.round_to_int:
                flags.append(("--no-yarn-correction-range-round-to-int", None))
    elif model.mla is not None:
        flags.append(("--rope-type", "rope"))
    return flags


def rope_note(model: ModelSpec) -> list[str]:
    """The rotary settings Megatron-LM's flags cannot give this model."""
    rope = model.rope
    if rope is None:
        return []
    notes = [] if not model.nope_layer_interval or model.num_layers % model.nope_layer_interval == 0 else [
        f"every {model.nope_layer_interval}th layer is NoPE, which does not divide the {model.num_layers} layers: "
        "--no-rope-freq not written (Megatron-Core asserts it divides them); the command applies RoPE everywhere"]
    notes += [] if rope.theta == round(rope.theta) else [
        f"rope_theta {rope.theta:g} written as --rotary-base {rope.theta:.0f} (Megatron-LM reads a whole number)"]
    own = {"low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
           "original_max_positions": rope.original_max_positions, "beta_fast": rope.beta_fast,
           "beta_slow": rope.beta_slow}
    fixed = {"llama3": MEGATRON_LLAMA3_SCALING, "yarn": MLA_YARN_FIXED if model.mla is not None else {}}.get(
        rope.scaling)
    if fixed is None and rope.scaling:
        return notes + [f"rope scaling {rope.scaling} (factor {rope.factor:g}) has no Megatron-LM flag: the command "
                        "builds unscaled RoPE; set it in your recipe"]
    differ = [f"{name} {own[name]:g} (Megatron {value:g})" for name, value in (fixed or {}).items()
              if own[name] and own[name] != value]
    if differ:
        notes.append(f"Megatron-LM fixes the rest of the {rope.scaling} scaling; this model has {', '.join(differ)}")
    return notes


def _moe_layer_pattern(model: ModelSpec) -> str | None:
    """--moe-layer-freq as Megatron's list expression (1 = MoE layer), or None when every layer is MoE."""
    pattern = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    if all(pattern):
        return None
    # the shortest period that repeats to the whole pattern: Llama 4 Maverick's ([0]*1+[1]*1)*24
    period = next(p for p in range(1, len(pattern) + 1)
                  if len(pattern) % p == 0 and pattern == pattern[:p] * (len(pattern) // p))
    runs: list[tuple[int, int]] = []
    for value in pattern[:period]:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    repeats = len(pattern) // period
    return "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")" + (f"*{repeats}" if repeats > 1 else "")


def unexpressed(estimate: Estimate) -> list[str]:
    """Everything a plan holds is a Megatron-LM flag; only remarks about approximations are listed."""
    notes = flash_version_note(estimate) + loss_kernel_note(estimate) \
        + expert_gemm_note(estimate, *MEGATRON_EXPERT_GEMM) + router_note(estimate.model) + rope_note(estimate.model)
    model = estimate.model
    if model.chunked_attention_layers:
        notes.append(f"attention_chunk_size {model.attention_chunk_size}: Megatron-Core has no chunked attention; its "
                     f"{model.chunked_attention_layers} chunked layers attend over the whole sequence"
                     + (f", more work than this estimate priced past {model.attention_chunk_size} tokens"
                        if estimate.training.seq_len > model.attention_chunk_size else
                        " (the same work at this sequence length)"))
    if estimate.plan.zero >= 2:
        notes.append(f"zero={estimate.plan.zero} uses Megatron-FSDP; check that your Megatron-LM version supports "
                     "it together with the other parallelisms of this plan")
    return notes


def cuda_device_max_connections(estimate: Estimate) -> str | None:
    """The launch environment's CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM's validate_args asserts it
    (megatron/training/arguments.py, core_v0.19.0): "1" with tensor or context parallelism (the TP/CP
    communication overlap needs one hardware queue: 'Using tensor model parallelism or context parallelism require
    setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1'; checked on devices before Blackwell), and
    "unset" with Megatron-FSDP ('FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'; with TP/CP too that is
    only a warning), and "32" with the EP all-to-all overlap, which runs its communication on a stream of its own:
    validate_args drops the "1" assert for it and warns that it 'requires setting a larger
    CUDA_DEVICE_MAX_CONNECTIONS' (one queue would serialise the all-to-all the step time hid behind compute);
    32 is what Megatron-Core's MoE team launches it with (yanring/Megatron-MoE-ModelZoo sbatch_benchmarking.sh,
    A2A_OVERLAP=1). None: no requirement, leave the environment alone."""
    plan = estimate.plan
    if plan.zero >= 2:
        return "unset"
    if model_parallel_overlap(estimate)["overlap_moe_expert_parallel_comm"]:
        return EP_OVERLAP_CONNECTIONS
    if plan.tp > 1 or plan.cp > 1:
        return "1"
    return None


EP_OVERLAP_CONNECTIONS = "32"
"""CUDA_DEVICE_MAX_CONNECTIONS under --overlap-moe-expert-parallel-comm (cuda_device_max_connections)."""


def launcher_prefix(estimate: Estimate) -> str:
    cluster = estimate.cluster
    per_node = min(cluster.gpus_per_node, cluster.num_gpus)
    connections = cuda_device_max_connections(estimate)
    env = {None: "", "unset": "env -u CUDA_DEVICE_MAX_CONNECTIONS "}.get(connections,
                                                                      f"CUDA_DEVICE_MAX_CONNECTIONS={connections} ")
    return f"{env}torchrun --nproc-per-node {per_node} --nnodes {cluster.num_nodes} pretrain_gpt.py"


def launch_config(estimate: Estimate) -> LaunchConfig:
    require_runnable(estimate, "megatron")
    flags = parallelism_flags(estimate) + batch_flags(estimate) + memory_flags(estimate) + overlap_flags(estimate)
    flags += model_flags(estimate.model)
    notes = unexpressed(estimate)
    lines = [f"# {TARGET_VERSIONS['megatron']}: {plan_caption(estimate)}",
             f"# flag names: {SOURCES[0]}",
             "# multi-node: add --node-rank/--master-addr/--master-port to torchrun; add your data, tokenizer, "
             "optimizer and checkpoint flags",
             f"# tokenizer must give vocab_size={estimate.model.vocab_size} ({one_line(estimate.model.name)})"]
    lines += [f"# note: {note}" for note in notes]
    body = [launcher_prefix(estimate)] + [flag if value is None else f"{flag} {_quote(value)}"
                                          for flag, value in flags]
    text = "\n".join(lines) + "\n" + " \\\n    ".join(body) + "\n"
    return LaunchConfig(framework="megatron", text=text, unexpressed=tuple(notes), sources=SOURCES,
                        target=TARGET_VERSIONS["megatron"])


def _quote(value: str) -> str:
    """Shell-quote values with shell metacharacters (the --moe-layer-freq expression); a list flag's words
    (--recompute-modules a b) stay separate words."""
    if all(word.isidentifier() for word in value.split()):
        return value
    import shlex

    return shlex.quote(value)

