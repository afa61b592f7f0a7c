"""CP-SAT over small factor tables versus numpy brute force over the same integer objective (a negative result).

Question. autopar's CP-SAT model (autopar/search/cpsat.py) is much slower than its numpy oracle
(autopar/search/oracle.py) because its cost tables span nearly all knobs. Does CP-SAT become competitive when the
cost is instead built from SMALL factor tables (at most 1,712 valid rows each in S1 and S2) combined with CP-SAT's
multiplication, min and division constraints? To time the solver and nothing else, both sides optimise one and the
same integer objective, an approximation of autopar's dense cost model (below): CP-SAT walks the (time, memory)
Pareto front with the epsilon-constraint method, numpy enumerates every plan of autopar's search space and takes the
front directly. The two fronts must be equal (compared as objective vectors; tied plans may differ).

Model. Times in TU = 100 ns; the step-time objective in TU/256 (the pipeline factor F keeps 8 fractional bits);
memory in MiB; activations in KiB per layer and micro-batch. The symbols are the factor tables listed below.

    X      = 3·Lw·T + R·T + LS·A + (4·Lw + 2·R)·B                   one micro-batch on the worst stage (TU)
    time   = F·X + 256·(P2P + DO)                                    one step (TU/256)
    F      = round(256·(m + (pp - 1)/vpp))                           micro-batch slots, pipeline bubble included
    P2P    = (2·vpp·m + 2·(pp - 1))·ONE                              stage-to-stage transfers (TU)
    memory = MS + floor(min(H, 16·m)·((Lw - R)·AF + R·AI) / 16384)   pipeline rank 0 (MiB); 16384 = 16 · 1024 KiB/MiB

3·Lw·T is forward + backward (2 × forward) of the stage's layers; R·T the forward re-run by full recompute; LS·A the
attention core re-run by selective recompute; (4·Lw + 2·R)·B two TP blocks per layer, each with one collective
forward and one backward, plus the forward one again for a recomputed layer; min(H, 16·m)/16 the micro-batches in
flight on rank 0.

Factor tables: the knobs each reads (first/last = first/last_stage_layers, rc/rl = recompute/recompute_layers,
m = micro-batches per step) and the costmodels function each follows.

    Lw   stage_layers              pp, first, last                   costmodels.plan.layers_on_stage (largest)
    R    recomputed_layers         pp, first, last, vpp, rc, rl      costmodels.memory.stage_shape
    LS   selective_layers          pp, first, last, rc               costmodels.steptime.stage_compute_s
    M    microbatches              tp, cp, pp, mbs                   costmodels.plan.num_microbatches
    F    pipeline_slots            m, pp, vpp                        costmodels.pipeline.bubble_microbatch_equivalents
    T    layer_fwd_units           tp, cp, mbs, sp                   costmodels.compute.layer_times_s
    A    attention_core_fwd_units  tp, cp, mbs                       costmodels.compute.layer_times_s
    B    tp_block_units            tp, cp, mbs, sp                   costmodels.steptime.tp_comm_s
    ONE  p2p_transfer_units        tp, cp, pp, mbs, sp               costmodels.pipeline.p2p_transfer_s
    DO   dp_optimizer_units        tp, cp, pp, first, last, zero     costmodels.steptime.dp_comm_s + optimizer_s
    MS   static_mib                tp, cp, pp, first, last, zero     costmodels.memory weights/gradients/optimizer
    H    held_sixteenths           pp, vpp                           costmodels.memory.in_flight_microbatches
    AF   stored_layer_kib          tp, cp, mbs, sp, rc               costmodels.memory.layer_activations_bytes
    AI   recomputed_input_kib      tp, cp, mbs, sp                   costmodels.memory.recomputed_layer_inputs_bytes

A table's valid rows carry autopar's rules that bind in these scenarios: the pipeline splits and recompute settings
of build_space, and the rules layers (vpp chunks), recompute, world, batch, vpp, sp_needs_tp, cp_needs_sp_tp and
cp_seq (autopar/search/rules.py); plans over the cluster's memory limit are infeasible. In CP-SAT each table is one
add_allowed_assignments over its knobs and its value; m is a variable equal to M (F reads it); the products are
add_multiplication_equality, min(H, 16·m) add_min_equality and the floor add_division_equality.

Simplifications relative to autopar's real cost model (costmodels.steptime, costmodels.memory):
- no per-stage maxima over the 4 candidate stages: each factor takes its own worst case (Lw layers; the largest
  parameter count of the 4 stages in DO and MS) and memory is rank 0's;
- no logits or MTP on the last stage, no embedding activations;
- no DP overlap windows (the gradient reduce and parameter gather are fully exposed) and no per-micro-batch ZeRO-2/3
  traffic;
- no CP ring exchange, no MoE (no EP all-to-all, no expert parameters);
- activations use Korthikanti et al.'s GPT coefficients without the attention-score term (flash attention):
  s·b·h·(10 + 24/t) per layer, 34·s·b·h/t with SP, selective recompute dropping 4·s·b·h/t, and a fully recomputed
  layer keeping its 2·s·b·h input (/t with SP), with s = seq/cp and b = mbs.

Walk. As autopar.search.cpsat.walk_front: with memory <= bound, find the fastest plan, then the least memory at that
time (hinted with the first solve's plan); the next bound is that memory - 1; stop when no plan fits. The default
run uses that walk with 1 worker and no presolve. --all-settings runs workers {1, 2} × presolve {off, on} ×
{two solves per point, one lexicographic solve minimising time·span + memory, span = memory range + 1}.

    python benchmarks/cpsat_decomposed.py [S1|S2] [--solve-limit 60] [--walk-limit 300] [--all-settings]

S1: llama-3.1-8b, 32 H100, seq 8192, global batch 256. S2: llama-3.1-70b, 256 H100, seq 8192, global batch 1024.
--solve-limit bounds each solve and --walk-limit each walk (seconds); a walk that hits either is incomplete.

The factor tables are built once and shared, untimed, by both sides. numpy_s is the best of two runs of the
enumeration (the first also pays for allocating its arrays); cpsat_s is the fastest complete walk among the
settings run (the walk alone; building the CP-SAT model is shown in the table). Ends with one line per scenario:

    cpsat-decomposed: S1 cpsat_s=X numpy_s=Y front=N equal=yes|no table_rows_max=R

equal=yes when every setting run found exactly the numpy front; table_rows_max is the largest table's valid rows.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

import autopar
from autopar.search.pareto import front_indices
from costmodels.rules import RULES_BY_ID, Problem
from autopar.search.space import Controls, SearchSpace, build_space
from costmodels.comm import dp_cp_group, group_collective_time_s
from costmodels.compute import layer_times_s
from costmodels.memory import in_flight_microbatches
from costmodels.params import stage_params_per_gpu
from costmodels.pipeline import p2p_transfer_s
from costmodels.steptime import candidate_stages, tp_block_s
from costmodels.plan import PlanArrays
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec


@dataclass(frozen=True)
class Scenario:
    model: str
    num_gpus: int
    seq_len: int
    global_batch: int


SCENARIOS = {
    "S1": Scenario("llama-3.1-8b", 32, 8192, 256),
    "S2": Scenario("llama-3.1-70b", 256, 8192, 1024),
}
GPU = "h100"

TIME_UNIT_S = 1e-7        # TU: 100 ns
SLOT_SCALE = 256          # F = round(256·(m + (pp-1)/vpp)); the step time is in TU/256
HELD_SCALE = 16           # H = ceil(16 · micro-batches held)
KIB_PER_MIB = 1024
BYTES_PER_KIB = 1024
BYTES_PER_MIB = 2**20
GRADIENT_BYTES = 4        # fp32 gradients reduced over dp·cp (TrainingSpec.gradient_bytes_per_param, the default)
PARAMETER_BYTES = 2       # bf16 parameters gathered with ZeRO >= 1 (costmodels.steptime.PARAM_BYTES)
ADAM_BYTES_PER_PARAM = 34  # costmodels.steptime.ADAM_BYTES_PER_PARAM

# CP-SAT knob variables, in creation order; the names are PlanArrays fields, plus the derived micro-batch count
KNOBS = ("tp", "cp", "pp", "first_stage_layers", "last_stage_layers", "vpp", "mbs", "sp", "zero", "recompute",
         "recompute_layers")
MICROBATCHES = "microbatches"
# free knobs of the search space besides the joint (split, recompute) domains; ep is (1,) for dense models
FREE_KNOBS = ("tp", "cp", "vpp", "mbs", "sp", "zero")
SELECTIVE, FULL = 1, 2    # costmodels.plan.Recompute


# ---- factor tables ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class FactorTable:
    """Integer values over the full index grid of `knobs`' domains, with the grid points that are allowed."""

    knobs: tuple[str, ...]
    values: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, knobs: tuple[str, ...], values, valid) -> FactorTable:
        values = np.asarray(values, dtype=np.int64)
        return cls(knobs, values, np.asarray(valid, dtype=bool) & np.ones(values.shape, dtype=bool))

    @property
    def rows(self) -> int:
        return int(self.valid.sum())

    def allowed_rows(self, domains: dict[str, tuple[int, ...]]) -> np.ndarray:
        """One row per valid grid point: the knob values, then the table's value."""
        index = np.nonzero(self.valid)
        columns = [np.asarray(domains[k], dtype=np.int64)[i] for k, i in zip(self.knobs, index, strict=True)]
        return np.stack(columns + [self.values[index]], axis=1)

    def lookup(self, index_by_knob: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(values, valid) at the given knob indices."""
        key = tuple(index_by_knob[k] for k in self.knobs)
        return self.values[key], self.valid[key]


@dataclass(frozen=True, eq=False)
class Instance:
    scenario: str
    space: SearchSpace
    domains: dict[str, tuple[int, ...]]
    tables: dict[str, FactorTable]
    memory_cap_mib: int


def _positions(domain: tuple[int, ...]) -> dict[int, int]:
    return {value: i for i, value in enumerate(domain)}


def _grid(domains: dict[str, tuple[int, ...]], knobs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each knob's values over the full index grid of `knobs` (axis i = knob i)."""
    mesh = np.meshgrid(*[np.asarray(domains[k], dtype=np.int64) for k in knobs], indexing="ij")
    return dict(zip(knobs, mesh, strict=True))


def _plans(grid: dict[str, np.ndarray]) -> PlanArrays:
    """The grid's points as plans (other fields: Plan's defaults)."""
    return PlanArrays.from_columns(**{k: v.ravel() for k, v in grid.items()})


def split_mask(space: SearchSpace, domains: dict[str, tuple[int, ...]]) -> np.ndarray:
    """Valid (pp, first, last) combinations: build_space's pipeline splits."""
    mask = np.zeros([len(domains[k]) for k in ("pp", "first_stage_layers", "last_stage_layers")], dtype=bool)
    pp_at, first_at, last_at = (_positions(domains[k]) for k in ("pp", "first_stage_layers", "last_stage_layers"))
    for pp, first, last in space.splits:
        mask[pp_at[pp], first_at[first], last_at[last]] = True
    return mask


def stage_layer_tables(space: SearchSpace, domains: dict[str, tuple[int, ...]],
                       num_layers: int) -> dict[str, FactorTable]:
    """Lw, R, LS. Lw: layers on the most loaded stage (costmodels.plan.layers_on_stage, middle stages rounded up).
    R: of those, the layers full recompute re-runs (costmodels.memory.stage_shape: recompute_layers per virtual
    chunk, 0 = all). LS: the layers whose attention core selective recompute re-runs (steptime.stage_compute_s)."""
    split_knobs = ("pp", "first_stage_layers", "last_stage_layers")
    splits = split_mask(space, domains)
    grid = _grid(domains, split_knobs)
    pp, first, last = grid["pp"], grid["first_stage_layers"], grid["last_stage_layers"]
    has_first = (pp > 1) & (first > 0)
    has_last = (pp > 1) & (last > 0)
    middle_stages = pp - has_first - has_last
    rest = num_layers - np.where(has_first, first, 0) - np.where(has_last, last, 0)
    middle_layers = np.where(middle_stages > 0, -(-rest // np.maximum(middle_stages, 1)), 0)
    first_layers = np.where(has_first, first, middle_layers)
    last_layers = np.where(has_last, last, middle_layers)
    worst_layers = np.maximum(np.maximum(first_layers, last_layers), middle_layers)

    # R over (pp, first, last, vpp, rc, rl): the split arrays broadcast over the last three axes
    recompute_knobs = split_knobs + ("vpp", "recompute", "recompute_layers")
    grid = _grid(domains, recompute_knobs)
    vpp, recompute, recompute_layers = grid["vpp"], grid["recompute"], grid["recompute_layers"]
    recompute_pairs = np.zeros((len(domains["recompute"]), len(domains["recompute_layers"])), dtype=bool)
    recompute_at, layers_at = _positions(domains["recompute"]), _positions(domains["recompute_layers"])
    for setting, layers in default_module_recomputes(space):
        recompute_pairs[recompute_at[setting], layers_at[layers]] = True

    def over_split(array: np.ndarray) -> np.ndarray:
        return array[..., None, None, None]

    # rules.layers (each stage's layers split into vpp chunks) and rules.recompute (partial: full, < largest chunk)
    whole_chunks = np.where(over_split(pp) == 1, num_layers % vpp == 0,
                            (over_split(first_layers) % vpp == 0) & (over_split(last_layers) % vpp == 0)
                            & ((over_split(middle_stages) == 0) | (over_split(middle_layers) % vpp == 0)))
    partial_ok = (recompute_layers == 0) | ((recompute == FULL) & (recompute_layers < over_split(worst_layers) // vpp))
    recompute_valid = over_split(splits) & whole_chunks & recompute_pairs[None, None, None, None] & partial_ok
    recomputed = np.where(recompute == FULL,
                          np.where(recompute_layers > 0, np.minimum(recompute_layers * vpp, over_split(worst_layers)),
                                   over_split(worst_layers)),
                          0)

    grid = _grid(domains, split_knobs + ("recompute",))
    selective = np.where(grid["recompute"] == SELECTIVE, worst_layers[..., None], 0)
    return {
        "stage_layers": FactorTable.of(split_knobs, worst_layers, splits),
        "recomputed_layers": FactorTable.of(recompute_knobs, recomputed, recompute_valid),
        "selective_layers": FactorTable.of(split_knobs + ("recompute",), selective,
                                           splits[..., None] & (grid["recompute"] <= FULL)),
    }


def microbatch_table(domains: dict[str, tuple[int, ...]], scenario: Scenario) -> FactorTable:
    """M: micro-batches per step, gbs/(dp·mbs) (costmodels.plan.num_microbatches); valid: rules.world and the
    divisibility part of rules.batch."""
    knobs = ("tp", "cp", "pp", "mbs")
    grid = _grid(domains, knobs)
    model_parallel = grid["tp"] * grid["cp"] * grid["pp"]
    dp = scenario.num_gpus // model_parallel
    valid = (scenario.num_gpus % model_parallel == 0) & (scenario.global_batch % (np.maximum(dp, 1) * grid["mbs"]) == 0)
    microbatches = np.where(valid, scenario.global_batch // np.maximum(dp * grid["mbs"], 1), 0)
    return FactorTable.of(knobs, microbatches, valid)


def pipeline_slot_table(domains: dict[str, tuple[int, ...]]) -> FactorTable:
    """F: 256 × (m + (pp-1)/vpp), the micro-batches of a step plus the bubble in micro-batch times
    (costmodels.pipeline.bubble_microbatch_equivalents); valid: the interleaving part of rules.batch
    (vpp > 1 needs m divisible by pp) and rules.vpp (vpp > 1 needs pp > 1)."""
    knobs = (MICROBATCHES, "pp", "vpp")
    grid = _grid(domains, knobs)
    microbatches, pp, vpp = grid[MICROBATCHES], grid["pp"], grid["vpp"]
    valid = (vpp == 1) | ((pp > 1) & (microbatches % pp == 0))
    return FactorTable.of(knobs, np.rint(SLOT_SCALE * (microbatches + (pp - 1) / vpp)), valid)


SEQUENCE_RULES = ("sp_needs_tp", "cp_needs_sp_tp", "cp_seq")
"""The rules of costmodels.rules that bind on the per-layer tables' knobs (tp, cp, mbs, sp)."""


def _sequence_rules_hold(grid: dict[str, np.ndarray], ctx: Problem) -> np.ndarray:
    """SEQUENCE_RULES on every point of a grid over (tp, cp, mbs, sp), from autopar's own rule functions."""
    plans = _plans(grid)
    holds = np.logical_and.reduce([RULES_BY_ID[rule].holds(ctx, plans) for rule in SEQUENCE_RULES])
    return holds.reshape(grid["tp"].shape)


def layer_time_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                      domains: dict[str, tuple[int, ...]]) -> dict[str, FactorTable]:
    """T, A: dense layer forward and attention core forward (costmodels.compute.layer_times_s). B: one TP block's
    collectives, an all-reduce, or with SP an all-gather + reduce-scatter, of the b·(s/cp)·h activation
    (costmodels.steptime.tp_block_s, as tp_comm_s sums them; the H100 profile hides none of it). Valid:
    rules.sp_needs_tp, rules.cp_needs_sp_tp and rules.cp_seq (with SP, tp divides seq/cp)."""
    knobs = ("tp", "cp", "mbs", "sp")
    grid = _grid(domains, knobs)
    shape = grid["tp"].shape
    valid = _sequence_rules_hold(grid, Problem(model, cluster, training))
    plans = _plans(grid)
    profile = cluster.profile
    layer_fwd_s = layer_times_s(model, profile, training, plans).dense_layer_fwd_s
    block_s = tp_block_s(model, cluster, training, plans)[0]

    core_knobs = ("tp", "cp", "mbs")
    core_grid = _grid(domains, core_knobs)
    core_fwd_s = layer_times_s(model, profile, training, _plans(core_grid)).attention_core_fwd_s
    return {
        "layer_fwd_units": FactorTable.of(knobs, np.rint(layer_fwd_s.reshape(shape) / TIME_UNIT_S), valid),
        "attention_core_fwd_units": FactorTable.of(
            core_knobs, np.rint(core_fwd_s.reshape(core_grid["tp"].shape) / TIME_UNIT_S), True),
        "tp_block_units": FactorTable.of(knobs, np.rint(block_s.reshape(shape) / TIME_UNIT_S), valid),
    }


def activation_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                      domains: dict[str, tuple[int, ...]]) -> dict[str, FactorTable]:
    """AF: KiB one stored layer keeps per micro-batch (approximates costmodels.memory.layer_activations_bytes with
    Korthikanti's GPT coefficients: sbh·(10 + 24/t), 34·sbh/t with SP, less 4·sbh/t with selective recompute).
    AI: KiB a fully recomputed layer keeps, its 2·sbh input, /t with SP
    (costmodels.memory.recomputed_layer_inputs_bytes). Valid as the layer time tables."""
    knobs = ("tp", "cp", "mbs", "sp")
    grid = _grid(domains, knobs)
    tp, cp, sp = grid["tp"], grid["cp"], grid["sp"]
    valid = _sequence_rules_hold(grid, Problem(model, cluster, training))
    tokens = training.seq_len / cp
    sbh = tokens * grid["mbs"] * model.hidden_size
    layer_bytes = np.where(sp == 1, 34.0 / tp, 10.0 + 24.0 / tp) * sbh
    input_bytes = 2.0 * sbh / np.where(sp == 1, tp, 1)

    stored_knobs = knobs + ("recompute",)
    recompute = _grid(domains, stored_knobs)["recompute"]
    stored_bytes = layer_bytes[..., None] - np.where(recompute == SELECTIVE, 4.0 * sbh[..., None] / tp[..., None], 0.0)
    return {
        "stored_layer_kib": FactorTable.of(stored_knobs, np.ceil(stored_bytes / BYTES_PER_KIB), valid[..., None]),
        "recomputed_input_kib": FactorTable.of(knobs, np.ceil(input_bytes / BYTES_PER_KIB), valid),
    }


def p2p_table(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              domains: dict[str, tuple[int, ...]]) -> FactorTable:
    """ONE: one stage-to-stage transfer of the tensor a rank holds (its 1/tp share with SP, the whole activation
    without); 0 without a pipeline (costmodels.pipeline.p2p_transfer_s, one of its transfers)."""
    knobs = ("tp", "cp", "pp", "mbs", "sp")
    grid = _grid(domains, knobs)
    plans = _plans(grid)
    one_s = p2p_transfer_s(model, cluster.profile, training, plans, cluster.num_gpus, cluster.nvlink_domain_gpus)
    transfer_s = np.where(plans.pp > 1, one_s, 0.0)
    return FactorTable.of(knobs, np.rint(transfer_s.reshape(grid["tp"].shape) / TIME_UNIT_S), True)


def data_parallel_tables(model: ModelSpec, cluster: ClusterSpec, domains: dict[str, tuple[int, ...]],
                         splits: np.ndarray) -> dict[str, FactorTable]:
    """DO: the data-parallel gradient traffic over dp·cp, fully exposed (costmodels.steptime.dp_comm_s without its
    overlap window and ZeRO-2/3 terms), plus the HBM-bound Adam step (costmodels.steptime.optimizer_s).
    MS: weights (2 B), gradients (4 B) and optimizer states (12 B) per parameter, ZeRO-sharded over dp·cp
    (costmodels.memory weights_bytes, gradients_bytes, optimizer_states_bytes). Both take the largest parameter
    count of the 4 candidate stages (costmodels.params.stage_params_per_gpu on steptime.candidate_stages).
    Valid: the pipeline splits and rules.world."""
    knobs = ("tp", "cp", "pp", "first_stage_layers", "last_stage_layers", "zero")
    grid = _grid(domains, knobs)
    shape = grid["tp"].shape
    plans = _plans(grid)
    num_gpus, profile = cluster.num_gpus, cluster.profile
    params = np.max([stage_params_per_gpu(model, plans, stage)[0] for stage in candidate_stages(plans)], axis=0)
    shards = np.maximum(num_gpus // (plans.tp * plans.cp * plans.pp), 1) * plans.cp
    zero = plans.zero
    static_bytes = params * (2 / np.where(zero >= 3, shards, 1) + 4 / np.where(zero >= 2, shards, 1)
                             + 12 / np.where(zero >= 1, shards, 1))
    group = dp_cp_group(plans, num_gpus, cluster.nvlink_domain_gpus)
    traffic_s = np.where(zero >= 1,
                         group_collective_time_s(profile, group, "reduce_scatter", params * GRADIENT_BYTES)
                         + group_collective_time_s(profile, group, "all_gather", params * PARAMETER_BYTES),
                         group_collective_time_s(profile, group, "all_reduce", params * GRADIENT_BYTES))
    optimizer_s = params / np.where(zero >= 1, shards, 1) * ADAM_BYTES_PER_PARAM / profile.hbm_bandwidth_bytes_per_s
    valid = ((num_gpus % (plans.tp * plans.cp * plans.pp) == 0).reshape(shape)
             & splits[None, None, :, :, :, None])
    return {
        "dp_optimizer_units": FactorTable.of(knobs, np.rint((traffic_s + optimizer_s).reshape(shape) / TIME_UNIT_S),
                                             valid),
        "static_mib": FactorTable.of(knobs, np.ceil(static_bytes.reshape(shape) / BYTES_PER_MIB), valid),
    }


def held_microbatch_table(domains: dict[str, tuple[int, ...]]) -> FactorTable:
    """H: 16 × the micro-batches pipeline rank 0 holds, pp (1F1B) or pp + (pp-1)/vpp (interleaved), before the cap
    at m, which the model applies as min(H, 16·m) (costmodels.memory.in_flight_microbatches)."""
    knobs = ("pp", "vpp")
    grid = _grid(domains, knobs)
    plans = _plans(grid)
    held = in_flight_microbatches(plans, np.zeros(len(plans), np.int64), np.full(len(plans), np.inf))
    return FactorTable.of(knobs, np.ceil(HELD_SCALE * held.reshape(grid["pp"].shape)), True)


def build_instance(name: str) -> Instance:
    scenario = SCENARIOS[name]
    model = autopar.load_model(scenario.model)
    cluster = autopar.make_cluster(gpu=GPU, num_gpus=scenario.num_gpus)
    # default schedule (1F1B): the decomposition below spells out 1F1B's bubble and in-flight micro-batches
    training = TrainingSpec(seq_len=scenario.seq_len, global_batch_size=scenario.global_batch)
    space = build_space(model, cluster, training, Controls())
    domains = {knob: space.domain(knob) for knob in KNOBS}
    splits = split_mask(space, domains)
    tables = stage_layer_tables(space, domains, model.num_layers)
    tables[MICROBATCHES] = microbatch_table(domains, scenario)
    domains[MICROBATCHES] = tuple(sorted(set(tables[MICROBATCHES].values[tables[MICROBATCHES].valid].tolist())))
    tables["pipeline_slots"] = pipeline_slot_table(domains)
    tables.update(layer_time_tables(model, cluster, training, domains))
    tables["p2p_transfer_units"] = p2p_table(model, cluster, training, domains)
    tables.update(data_parallel_tables(model, cluster, domains, splits))
    tables["held_sixteenths"] = held_microbatch_table(domains)
    tables.update(activation_tables(model, cluster, training, domains))
    return Instance(name, space, domains, tables, int(cluster.memory_limit_bytes // BYTES_PER_MIB))


# ---- numpy: every plan of the space -------------------------------------------------------------------------------

@dataclass(frozen=True)
class NumpyFront:
    front: tuple[tuple[int, int], ...]
    elapsed_s: float
    plans: int
    feasible: int


def pareto_front(time_units: np.ndarray, memory_mib: np.ndarray, knob_values: dict[str, np.ndarray]
                 ) -> tuple[tuple[int, int], ...]:
    """Non-dominated (time, memory) pairs, fastest first: the search's own front (autopar.search.pareto)."""
    dense_defaults = {"ep": np.ones(len(time_units), np.int64), "etp": knob_values["tp"],  # ep (1,): dense models
                      "recompute_modules": np.zeros(len(time_units), np.int64)}   # default modules only, see above
    keep = front_indices(time_units, memory_mib, {**dense_defaults, **knob_values})
    return tuple(zip(time_units[keep].tolist(), memory_mib[keep].tolist(), strict=True))


def default_module_recomputes(space) -> list[tuple[int, int]]:
    """(recompute, recompute_layers) of the space with selective recompute at Megatron's default module (core_attn):
    this decomposition prices selective recompute as the attention core alone (its LS table), so the other
    --recompute-modules sets of the search space are left out of its tables."""
    return [(setting, layers) for setting, layers, modules in space.recomputes if modules == 0]


def numpy_front(instance: Instance) -> NumpyFront:
    """The objective of every plan of the search space, by table lookups, and its Pareto front."""
    start = time.perf_counter()
    space, domains, tables = instance.space, instance.domains, instance.tables
    position = {knob: _positions(domain) for knob, domain in domains.items()}
    split_index = np.array([[position["pp"][pp], position["first_stage_layers"][first],
                             position["last_stage_layers"][last]] for pp, first, last in space.splits])
    recomputes = default_module_recomputes(space)
    recompute_index = np.array([[position["recompute"][setting], position["recompute_layers"][layers]]
                                for setting, layers in recomputes])
    sizes = [len(space.splits), len(recomputes)] + [len(domains[k]) for k in FREE_KNOBS]
    combos = np.indices(sizes).reshape(len(sizes), -1)
    index = {
        "pp": split_index[combos[0], 0], "first_stage_layers": split_index[combos[0], 1],
        "last_stage_layers": split_index[combos[0], 2],
        "recompute": recompute_index[combos[1], 0], "recompute_layers": recompute_index[combos[1], 1],
    }
    index.update(zip(FREE_KNOBS, combos[2:], strict=True))

    value = {}
    valid = np.ones(combos.shape[1], dtype=bool)
    for name in ("stage_layers", "recomputed_layers", "selective_layers", MICROBATCHES):
        value[name], table_valid = tables[name].lookup(index)
        valid &= table_valid
    microbatch_domain = np.asarray(domains[MICROBATCHES])
    # invalid plans have m = 0; clip their index, the mask already drops them
    index[MICROBATCHES] = np.minimum(np.searchsorted(microbatch_domain, value[MICROBATCHES]),
                                     len(microbatch_domain) - 1)
    for name in [name for name in tables if name not in value]:
        value[name], table_valid = tables[name].lookup(index)
        valid &= table_valid

    vpp = np.asarray(domains["vpp"])[index["vpp"]]
    pp = np.asarray(domains["pp"])[index["pp"]]
    microbatches = value[MICROBATCHES]
    stage_layers, recomputed = value["stage_layers"], value["recomputed_layers"]
    layer_fwd = value["layer_fwd_units"]
    per_microbatch_units = (3 * stage_layers * layer_fwd + recomputed * layer_fwd
                            + value["selective_layers"] * value["attention_core_fwd_units"]
                            + (4 * stage_layers + 2 * recomputed) * value["tp_block_units"])
    p2p_units = (2 * vpp * microbatches + 2 * (pp - 1)) * value["p2p_transfer_units"]
    time_units = value["pipeline_slots"] * per_microbatch_units + SLOT_SCALE * (p2p_units + value["dp_optimizer_units"])
    in_flight = np.minimum(value["held_sixteenths"], HELD_SCALE * microbatches)
    activation_kib = ((stage_layers - recomputed) * value["stored_layer_kib"]
                      + recomputed * value["recomputed_input_kib"])
    memory_mib = value["static_mib"] + (in_flight * activation_kib) // (HELD_SCALE * KIB_PER_MIB)
    valid &= memory_mib <= instance.memory_cap_mib
    knob_values = {knob: np.asarray(domains[knob])[index[knob]][valid] for knob in KNOBS}
    front = pareto_front(time_units[valid], memory_mib[valid], knob_values)
    return NumpyFront(front, time.perf_counter() - start, combos.shape[1], int(valid.sum()))


# ---- CP-SAT: the same objective from the factor tables --------------------------------------------------------------

@dataclass(frozen=True)
class Bounded:
    """A CP-SAT integer variable and the bounds it was created with."""

    var: cp_model.IntVar
    lo: int
    hi: int


@dataclass(frozen=True, eq=False)
class CpsatModel:
    model: cp_model.CpModel
    knob_vars: dict[str, cp_model.IntVar]
    time: Bounded
    memory: Bounded


def _table_var(model: cp_model.CpModel, knob_vars: dict[str, cp_model.IntVar], table: FactorTable,
               domains: dict[str, tuple[int, ...]], name: str) -> Bounded:
    """The table's value as a variable, tied to its knobs by the table's valid rows."""
    rows = table.allowed_rows(domains)
    values = rows[:, -1]
    var = model.new_int_var_from_domain(cp_model.Domain.from_values(sorted(set(values.tolist()))), name)
    model.add_allowed_assignments([knob_vars[k] for k in table.knobs] + [var], rows.tolist())
    return Bounded(var, int(values.min()), int(values.max()))


def _product(model: cp_model.CpModel, left: Bounded, right: Bounded, name: str) -> Bounded:
    corners = (left.lo * right.lo, left.lo * right.hi, left.hi * right.lo, left.hi * right.hi)
    var = model.new_int_var(min(corners), max(corners), name)
    model.add_multiplication_equality(var, [left.var, right.var])
    return Bounded(var, min(corners), max(corners))


def _defined(model: cp_model.CpModel, expression, lo: int, hi: int, name: str) -> Bounded:
    var = model.new_int_var(lo, hi, name)
    model.add(var == expression)
    return Bounded(var, lo, hi)


def build_cpsat_model(instance: Instance) -> CpsatModel:
    """The module docstring's formulas; the variables' bounds come from the tables' ranges."""
    domains, tables = instance.domains, instance.tables
    model = cp_model.CpModel()
    knob_vars = {knob: model.new_int_var_from_domain(cp_model.Domain.from_values(list(domains[knob])), knob)
                 for knob in KNOBS + (MICROBATCHES,)}
    table_order = ("stage_layers", "recomputed_layers", "selective_layers", MICROBATCHES, "pipeline_slots",
                   "layer_fwd_units", "attention_core_fwd_units", "tp_block_units", "p2p_transfer_units",
                   "dp_optimizer_units", "static_mib", "held_sixteenths", "stored_layer_kib", "recomputed_input_kib")
    value = {name: _table_var(model, knob_vars, tables[name], domains, name) for name in table_order}
    model.add(knob_vars[MICROBATCHES] == value[MICROBATCHES].var)

    # time
    stage_layers, recomputed = value["stage_layers"], value["recomputed_layers"]
    stage_fwd = _product(model, stage_layers, value["layer_fwd_units"], "stage_fwd_units")
    recompute_fwd = _product(model, recomputed, value["layer_fwd_units"], "recompute_fwd_units")
    selective_fwd = _product(model, value["selective_layers"], value["attention_core_fwd_units"],
                             "selective_fwd_units")
    tp_blocks = _defined(model, 4 * stage_layers.var + 2 * recomputed.var, 4 * stage_layers.lo + 2 * recomputed.lo,
                         4 * stage_layers.hi + 2 * recomputed.hi, "tp_blocks")
    tp_comm = _product(model, tp_blocks, value["tp_block_units"], "tp_comm_units")
    per_microbatch = _defined(model, 3 * stage_fwd.var + recompute_fwd.var + selective_fwd.var + tp_comm.var,
                              3 * stage_fwd.lo + recompute_fwd.lo + selective_fwd.lo + tp_comm.lo,
                              3 * stage_fwd.hi + recompute_fwd.hi + selective_fwd.hi + tp_comm.hi,
                              "per_microbatch_units")
    slots_time = _product(model, value["pipeline_slots"], per_microbatch, "slots_time_units")
    microbatches = Bounded(knob_vars[MICROBATCHES], min(domains[MICROBATCHES]), max(domains[MICROBATCHES]))
    vpp = Bounded(knob_vars["vpp"], min(domains["vpp"]), max(domains["vpp"]))
    pp = Bounded(knob_vars["pp"], min(domains["pp"]), max(domains["pp"]))
    chunk_microbatches = _product(model, microbatches, vpp, "chunk_microbatches")
    transfers = _defined(model, 2 * chunk_microbatches.var + 2 * pp.var - 2, 2 * chunk_microbatches.lo + 2 * pp.lo - 2,
                         2 * chunk_microbatches.hi + 2 * pp.hi - 2, "transfers")
    p2p = _product(model, transfers, value["p2p_transfer_units"], "p2p_units")
    data_parallel = value["dp_optimizer_units"]
    step_time = _defined(model, slots_time.var + SLOT_SCALE * (p2p.var + data_parallel.var),
                         slots_time.lo + SLOT_SCALE * (p2p.lo + data_parallel.lo),
                         slots_time.hi + SLOT_SCALE * (p2p.hi + data_parallel.hi), "time")

    # memory
    held = value["held_sixteenths"]
    in_flight = Bounded(model.new_int_var(0, held.hi, "in_flight_sixteenths"), 0, held.hi)
    model.add_min_equality(in_flight.var, [held.var, HELD_SCALE * knob_vars[MICROBATCHES]])
    stored = _defined(model, stage_layers.var - recomputed.var, 0, stage_layers.hi, "stored_layers")
    stored_kib = _product(model, stored, value["stored_layer_kib"], "stored_kib")
    inputs_kib = _product(model, recomputed, value["recomputed_input_kib"], "recomputed_inputs_kib")
    activation_kib = _defined(model, stored_kib.var + inputs_kib.var, 0, stored_kib.hi + inputs_kib.hi,
                              "activation_kib")
    activation_sixteenths = _product(model, in_flight, activation_kib, "activation_kib_sixteenths")
    activation_mib = model.new_int_var(0, activation_sixteenths.hi // (HELD_SCALE * KIB_PER_MIB), "activation_mib")
    model.add_division_equality(activation_mib, activation_sixteenths.var, HELD_SCALE * KIB_PER_MIB)
    static = value["static_mib"]
    memory = _defined(model, static.var + activation_mib, static.lo, instance.memory_cap_mib, "memory_mib")
    return CpsatModel(model, knob_vars, step_time, memory)


# ---- the epsilon-constraint walk ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SolverSetting:
    workers: int
    presolve: bool
    lexicographic: bool

    @property
    def objective(self) -> str:
        return "lexicographic" if self.lexicographic else "two-step"

    @property
    def label(self) -> str:
        return f"workers={self.workers} presolve={'on' if self.presolve else 'off'} {self.objective}"


DEFAULT_SETTING = SolverSetting(workers=1, presolve=False, lexicographic=False)


@dataclass(frozen=True)
class PointOutcome:
    point: tuple[int, int] | None   # (time, memory); None when no plan fits the bound or a solve failed
    solve_s: tuple[float, ...]
    problem: str | None = None


@dataclass(frozen=True)
class WalkResult:
    setting: SolverSetting
    front: tuple[tuple[int, int], ...]
    build_s: float
    walk_s: float
    solve_s: tuple[float, ...]
    problems: tuple[str, ...]
    time_clamped: bool

    @property
    def complete(self) -> bool:
        return not self.problems


def _set_domain(var: cp_model.IntVar, lo: int, hi: int) -> None:
    var.with_domain(cp_model.Domain(lo, hi))


def _timed_solve(cpsat: CpsatModel, setting: SolverSetting,
                 solve_limit_s: float) -> tuple[cp_model.CpSolver, int, float]:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = setting.workers
    solver.parameters.random_seed = 0
    solver.parameters.cp_model_presolve = setting.presolve
    solver.parameters.max_time_in_seconds = solve_limit_s
    start = time.perf_counter()
    status = solver.solve(cpsat.model)
    return solver, status, time.perf_counter() - start


def _two_step_point(cpsat: CpsatModel, setting: SolverSetting, solve_limit_s: float) -> PointOutcome:
    """Fastest plan within the bound, then the least memory at that time, hinted with the first plan."""
    cpsat.model.minimize(cpsat.time.var)
    solver, status, first_s = _timed_solve(cpsat, setting, solve_limit_s)
    if status == cp_model.INFEASIBLE:
        return PointOutcome(None, (first_s,))
    if status != cp_model.OPTIMAL:
        return PointOutcome(None, (first_s,), solver.status_name(status))
    best_time = int(solver.value(cpsat.time.var))
    first_plan = {knob: int(solver.value(var)) for knob, var in cpsat.knob_vars.items()}
    _set_domain(cpsat.time.var, best_time, best_time)
    for knob, knob_value in first_plan.items():
        cpsat.model.add_hint(cpsat.knob_vars[knob], knob_value)
    cpsat.model.minimize(cpsat.memory.var)
    solver, status, second_s = _timed_solve(cpsat, setting, solve_limit_s)
    if status != cp_model.OPTIMAL:
        return PointOutcome(None, (first_s, second_s), "second solve " + solver.status_name(status))
    return PointOutcome((best_time, int(solver.value(cpsat.memory.var))), (first_s, second_s))


def _lexicographic_point(cpsat: CpsatModel, setting: SolverSetting, solve_limit_s: float,
                         memory_span: int) -> PointOutcome:
    """Fastest plan within the bound and, among those, the least memory, in one solve."""
    cpsat.model.minimize(cpsat.time.var * memory_span + cpsat.memory.var)
    solver, status, solve_s = _timed_solve(cpsat, setting, solve_limit_s)
    if status == cp_model.INFEASIBLE:
        return PointOutcome(None, (solve_s,))
    if status != cp_model.OPTIMAL:
        return PointOutcome(None, (solve_s,), solver.status_name(status))
    return PointOutcome((int(solver.value(cpsat.time.var)), int(solver.value(cpsat.memory.var))), (solve_s,))


def walk_front(instance: Instance, setting: SolverSetting, solve_limit_s: float, walk_limit_s: float) -> WalkResult:
    """The Pareto front, one point per memory bound, from the largest bound down (module docstring)."""
    start = time.perf_counter()
    cpsat = build_cpsat_model(instance)
    build_s = time.perf_counter() - start
    time_lo, time_hi = cpsat.time.lo, cpsat.time.hi
    memory_lo, memory_hi = cpsat.memory.lo, cpsat.memory.hi
    memory_span = memory_hi - memory_lo + 1
    time_clamped = False
    # Overflow guard: CP-SAT rejects an objective whose range overflows int64, and time·span + memory can (S2:
    # time up to ~3.5e14 TU/256 × a span of ~6e4 MiB). The time domain is clamped to 2^60 // span instead. This is
    # sound only if no plan within the memory cap is slower than the clamp; were one slower, the walk would end early
    # (INFEASIBLE at that bound) and the comparison with the numpy front would report equal=no. In S2 the clamp,
    # ~1.9e13, is ~90 times the slowest point of the front (~2.1e11).
    if setting.lexicographic and time_hi * memory_span > 2**60:
        time_hi = 2**60 // memory_span
        time_clamped = True

    front, solve_s, problems = [], [], []
    bound = memory_hi
    walk_start = time.perf_counter()
    while bound >= memory_lo:
        if time.perf_counter() - walk_start > walk_limit_s:
            problems.append("walk limit")
            break
        _set_domain(cpsat.memory.var, memory_lo, bound)
        _set_domain(cpsat.time.var, time_lo, time_hi)
        cpsat.model.clear_hints()
        if setting.lexicographic:
            outcome = _lexicographic_point(cpsat, setting, solve_limit_s, memory_span)
        else:
            outcome = _two_step_point(cpsat, setting, solve_limit_s)
        solve_s.extend(outcome.solve_s)
        if outcome.problem is not None:
            problems.append(outcome.problem)
            break
        if outcome.point is None:
            break
        front.append(outcome.point)
        bound = outcome.point[1] - 1
    return WalkResult(setting, tuple(front), build_s, time.perf_counter() - walk_start, tuple(solve_s),
                      tuple(problems), time_clamped)


# ---- report -------------------------------------------------------------------------------------------------------

def run_scenario(name: str, settings: list[SolverSetting], solve_limit_s: float, walk_limit_s: float,
                 console) -> str:
    """Prints the scenario's tables; returns its summary line."""
    from rich.table import Table

    start = time.perf_counter()
    instance = build_instance(name)
    scenario = SCENARIOS[name]
    console.print(f"[bold]{name}[/bold]: {scenario.model}, {scenario.num_gpus} {GPU}, seq {scenario.seq_len}, "
                  f"global batch {scenario.global_batch}; search space {instance.space.size:,} plans; "
                  f"memory cap {instance.memory_cap_mib:,} MiB; factor tables built in "
                  f"{time.perf_counter() - start:.2f} s")
    sizes = Table(title=f"{name}: factor tables")
    for column in ("table", "knobs", "valid rows"):
        sizes.add_column(column, justify="right" if column == "valid rows" else "left")
    for table_name, table in instance.tables.items():
        sizes.add_row(table_name, ", ".join(table.knobs), f"{table.rows:,}")
    console.print(sizes)

    first, second = numpy_front(instance), numpy_front(instance)
    numpy_s = min(first.elapsed_s, second.elapsed_s)
    console.print(f"numpy: {first.plans:,} plans, {first.feasible:,} valid and within the cap, front "
                  f"{len(first.front)} points, {numpy_s:.3f} s (best of {first.elapsed_s:.3f}, "
                  f"{second.elapsed_s:.3f})")

    results = []
    for setting in settings:
        result = walk_front(instance, setting, solve_limit_s, walk_limit_s)
        results.append(result)
        console.print(f"{setting.label}: walk {result.walk_s:.2f} s", style="dim")
    walks = Table(title=f"{name}: CP-SAT epsilon-constraint walk (numpy front: {len(first.front)} points, "
                        f"{numpy_s:.3f} s)")
    for column in ("workers", "presolve", "objective", "build s", "walk s", "solves", "median solve s",
                   "max solve s", "points", "equal", "note"):
        walks.add_column(column, justify="left" if column in ("objective", "note") else "right")
    for r in results:
        notes = list(r.problems) + (["time domain clamped"] if r.time_clamped else [])
        walks.add_row(str(r.setting.workers), "on" if r.setting.presolve else "off", r.setting.objective,
                      f"{r.build_s:.3f}", f"{r.walk_s:.2f}", str(len(r.solve_s)),
                      f"{statistics.median(r.solve_s):.3f}" if r.solve_s else "-",
                      f"{max(r.solve_s):.3f}" if r.solve_s else "-", str(len(r.front)),
                      "yes" if r.front == first.front else "no", "; ".join(notes))
    console.print(walks)

    complete = [r.walk_s for r in results if r.complete]
    cpsat_text = f"{min(complete):.2f}" if complete else f">{max(r.walk_s for r in results):.0f}"
    equal = "yes" if all(r.front == first.front for r in results) else "no"
    rows_max = max(table.rows for table in instance.tables.values())
    return (f"cpsat-decomposed: {name} cpsat_s={cpsat_text} numpy_s={numpy_s:.3f} front={len(first.front)} "
            f"equal={equal} table_rows_max={rows_max}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"one of {', '.join(SCENARIOS)} (S1)")
    parser.add_argument("--solve-limit", type=float, default=60.0, help="seconds per CP-SAT solve")
    parser.add_argument("--walk-limit", type=float, default=300.0, help="seconds per front walk")
    parser.add_argument("--all-settings", action="store_true",
                        help="workers {1,2} × presolve {off,on} × {two-step, lexicographic}")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or ["S1"]
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.all_settings:
        settings = [SolverSetting(workers, presolve, lexicographic)
                    for workers, presolve, lexicographic in itertools.product((1, 2), (False, True), (False, True))]
    else:
        settings = [DEFAULT_SETTING]
    from rich.console import Console

    console = Console(width=160)
    summaries = [run_scenario(name, settings, args.solve_limit, args.walk_limit, console) for name in scenarios]
    for line in summaries:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
