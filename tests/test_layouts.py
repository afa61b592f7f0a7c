"""Pipeline layouts (costmodels.layout, autopar.search.layouts): the exact engines against brute force, and the
pricing against the uniform cost model."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autopar
from autopar.search.layouts import best_layout, brute_force, chain_dp, compositions, cpsat_layout, objectives_of
from costmodels.errors import InputError
from costmodels.layout import LayoutTables, layout_tables, price_layout, uniform_layout, with_layout
from costmodels.plan import Plan
from costmodels.specs import TrainingSpec


@st.composite
def instances(draw):
    """Random integer tables (any values: the engines must be exact whatever the cost model says) on small
    instances: <= 20 layers, pp·vpp <= 6, with or without a MoE pattern (first dense layers, layer frequency)."""
    pp = draw(st.integers(2, 6))
    vpp = draw(st.integers(1, 6 // pp))
    layers = draw(st.integers(1, 20))
    moe = draw(st.booleans())
    first_dense = draw(st.integers(0, layers)) if moe else 0
    freq = draw(st.integers(1, 3)) if moe else 1
    seed = draw(st.integers(0, 2**31 - 1))
    microbatches = draw(st.integers(1, 16))
    rng = np.random.default_rng(seed)
    probe = LayoutTables(plan=Plan(pp=pp, vpp=vpp), num_layers=layers, num_moe_layers=0, moe_first_dense=first_dense,
                         moe_freq=freq, microbatches=microbatches, stage_time_ns=np.zeros((3, 1, 1), np.int64),
                         sync_ns=np.zeros((pp, 1, 1), np.int64), memory_mib=np.zeros((pp, 1, 1), np.int64),
                         p2p_ns=0, memory_limit_mib=0)
    num_moe = int(dataclasses.replace(probe, num_moe_layers=layers).moe_before(layers)) if moe else 0
    shape = (layers - num_moe + 1, num_moe + 1)
    dense, moe_cells = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    # costs grow with the layers (as real ones do) plus noise, so the optimum is not trivially uniform
    per_dense, per_moe = rng.integers(50, 150, size=2)
    stage = (rng.integers(0, 300, size=(3, 1, 1)) + per_dense * dense + per_moe * moe_cells
             + rng.integers(0, 60, size=(3,) + shape))
    sync = rng.integers(0, 200, size=(pp, 1, 1)) + rng.integers(0, 40, size=(pp,) + shape)
    memory = rng.integers(0, 50, size=(pp, 1, 1)) + 7 * (dense + moe_cells) + rng.integers(0, 5, size=(pp,) + shape)
    limit = int(rng.integers(int(memory.min()), int(memory.max()) + 2))
    return dataclasses.replace(probe, num_moe_layers=num_moe, stage_time_ns=stage.astype(np.int64),
                               sync_ns=sync.astype(np.int64), memory_mib=memory.astype(np.int64),
                               p2p_ns=int(rng.integers(0, 100)), memory_limit_mib=limit)


def _objective(result):
    return None if result.best is None else result.best.objective_ns


@pytest.mark.slow
@given(instances())
def test_cpsat_and_dp_equal_brute_force(tables):
    """CI: the 'ci' profile's examples; `pytest --slow`: 300 instances (tests/conftest.py)."""
    truth = brute_force(tables)
    cpsat = cpsat_layout(tables, time_limit_s=None)
    assert cpsat.proven_optimal
    assert _objective(cpsat) == _objective(truth)
    if truth.best is not None:
        assert cpsat.best.fits and price_layout(tables, cpsat.best.layout).objective_ns == truth.best.objective_ns
    if tables.vpp == 1:   # the DP is exact when it finishes; past its solve cap best_layout hands over to CP-SAT
        dp = chain_dp(tables)
        if dp.proven_optimal:
            assert _objective(dp) == _objective(truth)
    assert _objective(best_layout(tables, time_limit_s=None)) == _objective(truth)


