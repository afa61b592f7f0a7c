"""Evaluating structure-only cost functions once per structure (costmodels.structure) changes no number."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from costmodels.rules import Problem, active_rules
from autopar.search.space import Controls, build_space
from autopar.search import oracle
from costmodels import memory, steptime
from costmodels.plan import PlanArrays
from costmodels.specs import TrainingSpec
from costmodels.structure import link


@pytest.mark.parametrize("name,gpus", [("deepseek-v2-lite", 64), ("llama-3.1-8b", 32), ("gpt-1.7b", 32)])
def test_shared_structure_values_equal_direct_evaluation(name, gpus):
    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls())
    ctx = Problem(model, cluster, training)
    base = oracle.structures(space, ctx, active_rules())
    rng = np.random.default_rng(0)
    n = len(base["tp"])
    index = rng.integers(0, n, size=3000)
    columns = {k: v[index] for k, v in base.items()}
    columns.update(mbs=rng.choice([1, 2, 4], size=3000), sp=rng.integers(0, 2, size=3000).astype(bool),
                   recompute=rng.integers(0, 3, size=3000))
    plain = PlanArrays.from_columns(**columns)
    base_plans = PlanArrays.from_columns(**base)
    linked = link(plain, base_plans, index).take(np.arange(0, 3000, 2))
    plain = plain.take(np.arange(0, 3000, 2))
    with np.errstate(all="ignore"):
        for got, want in ((steptime.step_time_terms_s(model, cluster, training, linked),
                           steptime.step_time_terms_s(model, cluster, training, plain)),):
            for term in want:
                np.testing.assert_array_equal(got[term], want[term], err_msg=term)
        got = memory.peak_memory(model, cluster, training, linked)
        want = memory.peak_memory(model, cluster, training, plain)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert linked.structure.cache, "the structure-only functions were not shared"


def test_vectorised_stage_memory_equals_plan_by_plan():
    """costmodels.scoring.estimates evaluates rank r of every plan together: the same numbers as one plan at a
    time (stage_memory)."""
    from costmodels.scoring import stage_memories, stage_memory

    model = autopar.load_model("deepseek-v2-lite")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    front = autopar.solve(model, cluster, training)
    plans = PlanArrays.from_plans(p.plan for p in front.points)
    assert len({p.plan.pp for p in front.points}) > 1
    together = stage_memories(model, cluster, training, plans)
    for i in range(len(plans)):
        assert together[i] == stage_memory(model, cluster, training, plans.take([i]))


# ---- values kept for a whole search (per_knobs with a key) and the oracle's early pruning ------------------------

def _search_batches(name: str, gpus: int, batches: int):
    """A search's plans as the oracle links them (structure rows × detail rows, detail index included), cut into
    `batches` batches that share one cache; and the same plans unlinked."""
    from autopar.search.space import mixed_radix

    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls())
    base = oracle.structures(space, Problem(model, cluster, training), active_rules())
    detail = space.factors(oracle._level_knobs(space, oracle.DETAIL_KNOBS))
    sizes = [len(t) for _, t in detail]
    digits = mixed_radix(sizes, 0, int(np.prod(sizes)))
    table = oracle._detail_table(space, detail, digits)
    rng = np.random.default_rng(1)
    structure_row = rng.integers(0, len(base["tp"]), size=4000)
    detail_row = rng.integers(0, len(digits[0]), size=4000)
    columns = {k: v[structure_row] for k, v in base.items()}
    columns.update(space.columns_from_factors(detail, [d[detail_row] for d in digits]))
    plain = PlanArrays.from_columns(**columns)
    cache: dict = {}
    linked = [link(plain.take(rows), PlanArrays.from_columns(**base), structure_row[rows], cache, table,
                   detail_row[rows]) for rows in np.array_split(np.arange(4000), batches)]
    return model, cluster, training, plain, linked, cache


@pytest.mark.parametrize("name,gpus", [("deepseek-v2-lite", 64), ("llama-3.1-8b", 32), ("gpt-1.7b", 32)])
def test_values_kept_for_the_search_equal_direct_evaluation(name, gpus):
    """Batch after batch, the layer pieces kept on their knob grid (steptime.layer_pieces) and the per-stage pieces
    evaluated once per distinct knob combination give every term bit for bit as evaluated plan by plan."""
    model, cluster, training, plain, linked, cache = _search_batches(name, gpus, batches=4)
    with np.errstate(all="ignore"):
        want = steptime.step_time_terms_s(model, cluster, training, plain)
        got = [steptime.step_time_terms_s(model, cluster, training, batch) for batch in linked]
    for term in want:
        np.testing.assert_array_equal(np.concatenate([g[term] for g in got]), want[term], err_msg=term)
    memos = [v for k, v in cache.items() if k[0] == "per_knobs_memo" and v is not None]
    assert memos and all(m.done.sum() < len(plain) for m in memos), "the layer pieces were not kept on their grid"


def test_shared_functions_on_the_base_reach_each_other_through_the_cache(monkeypatch):
    """A shared function evaluated on the structure table (layers_on_stage, moe_layers_on_stage) reads the shared
    functions it calls (layers_per_middle_stage) from the search's cache: the middle-stage split is computed once per
    search, not once per caller and rank, and the values equal direct evaluation."""
    from costmodels import params, plan as plan_module

    model, cluster, training, plain, linked, cache = _search_batches("deepseek-v2-lite", 64, batches=2)
    calls = []
    direct = plan_module._layers_per_middle_stage
    monkeypatch.setattr(plan_module, "_layers_per_middle_stage",
                        lambda num_layers, plans: calls.append(len(plans)) or direct(num_layers, plans))
    for batch in linked:
        for stage in (0, 1, 2):
            moe = params.moe_layers_on_stage(model, batch, stage)
            layers = plan_module.layers_on_stage(model.num_layers, batch, stage)
            plain_batch = PlanArrays(**{k: getattr(batch, k) for k in plan_module.PLAN_FIELDS})
            np.testing.assert_array_equal(moe, params._moe_layers_on_stage(model, plain_batch, stage))
            np.testing.assert_array_equal(layers, plan_module._layers_on_stage(model.num_layers, plain_batch, stage))
    shared_calls = [n for n in calls if n == len(linked[0].structure.base)]
    assert len(shared_calls) == 1, f"the middle-stage split was evaluated {len(shared_calls)} times on the base"


def _perturbed(plans: PlanArrays, knobs: tuple[str, ...], rng) -> PlanArrays:
    """`plans` with every knob outside `knobs` replaced by another plan's value."""
    from costmodels.plan import PLAN_FIELDS

    columns = {k: getattr(plans, k) if k in knobs else rng.permutation(getattr(plans, k)) for k in PLAN_FIELDS}
    return PlanArrays(**columns)


