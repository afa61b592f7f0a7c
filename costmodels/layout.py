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

Step time of a layout with per-microbatch rank times T_r (r = 0..p-1), v virtual stages per rank and m micro-batches:

    step = m · max_r T_r + (Σ_r T_r − max_r T_r) / v + max_r E_r + p2p

For v = 1 the pipelined part is (m − 1)·max T + Σ T: the slowest stage sets the pace in the steady 1F1B phase and
every stage's time is paid once in fill and drain (DAPPLE, Fan et al., arXiv 2007.01045 §3, pipeline latency of
synchronous 1F1B with unequal stages). With equal stages it is (m + (p − 1)/v)·T, the interleaved 1F1B time of
Narayanan et al., arXiv 2104.04473 eq. 2 (bubble (p − 1)/v micro-batch times); dividing the fill/drain term by v for
unequal stages is this model's generalisation (each of the v chunks of a rank fills and drains once, with 1/v of its
work). E_r is rank r's exposed data-parallel sync and optimizer step (steptime.dp_comm_s + optimizer_s); p2p the
stage-to-stage transfers (pipeline.p2p_time_s), which a layout does not change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels import compute as compute_model
from costmodels import memory, steptime
from costmodels.params import moe_layers_before
from costmodels.pipeline import p2p_time_s
from costmodels.plan import Plan, PlanArrays, StageContent, layers_on_stage, num_microbatches
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

TIME_UNIT_S = 1e-9
MEMORY_UNIT_BYTES = 2**20


def uniform_layout(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """The decoder layers of each virtual stage under the plan's own split (Megatron's even split, first/last-stage
    counts; a rank's layers split evenly over its vpp chunks; the embedding/loss slot split gives the slot's chunk
    one layer fewer)."""
    from costmodels.plan import embedding_loss_slots

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


@dataclass(frozen=True)
class LayoutTables:
    """Integer per-rank costs of one structure, indexed [rank, dense layers, MoE layers]."""

    plan: Plan
    num_layers: int
    num_moe_layers: int
    moe_first_dense: int
    moe_freq: int
    microbatches: int
    time_ns: np.ndarray
    """Per-microbatch time of the rank (compute + exposed TP/CP/EP), ns."""
    sync_ns: np.ndarray
    """Exposed data-parallel sync + optimizer step of the rank per step, ns."""
    memory_mib: np.ndarray
    """Peak memory of one GPU of the rank, MiB (rounded up)."""
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


def layout_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan) -> LayoutTables:
    """Tabulate every rank's costs for every (dense, MoE) layer count it could hold."""
    pp = plan.pp
    num_moe = int(moe_layers_before(model, np.array([model.num_layers]))[0])
    num_dense = model.num_layers - num_moe
    dense, moe = np.meshgrid(np.arange(num_dense + 1), np.arange(num_moe + 1), indexing="ij")
    cells = dense.size
    ranks = np.repeat(np.arange(pp), cells)
    dense_all, moe_all = np.tile(dense.ravel(), pp), np.tile(moe.ravel(), pp)
    plans = PlanArrays.from_plans([plan]).take(np.zeros(len(ranks), dtype=np.int64))
    stage = StageContent.of(ranks, dense_all + moe_all, moe_all)
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    with np.errstate(divide="ignore", invalid="ignore"):
        times = compute_model.layer_times_s(model, cluster.profile, training, plans)
        microbatch = steptime.stage_microbatch(model, cluster, training, plans, times, stage)
        per_microbatch_s = microbatch.compute_s + microbatch.tp_comm_s + microbatch.cp_comm_s + microbatch.ep_comm_s
        sync_s = (steptime.dp_comm_s(model, cluster, training, plans, stage, microbatch, microbatches)
                  + steptime.optimizer_s(model, cluster, plans, stage))
        memory_bytes = memory.total_bytes(memory.memory_terms_bytes(model, cluster, training, plans, stage))
        p2p_s = float(p2p_time_s(model, cluster.profile, training, plans.take([0]),
                                 cluster.num_gpus, cluster.gpus_per_node, microbatches[:1])[0])
    shape = (pp, num_dense + 1, num_moe + 1)
    return LayoutTables(
        plan=plan, num_layers=model.num_layers, num_moe_layers=num_moe,
        moe_first_dense=model.moe.first_dense_layers if model.moe is not None else 0,
        moe_freq=model.moe.layer_freq if model.moe is not None else 1,
        microbatches=int(round(float(microbatches[0]))),
        time_ns=np.rint(per_microbatch_s / TIME_UNIT_S).astype(np.int64).reshape(shape),
        sync_ns=np.rint(sync_s / TIME_UNIT_S).astype(np.int64).reshape(shape),
        memory_mib=np.ceil(memory_bytes / MEMORY_UNIT_BYTES).astype(np.int64).reshape(shape),
        p2p_ns=int(round(p2p_s / TIME_UNIT_S)),
        memory_limit_mib=int(math.floor(cluster.memory_limit_bytes / MEMORY_UNIT_BYTES)),
    )


