"""What each engine launches from the host for one layer, by launch path, and where it makes the host wait.

costmodels.host prices a launch by its path (HostCosts) and turns launches and synchronisations into GPU idle time;
this module counts them, per engine (specs.Engine), per launch path (specs.LaunchPath), per layer and pass, as the
engines' own code issues them. The counts were read from the engines' sources (pinned below) and, for the eager
PyTorch models, counted by a dispatch-mode op counter on torch 2.13 (one forward and one backward, views and
allocations left out); each table cites where its numbers come from.

    Megatron-Core core_v0.19.0 (5be96267) with Transformer Engine v2.17.1 (4329ff84), the TE it pins
    torchtitan v0.2.2 (73a0e697); DeepSpeed v0.19.5 (cf443004) and, for ZeRO-3 as released in 2021, v0.3.13-v0.5.10
    nanoGPT master (3adf61e1); Hugging Face transformers 5.25.0; torch 2.13.0; llm.c f1e2ace6

Launch paths (`Launches` fields; `Launches.host_s` prices them with HostCosts):

    aten_op      an eager ATen op (or a C++ extension op: TE's tex.*, a fused-RoPE autograd Function) from Python,
                 or a backward op the autograd engine dispatches
    aten_gemm    an eager matmul / linear from Python (cuBLAS handle, heuristic, launch)
    te_module    one Transformer Engine module call (its Python prologue, autograd Function, and its GEMM or norm
                 launch): TE_MODULE_TO_TORCH_LINEAR torch linears (TE issue #2053)
    cublas       a further cuBLAS GEMM one C++ op launches (TE GroupedLinear's per-expert GEMMs, a TE linear's second
                 backward GEMM, llm.c's matmuls): the GEMM's own host work, what a torch.matmul costs beyond a
                 torch.add, plus a raw launch
    launch       a further kernel one C++ op launches (TE's norm and cuDNN kernels, llm.c's kernels)
    triton       a Triton kernel launched from Python (Inductor's wrapper, TE's Triton permutation kernels)
    compiled     entering a torch.compile'd graph (guards, generated wrapper), its kernels counted apart
    graph_replay, graph_node   a CUDA-graph replay and its kernel nodes
    collective   a torch.distributed collective from Python (one dispatch, one NCCL launch)
    dtensor      an operator on DTensor arguments (eager tensor parallelism through torch.distributed.tensor):
                 DTensor's dispatch before the operator's own launch, host time only (dtensor_dispatches)
    zero3_hook   DeepSpeed ZeRO-3's module hooks: their Python per hooked module and fetched parameter, in eager
                 operators (ZERO3_HOOK_TO_ATEN_OP), host time only (the kernels they launch are counted apart)
    model_python an eager model's own host work around the kernels it launches (its modules' Python, the views
                 between kernels, the autograd graph; in the backward the autograd engine's per node), in eager
                 operators (EAGER_MODEL_PYTHON_TO_ATEN_OP), host time only (`eager_model_python`)

A layer's pieces (`LayerLaunches`): the dense layer's forward and backward; a MoE layer's forward split at the
dispatcher's host synchronisation (`moe_pre_fwd` up to it, `moe_post_fwd` after), its backward; the embedding
(`head`) and the final norm, output layer and loss (`tail`); and the synchronisations: per MoE layer forward, per
micro-batch on the last stage, at every stage-to-stage transfer, per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from costmodels.errors import InputError
from costmodels.host import DEFAULT_HOST_COSTS_US, HostCosts
from costmodels.params import stage_params_per_gpu
from costmodels.plan import PlanArrays, Recompute, RecomputeModule, data_parallel_size, recomputes_module
from costmodels.specs import (CrossEntropyKernel, Engine, ExpertGemm, LaunchPath, MlpKind, ModelSpec, MoEDispatcher,
                              NormKind, PositionEmbedding, TrainingSpec)

TE_MODULE_TO_TORCH_LINEAR = 99.66 / 37.08
"""Host time of one Transformer Engine module call in torch linears: TE issue #2053 ('High CPU overhead on Grace
systems', 2025-08) timed te.Linear's bf16 forward at 99.66 µs of CPU per call against 37.08 µs for torch's linear
on GB200, 90.53 against 33.17 µs on GH200 (2.69 and 2.73 times); the TE prologue (quantizer setup, fp8 meta, NVTX,
autograd Function) is Python work that scales like the torch call it wraps. A TE maintainer wrote in 2026-01 (issue
#2126) that the gap had 'greatly reduced' since; no newer figure is published, so the measured ratio is used."""


DTENSOR_DISPATCH_TO_ATEN_OP = 0.95
"""Host time of DTensor's dispatch of one operator, beyond the operator's own, in eager operators
(host.aten_op_us): benchmarks/dtensor_dispatch.py on torch 2.13.0 (the CPU build, this project's Xeon machines) times
detach, add, mul, mm and silu on DTensors against plain tensors, 6.7-7.8 µs more a call over five runs (the median of
the five operators each run; the median run 7.0 µs; the kernel is the same, so the difference is the dispatch: the
C++ fast path, the cached sharding propagation, unwrapping and rewrapping), over the profile's fitted eager operator,
7.35 µs. It is host Python and C++, which the same class of server CPU runs at about the same speed. (PyTorch's own
detach benchmark gave 24-26 µs against a plain tensor's 4.8 µs in 2025-10, pytorch#166371 and #160580, before later
fast-path work.)"""

MEASURED_ATEN_OP_US = DEFAULT_HOST_COSTS_US["aten_op_us"]
"""The eager operator the host microbenchmarks give (7.352 µs): the unit host measurements of this machine's CPU are
carried over in (DTENSOR_DISPATCH_TO_ATEN_OP, ZERO3_HOOK_TO_ATEN_OP, ZERO3_STEP_TO_ATEN_OP,
EAGER_MODEL_PYTHON_TO_ATEN_OP)."""

EAGER_MODEL_PYTHON_TO_ATEN_OP = {"fwd": 6.20 / MEASURED_ATEN_OP_US, "bwd": 2.65 / MEASURED_ATEN_OP_US}
"""Host time an eager model adds to each kernel it launches, per pass, in eager operators (host.aten_op_us, 7.352
µs): benchmarks/eager_model_host.py on torch 2.13.0 (the CPU build, this project's Xeon machines) times nanoGPT's
Block and Hugging Face's LlamaDecoderLayer at weights too small for the kernels to matter, forward with gradients
and backward per layer, against the same pass's kernel operators replayed bare (the same arguments, no module, no
autograd): 6.52 and 5.88 µs more per kernel forward (the median 6.20), 3.09 and 2.22 backward (2.65). The forward's
part is the modules' Python, the views and reshapes between kernels and the autograd graph it records; the
backward's the autograd engine's work per node. The host profile's eager operator is a bare `torch.add` in a loop
(FlagGems #4558: 7.1 µs on A100), which has none of it. Python and C++ on the host, which the same class of server
CPU runs at about the same speed."""

ZERO3_HOOK_TO_ATEN_OP = {"fwd": (184.2 / MEASURED_ATEN_OP_US, 33.3 / MEASURED_ATEN_OP_US),
                         "bwd": (136.2 / MEASURED_ATEN_OP_US, 113.0 / MEASURED_ATEN_OP_US)}
"""Host time of DeepSpeed ZeRO-3's hooks per pass, as (per hooked module, per fetched parameter) in eager operators
(host.aten_op_us, 7.352 µs): benchmarks/deepspeed_zero3_host.py on DeepSpeed 0.19.8 (the CPU accelerator, one gloo
rank, torch 2.13's CPU build, this project's Xeon machines) times forward and backward of models of small weights
under ZeRO-3 against plain PyTorch (one or four weights a module, every weight partitioned) and fits the extra time
per module whose forward runs and per parameter: forward 184.2 µs a module and 33.3 a parameter, backward 136.2 and
113.0 (the medians of three runs; no cost once a pass). On one rank DeepSpeed gathers nothing (a one-rank group takes
`_no_gather_coalesced`), so these are the hooks' Python without the fetch's own copies and collective, which
`_deepspeed_zero` prices as launches (the backward's copy of each gradient into the reduce bucket runs on the CPU
inside the figure, about a microsecond of it). The module part is the hooks on every submodule (the coordinator's
trace and prefetch bookkeeping, the autograd Functions wrapped around each module's outputs for its backward hooks:
parameter_offload.py, partitioned_param_coordinator.py); the parameter part the fetch's and release's bookkeeping
and, backward, the gradient's reduce bookkeeping per parameter (partition_parameters.py, stage3.py). Python on the
host, which the same class of server CPU runs at about the same speed; on a GPU the hooks also record and wait on
CUDA events, which the CPU accelerator skips, so these are lower bounds. (DeepSpeed PR #6694: 'the loop time is
excessively long in fine-grained module'.)"""

ZERO3_STEP_TO_ATEN_OP = (1458.0 / MEASURED_ATEN_OP_US, 22.0 / MEASURED_ATEN_OP_US)
"""Host time of DeepSpeed ZeRO-3's optimizer step beyond the optimizer's kernels, as (per step, per parameter tensor) in
eager operators: benchmarks/deepspeed_zero3_host.py (as ZERO3_HOOK_TO_ATEN_OP) times engine.step() against a plain
optimizer step and fits a fixed part and a part per parameter: 1458 µs a step and 22.0 a parameter (the medians of
three runs). The step walks every parameter of the partition (stage3.py `_post_step`,
`_reassign_or_swap_out_partitioned_parameters`, the gradients' release), Python per parameter on the host while the
GPU has only the few fused kernels over the flat fp32 partition."""


def _zero(n: int) -> np.ndarray:
    return np.zeros(n)


@dataclass(frozen=True)
class Launches:
    """Host launches by path (module docstring), each a count per plan (a float or an array)."""

    aten_op: "np.ndarray | float" = 0.0
    aten_gemm: "np.ndarray | float" = 0.0
    te_module: "np.ndarray | float" = 0.0
    cublas: "np.ndarray | float" = 0.0
    launch: "np.ndarray | float" = 0.0
    triton: "np.ndarray | float" = 0.0
    compiled: "np.ndarray | float" = 0.0
    graph_replay: "np.ndarray | float" = 0.0
    graph_node: "np.ndarray | float" = 0.0
    collective: "np.ndarray | float" = 0.0
    dtensor: "np.ndarray | float" = 0.0
    zero3_hook: "np.ndarray | float" = 0.0
    model_python: "np.ndarray | float" = 0.0

    def __add__(self, other: "Launches") -> "Launches":
        return Launches(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def times(self, count) -> "Launches":
        return Launches(**{f.name: getattr(self, f.name) * count for f in dataclasses.fields(self)})

    def where(self, mask, other: "Launches") -> "Launches":
        """Per plan: these launches where `mask`, `other`'s elsewhere."""
        return Launches(**{f.name: np.where(mask, getattr(self, f.name), getattr(other, f.name))
                           for f in dataclasses.fields(self)})

    @property
    def kernels(self):
        """GPU kernels these launches put on the GPU (a compiled-graph entry, a replay launch, DTensor's dispatch,
        ZeRO-3's hook Python and an eager model's own Python none of their own)."""
        return (self.aten_op + self.aten_gemm + self.te_module + self.cublas + self.launch + self.triton
                + self.graph_node + self.collective)

    def host_s(self, costs: HostCosts):
        """Host seconds to issue them (costmodels.host.HostCosts; TE modules and C++ GEMMs as derived above)."""
        te_module_s = TE_MODULE_TO_TORCH_LINEAR * costs.aten_gemm_s
        cublas_s = max(costs.aten_gemm_s - costs.aten_op_s, 0.0) + costs.launch_s
        return (self.aten_op * costs.aten_op_s + self.aten_gemm * costs.aten_gemm_s + self.te_module * te_module_s
                + self.cublas * cublas_s + self.launch * costs.launch_s + self.triton * costs.triton_launch_s
                + self.compiled * costs.compiled_call_s + self.graph_replay * costs.cuda_graph_replay_s
                + self.graph_node * costs.cuda_graph_node_s + self.collective * costs.aten_op_s
                + (self.dtensor * DTENSOR_DISPATCH_TO_ATEN_OP + self.zero3_hook + self.model_python)
                * costs.aten_op_s)

    def captured(self) -> "Launches":
        """These launches replayed as one CUDA graph: one replay, a node per kernel (Megatron-Core's captured
        modules; the Python that builds them runs once, at capture)."""
        return Launches(graph_replay=np.where(np.asarray(self.kernels) > 0, 1.0, 0.0), graph_node=self.kernels)


@dataclass(frozen=True)
class LayerLaunches:
    """One engine's launches per layer and pass (module docstring) and its host synchronisations."""

    dense_fwd: Launches
    dense_bwd: Launches
    moe_pre_fwd: Launches
    """A MoE layer's forward up to the dispatcher's host synchronisation (attention half, norm, router)."""
    moe_post_fwd: Launches
    """... after it (dispatch, experts, combine)."""
    moe_bwd: Launches
    head_fwd: Launches
    head_bwd: Launches
    tail_fwd: Launches
    tail_bwd: Launches
    dense_recompute: Launches
    """What selective recompute re-runs per dense layer in the backward (full recompute re-runs `dense_fwd`)."""
    moe_recompute: Launches
    dispatch_syncs: np.ndarray
    """Host synchronisations per MoE layer forward (a recomputed MoE forward repeats them)."""
    moe_recompute_syncs: np.ndarray
    """Of them, what selective recompute of the MoE module repeats per MoE layer in the backward."""
    loss_syncs: float
    """Per micro-batch, on the last stage, right after its forward."""
    transfer_syncs: np.ndarray
    """Whether every stage-to-stage transfer ends in a full device synchronisation (per plan)."""
    backward_end_syncs: "np.ndarray | float" = 0.0
    """Per micro-batch, at the end of its backward (per plan): DeepSpeed's ZeRO-3 epilogue."""


# ---- shapes of a layer the counts read ---------------------------------------------------------------------------

def _gated(model: ModelSpec) -> bool:
    return model.mlp is MlpKind.GATED


def _rotary(model: ModelSpec) -> bool:
    return model.position_embedding is PositionEmbedding.ROPE


def _gqa(model: ModelSpec) -> bool:
    return model.mla is None and model.num_kv_heads < model.num_attention_heads


def local_experts(model: ModelSpec, plans: PlanArrays) -> np.ndarray:
    return np.zeros(len(plans)) if model.moe is None else model.moe.num_experts / plans.ep.astype(float)


def _tp_collectives(plans: PlanArrays, with_sp: int, without_sp: int) -> np.ndarray:
    """Collectives of the tp group a block issues: `with_sp` under sequence parallelism, `without_sp` else, none at
    tp 1."""
    return np.where(plans.tp > 1, np.where(plans.sp, float(with_sp), float(without_sp)), 0.0)


# ---- DTensor: eager tensor parallelism in torchtitan and a plain PyTorch loop ----------------------------------------

def dtensor_dispatches(linears: float, norms: float, norm_params: float, consumer_adds: float, linear_bias: bool
                       ) -> tuple[float, float]:
    """(forward, backward) operators on DTensor arguments of one decoder layer under torchtitan's tensor-parallel plan
    (SequenceParallel norms, PrepareModuleInput before the attention and the MLP, ColwiseParallel / RowwiseParallel
    linears whose outputs are local tensors): forward, per linear its weight's transpose, the matmul and two views
    (4), per norm one (the fused kernel); backward, per linear two matmuls, four transposes and two views (8), a bias
    gradient's sum and view (2 more), per norm one, per parameter its gradient's accumulation, and a gradient sum per
    extra consumer of a DTensor input (q, k and v read the same input: 2; w1 and w3: 1). What is not a DTensor --
    the attention core between the projections, the residual adds on the layer's local input -- runs on plain
    tensors. benchmarks/dtensor_dispatch.py counts the same on torch 2.13 (tests/test_dtensor_dispatch.py)."""
    forward = 4.0 * linears + norms
    backward = 8.0 * linears + norms + linears * (2.0 if linear_bias else 1.0) + norm_params + consumer_adds \
        + (2.0 * linears if linear_bias else 0.0)
    return forward, backward


def layer_dtensor_dispatches(model: ModelSpec, separate_qkv: bool) -> tuple[float, float]:
    """`dtensor_dispatches` of one of the model's decoder layers: q, k, v and o (or a fused QKV and o) and the MLP's
    two or three linears, its two norms' parameters (a LayerNorm's weight and bias, an RMSNorm's weight)."""
    gated = _gated(model)
    linears = (4.0 if separate_qkv else 2.0) + (3.0 if gated else 2.0)
    consumer_adds = (2.0 if separate_qkv else 0.0) + (1.0 if gated else 0.0)
    return dtensor_dispatches(linears, 2.0, norm_params_per_layer(model), consumer_adds, model.linear_bias)


def _dtensor_moe(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> tuple[Launches, Launches]:
    """DTensor's dispatches a torchtitan MoE layer adds to its attention half's (`_dtensor_layer` scaled to it): under
    tensor parallelism the router's gate (NoParallel, a replicated DTensor weight) and the shared experts'
    three linears (ColwiseParallel / RowwiseParallel, their input read twice); with the experts sharded over EP or TP
    (DTensor weights), GroupedExperts' `to_local()` of its three weights each forward and their gradients back into
    DTensors (distributed/expert_parallel.py, models/moe/moe.py). Compiled: none."""
    assert model.moe is not None
    if training.launch is LaunchPath.COMPILE:
        return Launches(), Launches()
    router_fwd, router_bwd = dtensor_dispatches(1.0, 0.0, 0.0, 0.0, False)
    shared = bool(model.moe.num_shared_experts)
    shared_fwd, shared_bwd = dtensor_dispatches(3.0, 0.0, 0.0, 1.0, False) if shared else (0.0, 0.0)
    tp, sharded = plans.tp > 1, (plans.tp > 1) | (plans.ep > 1)
    forward = np.where(tp, router_fwd + shared_fwd, 0.0) + np.where(sharded, 3.0, 0.0)
    backward = np.where(tp, router_bwd + shared_bwd, 0.0) + np.where(sharded, 6.0, 0.0)
    return Launches(dtensor=forward), Launches(dtensor=backward)


def _dtensor_layer(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, separate_qkv: bool
                   ) -> tuple[Launches, Launches]:
    """DTensor's dispatches of one layer where eager tensor parallelism runs (tp > 1, not compiled: a compiled graph
    is traced through DTensor once and runs on plain tensors)."""
    if training.launch is LaunchPath.COMPILE:
        return Launches(), Launches()
    forward, backward = layer_dtensor_dispatches(model, separate_qkv)
    tp = plans.tp > 1
    return Launches(dtensor=np.where(tp, forward, 0.0)), Launches(dtensor=np.where(tp, backward, 0.0))



# ---- Megatron-Core + Transformer Engine ---------------------------------------------------------------------------
# Counts: Megatron-Core core_v0.19.0 TE spec (gpt_layer_specs.py get_gpt_layer_with_transformer_engine_submodules)
# with TE v2.17.1, bf16, as read from the sources (module docstring); the performance recipes' MoE fusions on
# (--moe-router-fusion, --moe-permute-fusion, --moe-grouped-gemm). Megatron's jit_fuser is torch.compile
# (megatron/core/jit.py), so its fused bias-dropout-add and activation functions are compiled calls of one Triton
# kernel each.

def _megatron_attention(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> tuple[Launches, Launches]:
    """(forward, backward) of the attention half of a layer: QKV LayerNormLinear (its norm kernel from C++), core
    attention, output projection, bias-dropout-add. Forward (transformer_layer.py, attention.py): the fused-RoPE
    tex kernel for q and k (rope_utils.py apply_rotary_pos_emb -> FusedRoPEFunc), the GQA query reshape copy
    (attention.py get_query_key_value_tensors) and TE's v.contiguous() (dot_product_attention/utils.py
    get_qkv_layout); TE DotProductAttention launches a seed kernel and cuDNN's SDPA (fused_attn_f16_arbitrary_seqlen.cu);
    SP all-gather before QKV and reduce-scatter after the projection (an all-reduce without SP). MLA: its five
    projections are TE linears. Backward: each TE Function's backward runs two GEMMs (dgrad, wgrad), the norm's
    backward two kernels, cuDNN's SDPA backward ~3, RoPE's backward 2, torch.split's backward a cat, a residual add,
    the DDP hook's add for the norm weight (distributed_data_parallel.py _make_backward_post_hook); SP: an
    all-gather of the output gradient, one of the saved norm output, a reduce-scatter of the input gradient."""
    n = len(plans)
    linears = 5.0 if model.mla is not None else 2.0
    rope = 2.0 if _rotary(model) else 0.0
    fused = training.flash_attention
    core_fwd = Launches(te_module=1.0, launch=2.0) if fused else \
        Launches(aten_gemm=2.0, aten_op=3.0)                # unfused: baddbmm, masked softmax, dropout, bmm
    core_bwd = Launches(te_module=1.0, launch=3.0) if fused else Launches(aten_gemm=4.0, aten_op=3.0)
    norm_weights = 2.0 if model.norm is NormKind.LAYERNORM else 1.0
    forward = Launches(te_module=linears, launch=1.0, aten_op=rope + (1.0 if _gqa(model) else 0.0) + 1.0,
                       compiled=1.0, triton=1.0, collective=_tp_collectives(plans, 2, 1)) + core_fwd
    backward = Launches(te_module=linears, cublas=linears, launch=2.0, aten_op=rope + 2.0 + norm_weights,
                        compiled=1.0, triton=1.0, collective=_tp_collectives(plans, 3, 1)) + core_bwd
    return forward + Launches(aten_op=_zero(n)), backward


def _megatron_dense_mlp(plans: PlanArrays) -> tuple[Launches, Launches]:
    """(forward, backward) of a dense MLP: fc1 LayerNormLinear (norm kernel from C++), the compiled activation
    (fused_bias_swiglu / bias_gelu), fc2 Linear, the compiled bias-dropout-add; SP gather and scatter (an
    all-reduce without SP). Backward: two GEMMs a linear, the norm's two kernels, the activation's compiled
    backward, a residual add and the norm weight's DDP add; SP: three collectives as in the attention half."""
    forward = Launches(te_module=2.0, launch=1.0, compiled=2.0, triton=2.0, collective=_tp_collectives(plans, 2, 1))
    backward = Launches(te_module=2.0, cublas=2.0, launch=2.0, aten_op=2.0, compiled=1.0, triton=1.0,
                        collective=_tp_collectives(plans, 3, 1))
    return forward, backward


def _megatron_moe_mlp(model: ModelSpec, training: TrainingSpec, plans: PlanArrays
                      ) -> tuple[Launches, Launches, Launches]:
    """(before the dispatch sync, after it, backward) of a MoE layer's MLP, alltoall dispatcher
    (moe/token_dispatcher.py MoEAlltoAllTokenDispatcher) or DeepEP (MoEFlexTokenDispatcher), experts in TE
    GroupedLinear (TEGroupedMLP).
    Before: the pre-MLP TENorm (a module of its own in MoE layers), the router GEMM (RouterGatingLinearFunction),
    the fused top-k (tex.fused_topk_with_score_function_fwd), the aux loss (scores, tokens-per-expert sum, loss
    kernels, auto-scaler; moe_utils.py), the dispatcher's preprocess (~6 ops, the all-gather of counts over tp x ep,
    3-5 non-blocking D2H copies) and TE's Triton permutation (4 kernels: make_row_id_map x3 + permute); shared
    experts run in line (an MLP of TE linears).
    After: the all-to-all of tokens and probs, the chunk sort (2 Triton kernels, > 1 local expert), GroupedLinear
    fc1 and fc2 (`_grouped_gemm_launches`), the compiled weighted SwiGLU, the chunk unsort, the all-to-all back,
    the unpermute, the compiled bias-dropout-add; etp > 1 adds an all-gather of tokens and probs and a
    reduce-scatter. DeepEP replaces the permutation and all-to-alls by its layout, notify and dispatch / combine
    kernels (fused_a2a.py).
    Backward: the grouped linears' dgrad and wgrad, the permutation and sort backwards, three all-to-alls, the
    router's two GEMMs and its DDP add, the aux-loss and top-k backwards, the norm's."""
    experts = local_experts(model, plans)
    sort = np.where(experts > 1, 2.0, 0.0)
    etp_collectives = np.where(plans.etp > 1, 2.0, 0.0)
    router = Launches(te_module=1.0, aten_gemm=1.0, aten_op=1.0 + 6.0, launch=1.0,
                      collective=np.where(plans.tp * plans.cp > 1, 1.0, 0.0))
    if training.moe_dispatcher is MoEDispatcher.DEEPEP:
        pre = router + Launches(aten_op=2.0, launch=1.0)
        dispatch, combine = Launches(launch=2.0), Launches(launch=1.0)
    else:
        pre = router + Launches(aten_op=6.0 + 4.0, triton=4.0,
                                collective=np.where(plans.tp * plans.ep > 1, 1.0, 0.0))
        dispatch, combine = Launches(collective=2.0, triton=sort), Launches(collective=1.0, triton=sort + 1.0)
    grouped_fwd, grouped_bwd = _grouped_gemm_launches(training, experts)
    post = dispatch + Launches(collective=etp_collectives, compiled=2.0, triton=2.0) + grouped_fwd + combine
    backward = grouped_bwd + Launches(triton=sort + 2.0, collective=3.0 + etp_collectives, compiled=1.0,
                                      aten_op=6.0 + 1.0 + 3.0, aten_gemm=2.0, te_module=1.0, launch=1.0)
    if model.moe is not None and model.moe.num_shared_experts:    # an MLP of TE linears, no norm or BDA of its own
        pre = pre + Launches(te_module=2.0, compiled=1.0, triton=1.0, collective=_tp_collectives(plans, 2, 1))
        backward = backward + Launches(te_module=2.0, cublas=2.0, compiled=1.0, triton=1.0,
                                       collective=_tp_collectives(plans, 3, 1))
    return pre, post, backward


def _grouped_gemm_launches(training: TrainingSpec, experts: np.ndarray) -> tuple[Launches, Launches]:
    """(forward, backward) launches of a MoE layer's two grouped linears over `experts` local experts. TE 2.17's
    GroupedLinear runs one cuBLASLt call per expert on four side streams (grouped_linear.py -> general_grouped_gemm
    -> multi_stream_cublas_gemm; the single grouped kernels are opt-in): a TE module call and n - 1 further cuBLAS
    GEMMs per linear forward, one and 2n - 1 backward (dgrad and wgrad per expert). ExpertGemm.GROUPED: one grouped
    kernel per GEMM."""
    if training.expert_gemm is ExpertGemm.GROUPED:
        return Launches(te_module=2.0), Launches(te_module=2.0, cublas=2.0)
    return (Launches(te_module=2.0, cublas=2.0 * np.maximum(experts - 1.0, 0.0)),
            Launches(te_module=2.0, cublas=np.maximum(4.0 * experts - 2.0, 0.0)))


def _megatron(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> LayerLaunches:
    n = len(plans)
    attention_fwd, attention_bwd = _megatron_attention(model, training, plans)
    mlp_fwd, mlp_bwd = _megatron_dense_mlp(plans)
    router_fwd, routed_fwd, moe_mlp_bwd = (_megatron_moe_mlp(model, training, plans) if model.moe is not None
                                           else (Launches(), Launches(), Launches()))
    dense_recompute, moe_recompute = _megatron_selective_recompute(training, plans, mlp_fwd, router_fwd, routed_fwd)
    if training.launch is LaunchPath.CUDA_GRAPH:
        attention_fwd, attention_bwd, mlp_fwd, mlp_bwd, router_fwd, routed_fwd, moe_mlp_bwd = _megatron_graphs(
            model, training, attention_fwd, attention_bwd, mlp_fwd, mlp_bwd, router_fwd, routed_fwd, moe_mlp_bwd)
    # embedding (+ its SP scatter / TP all-reduce); backward: the sort-based embedding backward, its DDP add
    head_fwd = Launches(aten_op=1.0, collective=np.where(plans.tp > 1, 1.0, 0.0))
    head_bwd = Launches(aten_op=3.0 + 1.0)
    # final TENorm, output layer (Megatron's ColumnParallelLinear, an autograd Function over cuBLAS), the loss
    # (fused: --cross-entropy-loss-fusion's compiled kernels; unfused: vocab-parallel cross entropy, ~8 ops and 3
    # all-reduces over tp), loss_func's masking and sums (pretrain_gpt.py)
    fused_loss = training.cross_entropy is not CrossEntropyKernel.UNFUSED
    loss_fwd = Launches(compiled=3.0, triton=3.0) if fused_loss else Launches(aten_op=8.0)
    tail_fwd = Launches(te_module=1.0, aten_gemm=1.0, aten_op=4.0,
                        collective=np.where(plans.tp > 1, 2.0 if fused_loss else 3.0, 0.0)) + loss_fwd
    tail_bwd = Launches(te_module=1.0, launch=1.0, aten_gemm=2.0, aten_op=1.0 + 3.0,
                        collective=np.where(plans.tp > 1, 1.0, 0.0))
    # token_dispatcher.py cuda_sync_point: one event.synchronize() per MoE forward, none under drop-and-pad; DeepEP:
    # the CPU spins on its host-mapped receive counters (buffer.hpp intranode_dispatch), then 3 data-dependent-size
    # ops in _indices_to_multihot (two boolean-mask indexings, repeat_interleave) on the default path
    if training.moe_dispatcher is MoEDispatcher.DEEPEP:
        dispatch_syncs = np.full(n, 4.0)
    else:
        dispatch_syncs = np.full(n, 0.0 if training.moe_pad_to_capacity else 1.0)
    return LayerLaunches(
        dense_fwd=attention_fwd + mlp_fwd, dense_bwd=attention_bwd + mlp_bwd,
        moe_pre_fwd=attention_fwd + router_fwd, moe_post_fwd=routed_fwd, moe_bwd=attention_bwd + moe_mlp_bwd,
        head_fwd=head_fwd, head_bwd=head_bwd, tail_fwd=tail_fwd, tail_bwd=tail_bwd,
        dense_recompute=dense_recompute, moe_recompute=moe_recompute, dispatch_syncs=dispatch_syncs,
        moe_recompute_syncs=np.where(recomputes_module(plans, RecomputeModule.MOE), dispatch_syncs, 0.0),
        # loss_func's validate_result(torch.isnan / torch.isinf) under the default rerun mode (pretrain_gpt.py,
        # rerun_state_machine.py): two bool() reads of a device tensor after each micro-batch's forward
        loss_syncs=2.0,
        # non-interleaved 1F1B: batch_p2p_comm with batch_p2p_sync (default) ends every _communicate in
        # torch.cuda.synchronize() (p2p_communication.py); the interleaved schedule with overlap_p2p_comm issues
        # isend/irecv and waits on the stream
        transfer_syncs=(plans.pp > 1) & ((plans.vpp == 1) | (not training.overlap_p2p_comm)),
    )


def _megatron_selective_recompute(training: TrainingSpec, plans: PlanArrays, mlp_fwd: Launches,
                                  router_fwd: Launches, routed_fwd: Launches) -> tuple[Launches, Launches]:
    """What --recompute-modules re-runs per layer in the backward (transformer_layer.py, attention.py
    _checkpointed_attention_forward, moe_layer.py): core_attn the TE core attention (v copy, seed, cuDNN), mlp the
    dense MLP, moe the whole MoE MLP (router, dispatch, experts, combine), moe_act the compiled activation,
    layernorm a norm module of its own (MoE layers' pre-MLP norm)."""
    def pick(module: RecomputeModule, launches: Launches) -> Launches:
        return launches.where(recomputes_module(plans, module), Launches())

    core = Launches(te_module=1.0, launch=2.0, aten_op=1.0) if training.flash_attention else         Launches(aten_gemm=2.0, aten_op=3.0)
    common = pick(RecomputeModule.CORE_ATTN, core)
    dense = common + pick(RecomputeModule.MLP, mlp_fwd)
    moe = common + pick(RecomputeModule.MOE, router_fwd + routed_fwd) \
        + pick(RecomputeModule.MOE_ACT, Launches(compiled=1.0, triton=1.0)) \
        + pick(RecomputeModule.LAYERNORM, Launches(te_module=1.0))
    return dense, moe


def _megatron_graphs(model: ModelSpec, training: TrainingSpec, attention_fwd, attention_bwd, mlp_fwd, mlp_bwd,
                     router_fwd, routed_fwd, moe_mlp_bwd):
    """The layer's pieces under --cuda-graph-impl with --cuda-graph-modules (Megatron-Core cuda_graphs.py; docs
    user-guide/features/cuda_graph.md): a captured module replays as one graph forward and one backward. 'attn' the
    attention half, 'mlp' a dense MLP, 'moe_router' + 'moe_preprocess' a MoE layer's norm, router, aux loss,
    dispatcher metadata and permutation (the dispatch's host sync stays, moved before the all-to-all), 'moe' the
    whole MoE MLP, which Megatron-Core allows per layer only under drop-and-pad (transformer_config.py
    __post_init__, for the local and transformer_engine impls); no module named = the whole layer. A
    whole-iteration capture has no such check, but captures no host synchronisation: the dropless dispatchers wait
    on the token counts (token_dispatcher.py _maybe_dtoh_and_synchronize), so its MoE needs drop-and-pad or
    HybridEP's static rank budget (--moe-expert-rank-capacity-factor), as Megatron-Bridge's whole-iteration MoE
    recipes run."""
    modules = set(training.cuda_graph_modules) or {"attn", "mlp", "moe"}
    if model.is_moe and training.cuda_graph_full_iteration and not training.moe_pad_to_capacity \
            and not (training.moe_hybridep and training.moe_rank_capacity_factor is not None):
        raise InputError("cuda_graph_full_iteration", "a whole-iteration CUDA graph of a MoE captures no host "
                                                      "synchronisation, and the dropless dispatchers wait on the "
                                                      "token counts: add --moe-expert-capacity-factor with "
                                                      "--moe-pad-expert-input-to-capacity, or HybridEP with "
                                                      "--moe-expert-rank-capacity-factor")
    if model.is_moe and "moe" in modules and not training.moe_pad_to_capacity \
            and not training.cuda_graph_full_iteration:
        raise InputError("cuda_graph_modules", "capturing the whole MoE layer (--cuda-graph-modules moe, or no "
                                               "module named) needs drop-and-pad routing: Megatron-Core refuses "
                                               "it otherwise; add --moe-expert-capacity-factor with "
                                               "--moe-pad-expert-input-to-capacity, or name attn moe_router "
                                               "moe_preprocess")

    def maybe(captured: bool, forward: Launches, backward: Launches) -> tuple[Launches, Launches]:
        return (forward.captured(), backward.captured()) if captured else (forward, backward)

    attention_fwd, attention_bwd = maybe("attn" in modules, attention_fwd, attention_bwd)
    mlp_fwd, mlp_bwd = maybe("mlp" in modules, mlp_fwd, mlp_bwd)
    whole_moe = "moe" in modules
    if whole_moe or {"moe_router", "moe_preprocess"} & modules:
        router_fwd = router_fwd.captured()
    if whole_moe:
        routed_fwd, moe_mlp_bwd = routed_fwd.captured(), moe_mlp_bwd.captured()
    return attention_fwd, attention_bwd, mlp_fwd, mlp_bwd, router_fwd, routed_fwd, moe_mlp_bwd


# ---- eager PyTorch models: Hugging Face transformers, nanoGPT ------------------------------------------------------
# CUDA kernels per decoder layer (an op counter under TorchDispatchMode on torch 2.13, count(L=2) - count(L=1), views
# and allocations left out; CUDA kernels per op as the ops' CUDA implementations launch them):
#   Hugging Face LlamaDecoderLayer (RMSNorm, rotary, gated MLP): 34 forward / 67 backward with SDPA, 42 / 76 with the
#   eager ("math") attention; GEMMs 7 / 14, the math attention 2 / 4 more (bmm).
#   nanoGPT Block (LayerNorm, learned positions, plain MLP, bias=False): 10 / 15 with SDPA, 19 / 24 with the math
#   attention; GEMMs 4 / 8, the math attention 2 / 4 more. With biases (GPT-2) the backward adds a sum per linear.
EAGER_LAYER_KERNELS = {  # (gated family?, fused attention?) -> (forward ops, backward ops, forward GEMMs, backward GEMMs)
    (True, True): (34.0, 67.0, 7.0, 14.0), (True, False): (42.0, 76.0, 9.0, 18.0),
    (False, True): (10.0, 15.0, 4.0, 8.0), (False, False): (19.0, 24.0, 6.0, 12.0),
}


def norm_params_per_layer(model: ModelSpec) -> float:
    """Parameter tensors of a decoder layer's two norms: a LayerNorm's weight and bias, an RMSNorm's weight."""
    return 2.0 * (2.0 if model.norm is NormKind.LAYERNORM else 1.0)


def attention_linears_per_layer(model: ModelSpec) -> float:
    """Linears of an eager decoder layer's attention as the model holds them: q, k, v and o in Hugging Face's gated
    models, a fused QKV and the output projection in GPT-2 / nanoGPT."""
    return 4.0 if _gated(model) else 2.0


def mlp_linears_per_layer(model: ModelSpec) -> float:
    """Linears of a dense layer's MLP: gate, up and down, or fc1 and fc2."""
    return 3.0 if _gated(model) else 2.0


def linear_tensors(model: ModelSpec, linears: float) -> float:
    """Parameter tensors of `linears` linears: a weight each, and a bias with linear_bias."""
    return linears * (2.0 if model.linear_bias else 1.0)


def param_tensors_per_layer(model: ModelSpec) -> float:
    """Weight (and bias) tensors of one decoder layer as an eager model holds them (attention_linears_per_layer,
    mlp_linears_per_layer), its norms'."""
    linears = attention_linears_per_layer(model) + mlp_linears_per_layer(model)
    qkv_biases = 3.0 if model.qkv_bias and not model.linear_bias else 0.0      # Qwen2's q, k and v biases
    qk_norms = 2.0 if model.qk_layernorm else 0.0                               # Qwen3's q_norm and k_norm
    return linear_tensors(model, linears) + qkv_biases + norm_params_per_layer(model) + qk_norms


def attention_side_param_tensors(model: ModelSpec) -> float:
    """Parameter tensors of a MoE decoder layer outside its block: a dense layer's less its MLP's linears."""
    return param_tensors_per_layer(model) - linear_tensors(model, mlp_linears_per_layer(model))


def param_modules_per_layer(model: ModelSpec) -> float:
    """Submodules holding parameters in one eager decoder layer: its linears and its two norms, and Qwen3's q_norm
    and k_norm (DeepSpeed ZeRO-3 before 0.6 fetched each on its own)."""
    return attention_linears_per_layer(model) + mlp_linears_per_layer(model) + 2.0 \
        + (2.0 if model.qk_layernorm else 0.0)


def eager_model_python(launches: Launches, direction: str) -> Launches:
    """`launches` issued by an eager model's Python, with the host work the model adds to each of their ATen
    kernels in `direction` ('fwd' or 'bwd'; EAGER_MODEL_PYTHON_TO_ATEN_OP)."""
    kernels = np.asarray(launches.aten_op, dtype=float) + np.asarray(launches.aten_gemm, dtype=float)
    return launches + Launches(model_python=kernels * EAGER_MODEL_PYTHON_TO_ATEN_OP[direction])


def _eager_layer(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, dtensor: bool
                 ) -> tuple[Launches, Launches]:
    """(forward, backward) launches of one dense decoder layer of an eager PyTorch model (EAGER_LAYER_KERNELS), plus
    a kernel per parameter tensor in the backward (AccumulateGrad's add while gradients accumulate, DDP's
    bucket copy on the last micro-batch: reducer.cpp mark_variable_ready_dense), the model's own host work around
    each kernel (`eager_model_python`) and tensor-parallel collectives (an all-gather and a reduce-scatter per block
    each way under SP). A plain PyTorch loop shards for tensor
    parallelism with DTensor (`_dtensor_layer`; q, k, v separate in Hugging Face's gated models, one fused QKV in
    nanoGPT's); DeepSpeed's AutoTP replaces the linears with its own on plain tensors (`dtensor` False)."""
    ops_f, ops_b, gemm_f, gemm_b = EAGER_LAYER_KERNELS[(_gated(model), training.flash_attention)]
    bias_sums = 4.0 if model.linear_bias else 0.0
    forward = eager_model_python(Launches(aten_op=ops_f - gemm_f, aten_gemm=gemm_f), "fwd") \
        + Launches(collective=_tp_collectives(plans, 4, 2))
    backward = eager_model_python(Launches(aten_op=ops_b - gemm_b + bias_sums + param_tensors_per_layer(model),
                                           aten_gemm=gemm_b), "bwd") + Launches(collective=_tp_collectives(plans, 4, 2))
    if dtensor:
        dtensor_fwd, dtensor_bwd = _dtensor_layer(model, training, plans, separate_qkv=_gated(model))
        forward, backward = forward + dtensor_fwd, backward + dtensor_bwd
    return forward, backward


def _fsdp2_unit(training: TrainingSpec, plans: PlanArrays) -> tuple[Launches, Launches]:
    """(forward, backward) of one FSDP2 unit (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py) at
    zero 3 / 2: forward unshard = the param all-gather input copy (_foreach_copy_), the copy-in, the all-gather, the
    copy-out (split_with_sizes_copy); backward: the unshard again when resharded after forward (zero 3), then
    foreach_reduce's chunk_cat, a div and the reduce-scatter. FSDP2 never blocks the host (record_stream-free
    design). Under a pipeline schedule (fsdp_gradients_unsynced) no backward reduces or reshards: the reduce-scatter
    runs once a step, and the forward finds the unit still gathered by the backward before it."""
    fsdp = plans.zero >= 2
    unsynced = fsdp_gradients_unsynced(training, plans)
    unshard = Launches(aten_op=3.0, collective=1.0)
    forward = unshard.where(fsdp & ~unsynced, Launches())
    backward = unshard.where(plans.zero >= 3, Launches()) + Launches(aten_op=2.0, collective=1.0).where(
        fsdp & ~unsynced, Launches())
    return forward, backward


def _eager_moe(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, compiled: bool
               ) -> tuple[Launches, Launches, Launches, np.ndarray]:
    """(before the first sync, after it, backward, host syncs per forward) of an eager PyTorch MoE MLP.
    torchtitan v0.2.2 (models/moe/moe.py, distributed/expert_parallel.py), ExpertGemm.GROUPED: router GEMM, scores,
    top-k, histc counts, argsort reorder, torch._grouped_mm x3 (48 forward / 39 backward ops in all for a Qwen3-like
    router); EP > 1 exchanges counts by all-to-all and reads the split sizes on the host (`.to("cpu",
    non_blocking=False)`: one sync), dispatches and combines by all-to-all; DeepEP's normal dispatch waits on the
    CPU for its receive counts, then _permute_tokens indexes by the mask twice and repeat_interleaves without an
    output size (distributed/deepep/deepep.py at v0.2.2: 4 syncs). Compiled (apply_compile compiles the router,
    reorderer, shared experts and the expert GEMM function apart): ~7 graph calls each way, eager glue between.
    ExpertGemm.LOOP (Hugging Face's eager blocks, e.g. Qwen3MoeSparseMoeBlock; DeepSpeed-MoE): `expert_hit =
    (mask.sum() > 0).nonzero()` and, per local expert, `torch.where(expert_mask[e])` -- each a host sync (data-
    dependent size) -- then the expert's three linears, its activation and multiply, the routing-weight multiply
    and index_add_. Eager, each kernel carries the block's own host work (`eager_model_python`)."""
    experts = local_experts(model, plans)
    shared = model.moe is not None and bool(model.moe.num_shared_experts)
    ep = plans.ep > 1
    if training.expert_gemm is ExpertGemm.LOOP:
        pre = Launches(aten_gemm=1.0, aten_op=8.0)
        per_expert_fwd = Launches(aten_gemm=3.0, aten_op=5.0)
        per_expert_bwd = Launches(aten_gemm=6.0, aten_op=6.0)
        post = per_expert_fwd.times(experts) + Launches(collective=np.where(ep, 2.0, 0.0))
        backward = per_expert_bwd.times(experts) + Launches(aten_gemm=2.0, aten_op=6.0,
                                                            collective=np.where(ep, 2.0, 0.0))
        syncs = 1.0 + experts
    else:
        deepep = training.moe_dispatcher is MoEDispatcher.DEEPEP
        if compiled:
            pre = Launches(compiled=3.0, triton=6.0, aten_gemm=1.0, aten_op=6.0)
            post = Launches(compiled=4.0, triton=6.0, aten_gemm=3.0, aten_op=8.0)
            backward = Launches(compiled=7.0, triton=10.0, aten_gemm=8.0, aten_op=12.0)
        else:
            pre = Launches(aten_gemm=1.0, aten_op=20.0)
            post = Launches(aten_gemm=3.0, aten_op=24.0)
            backward = Launches(aten_gemm=8.0, aten_op=31.0)
        exchange = Launches(collective=np.where(ep, 1.0, 0.0), aten_op=np.where(ep, 4.0, 0.0))
        pre = pre + exchange
        post = post + Launches(collective=np.where(ep, 2.0, 0.0))
        backward = backward + Launches(collective=np.where(ep, 2.0, 0.0))
        syncs = np.where(ep, DEEPEP_TITAN_SYNCS if deepep else 1.0, 0.0)
    if shared:
        pre = pre + Launches(aten_gemm=3.0, aten_op=2.0)
        backward = backward + Launches(aten_gemm=6.0, aten_op=3.0)
    if not compiled:      # the MoE block's own Python around each kernel (outside a compiled region's graph calls)
        pre, post, backward = (eager_model_python(pre, "fwd"), eager_model_python(post, "fwd"),
                               eager_model_python(backward, "bwd"))
    return pre, post, backward, np.broadcast_to(np.asarray(syncs, dtype=float), (len(plans),)).copy()


def _torchtitan_layer(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> tuple[Launches, Launches]:
    """(forward, backward) of a torchtitan v0.2.2 Llama block (models/llama3/model/model.py; the op counter: 16 / 33
    CUDA kernels eager, 7 / 14 GEMMs; compiled with fullgraph (infra/parallelize.py apply_compile), one graph call
    each way with ~4 / 5 Inductor kernels, the GEMMs as extern mm calls from the wrapper, SDPA and the complex-RoPE
    fallbacks as ATen ops). TP (DTensor SequenceParallel/Colwise/Rowwise): an all-gather and a reduce-scatter per
    block each way; a plain MLP has one GEMM fewer."""
    mlp_gemms = mlp_linears_per_layer(model)
    dtensor_fwd, dtensor_bwd = _dtensor_layer(model, training, plans, separate_qkv=True)
    if training.launch is LaunchPath.COMPILE:
        forward = Launches(compiled=1.0, triton=4.0, aten_gemm=4.0 + mlp_gemms, aten_op=3.0)
        backward = Launches(compiled=1.0, triton=5.0, aten_gemm=2.0 * (4.0 + mlp_gemms), aten_op=4.0, launch=2.0)
    else:
        forward = eager_model_python(Launches(aten_gemm=4.0 + mlp_gemms, aten_op=9.0), "fwd")
        backward = eager_model_python(Launches(aten_gemm=2.0 * (4.0 + mlp_gemms), aten_op=19.0), "bwd")
    tp = _tp_collectives(plans, 4, 2)
    return forward + dtensor_fwd + Launches(collective=tp), backward + dtensor_bwd + Launches(collective=tp)


def _eager_engine(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> LayerLaunches:
    """torchtitan, a plain PyTorch loop, and DeepSpeed's engine over an eager model."""
    n = len(plans)
    engine = training.engine
    compiled = training.launch is LaunchPath.COMPILE
    if engine is Engine.TORCHTITAN:
        layer_fwd, layer_bwd = _torchtitan_layer(model, training, plans)
        attention_share = 0.6         # of a block's launches before its MLP (attention norm .. residual add)
    else:
        layer_fwd, layer_bwd = _eager_layer(model, training, plans, dtensor=engine is Engine.PYTORCH)
        attention_share = 0.6
        if compiled:   # a compiled eager model: Inductor's fusion of the block, one graph call each way
            layer_fwd = Launches(compiled=1.0, triton=layer_fwd.aten_op * 0.4, aten_gemm=layer_fwd.aten_gemm,
                                 collective=layer_fwd.collective)
            layer_bwd = Launches(compiled=1.0, triton=layer_bwd.aten_op * 0.4, aten_gemm=layer_bwd.aten_gemm,
                                 collective=layer_bwd.collective)
    deepspeed = engine is Engine.DEEPSPEED
    fsdp_fwd, fsdp_bwd = _fsdp2_unit(training, plans) if not deepspeed else _deepspeed_zero(model, plans)
    # a MoE layer's own: DeepSpeed fetches its attention side here and its block in _deepspeed_expert_fetch
    moe_fsdp_fwd, moe_fsdp_bwd = (fsdp_fwd, fsdp_bwd) if not deepspeed else _deepspeed_zero(model, plans, True)
    attention_fwd = layer_fwd.times(attention_share)
    moe_pre_sac = Launches()
    if model.moe is not None:
        pre, post, moe_bwd, dispatch_syncs = _eager_moe(model, training, plans, compiled)
        if engine is Engine.TORCHTITAN:
            dtensor_fwd, dtensor_bwd = _dtensor_moe(model, training, plans)
            pre, moe_bwd = pre + dtensor_fwd, moe_bwd + dtensor_bwd
        moe_pre, moe_pre_sac = attention_fwd + pre + moe_fsdp_fwd, pre
        moe_bwd = layer_bwd.times(attention_share) + moe_bwd + moe_fsdp_bwd
    else:
        moe_pre = moe_bwd = post = Launches()
        dispatch_syncs = np.zeros(n)
    if deepspeed and model.moe is not None:   # ZeRO-3's fetch of the MoE block's experts
        fetch_fwd, fetch_bwd = _deepspeed_expert_fetch(model, training, plans)
        post, moe_bwd = post + fetch_fwd, moe_bwd + fetch_bwd
    head_fwd, head_bwd = Launches(aten_op=2.0), Launches(aten_op=4.0)
    # final norm, output GEMM, PyTorch's cross entropy (log_softmax + nll_loss, 2 kernels each way)
    tail_fwd, tail_bwd = Launches(aten_op=3.0, aten_gemm=1.0), Launches(aten_op=4.0, aten_gemm=2.0)
    if deepspeed:   # ZeRO-3 around the decoder layers: the model's own modules and embeddings
        ends = _deepspeed_model_ends(model, plans)
        head_fwd, head_bwd, tail_fwd, tail_bwd = (a + b for a, b in zip((head_fwd, head_bwd, tail_fwd, tail_bwd),
                                                                         ends))
    return LayerLaunches(
        dense_fwd=layer_fwd + fsdp_fwd, dense_bwd=layer_bwd + fsdp_bwd,
        moe_pre_fwd=moe_pre, moe_post_fwd=post, moe_bwd=moe_bwd,
        head_fwd=head_fwd, head_bwd=head_bwd, tail_fwd=tail_fwd, tail_bwd=tail_bwd,
        # activation checkpointing re-runs the checkpointed block's forward (full); torchtitan's per-op SAC all of it
        # but the kept ops (_sac_recompute); selective recompute elsewhere about a third of the block's launches
        dense_recompute=_sac_recompute(layer_fwd, model, False) if engine is Engine.TORCHTITAN
        else layer_fwd.times(0.35),
        moe_recompute=_sac_recompute(attention_fwd + moe_pre_sac + post, model, True)
        if engine is Engine.TORCHTITAN and model.moe is not None else (attention_fwd + post).times(0.35),
        dispatch_syncs=dispatch_syncs, moe_recompute_syncs=_sac_recompute_syncs(training, plans, dispatch_syncs),
        loss_syncs=0.0,
        # torch.distributed.pipelining and DeepSpeed's PipelineEngine wait on the stream, not the host
        transfer_syncs=np.zeros(n, dtype=bool),
        # DeepSpeed's ZeRO-3 ends every backward in independent_gradient_partition_epilogue, whose
        # reduce_and_partition_stream.synchronize() the host waits on (stage3.py; overlap_comm, on at stage 3)
        backward_end_syncs=np.where(deepspeed & (plans.zero >= 3), 1.0, 0.0),
    )


DEEPEP_TITAN_SYNCS = 4.0
"""Host syncs of one torchtitan MoE forward on its DeepEP path (_eager_moe)."""


def _sac_recompute_syncs(training: TrainingSpec, plans: PlanArrays, dispatch_syncs: np.ndarray) -> np.ndarray:
    """Host syncs torchtitan's per-op SAC re-runs in a MoE layer's backward: none on the all-to-all path (its policy
    saves the split sizes' copy to the CPU, aten._to_copy: activation_checkpoint.py _get_custom_policy); on the DeepEP
    path the permutation's three data-dependent ops, the dispatch's outputs being saved whenever DeepEP runs
    (deepseek_v3 infra/parallelize.py adds its dispatch and combine ops to the save list)."""
    deepep = training.moe_dispatcher is MoEDispatcher.DEEPEP
    return np.where(per_op_sac(training, plans) & (dispatch_syncs > 0) & deepep, DEEPEP_TITAN_SYNCS - 1.0, 0.0)


def _sac_recompute(forward: Launches, model: ModelSpec, moe_layer: bool) -> Launches:
    """torchtitan's per-op SAC recompute of a block (per_op_sac): its forward's launches less the attention kernel
    (one op: an eager ATen op, or one of a compiled block's kernels) and the matmuls whose outputs are kept
    (sac_kept_matmuls); compiled, the recompute runs inside the backward graph, so no graph entry of its own. Its
    device-to-host copies are kept (the policy saves `_to_copy` to the CPU): on the all-to-all path it adds no
    synchronisation; on the DeepEP path `_sac_recompute_syncs`."""
    compiled = np.asarray(forward.compiled) > 0
    kept = float(len(sac_kept_matmuls(model, moe_layer)))
    return dataclasses.replace(
        forward, compiled=0.0, aten_gemm=np.maximum(np.asarray(forward.aten_gemm) - kept, 0.0),
        aten_op=np.where(compiled, forward.aten_op, np.maximum(np.asarray(forward.aten_op) - 1.0, 0.0)),
        triton=np.where(compiled, np.maximum(np.asarray(forward.triton) - 1.0, 0.0), forward.triton))


ZERO3_PERSISTENCE_THRESHOLD_PARAMS = 100_000
"""DeepSpeed's `stage3_param_persistence_threshold` default (runtime/zero/config.py): a parameter of fewer elements
is kept whole on every rank and never fetched or released. A layer's norm weights and biases fall below it, its
linears' weights above it (a 512 x 512 weight already holds 262,144), so ZeRO-3 fetches a layer's linears only."""
DROPOUT_MODULES_PER_LAYER = 2.0
"""nn.Dropout submodules whose forward runs in a layer trained with dropout (Hugging Face's GPT-2: the attention's
residual dropout and the MLP's; its attention-probability dropout is a function call)."""


def zero3_hook_ops(hooked_modules: "np.ndarray | float", parameters: "np.ndarray | float", direction: str
                   ) -> "np.ndarray | float":
    """ZeRO-3's hook Python in eager operators (Launches.zero3_hook) for one pass (`direction` 'fwd' or 'bwd') over
    `hooked_modules` submodules fetching `parameters` parameter tensors (ZERO3_HOOK_TO_ATEN_OP)."""
    per_module, per_parameter = ZERO3_HOOK_TO_ATEN_OP[direction]
    return per_module * hooked_modules + per_parameter * parameters


def zero3_fetched_linears_per_layer(model: ModelSpec, moe_layer: bool = False) -> float:
    """Linears of one eager decoder layer that ZeRO-3 fetches (ZERO3_PERSISTENCE_THRESHOLD_PARAMS): the attention's
    four (q, k, v, o; a fused QKV and o in GPT-2) and a dense layer's MLP; a MoE layer's block is
    `_deepspeed_expert_fetch`'s."""
    return attention_linears_per_layer(model) + (0.0 if moe_layer else mlp_linears_per_layer(model))


def zero3_hooked_modules_per_layer(model: ModelSpec, moe_layer: bool = False) -> float:
    """Submodules of one eager decoder layer whose forward runs, each with ZeRO-3's hooks (DeepSpeed hooks every
    submodule): the layer and its attention, the attention's linears, the norms (two, and Qwen3's q_norm and
    k_norm), the dropouts of a model trained with dropout, and the MLP module with its linears and its activation
    module (Hugging Face's ACT2FN modules, GPT-2's NewGELUActivation), or a MoE layer's block (its router and experts:
    `_deepspeed_expert_fetch`)."""
    norms = 2.0 + (2.0 if model.qk_layernorm else 0.0)
    dropouts = DROPOUT_MODULES_PER_LAYER if model.dropout else 0.0
    mlp = 1.0 if moe_layer else 1.0 + mlp_linears_per_layer(model) + 1.0
    return 2.0 + attention_linears_per_layer(model) + norms + dropouts + mlp


def _deepspeed_zero(model: ModelSpec, plans: PlanArrays, moe_layer: bool = False) -> tuple[Launches, Launches]:
    """(forward, backward) launches DeepSpeed's ZeRO adds to one eager decoder layer (v0.19.5 runtime/zero/
    partitioned_param_coordinator.py, partition_parameters.py, stage3.py); for a MoE layer its attention side and
    block (the experts are `_deepspeed_expert_fetch`'s). ZeRO-3: per fetched linear and pass one coalesced
    all-gather (its copy-in cat and the NCCL call) and a cat copy-out (norms and biases stay whole on every rank:
    ZERO3_PERSISTENCE_THRESHOLD_PARAMS); backward the same fetch plus a copy of each gradient into the reduce bucket;
    and the hooks' Python on every submodule, per pass (zero3_hook). ZeRO-1/2: a copy of each gradient into the
    bucket. The 2021 per-parameter fetch (zero3_serial_fetch) is priced by costmodels.steptime.dp_comm_s."""
    linears = zero3_fetched_linears_per_layer(model, moe_layer)
    tensors = attention_side_param_tensors(model) if moe_layer else param_tensors_per_layer(model)
    hooked = zero3_hooked_modules_per_layer(model, moe_layer)
    fetch = Launches(aten_op=2.0 * linears, collective=linears)
    zero3 = plans.zero >= 3
    forward = (fetch + Launches(zero3_hook=zero3_hook_ops(hooked, linears, "fwd"))).where(zero3, Launches())
    backward = (fetch + Launches(zero3_hook=zero3_hook_ops(hooked, linears, "bwd"))).where(zero3, Launches()) \
        + Launches(aten_op=tensors).where(plans.zero >= 1, Launches())
    return forward, backward


def _deepspeed_model_ends(model: ModelSpec, plans: PlanArrays) -> tuple[Launches, Launches, Launches, Launches]:
    """(head forward, head backward, tail forward, tail backward) that ZeRO-3 adds around the decoder layers of a
    Hugging Face model: the causal-LM wrapper, the inner model, the token embedding (GPT-2's position embedding too)
    and the rotary embedding module hooked, the embeddings' weights fetched; the final norm and the output layer
    hooked, its weight fetched (the embedding's again when tied)."""
    # the wrapper, the inner model, the token embedding, and the rotary module or GPT-2's position embedding
    head_hooked = 4.0
    head_weights = 2.0 if model.position_embedding is PositionEmbedding.LEARNED else 1.0
    zero3 = plans.zero >= 3

    def fetching(hooked: float, weights: float, direction: str) -> Launches:
        return Launches(aten_op=2.0 * weights, collective=weights,
                        zero3_hook=zero3_hook_ops(hooked, weights, direction)).where(zero3, Launches())

    return (fetching(head_hooked, head_weights, "fwd"), fetching(head_hooked, head_weights, "bwd"),
            fetching(2.0, 1.0, "fwd"), fetching(2.0, 1.0, "bwd"))


def _deepspeed_expert_fetch(model: ModelSpec, training: TrainingSpec, plans: PlanArrays
                            ) -> tuple[Launches, Launches]:
    """ZeRO-3's fetch of an eager MoE block's router and experts. The frameworks that train Hugging Face MoE models
    under ZeRO-3 register the MoE block as a ZeRO-3 leaf module (deepspeed.utils.set_z3_leaf_modules, DeepSpeed PR
    #4966: with hooks on each expert the ranks, routing differently, fetch different experts and hang; ms-swift
    swift/model/register.py `_deepspeed_set_z3_leaf_modules` registers Qwen3MoeSparseMoeBlock,
    Qwen2MoeSparseMoeBlock, GptOssMLP, Llama4TextMoe and the rest; LlamaFactory likewise): DeepSpeed then hooks the
    block alone and fetches every parameter under it at once (parameter_offload.py and
    partitioned_param_coordinator.py: `iter_params(sub_module, recurse=z3_leaf_module(sub_module))`), one coalesced
    all-gather with its copy-in cat and a copy-out per parameter (partition_parameters.py `_all_gather_coalesced`),
    per pass; backward the same fetch, and each gradient copied into the reduce bucket once the block's backward is
    done (stage3.py `reduce_leaf_module_grads`). Without the leaf module (TrainingSpec.zero3_moe_leaf off) the router
    and each expert linear are submodules with hooks of their own (`_deepspeed_zero`): per linear and pass a
    coalesced all-gather with its copy-in and copy-out. The hooks' Python (zero3_hook): the block's own hook is in
    the layer's count; not a leaf, the router's and every expert's, its three linears' and its activation module's
    (each expert an MLP module of its own in a ModuleList, as transformers' MoE blocks held them before 5.0; with
    the experts in one grouped module, ExpertGemm not LOOP, that module and its two weights), and the shared experts'
    likewise; a fetch for each weight either way."""
    experts = local_experts(model, plans)
    shared = float(model.moe.num_shared_experts)       # an MLP module each (DeepSeek's, Qwen2-MoE's shared expert)
    looped = training.expert_gemm is ExpertGemm.LOOP
    # the router's weight, the experts' and the shared experts'
    weights = 1.0 + (3.0 * experts if looped else 2.0) + 3.0 * shared
    hooked = 1.0 + (5.0 * experts if looped else 1.0) + 5.0 * shared
    if training.zero3_moe_leaf:
        fetch = Launches(aten_op=1.0 + weights, collective=1.0)
        hooked = 0.0
    else:
        fetch = Launches(aten_op=2.0 * weights, collective=weights)
    zero3 = plans.zero >= 3
    forward = fetch + Launches(zero3_hook=zero3_hook_ops(hooked, weights, "fwd"))
    backward = fetch + Launches(aten_op=weights, zero3_hook=zero3_hook_ops(hooked, weights, "bwd"))
    return forward.where(zero3, Launches()), backward.where(zero3, Launches())


# ---- a CUDA-C trainer (llm.c) ---------------------------------------------------------------------------------------

def _native(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> LayerLaunches:
    """llm.c's train_gpt2.cu: per layer forward a fused residual + layernorm, four cuBLASLt matmuls (bias and GELU
    in their epilogues), the cuDNN attention (~1 kernel forward, ~3 backward), a residual; backward about twice
    the kernels; every launch from C (no Python); per step the loss copied back and a cudaDeviceSynchronize."""
    n = len(plans)
    forward = Launches(launch=3.0, cublas=4.0)
    backward = Launches(launch=7.0, cublas=8.0)
    return LayerLaunches(
        dense_fwd=forward, dense_bwd=backward, moe_pre_fwd=Launches(), moe_post_fwd=Launches(), moe_bwd=Launches(),
        head_fwd=Launches(launch=1.0), head_bwd=Launches(launch=2.0),
        tail_fwd=Launches(launch=2.0, cublas=1.0), tail_bwd=Launches(launch=2.0, cublas=2.0),
        dense_recompute=Launches(), moe_recompute=Launches(), dispatch_syncs=np.zeros(n),
        moe_recompute_syncs=np.zeros(n), loss_syncs=0.0, transfer_syncs=np.zeros(n, dtype=bool))


LOSS_OF_ENGINE = {Engine.MEGATRON: CrossEntropyKernel.FUSED, Engine.TORCHTITAN: CrossEntropyKernel.UNFUSED,
                  Engine.DEEPSPEED: CrossEntropyKernel.UNFUSED, Engine.PYTORCH: CrossEntropyKernel.UNFUSED,
                  Engine.NATIVE: CrossEntropyKernel.XENTROPY}
"""The loss each engine runs eagerly: Megatron-Core's fused cross entropy (autopar's default,
--cross-entropy-loss-fusion); PyTorch's F.cross_entropy on upcast logits (torchtitan components/loss.py, Hugging
Face's ForCausalLMLoss under DeepSpeed, a plain loop); llm.c's fused classifier, one kernel each way."""


def engine_loss(engine: "Engine | str", compiled: bool) -> CrossEntropyKernel:
    """The loss kernels an engine runs (LOSS_OF_ENGINE; the CLI's default for --cross-entropy). torch.compile'd, the
    loss is inside the compiled region (torchtitan's CompileConfig compiles 'loss' with 'model'; nanoGPT's and Hugging
    Face's models compute it in their forward): Inductor's fused upcast, log-softmax and NLL, xentropy's bytes."""
    return CrossEntropyKernel.XENTROPY if compiled else LOSS_OF_ENGINE[Engine(engine)]


def layer_launches(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> LayerLaunches:
    """The launches and synchronisations of `training.engine` for every plan."""
    if training.engine is Engine.MEGATRON:
        return _megatron(model, training, plans)
    if training.engine is Engine.NATIVE:
        return _native(model, training, plans)
    return _eager_engine(model, training, plans)


def moe_router_replicated(training: TrainingSpec) -> bool:
    """Whether every TP rank routes all of a micro-batch's tokens: torchtitan all-gathers a MoE layer's input over
    TP and runs its router replicated (models/llama4/infra/parallelize.py apply_moe_ep_tp, shared by qwen3 and
    deepseek_v3: "moe": PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
    ...) -- "all-gather for input, reduce-scatter for output" -- and "moe.router.gate": NoParallel()); Megatron-Core
    routes each rank's sequence-parallel share."""
    return training.engine is Engine.TORCHTITAN


def moe_dispatch_replicated(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Where each TP rank permutes and dispatches all of the micro-batch's routed tokens rather than its 1/tp share:
    torchtitan with expert TP (etp = tp > 1: ExpertTensorParallel, whose experts hold 1/tp of each expert's width
    and take the tokens replicated over TP), and torchtitan's DeepEP path under TP (DeepEPMoE sets its reorderer to
    None, so the "moe.reorderer": ReordererSequenceParallel() entry of apply_moe_ep_tp's plan never applies and every
    TP rank dispatches the whole all-gathered input: models/moe/moe_deepep.py, 2026-01). With etp 1 the standard path
    splits the routed tokens over TP again before the dispatch ("If TP is borrowed for EP, then split the tokens
    across TP ranks": ReordererSequenceParallel), as Megatron-Core's sequence-parallel dispatch does."""
    deepep = training.moe_dispatcher is MoEDispatcher.DEEPEP
    return np.full(len(plans), moe_router_replicated(training)) & ((plans.etp > 1) | (deepep & (plans.tp > 1)))


def per_op_sac(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Where recompute `selective` is torchtitan's per-op selective activation checkpointing (SelectiveAC,
    torchtitan 0.3.0 distributed/activation_checkpoint.py; `mode = "selective"` with `selective_ac_option = "op"`
    before the 2026-06 policy classes): every transformer block runs under torch.utils.checkpoint with a policy
    that keeps the block's input and the outputs of the ops in its save set -- every other matmul
    (aten.mm / aten.linear, counted through the block: the first, third, ... are kept), the attention kernel's
    outputs, top-k, the reduce-scatters and (`TrainingSpec.sac_saves_all_to_all`) the MoE all-to-alls -- and
    recomputes every other op in the backward: the other matmuls, the norms, RoPE, activations, the router's gate
    (force_recompute_mm_shapes_by_fqns, default ["moe.router.gate"]) and the routed experts' torch._grouped_mm
    (not in the save set: torch._functorch.partitioners' compute_intensive_ops has mm, addmm, bmm, _scaled_mm and
    the SDPA kernels, not _grouped_mm). Megatron-Core's module-level selective recompute everywhere else."""
    return np.full(len(plans), training.engine is Engine.TORCHTITAN) & (plans.recompute == Recompute.SELECTIVE)


@dataclass(frozen=True)
class BlockMatmul:
    """One nn.Linear of a torchtitan transformer block: its input and output widths and how tensor parallelism
    splits it ('column': the output over tp, 'row': the input, 'none': replicated)."""

    d_in: float
    d_out: float
    split: str


def sac_block_matmuls(model: ModelSpec, moe_layer: bool) -> list[BlockMatmul]:
    """A torchtitan block's matmuls in forward order, as per-op SAC counts them (per_op_sac): the attention's
    projections (models/common attention: wq, wk, wv, wo; DeepSeek-V3's MLA: wq or wq_a and wq_b, wkv_a, wkv_b,
    wo), then the dense FeedForward's w1, w3, w2 (`w2(silu(w1(x)) * w3(x))`) or a MoE layer's shared experts (the
    same three). The router's gate is forced to recompute and not counted (force_recompute_mm_shapes_by_fqns);
    the routed experts run torch._grouped_mm, which the policy neither counts nor keeps."""
    h = float(model.hidden_size)
    if model.mla is not None:
        mla, heads = model.mla, model.num_attention_heads
        query = [BlockMatmul(h, mla.q_lora_rank, "none"),
                 BlockMatmul(mla.q_lora_rank, heads * mla.qk_head_dim, "column")] if mla.q_lora_rank \
            else [BlockMatmul(h, heads * mla.qk_head_dim, "column")]
        attention = query + [BlockMatmul(h, mla.kv_lora_rank + mla.qk_rope_head_dim, "none"),
                             BlockMatmul(mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                                         "column"),
                             BlockMatmul(heads * mla.v_head_dim, h, "row")]
    else:
        attention = [BlockMatmul(h, model.q_size, "column"), BlockMatmul(h, model.kv_size, "column"),
                     BlockMatmul(h, model.kv_size, "column"), BlockMatmul(model.q_size, h, "row")]

    def feed_forward(width: float) -> list[BlockMatmul]:
        up = [BlockMatmul(h, width, "column")] * (2 if _gated(model) else 1)
        return up + [BlockMatmul(width, h, "row")]
    if not moe_layer:
        return attention + feed_forward(model.ffn_hidden_size)
    assert model.moe is not None
    return attention + (feed_forward(model.moe.shared_expert_ffn_hidden_size) if model.moe.num_shared_experts
                        else [])


def sac_kept_matmuls(model: ModelSpec, moe_layer: bool) -> list[BlockMatmul]:
    """The matmuls whose outputs per-op SAC keeps: the policy counts aten.mm through the block and keeps the odd
    ones, the first, third, ... (`meta[mm_count_key] % 2 == 0` recomputes the even ones)."""
    return sac_block_matmuls(model, moe_layer)[0::2]


def fsdp_gradients_unsynced(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Where FSDP accumulates a pipeline stage's gradients unsharded over the step and reduce-scatters them once:
    torchtitan with pipeline parallelism (zero 2 and 3). torch.distributed.pipelining runs every micro-batch's
    backward with set_requires_gradient_sync(False) and set_reshard_after_backward(False) (stage.py
    backward_maybe_with_nosync): the gradients accumulate unsharded in the reduce dtype until the schedule's
    REDUCE_GRAD after the stage's last backward reduce-scatters them and waits (schedules.py _add_reduce_grad,
    stage.perform_reduce_grad). No backward reshards the parameters either: at ZeRO-2 (the export's
    fsdp_reshard_after_forward 'never', export.torchtitan.FSDP_RESHARD_AFTER_FORWARD) they are gathered once and
    stay; at ZeRO-3 ('always') each forward frees them after it and each backward gathers them again, and they stay
    gathered from one backward's end to the next forward."""
    return (training.engine is Engine.TORCHTITAN) & (plans.pp > 1) & (plans.zero >= 2)


def host_reads_zero(training: TrainingSpec) -> bool:
    """Whether the engine's launches per layer depend on the ZeRO stage (FSDP2's and DeepSpeed's per-layer parameter
    gathers are host launches beside the compute; Megatron-Core's buckets are not per layer)."""
    return training.engine in (Engine.TORCHTITAN, Engine.PYTORCH, Engine.DEEPSPEED)


def step_launches(training: TrainingSpec) -> tuple[float, Launches]:
    """(host synchronisations, launches) of the engine's optimizer step, per step, the same for every plan:
      Megatron-Core: the rerun state machine's reduce (1), train_step's four reads after the optimizer and
        get_loss_scale().item() (training.py), and the DDP buckets' NaN checks (`megatron_bucket_checks`, per plan:
        2 for the one bucket of a dense model without --overlap-grad-reduce); TE's multi-tensor Adam, the norm and
        the bf16 copy, a few launches per ~110 tensors;
      torchtitan v0.2.2: dist_sum(local_valid_tokens).item() at every step start (train.py train_step); nanoGPT:
        loss.item() every iteration (log_interval 1); DeepSpeed 0.19: none per step (2021, `zero3_serial_fetch`:
        its timers called torch.cuda.synchronize() at start and stop of train_batch); foreach AdamW: 8 ops a
        parameter group (2 groups), clip_grad_norm_: 8 (torch optim/adam.py, nn/utils/clip_grad.py);
      llm.c: two per step, four kernels and two all-reduces launched from C."""
    engine = training.engine
    if engine is Engine.MEGATRON:
        return 6.0, Launches(aten_op=12.0)
    if engine is Engine.NATIVE:
        return 2.0, Launches(launch=4.0, collective=2.0)
    if engine is Engine.DEEPSPEED:
        return (2.0 if training.zero3_serial_fetch else 0.0), Launches(aten_op=8.0 * 2.0 + 8.0)
    return 1.0, Launches(aten_op=8.0 * 2.0 + 8.0)


def model_param_tensors(model: ModelSpec) -> float:
    """Parameter tensors of the whole eager model (param_tensors_per_layer a dense layer; a MoE layer's router and
    its experts' three weights each, and its shared experts', in place of the MLP's; the embeddings, the final norm's
    and an untied output layer)."""
    tensors = model.num_dense_layers * param_tensors_per_layer(model)
    if model.moe is not None:
        experts = 3.0 * (model.moe.num_experts + model.moe.num_shared_experts)
        tensors += model.num_moe_layers * (attention_side_param_tensors(model) + 1.0 + experts)
    learned = 1.0 if model.position_embedding is PositionEmbedding.LEARNED else 0.0      # GPT-2's wpe
    return tensors + 1.0 + learned + norm_params_per_layer(model) / 2.0 + (0.0 if model.tied_embeddings else 1.0)


MEGATRON_MIN_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def megatron_ddp_bucket_params(plans: PlanArrays, num_gpus: int) -> np.ndarray:
    """Megatron-LM's DDP bucket under --overlap-grad-reduce: max(40M, 1M x dp·cp) parameters (training.py
    resolve_ddp_bucket_size: max(40_000_000, 1_000_000 * dp_cp_size), over the data-parallel group with context
    parallelism)."""
    return np.maximum(float(MEGATRON_MIN_BUCKET_PARAMS),
                      MEGATRON_BUCKET_PARAMS_PER_DP_RANK * data_parallel_size(plans, num_gpus) * plans.cp)
NAN_CHECK_SYNCS_PER_BUCKET = 2.0
"""check_grads (param_and_grad_buffer.py, --check-for-nan-in-loss-and-grad, on by default): validate_result of the
bucket's grad norm against isnan and isinf, each a bool() of a device tensor under the default rerun mode."""


def megatron_bucket_checks(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, num_gpus: int,
                           stage: "np.ndarray | int") -> np.ndarray:
    """Host syncs of Megatron-Core's DDP NaN/Inf checks per step on pipeline rank `stage`: two per bucket
    (NAN_CHECK_SYNCS_PER_BUCKET). Each model chunk has its own DDP with a dense buffer and, in a MoE model, an expert
    buffer; without --overlap-grad-reduce each buffer is one bucket, and with it only pipeline rank 0's first
    chunk is split into buckets of max(40M, 1M x dp·cp) parameters (DistributedDataParallel: `if disable_bucketing or
    pp_rank > 0: self.bucket_size = None`; the chunks after the first are built with disable_bucketing). None under
    Megatron-FSDP (zero >= 2): it checks only on its non-overlapped reduce path (megatron_fsdp param_and_grad_buffer
    reduce_scatter_gradients), and sharded gradients force the overlapped one (megatron_fsdp.py)."""
    non_expert, expert = stage_params_per_gpu(model, plans, stage)
    vpp = plans.vpp.astype(float)
    buffers = [non_expert] + ([expert] if model.is_moe else [])
    bucket = megatron_ddp_bucket_params(plans, num_gpus)
    bucketed = training.overlap_grad_reduce & (np.asarray(stage) == 0)
    buckets = sum(np.where(bucketed, np.ceil(params / vpp / bucket) + vpp - 1.0, vpp) for params in buffers)
    return np.where(plans.zero >= 2, 0.0, NAN_CHECK_SYNCS_PER_BUCKET * buckets)


def step_host_s(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, costs: HostCosts, num_gpus: int,
                stage: "np.ndarray | int") -> np.ndarray:
    """The host's share of the optimizer step for each plan on pipeline rank `stage`: its synchronisations'
    wake-ups and the launches after the last of them, which nothing hides (`step_launches`; Megatron-Core's DDP
    checks with them, `megatron_bucket_checks`); under DeepSpeed ZeRO-3 also the step's walk over every parameter
    of the partition (ZERO3_STEP_TO_ATEN_OP: every rank holds a shard of every parameter)."""
    syncs, optimizer = step_launches(training)
    fixed_s = syncs * costs.sync_s + float(np.asarray(optimizer.host_s(costs)))
    if training.engine is Engine.MEGATRON:
        return fixed_s + megatron_bucket_checks(model, training, plans, num_gpus, stage) * costs.sync_s
    if training.engine is not Engine.DEEPSPEED:
        return np.full(len(plans), fixed_s)
    per_step, per_tensor = ZERO3_STEP_TO_ATEN_OP
    zero3_s = (per_step + per_tensor * model_param_tensors(model)) * costs.aten_op_s
    return fixed_s + np.where(plans.zero >= 3, zero3_s, 0.0)


# ---- the engine's elementwise kernels: HBM traffic ----------------------------------------------------------------

def elementwise_bytes_per_token(model: ModelSpec, training: TrainingSpec) -> float:
    """HBM bytes per token one dense layer's non-GEMM kernels move in the forward as the engine runs them (bf16, 2
    bytes an element; a kernel reads its inputs and writes its outputs once), itemised from the same sources as the
    launch counts; q, kv the query and key/value widths, f the MLP width, h the hidden size:
      Megatron-Core + TE: two norms fused into LayerNormLinear (read and write h: 4h each), fused RoPE on q and k
        (4(q+kv)), the GQA query copy (4q) and TE's v.contiguous() (4kv), two compiled bias-dropout-adds (read x and
        the residual, write: 6h each), the fused activation (gated: read 2f write f, 6f; else 4f);
      torch.compile'd blocks: a fused norm (4h), RoPE fused into the projections' epilogue pointwise (4(q+kv)), the
        residual add fused with the next norm (8h), the activation (6f / 4f), the block's last residual add (6h);
      torchtitan eager: nn.RMSNorm's fused kernel (4h each), complex RoPE in fp32 (upcast, complex multiply, cast
        back: 20(q+kv)), two residual adds (12h), SiLU and the gate multiply (10f);
      Hugging Face's eager decoder layers under DeepSpeed (RMSNorm models): the norm as seven ops in fp32 (36h
        each), rotate_half RoPE (slice, neg, cat, two multiplies and an add: 24(q+kv)), repeat_kv's copies of k and
        v (8q), the head merge copy (4q), two residual adds (12h), SiLU and multiply (10f);
      a plain PyTorch model of functional ops (nanoGPT; DeepSpeed's LayerNorm models): one kernel a norm (8h),
        rotate_half RoPE (24(q+kv)), repeat_kv (8q), the head merge copy (4q), two residual adds (12h), the
        activation (SiLU and multiply 10f, GELU 4f);
      with TrainingSpec.fused_kernels (apex / TE / xformers / Liger ops) the eager engines' as Megatron-Core's;
      llm.c: fused residual + layernorm twice (8h each), GELU in the GEMM epilogue writing its input beside (4f).
    costmodels.compute scales its fitted elementwise traffic (the profile's, fitted on Megatron runs) by this over
    Megatron-Core's (`elementwise_traffic_scale`)."""
    h = float(model.hidden_size)
    q, kv = float(model.q_size), float(model.kv_size)
    f = float(model.ffn_hidden_size)
    gated, rotary, gqa = _gated(model), _rotary(model), _gqa(model)
    act = 6.0 * f if gated else 4.0 * f
    rope = (q + kv) if rotary else 0.0
    engine = training.engine
    if engine is Engine.MEGATRON or (training.fused_kernels and engine in (Engine.PYTORCH, Engine.DEEPSPEED)):
        return 8.0 * h + 4.0 * rope + (4.0 * q if gqa else 0.0) + 4.0 * kv + 12.0 * h + act
    if engine is Engine.NATIVE:
        return 16.0 * h + 4.0 * f
    if training.launch is LaunchPath.COMPILE:
        return 18.0 * h + 4.0 * rope + act
    if engine is Engine.TORCHTITAN:
        return 8.0 * h + 20.0 * rope + 12.0 * h + (10.0 * f if gated else 4.0 * f)
    if model.norm is NormKind.RMSNORM and engine is Engine.DEEPSPEED:   # Hugging Face's eager decoder layers
        return 72.0 * h + 24.0 * rope + (8.0 * q if gqa else 0.0) + 4.0 * q + 12.0 * h + (10.0 * f if gated
                                                                                          else 4.0 * f)
    # a plain PyTorch model of torch.nn.functional ops: one kernel per norm (F.layer_norm / F.rms_norm), RoPE by
    # rotate_half, repeat_kv's copies under GQA, the head merge copy, two residual adds, SiLU and the gate multiply
    return 8.0 * h + 24.0 * rope + (8.0 * q if gqa else 0.0) + 4.0 * q + 12.0 * h + (10.0 * f if gated else 4.0 * f)


def elementwise_traffic_scale(model: ModelSpec, training: TrainingSpec) -> float:
    """The engine's elementwise HBM traffic over Megatron-Core's for the same layer (`elementwise_bytes_per_token`)."""
    if training.engine is Engine.MEGATRON:
        return 1.0
    megatron = dataclasses.replace(training, engine=Engine.MEGATRON, launch=LaunchPath.EAGER, cuda_graph_modules=(),
                                   zero3_serial_fetch=False)
    return elementwise_bytes_per_token(model, training) / elementwise_bytes_per_token(model, megatron)
