"""What each training framework can run: one capability table per framework, as vectorised rules.

A plan autopar finds is a Megatron-Core plan (the rules in costmodels/rules.py are Megatron's). Every other
framework runs only part of that space; its table here lists, knob by knob, what it lacks, with the source that
says so. The same `Rule` objects serve three callers:

* the exporters (`refusals(estimate, framework)`): a plan that breaks one is never emitted; the launch config is
  refused with the reason (exit 2), naming the knob the framework lacks;
* the search (`autopar solve --framework FW`; from Python `solve(..., extra_rules=framework_rules(FW))`): the rules
  are added to the search's own, so the front shown is the front FW can launch (not the full front filtered
  afterwards);
* the conformance benchmark (benchmarks/conformance.py), which counts refusals.

Versions are the releases the exporters target (late 2026; `TARGET_VERSIONS`), each stated in the emitted header.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from costmodels.rules import Problem as Context, Rule
from autopar.export.names import framework_name
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import Engine, LaunchPath, PipelineSchedule, TrainingSpec

TARGET_VERSIONS: dict[str, str] = {
    "megatron": "Megatron-LM core_v0.19.0 (megatron-core 0.19.2)",
    "nemo": "NeMo 2 (nemo-toolkit 2.7.3, the last release with nemo.collections.llm, on megatron-core 0.16.1, the "
            "Megatron-Core it imports)",
    "bridge": "Megatron-Bridge 0.6.2 (megatron-core 0.19.2)",
    "verl": "verl 0.9.1 (Megatron backend, megatron-core 0.19)",
    "torchtitan": "torchtitan 0.3.0 (Python config registry)",
    "deepspeed": "DeepSpeed 0.19.8",
}
"""The framework release each exporter is written against; the emitted header names it."""


class Unsupported(InputError):
    """A launch config that the framework cannot run: which knobs it lacks and why (CLI exit 2)."""

    def __init__(self, framework: str, plan: Plan, reasons: tuple[str, ...], inputs_only: bool = False) -> None:
        self.framework = framework
        self.reasons = tuple(reasons)
        self.plan = plan
        self.inputs_only = inputs_only
        hint = ("no layout changes that: change the inputs named" if inputs_only else
                f"Search only the plans it can run with `autopar solve ... --framework {framework}`")
        super().__init__("emit", f"{framework} ({TARGET_VERSIONS[framework]}) cannot run plan '{plan.short()}': "
                                 f"{'; '.join(self.reasons)}. {hint}")

    def with_nearest(self, estimate) -> "Unsupported":
        """The same refusal, naming the nearest plan the framework can run: the fastest point of the front searched
        for it (`solve(..., framework=...)`) whose peak memory is at most the refused plan's, else its leanest point,
        with its predicted cost. Solving takes a moment, so only the CLI asks for it. A refusal of the inputs
        (`inputs_only`: a model or a training setting the framework cannot take) has no nearest plan: every plan would
        be refused the same."""
        if self.inputs_only:
            return self
        from autopar.errors import Infeasible
        from autopar.search.solve import solve

        try:
            front = solve(estimate.model, estimate.cluster, estimate.training,
                          extra_rules=framework_rules(self.framework)).points
        except Infeasible:
            return self
        within = [p for p in front if p.peak_memory_bytes <= estimate.peak_memory_bytes]
        nearest = within[0] if within else min(front, key=lambda p: p.peak_memory_bytes)
        refused = Unsupported(self.framework, self.plan, self.reasons)
        refused.message += (f"; the nearest plan it can run is '{nearest.plan.short()}' (predicted "
                            f"{nearest.step_time_s:.2f} s per step, peak {nearest.peak_memory_bytes / 2**30:.1f} GiB "
                            f"per GPU, against {estimate.step_time_s:.2f} s and "
                            f"{estimate.peak_memory_bytes / 2**30:.1f} GiB): rerun `autopar solve` with --framework "
                            f"{self.framework}, or estimate that plan")
        refused.args = (f"{refused.field}: {refused.message}",)
        return refused


# ---- the knob conditions, vectorised over many plans (PlanArrays) ------------------------------------------------

def _dp(ctx: Context, p: PlanArrays) -> np.ndarray:
    return ctx.cluster.num_gpus // np.maximum(p.tp * p.cp * p.pp, 1)


def _uneven(p: PlanArrays) -> np.ndarray:
    return (p.pp > 1) & ((p.first_stage_layers > 0) | (p.last_stage_layers > 0))


def _moe(ctx: Context) -> bool:
    return ctx.model.is_moe


# DeepSpeed 0.19.8 ----------------------------------------------------------------------------------------------

def _ds_pipeline_zero(ctx: Context, p: PlanArrays) -> np.ndarray:
    # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: assert self.zero_optimization_stage() <
    # ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    return (p.pp == 1) | (p.zero <= 1)


def _ds_moe_zero3(ctx: Context, p: PlanArrays) -> np.ndarray:
    # deepspeed/runtime/engine.py _configure_zero_optimizer: "Native DeepSpeed MoE is not supported with ZeRO Stage
    # 3. Use AutoEP or choose ZeRO stage 1/2." The exporter targets native DeepSpeed-MoE (deepspeed.moe.layer.MoE,
    # ep_size in model code); AutoEP (HF models only, no TP from an mpu) is out of its scope.
    return np.full(len(p), True) if not _moe(ctx) else p.zero <= 2


def _ds_no_cp(ctx: Context, p: PlanArrays) -> np.ndarray:
    # DeepSpeed has Ulysses sequence parallelism (sequence_parallel_size: all-to-all over attention heads), not
    # Megatron's ring context parallelism; a cp > 1 plan's memory and communication are not Ulysses'.
    return p.cp == 1


def _ds_no_interleave(ctx: Context, p: PlanArrays) -> np.ndarray:
    # deepspeed/runtime/pipe/schedule.py has TrainSchedule (1F1B) only; PipelineModule(partition_method=...) splits
    # by 'parameters' / 'uniform' / 'type:regex', never by explicit first/last stage sizes.
    return (p.vpp == 1) & ~_uneven(p)


def _ds_no_megatron_sp(ctx: Context, p: PlanArrays) -> np.ndarray:
    # AutoTP (tensor_parallel.autotp_size) shards Linear layers only; norms and dropout stay replicated, so
    # Megatron's sequence parallelism (activations sharded over tp outside the matmuls) is not available.
    return ~p.sp.astype(bool)


def _ds_experts(ctx: Context, p: PlanArrays) -> np.ndarray:
    # DeepSpeed-MoE (deepspeed.moe.layer.MoE(ep_size=...)): experts are not tensor-parallel (expert weights whole on
    # each EP rank, the "expert slicing" of inference only); ETP is 1 when experts are split, and tp-sharded
    # experts (ep = 1, etp = tp) are AutoTP's Linear sharding of a dense-style expert block.
    if not _moe(ctx):
        return np.full(len(p), True)
    return np.where(p.ep > 1, p.etp == 1, p.etp == p.tp)


def _ds_recompute(ctx: Context, p: PlanArrays) -> np.ndarray:
    # deepspeed.checkpointing.checkpoint recomputes whatever function it wraps (model code): whole layers, so full
    # recompute (of all or of k layers per stage) maps; Megatron's selective attention-core recompute needs a
    # model with that split, which DeepSpeed's config and AutoTP do not provide.
    return p.recompute != int(Recompute.SELECTIVE)


# torchtitan 0.3.0 ----------------------------------------------------------------------------------------------

def _tt_zero(ctx: Context, p: PlanArrays) -> np.ndarray:
    # torchtitan shards data parallelism with FSDP2 (fully_shard) or replicates it (DDP / HSDP replicate axis):
    # ZeRO-0 = data_parallel_replicate_degree, ZeRO-3 = data_parallel_shard_degree, ZeRO-2 =
    # fsdp_reshard_after_forward="never". Optimizer-only sharding (ZeRO-1) does not exist in FSDP2.
    return p.zero != 1


def _tt_experts(ctx: Context, p: PlanArrays) -> np.ndarray:
    # torchtitan/models/common/moe_sharding.py: with EP the routed experts are sharded over the sparse mesh
    # (dp_replicate, efsdp, ep) only (expert TP = 1); without EP they are sharded on the dense TP axis (expert TP =
    # tp). torchtitan/config/configs.py expert_parallel_degree: "EP borrows ranks from FSDP and TP: efsdp =
    # dp_shard * cp * tp / ep" -- ep must divide dp_shard·cp·tp, and dp_shard is 1 without FSDP (zero = 0).
    if not _moe(ctx):
        return np.full(len(p), True)
    dp_shard = np.where(p.zero >= 2, _dp(ctx, p), 1)
    borrowable = dp_shard * p.cp * p.tp
    etp_ok = np.where(p.ep > 1, p.etp == 1, p.etp == p.tp)
    return etp_ok & (borrowable % p.ep == 0)


def _tt_cp_replicas(ctx: Context, p: PlanArrays) -> np.ndarray:
    # torchtitan/distributed/parallel_dims.py: fsdp = dp_shard * cp ("we always assume that when cp is used, FSDP is
    # also applied"); a zero-0 plan (replicated weights) with cp > 1 is not what torchtitan builds
    return (p.zero >= 2) | (p.cp == 1)


def _tt_recompute(ctx: Context, p: PlanArrays) -> np.ndarray:
    # torchtitan/distributed/activation_checkpoint.py: FullAC wraps every transformer block, SelectiveAC is per-op
    # (save matmuls / comms, recompute the rest) -- there is no "recompute the first k layers of each stage"
    # (Megatron's --recompute-method block --recompute-num-layers k) and no module list (--recompute-modules).
    # Selective maps where the estimate priced torchtitan's per-op SAC (engine torchtitan:
    # costmodels.engines.per_op_sac), not Megatron's attention-core recompute.
    selective_ok = (p.recompute_modules == 0) & (ctx.training.engine is Engine.TORCHTITAN)
    return ((p.recompute != int(Recompute.SELECTIVE)) | selective_ok) & (p.recompute_layers == 0)


# Megatron-LM, NeMo 2, Megatron-Bridge, verl's Megatron backend: Megatron-Core plans, every knob expressible
# (verl 0.9.1: ZeRO-2/3 as use_megatron_fsdp with override_ddp_config.data_parallel_sharding_strategy, applied over
# its defaults by verl/utils/megatron_utils.py through Megatron-Bridge's create_ddp_config) ---------------------------

def _rule(framework: str, name: str, reason: str, source: str, knobs: tuple[str, ...], holds) -> Rule:
    return Rule(f"{framework}:{name}", reason, source, knobs, False, holds)


def _one_f_one_b(ctx: Context, p: PlanArrays) -> np.ndarray:
    # the zero-bubble schedules change nothing without a pipeline
    return (p.pp == 1) | (ctx.training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B)


def zero_bubble_fork_flags(schedule: PipelineSchedule, pp: int) -> list[str]:
    """The launch flags of sail-sg/zero-bubble-pipeline-parallelism (a Megatron-LM fork; its README and
    examples/pretrain_zero_bubble.sh) for `schedule` on `pp` stages: --enable-zero-bubble, the memory limit in
    micro-batches (--zero-bubble-max-pending-backward pp for ZB-1p, 2·pp for ZB-2p) and the optimizer
    post-validation of the paper's §4, which its example script turns on with the zero-bubble schedules."""
    limit = pp if schedule is PipelineSchedule.ZB_1P else 2 * pp
    return ["--enable-zero-bubble", "--zero-bubble-max-pending-backward", str(limit),
            "--enable-optimizer-post-validation"]