def test_compositions_are_all_and_only_the_compositions():
    rows = compositions(5, 3)
    assert len(rows) == math.comb(7, 2) and (rows.sum(axis=1) == 5).all() and (rows >= 0).all()
    assert len({tuple(r) for r in rows}) == len(rows)


def test_vectorised_objectives_equal_price_layout():
    model = autopar.load_model("deepseek-v2-lite")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    tables = layout_tables(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=256),
                           Plan(tp=2, pp=4, vpp=1, ep=8, mbs=1, zero=1, first_stage_layers=6))
    rows = np.array([uniform_layout(model, tables.plan), (7, 7, 7, 6), (9, 9, 8, 1)])
    objective, fits = objectives_of(tables, rows)
    for row, value, fit in zip(rows, objective, fits):
        cost = price_layout(tables, tuple(row))
        assert cost.objective_ns == value and cost.fits == fit


@pytest.mark.parametrize("name,gpus,plan", [
    ("llama-3.1-8b", 32, Plan(tp=2, pp=4, mbs=1, zero=1)),
    ("llama-3.1-8b", 32, Plan(tp=2, pp=4, vpp=2, mbs=1, zero=1)),
    ("deepseek-v2-lite", 48, Plan(tp=1, pp=3, ep=8, mbs=1, zero=1, first_stage_layers=8, last_stage_layers=9)),
])
def test_uniform_layout_priced_like_the_uniform_model(name, gpus, plan):
    """Equal stages: the layout formula is the uniform model's (m + (p-1)/v)·T; memory per rank the same terms."""
    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    tables = layout_tables(model, cluster, training, plan)
    cost = price_layout(tables, uniform_layout(model, plan))
    estimate = autopar.estimate(model, cluster, training, plan)
    assert sum(uniform_layout(model, plan)) == model.num_layers
    # memory: the same per-rank terms (whole MiB, rounded up)
    for rank, stage in enumerate(estimate.stages):
        assert cost.rank_memory_mib[rank] == math.ceil(stage.total_bytes / 2**20)
    # time: never above the uniform model (which takes each term on its own worst stage), equal when stages match
    assert cost.step_time_s <= estimate.step_time_s * (1 + 1e-9)
    if plan.first_stage_layers == 0 and plan.last_stage_layers == 0 and model.vocab_size < 50_000:
        assert cost.step_time_s == pytest.approx(estimate.step_time_s, rel=2e-3)


def test_layouts_price_the_overlapped_all_to_all_as_the_uniform_model_does():
    """--overlap-moe-expert-parallel-comm: each virtual stage carries its exposed share of the all-to-all, so the even
    layout's EP term is the uniform model's, and the step no more than it (the uniform bubble counts the whole
    exchange; a layout's fill and drain count the stage's)."""
    from costmodels.layout import layout_breakdown

    model = autopar.load_model("mixtral-8x7b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    plan = Plan(tp=2, pp=4, vpp=2, ep=8, sp=True, mbs=1, zero=1)
    for overlap in (False, True):
        training = TrainingSpec(seq_len=4096, global_batch_size=256, moe_a2a_overlap=overlap)
        estimate = autopar.estimate(model, cluster, training, plan)
        even = layout_breakdown(model, cluster, training, plan, uniform_layout(model, plan))
        assert even.time_terms_s["ep_comm"] == pytest.approx(estimate.time_terms_s["ep_comm"], rel=1e-9)
        assert even.step_time_s <= estimate.step_time_s * (1 + 1e-9)
        cost = price_layout(layout_tables(model, cluster, training, plan), uniform_layout(model, plan))
        assert cost.step_time_s == pytest.approx(even.step_time_s, rel=1e-6)
    off = layout_breakdown(model, cluster, dataclasses.replace(training, moe_a2a_overlap=False), plan,
                           uniform_layout(model, plan))
    assert even.time_terms_s["ep_comm"] < off.time_terms_s["ep_comm"]


def test_piling_a_rank_into_one_chunk_loses_the_interleaving_gain():
    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    plan = Plan(tp=2, pp=4, vpp=2, mbs=1, zero=1)
    tables = layout_tables(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=256), plan)
    even = price_layout(tables, uniform_layout(model, plan))
    piled = price_layout(tables, (8, 8, 8, 8, 0, 0, 0, 0))
    assert piled.step_time_s > even.step_time_s


