"""The rules: the Parallelism Strategies Guide and Megatron's own constraints as named, vectorised checks.

Each rule is a `Rule` with an id (the name users see and `--relax` takes), a one-line reason, its source, the plan
knobs it reads (so the CP-SAT model can state it as a table over just those knobs), `holds(problem, plans)`, a boolean
mask over many plans, and `explain(problem, plan)`, the message for one plan that breaks it, with that plan's numbers and
a fix (written next to `holds`, so the condition and its wording stay together). DESIGN.md §3 is the table of
record. Rules marked relaxable are the guide's advice (Megatron itself runs without them); the others are what
Megatron's process groups, schedules and layer code require.

`memory` is special: it reads the cost model's peak memory, so it takes the peak as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from costmodels import memory
from costmodels.errors import InputError
from costmodels.plan import (PLAN_FIELDS, Plan, PlanArrays, Recompute, RecomputeModule, as_plan_arrays,
                             embedding_loss_slots, recomputes_module)
from costmodels.specs import (OFFLOAD_INSIDE_MOE, ClusterSpec, Fp8Recipe, LaunchPath, ModelSpec, PipelineSchedule,
                               TrainingSpec)


@dataclass(frozen=True)
class Problem:
    """What a plan is judged against: the model, the cluster and the training run (one solve's fixed inputs)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str
    source: str
    knobs: tuple[str, ...]
    relaxable: bool
    holds: Callable[[Problem, PlanArrays], np.ndarray]
    explain: Callable[[Problem, Plan], str | None] | None = None
    """The message for one plan that breaks the rule (called only when `holds` is False for it); None, or no
    `explain`, when there is nothing more specific to say than `reason`."""

    def why_broken(self, problem: Problem, plan: Plan) -> str:
        """What is wrong with `plan`, which breaks this rule: `explain`'s message, else `reason`."""
        message = self.explain(problem, plan) if self.explain is not None else None
        return message if message is not None else self.reason


# ---- one function per rule -------------------------------------------------------------------------------------

def _world(problem: Problem, p: PlanArrays) -> np.ndarray:
    n = problem.cluster.num_gpus
    return (n % (p.tp * p.cp * p.pp) == 0) & (n % (p.etp * p.ep * p.pp) == 0)


def _explain_world(problem: Problem, plan: Plan) -> str:
    n = problem.cluster.num_gpus
    model_parallel, expert_parallel = plan.tp * plan.cp * plan.pp, plan.etp * plan.ep * plan.pp
    if n % model_parallel:
        return (f"num_gpus={n} is not divisible by tp·cp·pp={plan.tp}·{plan.cp}·{plan.pp}={model_parallel}; "
                "change the GPU count or the sizes")
    return (f"num_gpus={n} is not divisible by etp·ep·pp={plan.etp}·{plan.ep}·{plan.pp}={expert_parallel}; "
            "change the GPU count or the expert sizes")


def _heads(problem: Problem, p: PlanArrays) -> np.ndarray:
    return (problem.model.num_attention_heads % p.tp == 0) & (problem.model.num_kv_heads % p.tp == 0)


def _explain_heads(problem: Problem, plan: Plan) -> str:
    heads, kv_heads = problem.model.num_attention_heads, problem.model.num_kv_heads
    return (f"tp={plan.tp} must divide num_attention_heads={heads} and num_kv_heads={kv_heads}; "
            f"use one of {_divisors(math.gcd(heads, kv_heads))}")


def _divisors(value: int) -> str:
    """The divisors of `value` for a message: all of them, or the first nine and the last when there are more."""
    divisors = [d for d in range(1, value + 1) if value % d == 0]
    shown = divisors if len(divisors) <= 10 else divisors[:9] + ["...", divisors[-1]]
    return ", ".join(str(d) for d in shown)


def _stage_layer_counts(num_layers: int, p: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, middle layers, number of middle stages), ends given as 0 taking the middle count."""
    multi = p.pp > 1
    has_first = multi & (p.first_stage_layers > 0)
    has_last = multi & (p.last_stage_layers > 0)
    middle_stages = p.pp - has_first - has_last
    rest = num_layers - np.where(has_first, p.first_stage_layers, 0) - np.where(has_last, p.last_stage_layers, 0)
    middle = np.where(middle_stages > 0, rest // np.maximum(middle_stages, 1), 0)
    whole = np.where(middle_stages > 0, rest % np.maximum(middle_stages, 1) == 0, rest == 0)
    first = np.where(has_first, p.first_stage_layers, middle)
    last = np.where(has_last, p.last_stage_layers, middle)
    return first, last, np.where(whole, middle, -1), middle_stages


def _layers(problem: Problem, p: PlanArrays) -> np.ndarray:
    return split_holds(problem.model.num_layers, p)


def split_holds(num_layers: int, p: PlanArrays) -> np.ndarray:
    """Whether each plan's even split with its first/last-stage counts places whole layers in vpp equal chunks on
    every rank (the `layers` rule of a plan without a layout)."""
    first, last, middle, middle_stages = _stage_layer_counts(num_layers, p)
    single = p.pp == 1
    ends_ok = np.where(single, (p.first_stage_layers == 0) & (p.last_stage_layers == 0), True)
    whole = (middle >= 0) & ((middle_stages == 0) | (middle >= 1)) & (first >= 1) & (last >= 1)
    # an end stage one layer lighter than the middle counts the embedding (loss) as a layer when interleaved
    embedding_slot, loss_slot = embedding_loss_slots(num_layers, p)
    chunks = (((first + embedding_slot) % p.vpp == 0) & ((last + loss_slot) % p.vpp == 0)
              & ((middle_stages == 0) | (middle % p.vpp == 0)))
    # Megatron-Core takes either the slot split or explicit end stages, not both (get_num_layers_to_build asserts)
    mixed = ((embedding_slot & (p.last_stage_layers > 0) & ~loss_slot)
             | (loss_slot & (p.first_stage_layers > 0) & ~embedding_slot))
    chunks = chunks & ~mixed
    return (p.pp <= num_layers) & ends_ok & np.where(single, num_layers % p.vpp == 0, whole & chunks)


def _explain_layers(problem: Problem, plan: Plan) -> str | None:
    num_layers = problem.model.num_layers
    if plan.layout:
        return layout_breaks(problem, plan).get("layers")
    if plan.pp == 1:
        if plan.first_stage_layers or plan.last_stage_layers:
            return "--first-stage-layers/--last-stage-layers need pp > 1"
        return None   # vpp > 1 without a pipeline: the vpp rule says why
    explicit = [count for count in (plan.first_stage_layers, plan.last_stage_layers) if count]
    middle_stages = plan.pp - len(explicit)
    rest = num_layers - sum(explicit)
    if rest < middle_stages or (middle_stages == 0 and rest != 0):
        return (f"first/last stage layers {sum(explicit)} leave {rest} of num_layers={num_layers} "
                f"for {middle_stages} other stages")
    if middle_stages and rest % middle_stages:
        if explicit:
            return f"the {rest} layers left after the first/last stages do not split evenly over {middle_stages} stages"
        return (f"pp={plan.pp} must divide num_layers={num_layers}; use one of "
                f"{_divisors(num_layers)} or --first-stage-layers/--last-stage-layers")
    embedding_slot, loss_slot = (bool(slot) for slot in embedding_loss_slots(num_layers, plan))
    if (embedding_slot and plan.last_stage_layers and not loss_slot) or \
            (loss_slot and plan.first_stage_layers and not embedding_slot):
        return ("an end stage one layer lighter than the middle (the embedding or loss counted as a layer) cannot be "
                "combined with an explicit other end (Megatron-Core takes one or the other)")
    slotted = [count + 1 if (embedding_slot and i == 0) or (loss_slot and i == len(explicit) - 1) else count
               for i, count in enumerate(explicit)]
    stage_layers = ([rest // middle_stages] * middle_stages if middle_stages else []) + slotted
    if any(count % plan.vpp for count in stage_layers):
        slot_hint = (f", or an end stage of {rest // middle_stages - 1} layers (the embedding or loss counts as one)"
                     if middle_stages and (rest // middle_stages) % plan.vpp == 0 else "")
        return f"vpp={plan.vpp} must divide the layers of every stage ({sorted(set(stage_layers))}){slot_hint}"
    return None


def _experts(problem: Problem, p: PlanArrays) -> np.ndarray:
    if problem.model.moe is None:
        return (p.ep == 1) & (p.etp == p.tp)
    return problem.model.moe.num_experts % p.ep == 0


def _explain_experts(problem: Problem, plan: Plan) -> str:
    if problem.model.moe is not None:
        num_experts = problem.model.moe.num_experts
        return f"ep={plan.ep} must divide num_experts={num_experts}; use one of {_divisors(num_experts)}"
    if plan.ep > 1:
        return f"ep={plan.ep} needs an MoE model; {problem.model.name} is dense, use ep=1"
    return f"etp={plan.etp} must equal tp={plan.tp}: {problem.model.name} is dense (no expert layers); drop --etp"


def _tp_node(problem: Problem, p: PlanArrays) -> np.ndarray:
    node = problem.cluster.nvlink_domain_gpus  # a node, or the job's share of a multi-node NVLink domain (NVL72)
    return (p.tp <= node) & (node % p.tp == 0) & (p.etp <= node) & (node % p.etp == 0)


def _explain_tp_node(problem: Problem, plan: Plan) -> str:
    node = problem.cluster.nvlink_domain_gpus
    what = (f"gpus_per_node={node}" if node == problem.cluster.gpus_per_node else
            f"the job's NVLink domain of {node} GPUs")
    if plan.tp > node or node % plan.tp:
        return (f"tp={plan.tp} must divide {what} (TP stays inside a node's NVLink domain; "
                "the guide: beyond 8 use PP)")
    return (f"etp={plan.etp} must divide {what} (expert TP stays inside a node's NVLink domain; "
            "use EP across nodes)")


def _cp_needs_sp_tp(problem: Problem, p: PlanArrays) -> np.ndarray:
    return (p.cp == 1) | (p.sp & (p.tp > 1))


def _explain_cp_needs_sp_tp(problem: Problem, plan: Plan) -> str:
    return f"cp={plan.cp} needs tp > 1 with --sp (the guide's CP requirement)"


def _sp_needs_tp(problem: Problem, p: PlanArrays) -> np.ndarray:
    return ~p.sp | (p.tp > 1)


def _explain_sp_needs_tp(problem: Problem, plan: Plan) -> str:
    return "sequence parallelism needs tp > 1; drop --sp"


def _moe_needs_sp(problem: Problem, p: PlanArrays) -> np.ndarray:
    if problem.model.moe is None:
        return np.ones(len(p), dtype=bool)
    return (p.tp == 1) | p.sp


def _explain_moe_needs_sp(problem: Problem, plan: Plan) -> str:
    return (f"tp={plan.tp} on an MoE model needs sequence parallelism (Megatron-Core requires it with MoE and TP); "
            "add --sp")


def _cp_seq(problem: Problem, p: PlanArrays) -> np.ndarray:
    seq = problem.training.seq_len
    split = (p.cp == 1) | (seq % (2 * p.cp) == 0)
    local = seq // p.cp
    return split & (seq % p.cp == 0) & (~p.sp | (local % p.tp == 0))


def _explain_cp_seq(problem: Problem, plan: Plan) -> str:
    seq = problem.training.seq_len
    if plan.cp > 1 and seq % (2 * plan.cp):
        return f"seq_len={seq} must be divisible by 2·cp={2 * plan.cp} (load-balanced context parallelism)"
    # seq_len splits into 2·cp chunks, so what breaks is the sequence-parallel split of seq_len/cp over tp
    return f"seq_len/cp={seq}/{plan.cp} must be divisible by tp={plan.tp} with sequence parallelism"


def _batch(problem: Problem, p: PlanArrays) -> np.ndarray:
    n, gbs = problem.cluster.num_gpus, problem.training.global_batch_size
    model_parallel = p.tp * p.cp * p.pp
    dp = n // model_parallel
    whole_dp = (n % model_parallel == 0) & (dp >= 1)
    per_step = np.maximum(dp, 1) * p.mbs
    fits = whole_dp & (gbs % per_step == 0)
    microbatches = gbs // per_step
    return fits & ((p.vpp == 1) | interleaved_groups_hold(microbatches, p.pp, problem.training))


def interleaved_groups_hold(microbatches: np.ndarray, pp: np.ndarray, training: TrainingSpec) -> np.ndarray:
    """Megatron-Core's interleaved schedule takes m micro-batches in groups of g (TrainingSpec.
    microbatch_group_size_per_vp_stage, 0 = pp, its default): it raises ValueError unless pp <= g <= m, and
    RuntimeError when the last group is short, 0 < m % g < pp ('dependency bubbles';
    pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving). With g = pp: m a multiple of pp."""
    group = training.microbatch_group_size_per_vp_stage or pp
    rest = microbatches % np.maximum(group, 1)
    return (group >= pp) & (group <= microbatches) & ((rest == 0) | (rest >= pp))


def _explain_batch(problem: Problem, plan: Plan) -> str | None:
    gbs, dp = problem.training.global_batch_size, plan.dp(problem.cluster.num_gpus)
    if not dp:
        return None   # tp·cp·pp does not divide the GPU count: the world rule says why
    per_step = dp * plan.mbs
    if gbs % per_step:
        return f"global_batch_size={gbs} must be divisible by dp·mbs={dp}·{plan.mbs}={per_step}"
    microbatches = gbs // per_step
    group = problem.training.microbatch_group_size_per_vp_stage
    if not group:
        return f"the interleaved schedule needs num_microbatches={microbatches} divisible by pp={plan.pp}"
    return (f"the interleaved schedule takes the {microbatches} micro-batches in groups of "
            f"--microbatch-group-size-per-virtual-pipeline-stage {group}: it needs pp={plan.pp} <= {group} <= "
            f"{microbatches}, and the last group either full or of at least pp micro-batches (Megatron-Core raises "
            "otherwise); change the group size or the global batch")


def _vpp(problem: Problem, p: PlanArrays) -> np.ndarray:
    # Megatron-LM validate_args: with the P2P overlap off, 'pipeline-model-parallel size should be greater than 2 to
    # avoid having multiple p2p sends and recvs between same 2 ranks per communication batch'
    least_pp = 1 if problem.training.overlap_p2p_comm else 2
    return (p.vpp == 1) | (p.pp > least_pp)


def _explain_vpp(problem: Problem, plan: Plan) -> str:
    if plan.pp > 1:
        return (f"vpp={plan.vpp} with pp={plan.pp} needs the P2P overlap (Megatron-LM asserts pp > 2 for the "
                "interleaved schedule without it); drop --no-overlap-p2p-communication or use pp > 2")
    return f"vpp={plan.vpp} needs pp > 1 (virtual stages interleave a pipeline)"


def _zero_bubble_vpp(problem: Problem, p: PlanArrays) -> np.ndarray:
    return (p.vpp == 1) | (problem.training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B)


def _explain_zero_bubble_vpp(problem: Problem, plan: Plan) -> str:
    return (f"vpp={plan.vpp} with pipeline schedule {problem.training.pipeline_schedule.value}: the zero-bubble "
            "schedules ZB-1p / ZB-2p run one chunk per pipeline rank; use vpp 1, or --pipeline-schedule 1f1b for "
            "the interleaved schedule")


def _zero_bubble_recompute(problem: Problem, p: PlanArrays) -> np.ndarray:
    # a pending W pass needs its GEMMs' inputs and output gradients (arXiv 2401.10241 Table 1: M_W = 32sbh per
    # layer), which recompute would drop and re-create in B: they stay until W, whatever is recomputed
    keeps_gemm_inputs = (p.recompute == Recompute.NONE) | (
        (p.recompute == Recompute.SELECTIVE)
        & ((p.recompute_modules == 0) | (p.recompute_modules == int(RecomputeModule.CORE_ATTN))))
    # without a pipeline the schedule changes nothing (no W is held back)
    return keeps_gemm_inputs | (p.pp == 1) | (problem.training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B)


def _explain_zero_bubble_recompute(problem: Problem, plan: Plan) -> str:
    what = plan.recompute.name.lower()
    if plan.recompute_modules:
        what += f" ({'+'.join(RecomputeModule.short_names(int(plan.recompute_modules)))})"
    return (f"recompute {what} with pipeline schedule {problem.training.pipeline_schedule.value}: a pending "
            "weight-gradient pass keeps the GEMM inputs recompute would drop, which this model does not price; use "
            "--recompute none or selective with core_attn only, or --pipeline-schedule 1f1b")


def _recompute(problem: Problem, p: PlanArrays) -> np.ndarray:
    first, last, middle, _ = _stage_layer_counts(problem.model.num_layers, p)
    largest_chunk = np.maximum(np.maximum(first, last), middle) // p.vpp
    partial = p.recompute_layers > 0
    modules_ok = (p.recompute_modules == 0) | (p.recompute == Recompute.SELECTIVE)   # --recompute-modules: selective
    return modules_ok & (~partial | ((p.recompute == Recompute.FULL) & (p.recompute_layers < largest_chunk)))


def _explain_recompute(problem: Problem, plan: Plan) -> str:
    if plan.recompute_modules and plan.recompute is not Recompute.SELECTIVE:
        return "recompute modules need --recompute selective"
    if plan.recompute is not Recompute.FULL:
        return f"--recompute-layers {plan.recompute_layers} needs --recompute full (block recompute of N layers)"
    if plan.layout:
        chunk = max(plan.layout)
    else:
        first, last, middle, _ = _stage_layer_counts(problem.model.num_layers, PlanArrays.from_plans([plan]))
        chunk = int(max(first[0], last[0], middle[0]) // plan.vpp)
    fix = f"use 1 to {chunk - 1}, or drop it" if chunk > 1 else "drop it"
    return (f"--recompute-layers {plan.recompute_layers} must be fewer than the {chunk} layer(s) of the largest "
            f"pipeline chunk (pp={plan.pp}, vpp={plan.vpp}); {fix} to recompute them all")


FP8_DELAYED_UNRECOMPUTABLE = RecomputeModule.LAYERNORM | RecomputeModule.MOE_ACT
"""Modules Megatron-Core will not recompute under fp8 delayed scaling: their recompute has the linear layer after them
keep its original (bf16) input, which TE's DelayedScaling quantizers refuse (TransformerConfig.__post_init__:
'Delayed scaling does not support moe_act and layernorm recompute for fp8')."""


def _fp8_delayed_recompute(problem: Problem, p: PlanArrays) -> np.ndarray:
    if problem.training.fp8_scaling is not Fp8Recipe.DELAYED:
        return np.ones(len(p), dtype=bool)
    return (p.recompute != Recompute.SELECTIVE) | ((p.recompute_modules & int(FP8_DELAYED_UNRECOMPUTABLE)) == 0)


def _explain_fp8_delayed_recompute(problem: Problem, plan: Plan) -> str:
    modules = RecomputeModule.names(int(plan.recompute_modules) & int(FP8_DELAYED_UNRECOMPUTABLE))
    return (f"recompute modules {', '.join(modules)} with fp8 delayed scaling: Megatron-Core refuses them ('Delayed "
            "scaling does not support moe_act and layernorm recompute for fp8'); use --fp8-recipe tensorwise (or "
            "blockwise, mxfp8), or other modules")


def _fp8_param_gather(problem: Problem, p: PlanArrays) -> np.ndarray:
    if not problem.training.fp8_param_gather:
        return np.ones(len(p), dtype=bool)
    return p.zero >= 1


def _explain_fp8_param_gather(problem: Problem, plan: Plan) -> str:
    return ("fp8 parameters (--fp8-param-gather) with zero=0: Megatron-LM runs them only with the distributed "
            "optimizer or FSDP ('--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron "
            "fsdp, or inference mode'); use --zero 1 or higher, or drop --fp8-param-gather")


def _cpu_offloading(problem: Problem, p: PlanArrays) -> np.ndarray:
    layers = problem.training.cpu_offload_layers
    if not layers:
        return np.ones(len(p), dtype=bool)
    return (p.pp == 1) & (p.recompute == Recompute.NONE) & (layers < problem.model.num_layers)


def _explain_cpu_offloading(problem: Problem, plan: Plan) -> str:
    layers, total = problem.training.cpu_offload_layers, problem.model.num_layers
    if layers >= total:
        return (f"CPU offloading of {layers} layers on a {total}-layer model: Megatron-Core offloads fewer than all "
                "('CPU offloading can be done only for layers less than num_layers'); offload fewer layers")
    if plan.pp > 1:
        return (f"CPU offloading with pp={plan.pp}: Megatron-Core runs it without pipelining only ('Currently there is "
                "no support for Pipeline parallelism with CPU offloading'); use pp 1 or drop the offloading")
    return ("CPU offloading with recompute: Megatron-Core refuses the two together ('CPU offloading does not work "
            "when activation recomputation is enabled'); drop one")


def _offload_inside_moe(problem: Problem, p: PlanArrays) -> np.ndarray:
    if not OFFLOAD_INSIDE_MOE & set(problem.training.offload_modules) or problem.model.moe is None:
        return np.ones(len(p), dtype=bool)
    return ~recomputes_module(p, RecomputeModule.MOE)


def _explain_offload_inside_moe(problem: Problem, plan: Plan) -> str:
    inside = sorted(OFFLOAD_INSIDE_MOE & set(problem.training.offload_modules))
    return (f"offloading {', '.join(inside)} with recompute module moe: Megatron-Core refuses it ('Cannot offload "
            "... while recomputing the entire MoE layer'); drop moe from the recompute modules or those from the "
            "offload modules")


def _cuda_graph_recompute(problem: Problem, p: PlanArrays) -> np.ndarray:
    if problem.training.launch is not LaunchPath.CUDA_GRAPH or problem.training.cuda_graph_full_iteration:
        return np.ones(len(p), dtype=bool)
    return p.recompute != Recompute.FULL


def _explain_cuda_graph_recompute(problem: Problem, plan: Plan) -> str:
    return ("full recompute with per-layer CUDA graphs (--cuda-graph-impl): Megatron-Core refuses the two together "
            "('full recompute is only supported with full iteration CUDA graph'); use selective recompute or none, "
            "drop --cuda-graph-impl, or capture the full iteration (Megatron-LM's --cuda-graph-impl full_iteration)")


def _memory_placeholder(problem: Problem, p: PlanArrays) -> np.ndarray:  # pragma: no cover - see memory_holds
    raise AssertionError("the memory rule needs the peak memory: use memory_holds")


RULES: tuple[Rule, ...] = (
    Rule("world", "tp·cp·pp and etp·ep·pp must divide the GPU count (dp and edp are whole)",
         "Megatron process groups", ("tp", "cp", "pp", "etp", "ep"), False, _world, _explain_world),
    Rule("heads", "tp must divide the attention heads and the KV heads", "Megatron TP", ("tp",), False, _heads,
         _explain_heads),
    Rule("layers", "layers must split into pp stages (explicit lighter first/last stages allowed) and each stage "
         "into vpp equal chunks", "Megatron PP", ("pp", "vpp", "first_stage_layers", "last_stage_layers"), False,
         _layers, _explain_layers),
    Rule("experts", "ep must divide the number of experts (dense models: ep = 1, etp = tp)", "guide, EP",
         ("ep", "etp", "tp"), False, _experts, _explain_experts),
    Rule("tp_node", "tp and etp must fit inside a node (TP never crosses NVLink; guide: TP <= 8)", "guide",
         ("tp", "etp"), True, _tp_node, _explain_tp_node),
    Rule("cp_needs_sp_tp", "context parallelism requires sequence parallelism and tp > 1", "guide, CP",
         ("cp", "sp", "tp"), True, _cp_needs_sp_tp, _explain_cp_needs_sp_tp),
    Rule("sp_needs_tp", "sequence parallelism needs tp > 1", "Megatron", ("sp", "tp"), False, _sp_needs_tp,
         _explain_sp_needs_tp),
    Rule("moe_needs_sp", "an MoE model with tp > 1 needs sequence parallelism",
         "Megatron-Core TransformerConfig ('When using MoE and tensor parallelism, sequence parallelism must be used')",
         ("tp", "sp"), False, _moe_needs_sp, _explain_moe_needs_sp),
    Rule("cp_seq", "seq_len must split into 2·cp chunks (load balancing), and with SP seq_len/cp by tp",
         "Megatron CP load balancing", ("cp", "sp", "tp"), False, _cp_seq, _explain_cp_seq),
    Rule("batch", "the global batch must split into dp × mbs × microbatches; interleaving needs the microbatches "
         "to be a multiple of pp (of the micro-batch group, with a last group of at least pp, when one is set)",
         "Megatron schedules", ("tp", "cp", "pp", "mbs", "vpp"), False, _batch,
         _explain_batch),
    Rule("vpp", "virtual pipeline stages need pp > 1 (pp > 2 without the P2P overlap)", "Megatron",
         ("vpp", "pp"), False, _vpp, _explain_vpp),
    Rule("zero_bubble_vpp", "the zero-bubble schedules (zb-1p, zb-2p) are not interleaved: vpp = 1",
         "arXiv 2401.10241 §3 (one stage per worker; the fork's interleaved variant is the ZB-V schedule)",
         ("vpp",), False, _zero_bubble_vpp, _explain_zero_bubble_vpp),
    Rule("zero_bubble_recompute", "with pp > 1 the zero-bubble schedules are priced without recompute or with the "
         "attention core's only (a pending W pass keeps the GEMM inputs other recompute drops)",
         "arXiv 2401.10241 §2.3 and Table 1 (M_W); sail-sg's fork keeps grad_output and input per deferred W",
         ("pp", "recompute", "recompute_modules"), False, _zero_bubble_recompute, _explain_zero_bubble_recompute),
    Rule("recompute", "partial recompute (recompute_layers > 0) needs full recompute and fewer layers than a chunk; "
         "recompute modules need selective recompute",
         "Megatron --recompute-method block / --recompute-modules",
         ("recompute", "recompute_layers", "recompute_modules", "pp", "vpp", "first_stage_layers", "last_stage_layers"),
         False, _recompute, _explain_recompute),
    Rule("fp8_delayed_recompute", "fp8 delayed scaling cannot recompute the layernorm or moe_act modules",
         "Megatron-Core TransformerConfig.__post_init__ (TE's DelayedScaling has no save_original_input)",
         ("recompute", "recompute_modules"), False, _fp8_delayed_recompute, _explain_fp8_delayed_recompute),
    Rule("fp8_param_gather", "fp8 parameters (--fp8-param-gather) need the distributed optimizer or FSDP: zero >= 1",
         "Megatron-LM validate_args (arguments.py: '--fp8-param-gather only supported with distributed optimizer, "
         "torch fsdp2, megatron fsdp, or inference mode')", ("zero",), False, _fp8_param_gather,
         _explain_fp8_param_gather),
    Rule("cuda_graph_recompute", "per-layer CUDA graphs (--cuda-graph-impl) do not take full recompute",
         "Megatron-Core TransformerConfig.__post_init__ ('full recompute is only supported with full iteration CUDA "
         "graph')", ("recompute",), False, _cuda_graph_recompute, _explain_cuda_graph_recompute),
    Rule("cpu_offloading", "CPU activation offloading runs with pp = 1, no recompute and fewer layers than the "
         "model's", "Megatron-Core TransformerConfig.__post_init__ (cpu_offloading)", ("pp", "recompute"), False,
         _cpu_offloading, _explain_cpu_offloading),
    Rule("offload_inside_moe", "the routed experts' activations are not offloaded (expert_fc1, moe_act, "
         "fused_group_mlp) while recompute module moe recomputes the whole MoE layer",
         "Megatron-Core TransformerConfig.__post_init__ (fine_grained_activation_offloading)", ("recompute",
                                                                                               "recompute_modules"),
         False, _offload_inside_moe, _explain_offload_inside_moe),
    Rule("memory", "peak memory of every pipeline stage must fit in (1 - headroom) × GPU memory", "guide",
         PLAN_FIELDS, False, _memory_placeholder),
)

RULES_BY_ID = {rule.id: rule for rule in RULES}
STRUCTURAL_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.id != "memory")


def memory_holds(cluster: ClusterSpec, peak_memory_bytes: np.ndarray) -> np.ndarray:
    return np.asarray(peak_memory_bytes) <= cluster.memory_limit_bytes


def active_rules(relax: Iterable[str] = ()) -> tuple[Rule, ...]:
    """The rules in force after `relax`; an unknown or non-relaxable name is an InputError listing the valid ones."""
    relax = tuple(relax)
    relaxable = [r.id for r in RULES if r.relaxable]
    for name in relax:
        if name not in RULES_BY_ID:
            raise InputError("relax", f"unknown rule {name!r}; rules that can be relaxed: {', '.join(relaxable)}")
        if not RULES_BY_ID[name].relaxable:
            why = ("it is the GPU's memory limit: use --headroom to change how much is kept free"
                   if name == "memory" else "Megatron cannot build such a plan")
            raise InputError("relax", f"rule {name!r} cannot be relaxed ({why}); rules that can be relaxed: "
                             f"{', '.join(relaxable)}")
    return tuple(r for r in RULES if r.id not in relax)


def structural_mask(problem: Problem, plans: PlanArrays, rules: Sequence[Rule]) -> np.ndarray:
    """Plans that satisfy every rule in `rules` except memory."""
    mask = np.ones(len(plans), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for rule in rules:
            if rule.id != "memory":
                mask &= rule.holds(problem, plans)
    return mask


def violated_rules(problem: Problem, plans: PlanArrays, rules: Sequence[Rule],
                   peak_memory_bytes: np.ndarray | None = None) -> list[tuple[str, ...]]:
    """For each plan, the ids of the rules it breaks, in RULES order."""
    broken = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for rule in rules:
            if rule.id == "memory":
                if peak_memory_bytes is None:
                    continue
                peak = np.asarray(peak_memory_bytes, dtype=float)
                broken.append((rule.id, np.isfinite(peak) & ~memory_holds(problem.cluster, peak)))
            else:
                broken.append((rule.id, ~rule.holds(problem, plans)))
    return [tuple(name for name, mask in broken if mask[i]) for i in range(len(plans))]


# ---- a plan with an explicit layout --------------------------------------------------------------------------------

LAYOUT_RULES: tuple[str, ...] = ("layers", "recompute")
"""The rules that read a plan's first/last split, which a layout replaces: a plan with a layout is checked against
the layout's own rules for them (`layout_breaks`), on any layer count, as Megatron-Core takes a
--pipeline-model-parallel-layout in place of the even split (TransformerConfig: the layout excludes every other
split field, and pp need not divide num_layers)."""


def layout_breaks(problem: Problem, plan: Plan) -> dict[str, str]:
    """The LAYOUT_RULES a plan with a layout breaks, rule id -> message (empty when the layout is valid).

    `layers`, as Megatron-Core's PipelineParallelLayerLayout validates a layout (megatron/core/transformer/
    pipeline_parallel_layer_layout.py: __init__ needs the virtual stages to be a multiple of pp;
    validate_layer_layout: the embedding first, the loss last, each once, exactly num_layers decoder layers, the MTP
    layers after every decoder layer in a rank's last virtual stage): autopar's layout lists decoder layers per
    virtual stage with the embedding on the first and the loss and MTP on the last, so what is left to check is that
    there are pp·vpp stages (Plan checks it), a pipeline (pp > 1) and that the decoder layers sum to the model's.
    Stages may be empty (Megatron-Core builds an empty chunk: pretty_repr's '(empty stage)').
    `recompute`: block recompute of n layers per virtual stage needs fewer than the largest stage's layers."""
    broken: dict[str, str] = {}
    num_layers = problem.model.num_layers
    if plan.pp < 2:
        broken["layers"] = "a pipeline layout needs pp > 1"
    elif len(plan.layout) != plan.pp * plan.vpp:
        broken["layers"] = (f"the layout has {len(plan.layout)} virtual stages; pp·vpp = {plan.pp}·{plan.vpp} = "
                            f"{plan.pp * plan.vpp} needed")
    elif sum(plan.layout) != num_layers:
        broken["layers"] = (f"the layout places {sum(plan.layout)} decoder layers; {problem.model.name} has "
                            f"{num_layers}: list every layer once")
    modules_ok = not plan.recompute_modules or plan.recompute is Recompute.SELECTIVE
    partial_ok = not plan.recompute_layers or (plan.recompute is Recompute.FULL
                                               and plan.recompute_layers < max(plan.layout, default=0))
    if not (modules_ok and partial_ok):
        broken["recompute"] = RULES_BY_ID["recompute"].explain(problem, plan) or RULES_BY_ID["recompute"].reason
    return broken


def plan_violations(problem: Problem, plan: Plan, rules: Sequence[Rule],
                    peak_memory_bytes: float | None = None) -> tuple[str, ...]:
    """The ids of the rules in `rules` one plan breaks, in RULES order: `violated_rules`, with a layout's own rules
    (`layout_breaks`) in place of the split's for a plan with a layout."""
    peak = None if peak_memory_bytes is None else np.array([peak_memory_bytes])
    if not plan.layout:
        return violated_rules(problem, PlanArrays.from_plans([plan]), rules, peak)[0]
    import dataclasses

    bare = dataclasses.replace(plan, layout=())
    others = violated_rules(problem, PlanArrays.from_plans([bare]), [r for r in rules if r.id not in LAYOUT_RULES],
                            peak)[0]
    broken = set(others) | (set(layout_breaks(problem, plan)) & {r.id for r in rules})
    return tuple(rule.id for rule in RULES if rule.id in broken)


def check_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan | PlanArrays,
               relax: Iterable[str] = ()) -> tuple[str, ...]:
    """The ids of the rules `plan` breaks (memory included, from the cost model's peak: of every rank of its
    layout, for a plan with one); () when it is valid."""
    problem, rules = Problem(model, cluster, training), active_rules(relax)
    if isinstance(plan, Plan) and plan.layout:
        peak = None
        if not layout_breaks(problem, plan):
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                peak = float(memory.total_bytes(memory.layout_memory_terms_bytes(model, cluster, training,
                                                                                 plan)).max())
        return plan_violations(problem, plan, rules, peak)
    plans = as_plan_arrays(plan)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        try:
            peak, _, _ = memory.peak_memory(model, cluster, training, plans)
        except (ZeroDivisionError, ValueError, IndexError):   # a structurally broken plan may not be evaluable
            peak = None
    return violated_rules(problem, plans, rules, peak)[0]