def _zero_bubble_rule(framework: str, lacks: str, source: str) -> Rule:
    reason = (f"pipeline schedule zb-1p / zb-2p with pp > 1: {lacks} (the schedules of arXiv 2401.10241 run in "
              "sail-sg/zero-bubble-pipeline-parallelism, a Megatron-LM fork); solve with --pipeline-schedule 1f1b to "
              "launch it here")

    def explain(ctx: Context, plan: Plan) -> str:
        schedule = ctx.training.pipeline_schedule
        return (f"pipeline schedule {schedule.value} with pp={plan.pp}: {lacks} (it runs in "
                f"sail-sg/zero-bubble-pipeline-parallelism, a Megatron-LM fork: "
                f"{' '.join(zero_bubble_fork_flags(schedule, plan.pp))}); solve with --pipeline-schedule 1f1b to "
                "launch it here")

    return Rule(f"{framework}:pipeline_schedule", reason, source, ("pp",), False, _one_f_one_b, explain)


def _fp32_grad_reduce(ctx: Context, p: PlanArrays) -> np.ndarray:
    return np.full(len(p), ctx.training.grad_reduce_in_fp32)


def _bf16_params(ctx: Context, p: PlanArrays) -> np.ndarray:
    return np.full(len(p), not ctx.training.fp8_param_gather)