def test_declared_knobs_are_all_the_shared_functions_read():
    """A function shared by its knobs (steptime.LAYER_KNOBS, MICROBATCH_KNOBS, the pp_p2p and optimizer terms'; the
    gradient sync's traffic is shared by the optimizer's) gives the same values when every other knob changes:
    nothing else it reads would be copied wrongly between plans."""
    from costmodels.plan import num_microbatches

    rng = np.random.default_rng(2)
    for name, gpus in (("deepseek-v2-lite", 64), ("mixtral-8x7b", 64), ("llama-3.1-8b", 32)):
        model, cluster, training, plain, _, _ = _search_batches(name, gpus, batches=1)

        def layer(p):
            times, comm = steptime.layer_pieces(model, cluster, training, p)
            return [*vars(times).values(), *vars(comm).values()]

        def microbatch(p):
            times, comm = steptime.layer_pieces(model, cluster, training, p)
            return [v for stage in steptime.candidate_stages(p)
                    for v in vars(steptime.stage_microbatch(model, cluster, training, p, times, stage, comm)).values()]

        def p2p(p):
            return [steptime.pp_p2p_s(model, cluster, training, p,
                                      num_microbatches(p, cluster.num_gpus, training.global_batch_size))]

        def gradient_sync(p):
            return [v for stage in steptime.candidate_stages(p)
                    for v in steptime.dp_traffic_s(model, cluster, p, stage)]

        def optimizer(p):
            return [steptime.optimizer_s(model, cluster, training, p, stage) for stage in steptime.candidate_stages(p)]

        for fn, knobs in ((layer, steptime.LAYER_KNOBS), (microbatch, steptime.MICROBATCH_KNOBS),
                          (p2p, steptime.TERM_KNOBS["pp_p2p"]), (gradient_sync, steptime.TERM_KNOBS["optimizer"]),
                          (optimizer, steptime.TERM_KNOBS["optimizer"])):
            with np.errstate(all="ignore"):
                want, got = fn(plain), fn(_perturbed(plain, knobs, rng))
            for w, g in zip(want, got):
                if w is not None:
                    np.testing.assert_array_equal(np.broadcast_to(g, np.shape(w)), w, err_msg=f"{name} {fn.__name__}")


