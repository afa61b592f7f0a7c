"""Explicit pipeline layouts on layer counts no even or first/last split divides (issue 43): a plan with a layout
takes the layout's own rules (costmodels.rules.layout_breaks: pp·vpp stages, every decoder layer once), not
pp | num_layers, in estimate, explain, --from-megatron-args and the search.

DeepSeek-V3 (61 decoder layers, one MTP layer) on tp 2, pp 8, vpp 4, ep 64 is Megatron-LM's own DeepSeek-V3 layout,
`Et|(tt|)*30mL`: the first virtual stage holds the embedding and one layer, thirty hold two, the last the MTP layer
and the loss. No first/last split runs 61 layers on 8 ranks in 4 equal chunks each (8 - 2 middle ranks... every
end-stage count would have to be a multiple of 4, or one less than the middle's 8, and 61 - 6·8 = 13 is neither).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import autopar
from autopar.megatron_args import parse_megatron_args
from costmodels.errors import InputError
from costmodels.layout import balanced_layout, parent_layout, parent_plan, split_is_whole, uniform_layout
from costmodels.plan import Plan
from costmodels.rules import Problem, check_plan, layout_breaks
from costmodels.specs import TrainingSpec

DSV3_LAYOUT = (1,) + (2,) * 30 + (0,)
DSV3_KNOBS = dict(tp=2, pp=8, vpp=4, ep=64, etp=1, mbs=1, sp=True, zero=1)
DSV3_COMMAND = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 64 "
                "--expert-tensor-parallel-size 1 --sequence-parallel --use-distributed-optimizer --bf16 "
                "--micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 "
                "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'")


@pytest.fixture(scope="module")
def dsv3():
    model = autopar.load_model("deepseek-v3")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=1024)
    training = TrainingSpec(seq_len=4096, global_batch_size=8192)
    return model, cluster, training


def test_no_split_runs_the_structure_but_the_layout_prices(dsv3):
    model, cluster, training = dsv3
    bare = Plan(**DSV3_KNOBS)
    assert not split_is_whole(model, bare)
    assert not split_is_whole(model, parent_plan(model, cluster, training, bare))   # nor any first/last split
    plan = Plan(**DSV3_KNOBS, layout=DSV3_LAYOUT)
    assert layout_breaks(Problem(model, cluster, training), plan) == {}
    result = autopar.estimate(model, cluster, training, plan)
    assert "layers" not in result.violations and result.plan.layout == DSV3_LAYOUT
    # rank r holds virtual stages r, r + 8, r + 16, r + 24: rank 0 1 + 2 + 2 + 2 = 7 layers, rank 7 2 + 2 + 2 + 0 = 6,
    # the others 8: 7 + 6·8 + 6 = 61
    assert [stage.layers for stage in result.stages] == [7, 8, 8, 8, 8, 8, 8, 6]
    # MTP and the loss on the last rank only, the embedding on the first only
    assert [s.terms_bytes["mtp_activations"] > 0 for s in result.stages] == [False] * 7 + [True]
    assert [s.terms_bytes["embedding_activations"] > 0 for s in result.stages] == [True] + [False] * 7
    assert result.step_time_s > 0 and result.peak_memory_bytes == max(s.total_bytes for s in result.stages)


def test_the_layout_is_checked_against_its_own_rules(dsv3):
    model, cluster, training = dsv3
    problem = Problem(model, cluster, training)
    short = Plan(**DSV3_KNOBS, layout=(1,) + (2,) * 29 + (1, 0))     # 60 layers
    assert "places 60 decoder layers" in layout_breaks(problem, short)["layers"]
    with pytest.raises(InputError, match="places 60 decoder layers"):
        autopar.estimate(model, cluster, training, short)
    # block recompute of n layers per virtual stage: fewer than the largest stage's 2
    too_many = Plan(**DSV3_KNOBS, recompute="full", recompute_layers=2, layout=DSV3_LAYOUT)
    assert "recompute" in layout_breaks(problem, too_many)
    ok = dataclasses.replace(too_many, recompute_layers=1)
    assert layout_breaks(problem, ok) == {}
    # explain's checks (check_plan): memory from the layout's own ranks, no `layers`
    assert "layers" not in check_plan(model, cluster, training, Plan(**DSV3_KNOBS, layout=DSV3_LAYOUT))


def test_the_megatron_layout_string_reads_to_the_same_estimate(dsv3):
    model, cluster, training = dsv3
    run = parse_megatron_args(DSV3_COMMAND)
    assert run.plan == Plan(**DSV3_KNOBS, layout=DSV3_LAYOUT)
    imported = autopar.estimate(model, cluster, run.training_spec(training), run.plan)
    typed = autopar.estimate(model, cluster, run.training_spec(training), Plan(**DSV3_KNOBS, layout=DSV3_LAYOUT))
    assert imported.peak_memory_bytes == typed.peak_memory_bytes
    assert imported.step_time_s == pytest.approx(typed.step_time_s, rel=1e-12)


def test_the_uniform_price_of_a_structure_only_a_layout_runs_is_its_fractional_even_split(dsv3):
    """The gap term compares a layout with the uniform model within one model: the parent of a layout no split runs
    is the bare plan, priced at 61/32 layers a virtual stage (costmodels.layout.parent_layout); the search starts
    from the balanced composition (costmodels.layout.balanced_layout)."""
    model, cluster, training = dsv3
    bare = Plan(**DSV3_KNOBS)
    assert parent_layout(model, bare) == (61 / 32,) * 32
    assert uniform_layout(model, bare) == balanced_layout(61, 32)
    # 61 = 32·1 + 29: the 29 stages after the first get a second layer, the first and the last two keep one
    assert balanced_layout(61, 32) == (1,) + (2,) * 29 + (1, 1)
    assert sum(balanced_layout(61, 32)) == 61 and balanced_layout(8, 4) == (2, 2, 2, 2)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=300)


def test_estimate_and_megatron_args_price_deepseek_v3s_layout_from_the_cli():
    layout = ",".join(map(str, DSV3_LAYOUT))
    typed = cli("estimate", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "64",
                "--etp", "1", "--zero", "1", "--global-batch", "8192", "--layout", layout, "--json")
    assert typed.returncode in (0, 1), typed.stderr          # priced: fits or not, never a bad input
    imported = cli("estimate", "deepseek-v3", "--gpus", "1024", "--from-megatron-args", DSV3_COMMAND, "--json")
    assert imported.returncode in (0, 1), imported.stderr
    a, b = json.loads(typed.stdout), json.loads(imported.stdout)
    assert a["plan"]["layout"] == b["plan"]["layout"] == list(DSV3_LAYOUT)
    assert a["peak_memory_bytes"] == b["peak_memory_bytes"]
    assert "layers" not in a["violations"]


def test_the_search_refines_a_structure_no_split_runs(dsv3):
    """The front of DeepSeek-V3 at tp 2 pp 8 ep 64 (full recompute) is at vpp 1 (the split 6/.../5... a first/last
    split); its vpp 2 neighbour has no split (61 - 6·8 = 13 layers for the two ends, which would each need an even
    count, or 7 with the embedding/loss slot on both). It is a near-front candidate as the bare plan, which the layout
    search turns into a layout plan, added even at the balanced layout (its parent is a price, not a plan) and priced
    through the layout's own rules."""
    from autopar.search.refine import near_front_candidates, refine_front, refine_structure

    model, cluster, training = dsv3
    front = autopar.solve(model, cluster, training, fix={"pp": 8, "tp": 2, "cp": 1, "mbs": 1, "ep": 64, "etp": 1,
                                                         "zero": 1, "recompute": "full", "recompute_layers": 0})
    assert all(split_is_whole(model, p.plan) for p in front.points)
    candidates = near_front_candidates(front, None, (), exclude=set(), seeds=1, resplit=False)
    only_layout = [c for c in candidates if not split_is_whole(model, c.plan)]
    assert [c.plan.vpp for c in only_layout] == [2]
    found = refine_structure(model, cluster, training, only_layout[0], deterministic_limit=0.2, time_limit_s=None)
    assert found is not None and sum(found.best_layout) == model.num_layers and len(found.best_layout) == 16
    priced = autopar.estimate(model, cluster, training, dataclasses.replace(only_layout[0].plan,
                                                                            layout=found.best_layout))
    assert "layers" not in priced.violations
    refined, refinements = refine_front(front, budget_s=20.0)
    assert any(r.parent.plan.vpp == 2 for r in refinements)
    assert any("no first/last split runs" in note for note in refined.notes)


def test_frameworks_without_layouts_refuse_a_structure_only_a_layout_runs(dsv3):
    """verl and DeepSpeed get the nearest first/last split of a layout plan (autopar.export.layout_fallback); where
    none runs the structure they are refused with the reason, not handed a plan Megatron-Core would refuse."""
    from autopar.export import launch_config

    model, cluster, training = dsv3
    result = autopar.estimate(model, cluster, training, Plan(**DSV3_KNOBS, recompute="full", layout=DSV3_LAYOUT))
    with pytest.raises(InputError, match="no first/last split runs 61 layers on pp=8 × vpp=4"):
        launch_config(result, "verl")
    assert "--pipeline-model-parallel-layout" in launch_config(result, "megatron").text