def _megatron_fsdp_grads(ctx: Context, p: PlanArrays) -> np.ndarray:
    return (p.zero <= 1) | (not ctx.training.grad_reduce_in_fp32)


def _megatron_fsdp_grads_rule(framework: str, where: str) -> Rule:
    """zero >= 2 runs Megatron-FSDP, whose main gradients are in megatron_fsdp_main_grads_dtype, default None: the
    parameters' dtype, bf16 (it does not read grad_reduce_in_fp32); a torch.dtype field that `where` passes on as
    the string it reads, so fp32 cannot be set there. The Megatron-LM export writes --megatron-fsdp-main-grads-dtype."""
    return _rule(framework, "megatron_fsdp_grads",
                 "zero>=2 with gradients in fp32: Megatron-FSDP keeps and reduces its main gradients in "
                 "megatron_fsdp_main_grads_dtype, by default the parameters' bf16 (it does not read "
                 f"grad_reduce_in_fp32), and {where} cannot set that torch.dtype field; solve with "
                 "--grad-reduce-in-bf16 to price what it runs, or emit Megatron-LM (--megatron-fsdp-main-grads-dtype)",
                 "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py "
                 "_resolve_group_grad_dtype; distributed_data_parallel_config.py megatron_fsdp_main_grads_dtype",
                 ("zero",), _megatron_fsdp_grads)


