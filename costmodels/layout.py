"""Pipeline layouts: any number of decoder layers on each virtual pipeline stage, priced stage by stage.

A layout lists the decoder layers of every virtual stage in model order (Megatron-Core's
--pipeline-model-parallel-layout, megatron/core/transformer/pipeline_parallel_layer_layout.py): virtual stage i runs
on pipeline rank i % pp as its chunk i // pp; the embedding sits on stage 0, the loss (output layer, cross entropy)
and the MTP modules on the last stage, as the cost model places them (costmodels.steptime / memory: first and last
rank). A plan's even split with its first/last-stage counts is one layout (`uniform_layout`).

Pricing (exact with respect to the cost model, no new formulas for the per-stage pieces): a rank's per-microbatch
time (compute + exposed TP/CP/EP collectives), its data-parallel sync + optimizer step, and its peak memory are the
ordinary per-stage cost functions evaluated with the rank's own dense and MoE layer counts
(costmodels.plan.StageContent); its in-flight micro-batches and its role (embedding, loss) come from its rank index
as in the uniform model. They are tabulated once per (rank, dense layers, MoE layers), so every search works on the
same integer tables (`LayoutTables`): time in whole nanoseconds (rounded to nearest), memory in whole MiB (rounded
up, so a layout that fits in units fits in bytes).

Step time of a layout. Virtual stage i's per-microbatch time t_i (forward + backward + recompute + exposed TP/CP/EP
collectives of its own layers, the EP all-to-all under --overlap-moe-expert-parallel-comm by `exposed_ep_s`; the
embedding's and the loss's work on the first and last virtual stage) is the per-stage cost function on its layers
alone. Rank r runs its chunks one after another: T_r = Σ_c t_{r,c}; its largest
chunk is C_r = max_c t_{r,c}. With m micro-batches:

    step = m · max_r T_r + (Σ_r C_r − max_r C_r) + max_r E_r + p2p

The first term is the steady state: every rank runs m micro-batches through all of its chunks and the slowest rank
sets the pace. The second is fill and drain: each rank's chunk enters the pipeline once before the last rank starts
(and leaves once after the first finishes), the pace-setting one counted in the first term. Without interleaving
(C_r = T_r) this is (m − 1)·max T + Σ T, the latency of synchronous 1F1B with unequal stages (DAPPLE, Fan et al.,
arXiv 2007.01045 §3: warm-up through every stage, steady phase at the slowest stage); with equal stages and v chunks
per rank (t = T/v) it is (m + (p − 1)/v)·T, interleaved 1F1B (Narayanan et al., arXiv 2104.04473 §2.2.2, eq. 2:
bubble (p − 1)/v micro-batch times). Counting each rank's largest chunk is this model's generalisation to unequal
chunks: a layout that piles a rank's layers into one chunk gets the non-interleaved bubble back. E_r is rank r's
exposed data-parallel sync and optimizer step (steptime.dp_comm_s + optimizer_s, on the rank's parameters); p2p the
stage-to-stage transfers (steptime.pp_p2p_s, the overlapped ones beside the even split's chunk), which a layout does
not change. Memory is per rank: its weights and its activations times its own in-flight micro-batches, in the
search's tables on its total layers (memory.in_flight_microbatches: chunks taken as equal, what the tables can
index), in a layout's breakdown and estimate from its chunks' own layers (memory.interleaved_held_layers, the
interleaved schedule walked: chunk 0 is held longest), so a layout the tables admit may come out over memory and
leave the front.

One approximation against the uniform model: under --overlap-moe-expert-parallel-comm the fill and drain term counts
each chunk's discounted all-to-all, where the uniform model's bubble (warmup and cooldown, when the exchange is
exposed) counts the whole of it; pricing it exactly would take a second stage table for C_r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels import compute as compute_model
from costmodels import memory, steptime
from costmodels.errors import InputError
from costmodels.params import layout_stage_layers, moe_layers_before
from costmodels.plan import Plan, PlanArrays, StageContent, layers_on_stage, num_microbatches
from costmodels.specs import ClusterSpec, ModelSpec, PipelineSchedule, TrainingSpec

TIME_UNIT_S = 1e-9
MEMORY_UNIT_BYTES = 2**20


def split_is_whole(model: ModelSpec, plan: Plan) -> bool:
    """Whether the plan's own split (even, with its first/last-stage counts) places whole layers in vpp equal chunks
    on every rank (the `layers` rule of a plan without a layout: costmodels.rules.split_holds)."""
    from costmodels.rules import split_holds

    return bool(split_holds(model.num_layers, PlanArrays.from_plans([plan]))[0])


def balanced_layout(num_layers: int, stages: int) -> tuple[int, ...]:
    """The composition of `num_layers` into `stages` virtual stages nearest the even split: ⌊L/S⌋ layers each, the
    L mod S left over one each on the stages after the first (which holds the embedding) in model order."""
    each, extra = divmod(num_layers, stages)
    order = list(range(1, stages)) + [0]
    bump = set(order[:extra])
    return tuple(each + (i in bump) for i in range(stages))


def uniform_layout(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """The decoder layers of each virtual stage under the plan's own split (Megatron's even split, first/last-stage
    counts; a rank's layers split evenly over its vpp chunks; the embedding/loss slot split gives the slot's chunk
    one layer fewer); where that split is not whole (pp·vpp does not divide the layers and no first/last split
    does: only a layout runs it), the balanced layout (`balanced_layout`)."""
    from costmodels.plan import embedding_loss_slots

    if not split_is_whole(model, plan):
        return balanced_layout(model.num_layers, plan.pp * plan.vpp)
    plans = PlanArrays.from_plans([plan])
    per_rank = [int(round(float(layers_on_stage(model.num_layers, plans, r)[0]))) for r in range(plan.pp)]
    embedding_slot, loss_slot = (bool(x[0]) for x in embedding_loss_slots(model.num_layers, plans))
    chunks = [[0] * plan.vpp for _ in range(plan.pp)]
    for r, layers in enumerate(per_rank):
        slots = layers + (embedding_slot and r == 0) + (loss_slot and r == plan.pp - 1)
        each = slots // plan.vpp
        chunks[r] = [each] * plan.vpp
        if embedding_slot and r == 0:
            chunks[r][0] -= 1
        if loss_slot and r == plan.pp - 1:
            chunks[r][-1] -= 1
        chunks[r][-1] += layers - sum(chunks[r])     # any remainder (not for plans the layers rule accepts)
    return tuple(chunks[i % plan.pp][i // plan.pp] for i in range(plan.pp * plan.vpp))


def layout_space_log10(num_layers: int, virtual_stages: int) -> float:
    """log10 of the number of layouts: compositions of the layers into the virtual stages (empty stages allowed),
    C(L + S − 1, S − 1)."""
    return math.log10(math.comb(num_layers + virtual_stages - 1, virtual_stages - 1))


ROLES = ("first", "middle", "last")
"""What a virtual stage holds besides decoder layers: the embedding (first), nothing (middle), the loss and MTP
(last)."""


def stage_role(index: int, stages: int) -> int:
    return 0 if index == 0 else 2 if index == stages - 1 else 1


@dataclass(frozen=True)
class LayoutTables:
    """Integer costs of one structure: per virtual-stage role and per rank, indexed by (dense, MoE) layers."""

    plan: Plan
    num_layers: int
    num_moe_layers: int
    moe_first_dense: int
    moe_freq: int
    microbatches: int
    stage_time_ns: np.ndarray
    """[role, dense, moe]: per-microbatch time of a virtual stage (compute + exposed TP/CP/EP), ns."""
    sync_ns: np.ndarray
    """[rank, dense, moe]: exposed data-parallel sync + optimizer step of the rank per step, ns."""
    memory_mib: np.ndarray
    """[rank, dense, moe]: peak memory of one GPU of the rank, MiB (rounded up)."""
    p2p_ns: int
    memory_limit_mib: int

    @property
    def pp(self) -> int:
        return self.plan.pp

    @property
    def vpp(self) -> int:
        return self.plan.vpp

    def moe_before(self, position: np.ndarray | int) -> np.ndarray:
        """MoE layers among decoder layers [0, position) (params.moe_layers_before in integers)."""
        if self.num_moe_layers == 0:
            return np.zeros_like(np.asarray(position))
        upto = np.clip(np.asarray(position), 0, self.num_layers)
        return np.maximum(upto // self.moe_freq - self.moe_first_dense // self.moe_freq, 0)


def prices_layouts(training: TrainingSpec) -> bool:
    """Whether this model prices per-stage layouts under `training`'s schedule: its fill-and-drain term is 1F1B's
    (interleaved or not); the zero-bubble schedules fill the pipeline with W passes and are priced on the even split
    only (pipeline.zero_bubble_s)."""
    return training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B


def require_layout_schedule(training: TrainingSpec) -> None:
    """InputError unless `prices_layouts(training)`."""
    if not prices_layouts(training):
        raise InputError("layout", f"per-stage pipeline layouts are priced for Megatron-Core's 1F1B schedules, not "
                                   f"pipeline schedule {training.pipeline_schedule.value}; drop the layout or use "
                                   "--pipeline-schedule 1f1b")


def layout_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan) -> LayoutTables:
    """Tabulate the costs of every (dense, MoE) layer count a virtual stage or a rank could hold."""
    require_layout_schedule(training)
    pp = plan.pp
    num_moe = int(moe_layers_before(model, np.array([model.num_layers]))[0])
    num_dense = model.num_layers - num_moe
    dense, moe = np.meshgrid(np.arange(num_dense + 1), np.arange(num_moe + 1), indexing="ij")
    cells = dense.size
    shape = (num_dense + 1, num_moe + 1)

    def grid(ranks: np.ndarray):
        plans = PlanArrays.from_plans([plan]).take(np.zeros(len(ranks) * cells, dtype=np.int64))
        stage = StageContent.of(np.repeat(ranks, cells), np.tile((dense + moe).ravel(), len(ranks)),
                                np.tile(moe.ravel(), len(ranks)))
        return plans, stage

    with np.errstate(divide="ignore", invalid="ignore"):
        # virtual stages by role: rank index 0 (embedding), -1 (a rank holding neither end), pp-1 (loss, MTP)
        plans, stage = grid(np.array([0, -1, pp - 1]))
        times = compute_model.layer_times_s(model, cluster.profile, training, plans)
        piece = steptime.stage_microbatch(model, cluster, training, plans, times, stage)
        stage_s = piece.compute_s + piece.tp_comm_s + piece.cp_comm_s + piece.host_s \
            + exposed_ep_s(model, cluster, training, plans, piece)
        # ranks: their parameters (sync, optimizer) and memory with their own in-flight micro-batches
        plans, stage = grid(np.arange(pp))
        microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
        times = compute_model.layer_times_s(model, cluster.profile, training, plans)
        piece = steptime.stage_microbatch(model, cluster, training, plans, times, stage)
        sync_s = (steptime.dp_comm_s(model, cluster, training, plans, stage, piece, microbatches)
                  + steptime.optimizer_s(model, cluster, training, plans, stage))
        memory_bytes = memory.total_bytes(memory.memory_terms_bytes(model, cluster, training, plans, stage))
        one = plans.take([0])
        p2p_s = float(steptime.pp_p2p_s(model, cluster, training, one, microbatches[:1])[0])
    return LayoutTables(
        plan=plan, num_layers=model.num_layers, num_moe_layers=num_moe,
        moe_first_dense=model.moe.first_dense_layers if model.moe is not None else 0,
        moe_freq=model.moe.layer_freq if model.moe is not None else 1,
        microbatches=int(round(float(microbatches[0]))),
        stage_time_ns=np.rint(stage_s / TIME_UNIT_S).astype(np.int64).reshape((3,) + shape),
        sync_ns=np.rint(sync_s / TIME_UNIT_S).astype(np.int64).reshape((pp,) + shape),
        memory_mib=np.ceil(memory_bytes / MEMORY_UNIT_BYTES).astype(np.int64).reshape((pp,) + shape),
        p2p_ns=int(round(p2p_s / TIME_UNIT_S)),
        memory_limit_mib=int(math.floor(cluster.memory_limit_bytes / MEMORY_UNIT_BYTES)),
    )


@dataclass(frozen=True)
class LayoutCost:
    """A layout priced on the integer tables."""

    layout: tuple[int, ...]
    objective_ns: int
    """The step time in ns (the integer every search minimises)."""
    stage_time_ns: tuple[int, ...]
    rank_dense: tuple[int, ...]
    rank_moe: tuple[int, ...]
    rank_time_ns: tuple[int, ...]
    rank_sync_ns: tuple[int, ...]
    rank_memory_mib: tuple[int, ...]
    fits: bool

    @property
    def step_time_s(self) -> float:
        return self.objective_ns * TIME_UNIT_S

    @property
    def peak_memory_mib(self) -> int:
        return max(self.rank_memory_mib)

    @property
    def bottleneck_rank(self) -> int:
        return int(np.argmax(self.rank_time_ns))


def stage_contents(tables: LayoutTables, layout) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) decoder layers of each virtual stage under `layout`."""
    bounds = np.concatenate(([0], np.cumsum(layout)))
    moe = np.diff(tables.moe_before(bounds))
    return np.asarray(layout) - moe, moe


