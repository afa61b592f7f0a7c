"""What every launch-config exporter shares: the result type, the layer split, and Megatron-Core's config names.

Megatron-Core's `TransformerConfig` / `ModelParallelConfig` field names (megatron/core/model_parallel_config.py,
megatron/core/transformer/transformer_config.py in NVIDIA/Megatron-LM) are what NeMo 2, Megatron-Bridge and verl's
Megatron backend all pass through, so they are computed once here (`mcore_parallel_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.plan import Plan, PlanArrays, Recompute, RecomputeModule, embedding_loss_slots
from costmodels.scoring import Estimate
from costmodels.specs import (CrossEntropyKernel, ExpertGemm, Fp8Recipe, LaunchPath, ModelSpec, MoEDispatcher,
                              TrainingSpec)
from costmodels.steptime import ep_a2a_overlap_applies


@dataclass(frozen=True)
class LaunchConfig:
    """One plan in one framework's own syntax.

    `text` is ready to paste (flags, overrides, YAML, TOML or JSON); where the syntax has comments, the knobs the
    framework cannot express are written into it as comments too. `unexpressed` lists them, one line each, for
    formats without comments (DeepSpeed's JSON) and for callers. `sources` names the upstream files the key names
    were taken from.
    """

    framework: str
    text: str
    unexpressed: tuple[str, ...]
    sources: tuple[str, ...]
    target: str = ""
    """The framework release the text is written for (export.capabilities.TARGET_VERSIONS), also in its header."""
    priced: "Estimate | None" = None
    """The estimate the text runs as priced: the one asked for, or, where the framework runs it only with another
    setting autopar chooses (export.capabilities.runnable_estimate), that setting's estimate; None = the one asked."""


def stage_layers(num_layers: int, plan: Plan) -> list[int]:
    """Decoder layers on each pipeline rank (all its virtual chunks together), first to last.

    Even split unless the plan names lighter first/last stages (Megatron --decoder-first/last-pipeline-num-layers).
    Assumes the `layers` rule holds (whole numbers); a remainder goes to the middle stages so the sum stays exact.
    """
    if plan.pp == 1:
        return [num_layers]
    if plan.layout:
        return [sum(plan.layout[rank::plan.pp]) for rank in range(plan.pp)]
    first = plan.first_stage_layers
    last = plan.last_stage_layers
    middle_count = plan.pp - (1 if first else 0) - (1 if last else 0)
    rest = num_layers - first - last
    base, extra = divmod(rest, middle_count) if middle_count else (0, 0)
    middle = [base + (1 if i < extra else 0) for i in range(middle_count)]
    return ([first] if first else []) + middle + ([last] if last else [])


def pipeline_slots(num_layers: int, plan: Plan) -> tuple[bool, bool]:
    """(embedding, loss): whether the plan's first (last) stage counts the embedding (loss) as a layer, Megatron-Core's
    --account-for-embedding/loss-in-pipeline-split (costmodels.plan.embedding_loss_slots)."""
    embedding, loss = embedding_loss_slots(num_layers, plan)
    return bool(embedding), bool(loss)


def chunk_layers_in_model_order(num_layers: int, plan: Plan) -> list[int]:
    """Layers of every (virtual) pipeline stage in model order: chunk 0 of ranks 0..pp-1, then chunk 1, ...

    This is Megatron-Core's interleaved assignment (each rank's layers, plus an embedding or loss slot, split evenly
    over its `vpp` chunks; the slot takes a layer's place in the first chunk of rank 0 or the last chunk of rank
    pp-1) and torchtitan's looped schedules' stage-to-rank mapping (stage i on rank i % pp).
    """
    if plan.layout:
        return list(plan.layout)
    per_rank = stage_layers(num_layers, plan)
    embedding, loss = pipeline_slots(num_layers, plan)
    slots = [0] * plan.pp
    slots[0] += embedding
    slots[-1] += loss
    chunks = []
    for chunk in range(plan.vpp):
        for rank in range(plan.pp):
            count = (per_rank[rank] + slots[rank]) // plan.vpp
            count -= (embedding and rank == 0 and chunk == 0) + (loss and rank == plan.pp - 1 and chunk == plan.vpp - 1)
            chunks.append(count)
    return chunks


def is_uneven(plan: Plan) -> bool:
    return plan.pp > 1 and bool(plan.first_stage_layers or plan.last_stage_layers) and not plan.layout


def gradient_accumulation_steps(estimate: Estimate) -> int:
    """Microbatches per optimizer step on each data-parallel rank: gbs / (dp·mbs)."""
    return int(round(estimate.num_microbatches))


def mcore_parallel_fields(plan: Plan, num_layers: int, moe: bool = True, num_mtp_layers: int = 0
                          ) -> dict[str, object]:
    """The plan in Megatron-Core config field names (None = leave the framework default).

    expert_*: only for MoE models (`moe`) or when the plan sets them.
    virtual_pipeline_model_parallel_size: None for plain 1F1B (Megatron stores None, not 1).
    num_layers_in_first/last_pipeline_stage: Megatron-Core TransformerConfig (uneven pipeline split);
    account_for_embedding/loss_in_pipeline_split (True, else None) instead, for a plan whose end stages count the
    embedding or loss as a layer (`pipeline_slots`); pipeline_model_parallel_layout (its string) instead of all of
    them for a plan with a layout.
    recompute_*: TransformerConfig; full recompute of every layer is method 'uniform' with 1 layer per unit,
    partial full recompute (recompute_layers = k) is method 'block' with k layers per (virtual) stage.
    """
    fields: dict[str, object] = {
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
        "context_parallel_size": plan.cp,
        "sequence_parallel": plan.sp,
        "expert_model_parallel_size": plan.ep,
        "expert_tensor_parallel_size": plan.etp,
        "num_layers_in_first_pipeline_stage": (plan.first_stage_layers or None) if is_uneven(plan) else None,
        "num_layers_in_last_pipeline_stage": (plan.last_stage_layers or None) if is_uneven(plan) else None,
    }
    embedding, loss = pipeline_slots(num_layers, plan)
    fields.update(account_for_embedding_in_pipeline_split=embedding or None,
                  account_for_loss_in_pipeline_split=loss or None)
    if embedding or loss:   # the slot split excludes explicit end stages (Megatron-Core asserts so)
        fields.update(num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None)
    if plan.layout:         # pipeline_model_parallel_layout replaces every other split field (TransformerConfig)
        from autopar.megatron_args import format_megatron_layout

        fields.update(num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
                      account_for_embedding_in_pipeline_split=None, account_for_loss_in_pipeline_split=None,
                      pipeline_model_parallel_layout=format_megatron_layout(plan.layout, num_mtp_layers))
    if not moe and plan.ep == 1 and plan.etp == plan.tp:
        del fields["expert_model_parallel_size"], fields["expert_tensor_parallel_size"]
    fields.update(mcore_recompute_fields(plan))
    return fields


def mcore_recompute_fields(plan: Plan) -> dict[str, object]:
    """TransformerConfig's recompute fields; recompute_modules (a list of module names) only when the plan's set is
    not Megatron-Core's default ['core_attn']."""
    modules = RecomputeModule.names(plan.recompute_modules) if plan.recompute_modules else None
    if plan.recompute is Recompute.SELECTIVE:
        return {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None,
                "recompute_modules": modules}
    none = {"recompute_modules": None}
    if plan.recompute is Recompute.FULL:
        if plan.recompute_layers:
            return {"recompute_granularity": "full", "recompute_method": "block",
                    "recompute_num_layers": plan.recompute_layers, **none}
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1, **none}
    return {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None, **none}