@pytest.mark.parametrize("name,gpus", [("deepseek-v2-lite", 64), ("mixtral-8x7b", 32)])
def test_pruning_against_the_running_front_keeps_the_front(name, gpus, monkeypatch):
    """The oracle drops plans the running front dominates on a lower bound of their time before pricing the rest,
    first within a batch (the plans its own bounds leave undominated priced first) and then across batches: in many
    small batches (much pruning) the front is the same, plan for plan, as in one batch."""
    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls(maximum={"vpp": 2, "mbs": 2, "cp": 2}))
    problem, rules = Problem(model, cluster, training), active_rules()
    bounded, priced = [], []
    bound, finish = oracle.objective.time_bound_units, oracle.objective.time_units_finish

    def counted_bound(*args, **kwargs):
        bounded.append(len(args[4]))
        return bound(*args, **kwargs)

    def counted_finish(*args, **kwargs):
        priced.append(len(args[4]))
        return finish(*args, **kwargs)

    monkeypatch.setattr(oracle.objective, "time_bound_units", counted_bound)
    monkeypatch.setattr(oracle.objective, "time_units_finish", counted_finish)
    monkeypatch.setattr(oracle, "CHUNK_PLANS", 10**9)
    whole = oracle.solve_oracle(space, problem, rules)
    assert sum(priced) < sum(bounded) / 2, "the batch's own bounds pruned little"
    monkeypatch.setattr(oracle, "CHUNK_PLANS", 3000)
    bounded.clear()
    priced.clear()
    batched = oracle.solve_oracle(space, problem, rules)
    assert len(bounded) > 5 and sum(priced) < sum(bounded) / 2, "little was pruned"
    assert batched.plans_seen == whole.plans_seen and batched.fitting_plans == whole.fitting_plans
    np.testing.assert_array_equal(batched.time_units, whole.time_units)
    np.testing.assert_array_equal(batched.memory_units, whole.memory_units)
    assert list(batched.plans) == list(whole.plans)