# ---- in and out --------------------------------------------------------------------------------------------------

def _deepseek_layout_estimate():
    model = autopar.load_model("deepseek-v3")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=2048)
    training = TrainingSpec(seq_len=4096, global_batch_size=4096)
    plan = Plan(tp=2, pp=16, cp=2, ep=8, etp=1, mbs=1, sp=True, zero=1, layout=(5,) + (4,) * 14 + (0,))
    return model, autopar.estimate(model, cluster, training, plan)


def test_megatron_layout_round_trip():
    from autopar.export import launch_config
    from autopar.megatron_args import parse_megatron_args

    model, estimate = _deepseek_layout_estimate()
    text = launch_config(estimate, "megatron").text
    assert "--pipeline-model-parallel-layout 'Et*5|(t*4|)*14,mL'" in text
    for flag in ("--decoder-first-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
                 "--account-for-embedding-in-pipeline-split"):
        assert flag not in text
    assert parse_megatron_args(text, model.num_layers).plan.layout == estimate.plan.layout


@pytest.mark.parametrize("layout", [(3, 4, 4, 2), (0, 5, 5, 3, 4, 0), (1, 0, 0, 12), (7, 6)])
def test_layout_strings_round_trip(layout):
    from autopar.megatron_args import format_megatron_layout, parse_megatron_layout

    pp = 2
    for mtp in (0, 1):
        assert parse_megatron_layout(format_megatron_layout(layout, mtp), pp) == (layout, mtp)


@pytest.mark.parametrize("text,message", [
    ("tEt|tL", "embedding E must come first"),
    ("Et|t|tL", "not a multiple"),
    ("Et|tX|tL|L", "unknown layer character"),
    ("Em|tL", "before the MTP layers"),
])
def test_bad_layout_strings_are_refused_with_the_reason(text, message):
    from autopar.megatron_args import parse_megatron_layout
    from costmodels.errors import InputError

    with pytest.raises(InputError, match=message):
        parse_megatron_layout(text, 2)


def test_frameworks_without_layouts_fall_back_to_the_nearest_split_and_say_so():
    from autopar.export import launch_config

    _, estimate = _deepseek_layout_estimate()
    config = launch_config(estimate, "verl")
    assert any("cannot express a per-stage pipeline layout" in note for note in config.unexpressed)
    assert "split-/1" in config.unexpressed[-1]           # the layout's ends: 5 layers first, none last -> 4 / 1
    bridge = launch_config(estimate, "bridge").text
    assert "model.pipeline_model_parallel_layout=\"'Et*5|(t*4|)*14,mL'\"" in bridge
    nemo = launch_config(estimate, "nemo").text
    assert "trainer.strategy.pipeline_model_parallel_layout=\"'Et*5|(t*4|)*14,mL'\"" in nemo


def test_torchtitan_module_lists_follow_the_layout():
    from autopar.export.torchtitan import module_fqns_per_model_part

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    estimate = autopar.estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=256),
                                Plan(tp=2, pp=4, mbs=1, layout=(9, 8, 8, 7)))
    parts = module_fqns_per_model_part(model.num_layers, estimate)
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == [9, 8, 8, 7]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]