def mcore_moe_fields(estimate: Estimate) -> dict[str, object]:
    """Megatron-Core MoE fields every MoE plan gets: moe_grouped_gemm, the grouped expert GEMM Megatron's MoE recipes
    use, and which Megatron-Core requires for recompute_modules 'moe_act' (TransformerConfig.__post_init__: 'moe_act
    in recompute_modules is only supported with moe_grouped_gemm'); and the token dispatcher the step time priced
    (`moe_dispatcher_fields`)."""
    return {"moe_grouped_gemm": True, **moe_dispatcher_fields(estimate), **moe_capacity_fields(estimate)} \
        if estimate.model.is_moe else {}


def moe_capacity_fields(estimate: Estimate) -> dict[str, float]:
    """TransformerConfig.moe_expert_capacity_factor for TrainingSpec.moe_capacity_factor (None: Megatron-Core's
    dropless default, not written). Megatron-Core accepts it with its default aux_loss balancing (and with
    seq_aux_loss, global_aux_loss or none; not with sinkhorn or quantile balancing, which no export writes) and
    drops, without padding, what exceeds an expert's capacity: the cap the step time priced."""
    capacity = estimate.training.moe_capacity_factor
    return {"moe_expert_capacity_factor": capacity} if estimate.model.is_moe and capacity is not None else {}