@pytest.mark.parametrize("name,gpus,training,tight", [
    ("deepseek-v2-lite", 64, TrainingSpec(seq_len=4096, global_batch_size=256), True),
    ("mixtral-8x7b", 32, TrainingSpec(seq_len=4096, global_batch_size=256, overlap_grad_reduce=True,
                                      overlap_param_gather=True), True),
    ("llama-3.1-8b", 32, TrainingSpec(seq_len=8192, global_batch_size=256, engine="torchtitan"), True),
    # Hugging Face's per-expert loop: the host timeline (left out of the bound) is most of the step
    ("qwen3-30b-a3b", 16, TrainingSpec(seq_len=4096, global_batch_size=64, engine="deepspeed",
                                       expert_gemm="loop"), False),
    # a zero-bubble schedule has no pipeline factor: its bound is the gradient sync's floor alone
    ("llama-3.1-8b", 32, TrainingSpec(seq_len=4096, global_batch_size=256, pipeline_schedule="zb-1p"), False),
    # fine-grained offloading over PCIe: its copies (steptime.offload_copies_s) are a term the bound leaves at 0
    ("qwen3-30b-a3b", 16, TrainingSpec(seq_len=4096, global_batch_size=64,
                                       offload_modules=("core_attn", "attn_proj", "expert_fc1")), False),
])
def test_time_bound_is_below_and_finish_equals_the_full_objective(name, gpus, training, tight):
    """The oracle prunes on objective.time_bound_units and prices the rest with time_units_finish: the bound is a
    lower bound of every plan's time_units (the gradient sync at its floor, steptime.dp_comm_floor_s, whatever its
    overlap and ZeRO stage) and the two together give exactly the integers of the full terms. Where the host adds
    little, the bound is most of the objective (what makes the pruning work)."""
    from autopar.search import objective

    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    space = build_space(model, cluster, training, Controls())
    problem = Problem(model, cluster, training)
    base = oracle.structures(space, problem, active_rules())
    rng = np.random.default_rng(1)
    index = rng.integers(0, len(base["tp"]), size=2000)
    columns = {k: v[index] for k, v in base.items()}
    columns.update(mbs=rng.choice([1, 2, 4], size=2000), sp=rng.integers(0, 2, size=2000).astype(bool),
                   recompute=rng.integers(0, 3, size=2000))
    plans = PlanArrays.from_columns(**columns)
    plans = plans.take(np.flatnonzero(oracle.structural_mask(problem, plans, active_rules())))
    structure = objective.objective_structure(model, cluster, training)
    with np.errstate(all="ignore"):
        full = objective.time_units(structure, cluster, training, plans,
                                    steptime.step_time_terms_s(model, cluster, training, plans))
        bound = objective.time_bound_units(structure, model, cluster, training, plans)
        rows = np.flatnonzero(rng.random(len(plans)) < 0.5)
        finished = objective.time_units_finish(structure, model, cluster, training, plans.take(rows),
                                               bound.take(rows))
    assert len(plans) > 200
    assert np.all(bound.units <= full)
    np.testing.assert_array_equal(finished, full[rows])
    if tight:
        assert np.mean(bound.units >= 0.5 * full) > 0.5, "the bound is far below the objective: it prunes little"


@pytest.mark.parametrize("name,gpus,training", [
    ("deepseek-v2-lite", 64, TrainingSpec(seq_len=4096, global_batch_size=256)),
    ("qwen3-30b-a3b", 32, TrainingSpec(seq_len=4096, global_batch_size=128, launch="cuda_graph",
                                       cuda_graph_modules=("attn",))),
    ("llama-3.1-8b", 32, TrainingSpec(seq_len=8192, global_batch_size=64, tp_comm_overlap=True))])
def test_the_structures_memory_bound_per_distinct_knobs_equals_the_whole_bound(name, gpus, training):
    """The oracle's pass over the structures evaluates each memory group once per distinct value of the knobs it
    reads (objective.memory_units_by_group with `within`): the same integers as memory_units over every structure."""
    from autopar.search import objective

    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    space = build_space(model, cluster, training, Controls())
    problem = Problem(model, cluster, training)
    columns = oracle.structures(space, problem, active_rules(), enforce_memory=False)
    structure = objective.objective_structure(model, cluster, training)
    plain = PlanArrays.from_columns(**columns)
    linked = link(plain, plain, np.arange(len(plain)))
    knobs = set(columns)
    with np.errstate(all="ignore"):
        want = objective.memory_units(structure, model, cluster, training, plain, only_knobs=knobs)
        got = objective.memory_units_by_group(structure, model, cluster, training, linked, within=knobs)
    assert len(plain) > 100
    np.testing.assert_array_equal(got, want)