def test_a_layout_plan_estimate_is_its_parent_less_the_per_stage_gain():
    from costmodels.layout import parent_plan

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    even = Plan(tp=2, pp=4, mbs=1, zero=1)
    # a layout that is a first/last split gets exactly that split's estimate
    as_split = autopar.estimate(model, cluster, training, dataclasses.replace(even, layout=(9, 8, 8, 7)))
    split = autopar.estimate(model, cluster, training, dataclasses.replace(even, first_stage_layers=9,
                                                                           last_stage_layers=7))
    assert as_split.step_time_s == pytest.approx(split.step_time_s, rel=1e-12)
    # any other: its parent's estimate less the per-stage model's gain between the parent's layout and it
    plan = dataclasses.replace(even, layout=(9, 9, 7, 7))
    parent = parent_plan(model, cluster, training, plan)
    tables = layout_tables(model, cluster, training, parent)
    gain_s = (price_layout(tables, uniform_layout(model, parent)).step_time_s
              - price_layout(tables, plan.layout).step_time_s)
    got = autopar.estimate(model, cluster, training, plan)
    want = autopar.estimate(model, cluster, training, parent).step_time_s - gain_s
    assert got.step_time_s == pytest.approx(want, rel=1e-6)
    assert [stage.layers for stage in got.stages] == [9, 9, 7, 7]


# ---- solve --layouts and explain ---------------------------------------------------------------------------------

def test_explain_layout_shows_each_rank_before_and_after():
    from autopar.search.refine import explain_layout

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    lines, document = explain_layout(model, cluster, training, Plan(tp=2, pp=4, mbs=1))
    assert lines[0].startswith("layout: 8|8|8|8") and "faster step" in lines[0]
    assert document["gain"] > 0 and sum(document["best_layout"]) == model.num_layers
    assert len(document["rank_time_s"]["best_layout"]) == 4 and len(lines) == 3 + 4
    # the 128K-vocabulary output layer makes the last rank the slowest under the even split
    assert max(document["rank_time_s"]["layout"]) == document["rank_time_s"]["layout"][-1]
    assert max(document["rank_time_s"]["best_layout"]) < max(document["rank_time_s"]["layout"])


def test_solve_with_layouts_refines_the_front():
    from autopar.search.refine import refine_front

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    front = autopar.solve(model, cluster, training, fix={"pp": 4, "tp": 2, "vpp": 2})
    refined, refinements = refine_front(front)     # the default: a fixed amount of work
    assert refinements and any(p.plan.layout for p in refined.points)
    assert refined.points[0].step_time_s <= front.points[0].step_time_s
    assert any(note.startswith("layouts:") for note in refined.notes)
    for point in refined.points:       # still a front: sorted, nothing dominated
        assert not any(q.step_time_s <= point.step_time_s and q.peak_memory_bytes < point.peak_memory_bytes
                       for q in refined.points)
    for r in refinements:
        assert r.best_ns <= r.uniform_ns


def test_a_layout_has_one_price_whatever_split_the_search_started_from():
    """A layout places every layer: the plan keeps no first/last split beside it (Plan), its parent is chosen from
    the layout alone (costmodels.layout.parent_plan), so `estimate` of a front point's knobs gives the front's number
    (it used to depend on the split of the structure whose search found the layout)."""
    from autopar.search.refine import refine_front

    model = autopar.load_model("deepseek-v3")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=2048)
    training = TrainingSpec(seq_len=4096, global_batch_size=4096)
    layout = (5,) + (4,) * 14 + (0,)
    knobs = dict(tp=2, pp=16, cp=2, ep=8, etp=1, mbs=1, sp=True, zero=1)
    plain = autopar.estimate(model, cluster, training, Plan(**knobs, layout=layout))
    for first, last in ((0, 1), (3, 2), (5, 0)):       # a split beside the layout is refused, not kept or dropped
        with pytest.raises(InputError, match="takes no first/last stage split"):
            Plan(**knobs, layout=layout, first_stage_layers=first, last_stage_layers=last)
        structure = Plan(**knobs, first_stage_layers=first, last_stage_layers=last)   # a search's structure
        assert autopar.estimate(model, cluster, training, with_layout(structure, layout)).step_time_s == \
            plain.step_time_s
    front = autopar.solve(autopar.load_model("llama-3.1-8b"), autopar.make_cluster(gpu="h100", num_gpus=32),
                          TrainingSpec(seq_len=4096, global_batch_size=256), fix={"pp": 4, "tp": 2, "vpp": 2})
    refined, _ = refine_front(front)
    layouts = [p for p in refined.points if p.plan.layout]
    assert layouts
    for point in layouts:
        again = autopar.estimate(point.model, point.cluster, point.training, point.plan)
        assert again.step_time_s == pytest.approx(point.step_time_s, rel=1e-12)
        assert again.peak_memory_bytes == point.peak_memory_bytes