def price_layout(tables: LayoutTables, layout) -> LayoutCost:
    pp, stages = tables.pp, tables.pp * tables.vpp
    assert len(layout) == stages and sum(layout) == tables.num_layers and min(layout) >= 0, layout
    dense, moe = stage_contents(tables, layout)
    t = [int(tables.stage_time_ns[stage_role(i, stages), dense[i], moe[i]]) for i in range(stages)]
    rank_dense = [int(dense[r::pp].sum()) for r in range(pp)]
    rank_moe = [int(moe[r::pp].sum()) for r in range(pp)]
    rank_time = [sum(t[r::pp]) for r in range(pp)]
    largest_chunk = [max(t[r::pp]) for r in range(pp)]
    sync = [int(tables.sync_ns[r, d, e]) for r, (d, e) in enumerate(zip(rank_dense, rank_moe))]
    mem = [int(tables.memory_mib[r, d, e]) for r, (d, e) in enumerate(zip(rank_dense, rank_moe))]
    objective = (tables.microbatches * max(rank_time) + sum(largest_chunk) - max(largest_chunk) + max(sync)
                 + tables.p2p_ns)
    return LayoutCost(layout=tuple(int(x) for x in layout), objective_ns=int(objective), stage_time_ns=tuple(t),
                      rank_dense=tuple(rank_dense), rank_moe=tuple(rank_moe), rank_time_ns=tuple(rank_time),
                      rank_sync_ns=tuple(sync), rank_memory_mib=tuple(mem),
                      fits=max(mem) <= tables.memory_limit_mib)