_MEGATRON_SCHEDULES = ("Megatron-Core has 1F1B and interleaved 1F1B (and the combined 1F1B of the MoE all-to-all "
                       "overlap), no zero-bubble schedule")
_MEGATRON_SCHEDULES_SOURCE = "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func"


def _data_parallel_only(ctx: Context, p: PlanArrays) -> np.ndarray:
    return (p.tp == 1) & (p.pp == 1) & (p.cp == 1) & (p.ep == 1)


def _llmc_zero(ctx: Context, p: PlanArrays) -> np.ndarray:
    return p.zero <= 1


def _plain_recompute(ctx: Context, p: PlanArrays) -> np.ndarray:
    return (p.recompute != Recompute.SELECTIVE) & (p.recompute_layers == 0)


def _no_recompute(ctx: Context, p: PlanArrays) -> np.ndarray:
    return p.recompute == Recompute.NONE


def _per_layer_graphs_through_te(ctx: Context, p: PlanArrays) -> np.ndarray:
    training = ctx.training
    local_layers = (training.launch is LaunchPath.CUDA_GRAPH and not training.cuda_graph_full_iteration
                    and training.cuda_graph_impl == "local")
    return np.full(len(p), not local_layers)


CAPABILITIES: dict[str, tuple[Rule, ...]] = {
    "megatron": (_zero_bubble_rule("megatron", _MEGATRON_SCHEDULES, _MEGATRON_SCHEDULES_SOURCE),),
    # NeMo 2.7.3 imports megatron-core 0.16 (0.19 removed modules it imports: inference_wrapper_config), whose
    # Megatron-FSDP keeps its main gradients in fp32 when grad_reduce_in_fp32 is set (megatron_fsdp.py passes
    # ddp_config.grad_reduce_in_fp32 to its buffers): no gradient-dtype rule
    "nemo": (_zero_bubble_rule("nemo", _MEGATRON_SCHEDULES, _MEGATRON_SCHEDULES_SOURCE),),
    # Megatron-Bridge: bf16 gradient reduction is written inside the mixed_precision node, and Megatron-FSDP's fp32
    # main gradients as ddp.megatron_fsdp_main_grads_dtype={_target_:torch.float32,_call_:false} (export.nemo)
    "bridge": (_zero_bubble_rule("bridge", _MEGATRON_SCHEDULES, _MEGATRON_SCHEDULES_SOURCE),
               _rule("bridge", "cuda_graph_impl", "per-layer CUDA graphs through Megatron-Core's local capture "
                     "(--cuda-graph-impl local): Megatron-Bridge 0.6.2 takes local for the whole iteration only",
                     "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration", (),
                     _per_layer_graphs_through_te)),
    "verl": (_zero_bubble_rule("verl", _MEGATRON_SCHEDULES, _MEGATRON_SCHEDULES_SOURCE),
             _megatron_fsdp_grads_rule("verl", "override_ddp_config (passed to DistributedDataParallelConfig as "
                                               "given)")),
    "torchtitan": (
        _rule("torchtitan", "zero", "zero=1: torchtitan's FSDP2 has no optimizer-only sharding (ZeRO-0 replicate, "
              "ZeRO-2 reshard_after_forward=never, ZeRO-3 FSDP)", "torchtitan/config/configs.py ParallelismConfig",
              ("zero",), _tt_zero),
        _rule("torchtitan", "experts", "expert TP: torchtitan shards experts over EP only (etp=1) when ep > 1 and "
              "over TP (etp=tp) when ep = 1, and ep must divide data_parallel_shard_degree·cp·tp",
              "torchtitan/models/common/moe_sharding.py; torchtitan/config/configs.py expert_parallel_degree",
              ("ep", "etp", "tp", "cp", "pp", "zero"), _tt_experts),
        _rule("torchtitan", "cp_replicas", "zero=0 with cp > 1: torchtitan applies FSDP over the context-parallel "
              "ranks whatever the data-parallel setting (ParallelDims: the fsdp mesh is dp_shard·cp, and "
              "parallelize applies fully_shard on it), so the weights are sharded over cp, not replicated as priced",
              "torchtitan/distributed/parallel_dims.py build_mesh; torchtitan/models/llama3/parallelize.py",
              ("zero", "cp"), _tt_cp_replicas),
        _rule("torchtitan", "recompute", "recompute: torchtitan has full AC of every block and per-op selective AC "
              "(priced with --framework torchtitan), not Megatron's module-level selective recompute or recompute "
              "of k layers per stage",
              "torchtitan/distributed/activation_checkpoint.py", ("recompute", "recompute_layers"), _tt_recompute),
        _rule("torchtitan", "grad_reduce_in_fp32", "gradients reduced in bf16 (--grad-reduce-in-bf16): torchtitan "
              "0.3.0 reduces in float32 only (training.mixed_precision_reduce: Literal['float32'])",
              "torchtitan/config/configs.py TrainingConfig.mixed_precision_reduce", (), _fp32_grad_reduce),
        _zero_bubble_rule("torchtitan", "torchtitan's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble, "
                          "DualPipeV) run several stages per rank, not the one-stage ZB-1p / ZB-2p priced here",
                          "torch/distributed/pipelining/schedules.py; torchtitan pipeline_llm"),
        # torchao's Float8Linear (recipe rowwise) and MXFP8Linear subclass the linear and keep its weight; the
        # converters have no fp8-parameter or fp8-all-gather option in 0.3.0 (Float8LinearConverter.Config:
        # recipe_name, filter_fqns, emulate; MXFP8LinearConverter.Config: fqns)
        _rule("torchtitan", "fp8_param_gather", "fp8 parameters (--fp8-param-gather): torchtitan 0.3.0 keeps no fp8 "
              "weights -- its torchao float8 and MXFP8 linears hold the weights in the training dtype and quantize "
              "them at each forward, and FSDP2 gathers them in bf16 (mixed_precision_param) -- so the job keeps "
              "bf16 weights and gathers; solve without --fp8-param-gather",
              "torchtitan/components/quantization/float8.py Float8LinearConverter, mx.py MXFP8LinearConverter",
              (), _bf16_params),
    ),
    # a plain PyTorch training loop (DDP, or FSDP for zero >= 2; torch.utils.checkpoint per block) and llm.c
    # (train_gpt2.cu: data parallel over MPI/NCCL with -z 0/1, recompute -r of the GELU/layernorm only, priced none)
    "pytorch": (
        _rule("pytorch", "data_parallel", "a plain PyTorch loop runs data parallel only (DDP, FSDP): no TP, PP, CP "
              "or EP without a framework", "torch.nn.parallel.DistributedDataParallel, torch.distributed.fsdp",
              ("tp", "pp", "cp", "ep"), _data_parallel_only),
        _rule("pytorch", "recompute", "recompute: torch.utils.checkpoint recomputes whole blocks (full), not "
              "Megatron's module-level selective recompute or k layers per stage", "torch/utils/checkpoint.py",
              ("recompute", "recompute_layers"), _plain_recompute),
    ),
    "llmc": (
        _rule("llmc", "data_parallel", "llm.c trains data parallel only (train_gpt2.cu over MPI/NCCL)",
              "karpathy/llm.c train_gpt2.cu", ("tp", "pp", "cp", "ep"), _data_parallel_only),
        _rule("llmc", "zero", "llm.c shards the optimizer state at most (-z 0 or 1)", "karpathy/llm.c train_gpt2.cu "
              "zero_stage", ("zero",), _llmc_zero),
        _rule("llmc", "recompute", "llm.c keeps every activation but what -r 1/2 recomputes inside the GELU and "
              "layernorm kernels (not priced: recompute none)", "karpathy/llm.c train_gpt2.cu recompute",
              ("recompute",), _no_recompute),
    ),
    "deepspeed": (
        _rule("deepspeed", "pipeline_zero", "zero >= 2 with pp > 1: DeepSpeed's pipeline engine asserts 'ZeRO-2 "
              "and ZeRO-3 are incompatible with pipeline parallelism'", "deepspeed/runtime/pipe/engine.py",
              ("pp", "zero"), _ds_pipeline_zero),
        _rule("deepspeed", "moe_zero3", "MoE with zero=3: native DeepSpeed-MoE runs with ZeRO stages 0-2 only (the engine "
              "asserts 'Native DeepSpeed MoE is not supported with ZeRO Stage 3')",
              "deepspeed/runtime/engine.py _configure_zero_optimizer", ("zero",), _ds_moe_zero3),
        _rule("deepspeed", "cp", "cp > 1: DeepSpeed has Ulysses sequence parallelism (all-to-all over heads), not "
              "ring context parallelism", "deepspeed/sequence/layer.py DistributedAttention", ("cp",), _ds_no_cp),
        _rule("deepspeed", "pipeline_split", "vpp > 1 or explicit first/last stage sizes: DeepSpeed's "
              "PipelineModule runs 1F1B over stages it partitions itself", "deepspeed/runtime/pipe/module.py, "
              "schedule.py", ("vpp", "pp", "first_stage_layers", "last_stage_layers"), _ds_no_interleave),
        _rule("deepspeed", "sp", "sp=true: AutoTP shards Linear layers only; Megatron-style sequence parallelism "
              "(norm/dropout activations sharded over tp) is not available", "deepspeed/module_inject/auto_tp.py",
              ("sp",), _ds_no_megatron_sp),
        _rule("deepspeed", "experts", "expert TP: DeepSpeed-MoE experts are whole on each EP rank (etp=1 when ep > "
              "1; etp=tp only without EP)", "deepspeed/moe/layer.py", ("ep", "etp", "tp"), _ds_experts),
        _rule("deepspeed", "recompute", "recompute=selective: DeepSpeed checkpoints whole wrapped functions "
              "(deepspeed.checkpointing.checkpoint), not Megatron's attention-core recompute",
              "deepspeed/runtime/activation_checkpointing/checkpointing.py", ("recompute",), _ds_recompute),
        _zero_bubble_rule("deepspeed", "DeepSpeed's pipeline engine runs TrainSchedule (1F1B) only",
                          "deepspeed/runtime/pipe/schedule.py"),
        # nothing under deepspeed/runtime (engine, ZeRO stages 1-3, bf16_optimizer) knows an fp8 dtype: the fp8 of a
        # DeepSpeed model is Transformer Engine's, cast at each forward from the weights the engine holds
        _rule("deepspeed", "fp8_param_gather", "fp8 parameters (--fp8-param-gather): DeepSpeed 0.19.8 keeps, shards "
              "and all-gathers the weights in bf16 (bf16.enabled; its engine and ZeRO have no fp8 parameter), and "
              "Transformer Engine layers in the model cast them to fp8 at each forward -- so the job keeps bf16 "
              "weights and gathers; solve without --fp8-param-gather",
              "deepspeed/runtime/engine.py, deepspeed/runtime/zero/stage_1_and_2.py, stage3.py", (), _bf16_params),
    ),
}
"""Per framework, the conditions a plan must meet for that framework to run it (beyond autopar's own rules)."""