def mcore_router_fields(model: ModelSpec) -> dict[str, object]:
    """Megatron-Core TransformerConfig router fields of the model's RouterSpec, where they differ from Megatron-Core's
    defaults (softmax over the top-k logits, no bias, no groups, no scaling, weights on the expert output):
    moe_router_score_function, moe_router_pre_softmax, moe_router_enable_expert_bias, moe_router_num_groups /
    moe_router_group_topk, moe_router_topk_scaling_factor, moe_apply_probs_on_input. A softmax router at top-1 gets
    pre-softmax in any case: Megatron-Core refuses the alternative, a softmax over one logit ('Please use
    --moe-router-pre-softmax when topk is 1', TransformerConfig.__post_init__; `router_note` says so)."""
    if model.moe is None:
        return {}
    router, fields = model.moe.router, {}
    if router.score_function != "softmax":
        fields["moe_router_score_function"] = router.score_function
    elif router.pre_softmax or model.moe.top_k == 1:
        fields["moe_router_pre_softmax"] = True
    if router.expert_bias:
        fields["moe_router_enable_expert_bias"] = True
    if router.num_groups:
        fields.update(moe_router_num_groups=router.num_groups, moe_router_group_topk=router.group_topk)
    if router.topk_scaling_factor != 1.0:
        fields["moe_router_topk_scaling_factor"] = router.topk_scaling_factor
    if router.probs_on_input:
        fields["moe_apply_probs_on_input"] = True
    return fields


def router_note(model: ModelSpec) -> list[str]:
    """The routers Megatron-Core cannot build as the model has them (megatron/core/transformer/moe/moe_utils.py
    topk_routing_with_score_function, group_limited_topk): softmax at top-1 without pre-softmax, sigmoid scores left
    unnormalised at top-k > 1 (Megatron renormalises them), groups scored by their best expert (Megatron sums the
    top top_k / group_topk of each group)."""
    moe = model.moe
    if moe is None:
        return []
    router, notes = moe.router, []
    if moe.top_k == 1 and router.score_function == "softmax" and not router.pre_softmax:
        notes.append("a softmax router at top-1 weights its expert by 1 (a softmax over one logit), which Megatron-Core "
                     "refuses; written as --moe-router-pre-softmax, the expert's softmax probability over all experts")
    if moe.top_k > 1 and router.score_function != "softmax" and not router.renormalised:
        notes.append(f"the {router.score_function} router keeps its top-{moe.top_k} weights unnormalised "
                     "(norm_topk_prob false); Megatron-Core renormalises them to sum to 1")
    if router.num_groups and router.group_by_max:
        notes.append("group-limited routing scores each group by its best expert (group_limited_greedy); "
                     f"Megatron-Core scores it by the sum of its top {max(moe.top_k // router.group_topk, 1)}")
    return notes


def moe_dispatcher_fields(estimate: Estimate) -> dict[str, str]:
    """TransformerConfig.moe_token_dispatcher_type (and moe_flex_dispatcher_backend) for TrainingSpec.moe_dispatcher:
    written always, since Megatron-Core's default is 'allgather', which the step time does not price and which
    --overlap-moe-expert-parallel-comm rejects ('overlap_moe_expert_parallel_comm is supported with alltoall/flex
    token dispatcher'). DeepEP runs under the flex dispatcher with its deepep backend, which Megatron-Core builds only
    over more than one GPU ('DeepEP dispatcher requires TPxEP > 1', MoEFlexTokenDispatcher, over the expert TP × EP
    group): with ep·etp = 1 no token leaves the GPU, both dispatchers cost nothing, and alltoall is written."""
    plan = estimate.plan
    if estimate.training.moe_dispatcher is MoEDispatcher.DEEPEP and plan.ep * plan.etp > 1:
        return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}
    return {"moe_token_dispatcher_type": "alltoall"}