@dataclass(frozen=True)
class LayoutCost:
    """A layout priced on the integer tables."""

    layout: tuple[int, ...]
    objective: int
    """v · step time in ns (the integer every search minimises)."""
    rank_dense: tuple[int, ...]
    rank_moe: tuple[int, ...]
    rank_time_ns: tuple[int, ...]
    rank_sync_ns: tuple[int, ...]
    rank_memory_mib: tuple[int, ...]
    fits: bool
    vpp: int

    @property
    def step_time_s(self) -> float:
        return self.objective / self.vpp * TIME_UNIT_S

    @property
    def peak_memory_mib(self) -> int:
        return max(self.rank_memory_mib)

    @property
    def bottleneck_rank(self) -> int:
        return int(np.argmax(self.rank_time_ns))


def rank_contents(tables: LayoutTables, layout: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(dense, MoE) decoder layers of each rank under `layout`."""
    pp = tables.pp
    bounds = np.concatenate(([0], np.cumsum(layout)))
    moe = np.diff(tables.moe_before(bounds))
    dense = np.asarray(layout) - moe
    rank_dense = [int(dense[r::pp].sum()) for r in range(pp)]
    rank_moe = [int(moe[r::pp].sum()) for r in range(pp)]
    return rank_dense, rank_moe


def objective_of(tables: LayoutTables, time_ns, sync_ns) -> int:
    """v · (m · max T + (Σ T − max T)/v + max E + p2p) in ns: the step-time formula of the module docstring."""
    v, m = tables.vpp, tables.microbatches
    t_max = max(time_ns)
    return v * m * t_max + (sum(time_ns) - t_max) + v * (max(sync_ns) + tables.p2p_ns)


def price_layout(tables: LayoutTables, layout: tuple[int, ...]) -> LayoutCost:
    assert len(layout) == tables.pp * tables.vpp and sum(layout) == tables.num_layers and min(layout) >= 0, layout
    rank_dense, rank_moe = rank_contents(tables, layout)
    time_ns = [int(tables.time_ns[r, d, e]) for r, (d, e) in enumerate(zip(rank_dense, rank_moe))]
    sync_ns = [int(tables.sync_ns[r, d, e]) for r, (d, e) in enumerate(zip(rank_dense, rank_moe))]
    memory_mib = [int(tables.memory_mib[r, d, e]) for r, (d, e) in enumerate(zip(rank_dense, rank_moe))]
    return LayoutCost(layout=tuple(int(x) for x in layout), objective=objective_of(tables, time_ns, sync_ns),
                      rank_dense=tuple(rank_dense), rank_moe=tuple(rank_moe), rank_time_ns=tuple(time_ns),
                      rank_sync_ns=tuple(sync_ns), rank_memory_mib=tuple(memory_mib),
                      fits=max(memory_mib) <= tables.memory_limit_mib, vpp=tables.vpp)