# ---- float breakdown of one layout (what reports show; the integer tables decide) -------------------------------

@dataclass(frozen=True)
class LayoutBreakdown:
    layout: tuple[int, ...]
    stage_time_s: tuple[float, ...]
    """Per-microbatch time of every virtual stage, model order."""
    rank_layers: tuple[tuple[int, int], ...]
    """(dense, MoE) decoder layers of every rank."""
    rank_time_s: tuple[float, ...]
    rank_memory_terms_bytes: tuple[dict[str, float], ...]
    time_terms_s: dict[str, float]
    """compute, tp_comm, cp_comm, ep_comm (m × the slowest rank's per-microbatch pieces), pp_bubble (fill and
    drain: Σ C − max C), pp_p2p, dp_comm and optimizer (of the rank whose sum is largest): they sum to step_time_s."""

    @property
    def step_time_s(self) -> float:
        return sum(self.time_terms_s.values())

    @property
    def rank_memory_bytes(self) -> tuple[float, ...]:
        return tuple(sum(t.values()) for t in self.rank_memory_terms_bytes)


def exposed_ep_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                 piece: "steptime.StageMicrobatch") -> np.ndarray:
    """Each virtual stage's EP all-to-all per micro-batch as the step exposes it: all of it, or under
    --overlap-moe-expert-parallel-comm its warmup/cooldown share whole and the rest phase by phase beside its MoE
    layers' compute (steptime.ep_exposed_per_microbatch_s and ep_paired_exposed_s, which scale with the stage: a
    chunk carries its own layers' exchange)."""
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    return steptime.ep_exposed_per_microbatch_s(model, training, plans, piece.ep_comm_s,
                                                piece.ep_paired_exposed_s, microbatches)