ADJUSTMENTS: dict[str, tuple[str, object, str]] = {
    "verl:megatron_fsdp_grads": (
        "grad_reduce_in_fp32", False, "gradients kept and reduced in bf16 (verl's Megatron-FSDP keeps its main "
        "gradients in the parameters' dtype: megatron_fsdp_main_grads_dtype cannot be set through "
        "override_ddp_config)"),
    "torchtitan:grad_reduce_in_fp32": (
        "grad_reduce_in_fp32", True, "gradients reduced in fp32 (torchtitan 0.3.0's "
        "training.mixed_precision_reduce is float32 only)"),
    "bridge:cuda_graph_impl": (
        "cuda_graph_impl", "transformer_engine", "the layers' CUDA graphs captured through Transformer Engine "
        "(cuda_graph_impl transformer_engine: Megatron-Bridge 0.6.2 runs local capture for the whole iteration "
        "only), whose static inputs keep an attention mask per layer in flight"),
}
"""Rules a plan breaks only through a TrainingSpec setting autopar chooses for the framework: rule id ->
(TrainingSpec field, the value the framework runs, why). The export writes that value and prices it
(`runnable_estimate`) instead of refusing the plan."""


def _tt_nearest_zero(plan: Plan, training: TrainingSpec) -> tuple[Plan, TrainingSpec, str]:
    """torchtitan has no ZeRO-1: its nearest is FSDP2 with the parameters kept gathered from forward to backward."""
    return (dataclasses.replace(plan, zero=2), training,
            "zero 2 (FSDP2 with fsdp_reshard_after_forward='never', torchtitan's nearest to the distributed optimizer: "
            "the gradients sharded too)")