@given(instances())
def test_the_layout_time_lower_bound_holds_for_every_layout(tables):
    """The near-front filter's bound (autopar.search.refine.layout_time_lower_bound_ns) is below every layout's step
    time, fitting or not, on any non-negative tables."""
    from autopar.search.refine import layout_gain_bound, layout_time_lower_bound_ns

    lower = layout_time_lower_bound_ns(tables)
    objective, _ = objectives_of(tables, compositions(tables.num_layers, tables.pp * tables.vpp))
    assert int(objective.min()) >= lower
    some_layout = int(objective[0])
    assert layout_gain_bound(tables, some_layout) >= some_layout - int(objective.min())


def test_the_gain_bound_is_not_vacuous_on_a_real_structure():
    """On llama-3.1-8b at pp 4 the bound leaves room for the real gain (the 128K-vocabulary loss on the last rank)
    and rules out more than half of the uniform step time."""
    from autopar.search.refine import layout_gain_bound

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    plan = Plan(tp=2, pp=4, mbs=1)
    tables = layout_tables(model, cluster, training, plan)
    uniform = price_layout(tables, uniform_layout(model, plan)).objective_ns
    best = best_layout(tables, time_limit_s=None).best.objective_ns
    bound = layout_gain_bound(tables, uniform)
    assert uniform - best <= bound < uniform / 2


def test_near_front_structures_that_could_overtake_are_refined_and_can_enter_the_front():
    """llama-3.1-8b on 32 H100 with pp 2 and tp 1 pinned: structures one knob step off the front (other vpp, mbs,
    recompute, zero) put layout plans on the front that refining the front's own structures does not; every one
    refined passed the gain-bound filter and stays within the pins."""
    from autopar.search.refine import front_time_at, layout_gain_bound, refine_front, structure_key
    from autopar.search.solve import controls_from
    from costmodels.layout import TIME_UNIT_S

    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=32)
    training = TrainingSpec(seq_len=4096, global_batch_size=512)
    fix = {"pp": 2, "tp": 1}
    front = autopar.solve(model, cluster, training, fix=fix)
    on_front = {structure_key(p.plan) for p in front.points}
    near, near_refinements = refine_front(front, budget_s=120, controls=controls_from(fix))
    alone, _ = refine_front(front, budget_s=120, near_front=False)
    entered = [p for p in near.points if p.plan.layout and structure_key(p.plan) not in on_front]
    assert entered, near.notes[-1]
    for point in alone.points:   # refining near-front structures too never loses a point
        assert any(q.step_time_s <= point.step_time_s and q.peak_memory_bytes <= point.peak_memory_bytes
                   for q in near.points)
    refined_near = [r for r in near_refinements if r.near_front]
    assert refined_near and "near-front candidates" in near.notes[-1]
    for r in refined_near:
        parent = r.parent
        assert structure_key(parent.plan) not in on_front and parent.plan.pp == 2 and parent.plan.tp == 1
        tables = layout_tables(model, cluster, training, parent.plan)
        bound_ns = layout_gain_bound(tables, r.uniform_ns)
        assert r.uniform_ns - r.best_ns <= bound_ns
        assert parent.step_time_s - bound_ns * TIME_UNIT_S < front_time_at(front.points, parent.peak_memory_bytes)