def layout_breakdown(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                     layout: "tuple[float, ...]") -> LayoutBreakdown:
    """The step-time formula of the module docstring in floats, with each term named, and every rank's memory.
    `layout` may be fractional (`parent_layout` of a split that is not whole)."""
    pp, stages = plan.pp, plan.pp * plan.vpp
    assert len(layout) == stages and math.isclose(sum(layout), model.num_layers), (layout, stages, model.num_layers)
    layers, moe = layout_stage_layers(model, layout)
    dense = layers - moe
    role_rank = np.array([(0, -1, pp - 1)[stage_role(i, stages)] for i in range(stages)])
    rank_dense = np.array([dense[r::pp].sum() for r in range(pp)])
    rank_moe = np.array([moe[r::pp].sum() for r in range(pp)])
    base = PlanArrays.from_plans([plan])
    with np.errstate(divide="ignore", invalid="ignore"):
        plans = base.take(np.zeros(stages, dtype=np.int64))
        times = compute_model.layer_times_s(model, cluster.profile, training, plans)
        piece = steptime.stage_microbatch(model, cluster, training, plans, times,
                                          StageContent.of(role_rank, dense + moe, moe))
        rank_plans = base.take(np.zeros(pp, dtype=np.int64))
        rank_stage = StageContent.of(np.arange(pp), rank_dense + rank_moe, rank_moe,
                                     np.array([layers[r::pp] for r in range(pp)]))
        microbatches = num_microbatches(rank_plans, cluster.num_gpus, training.global_batch_size)
        rank_times = compute_model.layer_times_s(model, cluster.profile, training, rank_plans)
        rank_piece = steptime.stage_microbatch(model, cluster, training, rank_plans, rank_times, rank_stage)
        ep_s = exposed_ep_s(model, cluster, training, plans, piece)
        dp_s = steptime.dp_comm_s(model, cluster, training, rank_plans, rank_stage, rank_piece, microbatches)
        optimizer_s = steptime.optimizer_s(model, cluster, training, rank_plans, rank_stage)
        memory_terms = memory.memory_terms_bytes(model, cluster, training, rank_plans, rank_stage)
        p2p_s = float(steptime.pp_p2p_s(model, cluster, training, rank_plans.take([0]), microbatches[:1])[0])
    stage_s = piece.compute_s + piece.tp_comm_s + piece.cp_comm_s + ep_s + piece.host_s
    rank_s = np.array([stage_s[r::pp].sum() for r in range(pp)])
    largest = np.array([stage_s[r::pp].max() for r in range(pp)])
    slow = int(np.argmax(rank_s))
    m = float(microbatches[0])
    sync = int(np.argmax(dp_s + optimizer_s))
    terms = {
        "compute": m * float(piece.compute_s[slow::pp].sum()),
        "tp_comm": m * float(piece.tp_comm_s[slow::pp].sum()),
        "cp_comm": m * float(piece.cp_comm_s[slow::pp].sum()),
        "ep_comm": m * float(ep_s[slow::pp].sum()),
        "host": m * float(np.broadcast_to(piece.host_s, stage_s.shape)[slow::pp].sum()),
        "pp_bubble": float(largest.sum() - largest.max()),
        "pp_p2p": p2p_s,
        "dp_comm": float(dp_s[sync]),
        "optimizer": float(optimizer_s[sync]),
    }
    return LayoutBreakdown(
        layout=tuple(layout), stage_time_s=tuple(float(x) for x in stage_s),
        rank_layers=tuple((int(round(d)), int(round(e))) for d, e in zip(rank_dense, rank_moe)),
        rank_time_s=tuple(float(x) for x in rank_s),
        rank_memory_terms_bytes=tuple({k: float(v[r]) for k, v in memory_terms.items()} for r in range(pp)),
        time_terms_s=terms)