def data_parallel_overlap(estimate: Estimate) -> dict[str, bool]:
    """Megatron-Core DistributedDataParallelConfig switches as the user set them for the step time
    (TrainingSpec.overlap_grad_reduce / overlap_param_gather; costmodels/steptime.py dp_comm_s). Both are off by
    default in Megatron-LM (megatron/training/arguments.py `--overlap-grad-reduce`, `--overlap-param-gather`).

    overlap_grad_reduce: written only where gradients are reduced over a data-parallel group (dense over dp·cp,
    experts over edp). overlap_param_gather: only with the distributed optimizer or Megatron-FSDP (zero >= 1), and
    only together with overlap_grad_reduce: validate_args asserts both ('--overlap-param-gather only supported with
    distributed optimizer or megatron fsdp', 'Must use --overlap-param-gather with --overlap-grad-reduce').
    """
    plan, num_gpus, training = estimate.plan, estimate.cluster.num_gpus, estimate.training
    reduces = plan.dp(num_gpus) * plan.cp > 1 or (estimate.model.is_moe and plan.edp(num_gpus) > 1)
    grad = reduces and training.overlap_grad_reduce
    return {"overlap_grad_reduce": grad, "overlap_param_gather": grad and plan.zero >= 1
            and training.overlap_param_gather}


def gradient_reduce_dtype(estimate: Estimate) -> dict[str, bool]:
    """Megatron-Core DistributedDataParallelConfig.grad_reduce_in_fp32 as the memory and the data-parallel reduce
    were priced (TrainingSpec.grad_reduce_in_fp32: the gradient buffer's dtype and the collectives' bytes)."""
    return {"grad_reduce_in_fp32": estimate.training.grad_reduce_in_fp32}


def model_parallel_overlap(estimate: Estimate) -> dict[str, bool]:
    """Megatron-Core ModelParallelConfig overlap switches as the user set them for the step time:
    tp_comm_overlap (needs sequence parallelism and tp > 1: Megatron asserts 'Tensor parallel communication/GEMM
    overlap can happen only when sequence parallelism is enabled') and overlap_moe_expert_parallel_comm where
    Megatron-Core's TransformerConfig runs it and the step time priced it (costmodels.steptime.ep_a2a_overlap_applies:
    expert parallelism, an interleaved pipeline if any, no full recompute, 'moe' not recomputed, at most one MTP
    layer)."""
    plan, training = estimate.plan, estimate.training
    a2a = bool(ep_a2a_overlap_applies(estimate.model, training, PlanArrays.from_plans([plan]))[0])
    return {"tp_comm_overlap": training.tp_comm_overlap and plan.sp and plan.tp > 1,
            "overlap_moe_expert_parallel_comm": a2a}


def pipeline_p2p_overlap(estimate: Estimate) -> dict[str, bool]:
    """Megatron-Core ModelParallelConfig P2P switches of the interleaved schedule as the step time priced them
    (TrainingSpec.overlap_p2p_comm; costmodels.pipeline.p2p_transfer_counts): overlap_p2p_comm, and batch_p2p_comm
    as its opposite (schedules.py raises 'Can not use both overlap_p2p_comm and batch_p2p_comm'; Megatron-LM's
    arguments.py derives batch_p2p_comm = not overlap_p2p_comm). Empty without interleaving: Megatron-LM turns the
    overlap off there ('non-interleaved schedule does not support overlapping p2p communication')."""
    plan = estimate.plan
    if plan.pp <= 1 or plan.vpp <= 1:
        return {}
    overlap = estimate.training.overlap_p2p_comm
    return {"overlap_p2p_comm": overlap, "batch_p2p_comm": not overlap}


def loss_fusion(estimate: Estimate) -> dict[str, bool]:
    """ModelParallelConfig.cross_entropy_loss_fusion as the step time priced the loss (TrainingSpec.cross_entropy,
    costmodels.compute.LOSS_BYTES_PER_LOGIT): Megatron-LM leaves it off unless asked (--cross-entropy-loss-fusion),
    Megatron-Bridge's GPTModelProvider and NeMo 2's GPTConfig turn it on; written either way so the launched job
    runs the kernels the estimate assumed. Megatron-Core has no xentropy kernel: its fused loss is the nearest
    (`loss_kernel_note` says so)."""
    return {"cross_entropy_loss_fusion": estimate.training.cross_entropy is not CrossEntropyKernel.UNFUSED}