def _tt_nearest_recompute(plan: Plan, training: TrainingSpec) -> tuple[Plan, TrainingSpec, str]:
    """Megatron's module-level selective recompute runs on torchtitan as its per-op SAC, priced with torchtitan's
    engine (costmodels.engines.per_op_sac); recompute of k layers per stage as full AC of every block."""
    if plan.recompute is Recompute.SELECTIVE:
        return (dataclasses.replace(plan, recompute_modules=0), dataclasses.replace(training, engine=Engine.TORCHTITAN),
                "selective recompute as torchtitan runs it, per-op SAC (SelectiveAC), and the step as its engine runs "
                "it")
    return (dataclasses.replace(plan, recompute_layers=0), training,
            "full AC of every block (torchtitan recomputes no k layers per stage)")


PLAN_ADJUSTMENTS = {"torchtitan:zero": _tt_nearest_zero, "torchtitan:recompute": _tt_nearest_recompute}
"""Rules a plan breaks through a knob the framework has a nearest setting for: rule id -> (plan, training) -> (the
plan and TrainingSpec the framework runs, why). Like ADJUSTMENTS, written and priced (`runnable_estimate`)."""


def runnable_estimate(estimate, framework: str):
    """(the estimate `framework` runs the plan as, a one-line note or None). The estimate itself where the framework
    runs it as priced; where the settings ADJUSTMENTS and PLAN_ADJUSTMENTS choose for the rules it breaks leave a
    plan it runs, that plan estimated again through the same estimate path with the TrainingSpec the framework runs
    (e.g. grad_reduce_in_fp32, ZeRO-2 for ZeRO-1 on torchtitan), and a note giving both costs -- refused instead
    where the plan fitted as asked and the adjusted one does not; else `Unsupported` with every reason."""
    from costmodels.scoring import estimate as score

    name = framework_name(framework)
    ctx = Context(estimate.model, estimate.cluster, estimate.training)
    plans = PlanArrays.from_plans([estimate.plan])
    with np.errstate(divide="ignore", invalid="ignore"):
        broken = [rule for rule in framework_rules(name) if not bool(rule.holds(ctx, plans)[0])]
    if not broken:
        return estimate, None
    adjustable = [rule for rule in broken if rule.id in ADJUSTMENTS or rule.id in PLAN_ADJUSTMENTS]
    if adjustable:
        plan, training, whys = estimate.plan, estimate.training, []
        try:   # a setting the adjusted engine cannot take (CUDA graphs under torchtitan) leaves the refusal
            for rule in adjustable:
                if rule.id in ADJUSTMENTS:
                    field, value, why = ADJUSTMENTS[rule.id]
                    training = dataclasses.replace(training, **{field: value})
                else:
                    plan, training, why = PLAN_ADJUSTMENTS[rule.id](plan, training)
                whys.append(why)
        except InputError:
            whys = []
        # the adjusted plan may mend other rules too (ZeRO-2's sharded experts): it must break none
        if whys and not refusals(Context(estimate.model, estimate.cluster, training), plan, name):
            adjusted = score(estimate.model, estimate.cluster, training, plan)
            why = "; ".join(whys)
            note = (f"written with {why}: predicted {adjusted.step_time_s:.3g} s per step, peak "
                    f"{adjusted.peak_memory_bytes / 2**30:.1f} GiB per GPU (as asked: {estimate.step_time_s:.3g} s, "
                    f"{estimate.peak_memory_bytes / 2**30:.1f} GiB)")
            fits_as_asked = estimate.peak_memory_bytes <= estimate.memory_limit_bytes
            if adjusted.peak_memory_bytes <= adjusted.memory_limit_bytes or not fits_as_asked:
                return adjusted, note
            raise Unsupported(name, estimate.plan, (f"it runs only as its nearest setting, {why}, which needs "
                                                    f"{adjusted.peak_memory_bytes / 2**30:.1f} GiB per GPU, over the "
                                                    f"{adjusted.memory_limit_bytes / 2**30:.1f} GiB limit",))
    require_runnable(estimate, name)
    return estimate, None