# ---- the plan a layout refines -----------------------------------------------------------------------------------

def parent_layout(model: ModelSpec, parent: Plan) -> "tuple[float, ...]":
    """The layout the uniform model prices for `parent` (a plan without a layout): its `uniform_layout` where its
    split is whole; else the even split itself, L/(pp·vpp) decoder layers on every virtual stage, fractional as the
    uniform model takes it (costmodels.plan.layers_per_middle_stage is a float), so that a layout on a layer count
    no split divides is compared within one model with the uniform model's price of its structure."""
    if split_is_whole(model, parent):
        return uniform_layout(model, parent)
    stages = parent.pp * parent.vpp
    return (model.num_layers / stages,) * stages


GAP_TERM = "uniform_model_gap"
"""Time term of a layout plan's estimate: the uniform model's step time of the parent plan minus the per-stage
model's time of the parent's own layout (costmodels.scoring.estimate of a plan with a layout)."""


def with_layout(plan: Plan, layout: "tuple[int, ...]") -> Plan:
    """`plan` with `layout` in place of its first/last split (a layout plan carries none: Plan)."""
    import dataclasses

    return dataclasses.replace(plan, layout=tuple(layout), first_stage_layers=0, last_stage_layers=0)


def parent_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan) -> Plan:
    """The plan without its layout, with the first/last split Megatron's rules accept whose layers per rank are
    nearest the layout's (least total difference; ties to the more even split), so that the uniform model, the rules
    and frameworks without layouts apply to it. A function of the layout alone (a layout plan carries no split of its
    own, Plan), so a layout gets one price whichever structure's search found it."""
    import dataclasses

    from costmodels.rules import RULES, Problem, structural_mask

    bare = dataclasses.replace(plan, layout=(), first_stage_layers=0, last_stage_layers=0)
    layers, pp = model.num_layers, plan.pp
    wanted = [sum(plan.layout[r::pp]) for r in range(pp)] if plan.layout else None
    candidates = set()
    for middle in sorted({max(layers // pp, 1), -(-layers // pp)}):
        rest = layers - (pp - 2) * middle if pp > 2 else layers
        for first in range(1, rest):
            candidates.add((first, rest - first, middle))
    problem = Problem(model, cluster, training)

    def ranks(first: int, last: int, middle: int) -> list[int]:
        return [first] + [middle] * (pp - 2) + [last]

    def distance(candidate) -> tuple[int, int]:
        first, last, middle = candidate
        counts = ranks(first, last, middle)
        off = sum(abs(a - b) for a, b in zip(counts, wanted)) if wanted else 0
        return off, max(counts) - min(counts)

    plans = []
    for first, last, middle in sorted(candidates, key=lambda c: (distance(c), c)):
        even = pp > 2
        plans.append(dataclasses.replace(bare, first_stage_layers=0 if even and first == middle else first,
                                         last_stage_layers=0 if even and last == middle else last))
    plans = [bare] + plans if layers % pp == 0 and not wanted else plans + [bare]
    # every rule Megatron needs (not the guide's advice, not memory): the split must also suit the recompute block
    needed = [rule for rule in RULES if not rule.relaxable and rule.id != "memory"]
    accepted = structural_mask(problem, PlanArrays.from_plans(plans), needed) if plans else []
    for candidate, ok in zip(plans, accepted):
        if ok:
            return candidate
    return bare