def mcore_cuda_graph_fields(training: TrainingSpec) -> dict[str, object]:
    """Megatron-Core's CUDA-graph fields as the step time priced the launches (TrainingSpec.launch).

    An eager estimate is written with cuda_graph_impl none: recipes turn graphs on by themselves (Megatron-Bridge
    0.6.2's qwen3_30b_a3b_pretrain_config: transformer_engine over moe_router and moe_preprocess), which the estimate
    did not price, and TransformerConfig.__post_init__ refuses full recompute under per-layer graphs ('full recompute
    is only supported with full iteration CUDA graph'). A cuda_graph estimate is written as transformer_engine with
    the captured modules (an empty list captures the whole layer), or as local where the estimate priced
    Megatron-Core's own capture path (TrainingSpec.cuda_graph_impl: the two capture the same modules and replay
    them alike, and differ in the static inputs they keep); Megatron-Bridge runs scoped capture with
    transformer_engine only (megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration). A
    whole-iteration capture (TrainingSpec.cuda_graph_full_iteration) is full_iteration, with no modules."""
    if training.launch is not LaunchPath.CUDA_GRAPH:
        return {"cuda_graph_impl": "none", "cuda_graph_modules": None}
    if training.cuda_graph_full_iteration:
        return {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": []}
    return {"cuda_graph_impl": training.cuda_graph_impl, "cuda_graph_modules": list(training.cuda_graph_modules)}


def mcore_offload_fields(training: TrainingSpec) -> dict[str, object]:
    """Megatron-Core's fine-grained activation offloading as the memory was priced (TrainingSpec.offload_modules):
    TransformerConfig's fine_grained_activation_offloading and offload_modules; empty when nothing is offloaded
    (the default, written only when priced, so that a recipe's own choice stands otherwise)."""
    if not training.offload_modules:
        return {}
    fields: dict[str, object] = {"fine_grained_activation_offloading": True,
                                 "offload_modules": list(training.offload_modules)}
    if training.offload_fraction != 1.0:
        fields["activation_offload_fraction"] = training.offload_fraction
    return fields


def expert_gemm_note(estimate: Estimate, runs: ExpertGemm, how: str) -> list[str]:
    """A MoE estimate's expert GEMMs (TrainingSpec.expert_gemm), where the target framework runs them as `runs`
    (`how` says with what)."""
    priced = estimate.training.expert_gemm
    if not estimate.model.is_moe or priced is runs:
        return []
    return [f"expert_gemm {priced.value}: {how}, which this estimate did not price; estimate again with "
            f"--expert-gemm {runs.value} for this framework"]


MEGATRON_EXPERT_GEMM = (ExpertGemm.CUBLAS, "Megatron-Core runs a cuBLAS GEMM per expert (TEGroupedMLP -> Transformer "
                                           "Engine's GroupedLinear, nvte_multi_stream_cublas_gemm)")
"""What every Megatron-Core export (Megatron-LM, NeMo, Megatron-Bridge, verl) runs the experts' GEMMs as."""


NEMO_FP8_PRESETS = {"delayed": "bf16_with_fp8_mixed", "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                    "blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed"}
"""NeMo 2's precision plugin for each fp8 recipe (nemo/collections/llm/recipes/precision/mixed_precision.py; the
subchannel one, 1x128 / 128x128 blocks, in later NeMo 2 releases, as scripts/performance imports it). All but the
subchannel one keep fp8 parameters (fp8_param_gather; MXFP8's with reuse_grad_buf_for_mxfp8_param_ag since
NVIDIA/NeMo#14445, nemo-toolkit 2.7.3): the export writes both as priced over the preset (`fp8_param_fields`)."""
NEMO_PRECISION_MODULE = "nemo.collections.llm.recipes.precision.mixed_precision"
"""Where NeMo 2's precision presets live. Only bf16_mixed and fp16_mixed are NeMo-Run CLI factories there
(@run.cli.factory, nemo-toolkit 2.7.3); the fp8 presets are plain functions, which NeMo-Run's CLI parser finds by
their dotted import path only (nemo_run/cli/cli_parser.py parse_factory: 'No matching factory found' for a bare
name that is not registered), so the NeMo export names them by it."""
BRIDGE_FP8_PRESETS = {"delayed": "bf16_with_fp8_delayed_scaling_mixed",
                      "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                      "blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed"}
"""Megatron-Bridge's mixed-precision preset for each fp8 recipe (src/megatron/bridge/training/mixed_precision.py:
each sets fp8_recipe to the recipe). All but the subchannel one keep fp8 parameters (fp8_param_gather; MXFP8's with
reuse_grad_buf_for_mxfp8_param_ag); the export names the preset where that is what the estimate priced
(export.nemo.bridge_mixed_precision)."""


def fp8_param_fields(estimate: Estimate) -> dict[str, bool]:
    """Megatron-Core's fp8-parameter switches as the estimate priced them (TrainingSpec.fp8_param_gather); empty in
    bf16, where every framework's default (off) is what was priced.

    fp8_param_gather: TransformerConfig.fp8_param (the weights built as Transformer Engine fp8 tensors) and
    DistributedDataParallelConfig.fp8_param_gather (the distributed optimizer's fp8 parameter buffer), which
    Megatron-LM's --fp8-param-gather sets together (training/argument_utils.py `kw_args['fp8_param'] =
    args.fp8_param_gather`) and NeMo's and Megatron-Bridge's precision configs keep equal.
    reuse_grad_buf_for_mxfp8_param_ag (MXFP8 only; DistributedDataParallelConfig and OptimizerConfig): with fp8
    parameters under the distributed optimizer (zero <= 1), MXFP8 weights are all-gathered in bf16 through the
    gradient buffer, as the estimate prices them (TrainingSpec.param_gather_bytes_by_zero); Megatron-Bridge asserts
    it there (training/config.py: "When fp8_param_gather=True and fp8_recipe='mxfp8',
    reuse_grad_buf_for_mxfp8_param_ag must be set to True"), DistributedDataParallelConfig refuses it without fp8
    parameters ('Reuse grad buffer only when keeping params in MXFP8.'), and Megatron-FSDP (zero >= 2) has no such
    buffer (Megatron-LM's validate_args and Bridge's config turn it off there)."""
    recipe = estimate.training.fp8_scaling
    if recipe is None:
        return {}
    on = estimate.training.fp8_param_gather
    fields = {"fp8_param_gather": on}
    if recipe is Fp8Recipe.MXFP8:
        fields["reuse_grad_buf_for_mxfp8_param_ag"] = on and estimate.plan.zero <= 1
    return fields


def fp8_preset_notes(estimate: Estimate) -> list[str]:
    """What NeMo's and Megatron-Bridge's fp8 presets change beside the recipe, which the estimate does not price:
    current scaling keeps the first and last layer in bf16 (first_last_layers_bf16, one layer each). Its
    fp8_param_gather is written as priced (`fp8_param_fields`), so it needs no note."""
    if estimate.training.fp8_scaling is not Fp8Recipe.TENSORWISE:
        return []
    return ["the current-scaling preset keeps the first and the last transformer layer in bf16 "
            "(first_last_layers_bf16); the estimate priced every layer in fp8"]


def tightest_stage_gib(estimate: Estimate, *terms: str) -> float:
    """The named memory terms of the estimate's tightest stage, GiB (0 for a term it does not have)."""
    stage = estimate.stages[estimate.worst_stage].terms_bytes
    return sum(stage.get(term, 0.0) for term in terms) / 2**30


def fp8_weight_copies_gib(estimate: Estimate) -> float:
    """The fp8 weight copies Transformer Engine keeps beside bf16 weights (memory term fp8_weight_copies) on the
    estimate's tightest stage, GiB; 0 in bf16."""
    return tightest_stage_gib(estimate, "fp8_weight_copies")


def fp8_weight_copies_note(estimate: Estimate, how: str) -> list[str]:
    """For a framework that keeps no fp8 weight copies (`how` says why): what the estimate counts of them."""
    copies = fp8_weight_copies_gib(estimate)
    if copies == 0.0:
        return []
    return [f"the estimate counts Transformer Engine's fp8 copies of the weights ({copies:.1f} GiB per GPU on the "
            f"tightest stage, as Megatron-Core keeps them), which {how}: less memory than estimated"]


def loss_kernel_note(estimate: Estimate) -> list[str]:
    """The loss kernel the estimate priced, where Megatron-Core cannot run it."""
    if estimate.training.cross_entropy is not CrossEntropyKernel.XENTROPY:
        return []
    return ["cross_entropy xentropy: not a Megatron-Core loss kernel; the job runs Megatron's fused cross entropy "
            "(--cross-entropy-loss-fusion), which moves more bytes per logit than this estimate priced"]


ATTENTION_BACKEND_OF_KERNEL = {"fa2": "flash", "fa3": "flash", "cudnn": "fused"}
"""TrainingSpec.attention_kernel -> Megatron-Core's AttnBackend (megatron/core/transformer/enums.py: flash, fused,
unfused, local, auto; TransformerConfig.attention_backend, --attention-backend): `flash` is TE's FlashAttention
(the FlashAttention version installed), `fused` TE's cuDNN FusedAttention."""


def megatron_attention_backend(estimate: Estimate) -> str | None:
    """The --attention-backend value the step time assumed; None for `auto` (Megatron-Core's default, nothing to
    write); `unfused` without flash attention (TE's UnfusedDotProductAttention keeps the score matrix)."""
    training = estimate.training
    if not training.flash_attention:
        return "unfused"
    return ATTENTION_BACKEND_OF_KERNEL.get(training.attention_kernel.value)


def flash_version_note(estimate: Estimate) -> list[str]:
    """--attention-backend flash does not say which FlashAttention: TE takes FlashAttention-3 on sm90 when
    flash_attn_3 is installed, else FlashAttention-2 (TE dot_product_attention/utils.py get_attention_backend).
    FlashAttention v1 and FlashAttention in Triton are no Transformer Engine backend: the job runs TE's choice."""
    kernel = estimate.training.attention_kernel.value
    if estimate.training.flash_attention and kernel in ("fa1", "fa_triton"):
        return [f"attention_kernel {kernel}: not a Transformer Engine attention backend; the job runs TE's default "
                f"(--attention-backend auto), faster than this estimate priced the attention core"]
    if not estimate.training.flash_attention or kernel not in ("fa2", "fa3"):
        return []
    return [f"attention_kernel {kernel}: install {'flash_attn_3 (Hopper)' if kernel == 'fa3' else 'flash-attn 2 only'}"
            f" so Transformer Engine's flash backend runs FlashAttention-{kernel[-1]}"]


def plan_caption(estimate: Estimate) -> str:
    """One line naming the model, the cluster and the plan, for the first comment of every config."""
    cluster = estimate.cluster
    return (f"autopar plan '{estimate.plan.short()}' for {one_line(estimate.model.name)} on {cluster.num_gpus}x "
            f"{cluster.profile.display_name} (dp={estimate.dp}, {gradient_accumulation_steps(estimate)} "
            f"microbatches per step)")


def one_line(text: str) -> str:
    """User-typed text (a model name) inside a one-line comment: no line breaks can end the comment early."""
    return " ".join(str(text).split())


def shell_word(text: str) -> str:
    """`text` as one shell word for an override pasted after a command: in double quotes where nothing inside is
    special to them (a list's brackets would glob, a layout's '(' and '|' would not parse), else shlex's quoting."""
    if not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    import shlex

    return shlex.quote(text)


def preset_name(model: ModelSpec) -> str:
    """The bundled preset a model spec was read from ('' for a config.json or Hugging Face id): ModelSpec.source
    is 'preset NAME' for those (autopar.models.load_preset)."""
    source = str(model.source)
    return source[len("preset "):] if source.startswith("preset ") else ""


def hf_model_source(model: ModelSpec) -> str:
    """What a framework reads the model's Hugging Face config.json from (Megatron-Bridge's
    AutoBridge.from_hf_pretrained, verl's actor_rollout_ref.model.path): a preset's `_name_or_path` (the Hugging
    Face id its config.json was taken from), the folder of a config.json path, else the Hugging Face id given."""
    import json
    import os

    name = preset_name(model)
    if name:
        from autopar.models import PRESETS_DIR

        config = json.loads((PRESETS_DIR / f"{name}.json").read_text())
        return str(config.get("_name_or_path") or name)
    source = str(model.source)
    if os.path.isfile(source):
        return os.path.dirname(os.path.abspath(source))
    return source