def framework_rules(framework: str) -> tuple[Rule, ...]:
    """The capability rules of `framework` (canonical name or alias), for the search; none for a framework priced
    but not exported (names.PRICED_ONLY: a plain PyTorch loop, llm.c), whose layouts autopar cannot check."""
    name = framework_name(framework, field="framework")
    return CAPABILITIES.get(name, ())


def refusals(ctx: Context, plan: Plan, framework: str) -> tuple[str, ...]:
    """Why `framework` cannot run `plan` (one reason per broken capability), empty when it can."""
    plans = PlanArrays.from_plans([plan])
    broken = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for rule in framework_rules(framework):
            if not bool(rule.holds(ctx, plans)[0]):
                broken.append(rule.why_broken(ctx, plan))
    return tuple(broken)


def require_runnable(estimate, framework: str) -> None:
    """Raise `Unsupported` (exit 2, with the reasons) when `framework` cannot run the estimate's plan."""
    name = framework_name(framework)
    ctx = Context(estimate.model, estimate.cluster, estimate.training)
    reasons = refusals(ctx, estimate.plan, name)
    if reasons:
        plans = PlanArrays.from_plans([estimate.plan])
        broken = [rule for rule in framework_rules(name) if not bool(rule.holds(ctx, plans)[0])]
        raise Unsupported(name, estimate.plan, reasons, inputs_only=all(not rule.knobs for rule in broken))