def test_solve_searches_layouts_by_default_repeatably_and_says_so():
    """`autopar solve` refines with layouts unless --no-layouts, says so in its notes, and (without a wall-clock
    --layouts-budget) prints the same front on every run; a bad budget is one line, exit 2."""
    import json
    import os
    import subprocess
    import sys

    def solve(*extra: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        return subprocess.run([sys.executable, "-m", "autopar", "solve", "llama-3.1-8b", "--gpus", "32",
                               "--fix", "pp=4", "--fix", "vpp=2", "--json", *extra],
                              capture_output=True, text=True, timeout=300, env=env)

    first, second, off = solve(), solve(), solve("--no-layouts")
    documents = [json.loads(r.stdout) for r in (first, second, off)]
    notes = [" ".join(d["notes"]) for d in documents]
    assert "layouts: searched" in notes[0] and "near-front" in notes[0] and "default work" in notes[0]
    assert "layouts: not searched (--no-layouts)" in notes[2]
    points = [[(p["label"], p["step_time_s"], p["peak_memory_bytes"]) for p in d["points"]] for d in documents]
    assert points[0] == points[1]
    assert any(p["plan"].get("layout") and p["pipeline_model_parallel_layout"] for p in documents[0]["points"])
    assert not any(p["plan"].get("layout") for p in documents[2]["points"])
    bad = solve("--layouts-budget", "0")
    assert bad.returncode == 2 and "layouts_budget" in bad.stderr and "Traceback" not in bad.stderr


def test_a_layout_the_tables_admit_but_exact_pricing_puts_over_memory_is_searched_again():
    """The layout search's tables take a rank's chunks as equal; the exact schedule holds chunk 0 longest, so the
    fastest layout by the tables can come out over memory (llama-3.1-8b on 32 H100 at pp 4 vpp 2, mbs 2: a layout
    piling nine layers into one chunk, 18 GiB over). refine_structure re-splits the ranks over memory within
    themselves (or searches again without their totals) and keeps only a layout that fits when priced exactly."""
    from autopar.models import load_model
    from autopar.search.refine import ranks_over_memory, refine_structure
    from costmodels.hardware import load_profile
    from costmodels.scoring import plan_estimates
    from costmodels.specs import ClusterSpec

    model = load_model("llama-3.1-8b")
    cluster = ClusterSpec(profile=load_profile("h100-80gb"), num_gpus=32)
    training = TrainingSpec()
    plan = Plan(tp=1, pp=4, vpp=2, mbs=2, zero=1)
    point = plan_estimates(model, cluster, training, [plan])[0]
    found = refine_structure(model, cluster, training, point, time_limit_s=None)
    assert found is not None and found.best_layout != found.uniform_layout
    assert not ranks_over_memory(model, cluster, training, plan, found.best_layout)
    # a layout that fits is as fast as the one piling nine layers into a chunk (the same layers per rank, re-split):
    # 11% faster than the even split
    assert found.best_ns < 0.9 * found.uniform_ns


def test_a_rank_re_split_keeps_its_layers_and_puts_the_remainder_on_its_later_chunks():
    from autopar.search.refine import resplit_ranks

    # pp 4, vpp 2: rank 2 holds virtual stages 2 and 6
    assert resplit_ranks((4, 5, 9, 4, 4, 4, 0, 2), 4, (2,)) == (4, 5, 4, 4, 4, 4, 5, 2)
    assert resplit_ranks((4, 5, 9, 4, 4, 4, 0, 2), 4, (2, 3)) == (4, 5, 4, 3, 4, 4, 5, 3)


def test_a_pinned_split_is_not_replaced_by_layouts():
    """--fix first/last_stage_layers keeps the split; a layout replaces it, so no layout plan may leave the pins."""
    from autopar.search.refine import refine_front
    from autopar.search.solve import controls_from

    fix = {"pp": 4, "tp": 2, "first_stage_layers": 6, "last_stage_layers": 6}
    front = autopar.solve(autopar.load_model("llama-3.1-8b"), autopar.make_cluster(gpu="h100", num_gpus=32),
                          TrainingSpec(seq_len=4096, global_batch_size=256), fix=fix)
    refined, refinements = refine_front(front, controls=controls_from(fix))
    assert not refinements and not any(p.plan.layout for p in refined.points)
    assert "your controls on the first/last split" in refined.notes[-1]
