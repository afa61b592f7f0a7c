"""The search space, the oracle's front, `autopar.solve`, explanations and edge cases (API and CLI)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import autopar
from autopar.search.explain import explain_plan
from autopar.search.oracle import solve_oracle
from autopar.search.pareto import dominates, front_indices
from costmodels.rules import Problem, active_rules, structural_mask
from autopar.search.space import Controls, build_space, layer_splits, parse_assignments
from costmodels.errors import InputError
from costmodels.evaluate import evaluate
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import ModelSpec, TrainingSpec

TOY = ModelSpec(name="toy", hidden_size=512, num_layers=4, num_attention_heads=4, ffn_hidden_size=2048,
                vocab_size=1000)


# ---- space -------------------------------------------------------------------------------------------------

def test_uneven_splits_for_published_depths():
    # DeepSeek-V3, 61 layers on pp 16: middle stages 4 layers, ends share 61 - 14·4 = 5
    assert layer_splits(61, 16) == [(0, 1), (1, 0), (2, 3), (3, 2)]
    # Llama-3.1-405B, 126 layers on pp 16: middle 8, ends share 126 - 14·8 = 14: (6, 8), (7, 7), (8, 6)
    assert layer_splits(126, 16) == [(0, 6), (6, 0), (7, 7)]
    assert layer_splits(105, 35) == [(0, 0)]                  # even: 3 per stage
    assert layer_splits(13, 2) == [(0, 5), (0, 6), (5, 0), (6, 0)]   # prime depth on 2 stages: lighter end given
    assert layer_splits(4, 8) == []


def test_space_has_uneven_stages_for_deepseek_v3():
    model = autopar.load_model("deepseek-v3")
    space = build_space(model, autopar.make_cluster(gpu="h100", num_gpus=2048), TrainingSpec(seq_len=4096,
                                                                                      global_batch_size=4096))
    assert {(16, 1, 0), (16, 2, 3)} <= set(space.splits)
    assert space.domain("ep") == (1, 2, 4, 8, 16, 32, 64, 128, 256)


def test_pins_bounds_and_bad_controls():
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=8), TrainingSpec(seq_len=1024, global_batch_size=8)
    space = build_space(TOY, cluster, training, Controls(fix={"tp": 3}, maximum={"mbs": 2}))
    assert space.domain("tp") == (3,)                 # a pin is kept even when no rule allows it
    assert space.domain("mbs") == (1, 2)
    assert parse_assignments(["sp=true", "recompute=full"], "fix") == {"sp": 1, "recompute": 2}
    with pytest.raises(InputError, match="knobs are"):
        parse_assignments(["dpp=2"], "fix")
    with pytest.raises(InputError, match="derived"):
        parse_assignments(["dp=2"], "fix")
    with pytest.raises(InputError, match="KNOB=VALUE"):
        parse_assignments(["tp4"], "fix")
    with pytest.raises(InputError, match="widen"):
        build_space(TOY, cluster, training, Controls(minimum={"mbs": 100}))


# ---- the oracle's front ------------------------------------------------------------------------------------

def test_front_indices_keeps_non_dominated_with_tie_break():
    # times 1, 1, 2, 3 with memories 5, 5, 4, 6: the tie at (1, 5) keeps the smaller tp; (3, 6) is dominated
    columns = {k: np.zeros(4, dtype=np.int64) for k in ("pp", "tp", "cp", "ep", "etp", "vpp", "first_stage_layers",
                                                        "last_stage_layers", "zero", "recompute",
                                                        "recompute_layers", "recompute_modules", "sp", "mbs")}
    columns["tp"] = np.array([2, 1, 1, 1])
    kept = front_indices(np.array([1, 1, 2, 3]), np.array([5, 5, 4, 6]), columns)
    assert list(kept) == [1, 2]


def test_oracle_front_against_brute_force_on_a_toy():
    # every candidate of a 4-GPU toy space evaluated directly: the oracle's front is exactly the non-dominated set
    cluster, training = autopar.make_cluster(gpu="a100-80gb", num_gpus=4), TrainingSpec(seq_len=512, global_batch_size=8)
    controls = Controls(maximum={"mbs": 2, "vpp": 2})
    space = build_space(TOY, cluster, training, controls)
    ctx, rules = Problem(TOY, cluster, training), active_rules()
    result = solve_oracle(space, ctx, rules)
    from autopar.search import objective
    from autopar.search.oracle import structures
    from autopar.search.space import mixed_radix, plan_arrays
    base = structures(space, ctx, rules)
    detail = space.factors(("mbs", "sp", "recompute", "zero"))
    sizes = [len(t) for _, t in detail]
    per = int(np.prod(sizes))
    n = len(base["tp"])
    cols = {k: np.repeat(v, per) for k, v in base.items()}
    cols.update(space.columns_from_factors(detail, [np.tile(d, n) for d in mixed_radix(sizes, 0, per)]))
    plans = plan_arrays(cols)
    plans = plans.take(np.flatnonzero(structural_mask(ctx, plans, rules)))
    t, m = objective.objectives(objective.objective_structure(TOY, cluster, training), TOY, cluster, training, plans)
    fits = m <= objective.memory_limit_units(cluster.memory_limit_bytes)
    vectors = set(zip(t[fits].tolist(), m[fits].tolist()))
    front = {v for v in vectors if not any(dominates(w, v) for w in vectors)}
    assert set(zip(result.time_units.tolist(), result.memory_units.tolist())) == front
    assert list(result.time_units) == sorted(result.time_units)          # fastest first
    assert all(np.diff(result.memory_units) < 0)                          # and each later point uses less memory


def test_integer_objectives_track_the_float_model():
    # time units are µs/2^16 after per-group rounding: within a few µs of evaluate(); memory rounds up to MiB
    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=32), TrainingSpec(seq_len=8192, global_batch_size=256)
    from autopar.search import objective
    plans = PlanArrays.from_plans([Plan(tp=2, pp=2, vpp=2, sp=True, mbs=1, zero=1),
                                   Plan(tp=8, pp=4, sp=True, recompute=Recompute.FULL, first_stage_layers=7,
                                        last_stage_layers=7)])
    t, m = objective.objectives(objective.objective_structure(model, cluster, training), model, cluster, training,
                                plans)
    ev = evaluate(model, cluster, training, plans)
    assert np.allclose(objective.time_units_to_s(t), ev.step_time_s, rtol=1e-4, atol=1e-5)
    assert np.all(m * objective.MEMORY_UNIT_BYTES >= ev.peak_memory_bytes)
    assert np.all(m * objective.MEMORY_UNIT_BYTES - ev.peak_memory_bytes < 40 * objective.MEMORY_UNIT_BYTES)


def test_integer_objectives_track_the_float_model_under_the_moe_all_to_all_overlap():
    """Under --overlap-moe-expert-parallel-comm the bubble takes the whole all-to-all of its unpaired chunks while
    ep_comm carries the overlap's discount, so the bubble cannot be Σ pipelined terms / m: the objective prices it
    as a term of its own and agrees with the float model (it came out 0.46% fast on this plan when factored)."""
    model = autopar.load_model("mixtral-8x7b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch_size=256, moe_a2a_overlap=True)
    from autopar.search import objective
    structure = objective.objective_structure(model, cluster, training)
    assert not structure.factored
    assert objective.objective_structure(model, cluster, dataclasses.replace(training, moe_a2a_overlap=False)).factored
    plans = PlanArrays.from_plans([Plan(tp=2, sp=True, pp=4, vpp=2, ep=8), Plan(tp=1, pp=2, vpp=8, ep=8)])
    t, _ = objective.objectives(structure, model, cluster, training, plans)
    ev = evaluate(model, cluster, training, plans)
    assert np.allclose(objective.time_units_to_s(t), ev.step_time_s, rtol=1e-4, atol=1e-5)


# ---- autopar.solve -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama8b_front():
    model = autopar.load_model("llama-3.1-8b")
    return autopar.solve(model, autopar.make_cluster(gpu="h100", num_gpus=32),
                         autopar.Training(seq_len=8192, global_batch_size=256))


def test_solve_front_is_feasible_sorted_and_rescored(llama8b_front):
    front = llama8b_front
    assert len(front) > 3 and front.proven_optimal
    times = [p.step_time_s for p in front]
    assert times == sorted(times)
    for point in front:
        assert point.violations == () and point.fits
    for a in front:
        for b in front:
            assert not dominates((a.step_time_s * (1 + 1e-6), a.peak_memory_bytes + 2**21),
                                 (b.step_time_s, b.peak_memory_bytes)) or a is b
    assert json.loads(front.to_json())["points"][0]["plan"]["tp"] >= 1


def test_solve_is_deterministic_and_thread_safe():
    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=16), TrainingSpec(seq_len=4096, global_batch_size=64)
    results = [None, None]

    def work(i):
        results[i] = [p.plan for p in autopar.solve(model, cluster, training, fix={"zero": 1})]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == results[1] and results[0]


def test_pins_and_relax_reach_the_search():
    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=32), TrainingSpec(seq_len=8192, global_batch_size=256)
    front = autopar.solve(model, cluster, training, fix={"tp": 4, "recompute": "selective"}, bounds={"pp": (None, 2)})
    assert all(p.plan.tp == 4 and p.plan.recompute == Recompute.SELECTIVE and p.plan.pp <= 2 for p in front)
    relaxed = autopar.solve(model, cluster, training, fix={"cp": 2, "tp": 1}, relax=["cp_needs_sp_tp"])
    assert relaxed.relaxed_rules == ("cp_needs_sp_tp",) and all(p.plan.cp == 2 for p in relaxed)
    with pytest.raises(InputError):
        autopar.solve(model, cluster, training, relax=["batch"])


def test_time_limit_marks_front_unproven():
    model = autopar.load_model("llama-3.1-70b")
    front = autopar.solve(model, autopar.make_cluster(gpu="h100", num_gpus=256),
                          TrainingSpec(seq_len=8192, global_batch_size=1024), time_limit_s=0.05)
    assert not front.proven_optimal
    assert any("not proven" in note for note in front.notes)


def test_a_time_limit_too_short_to_price_a_batch_still_returns_a_front():
    """The oracle stops at a time limit only once a plan fits: with a limit shorter than any batch (and a first
    batch of structures whose plans may all be over memory), the front found so far is not empty."""
    from autopar.search import oracle

    model = autopar.load_model("qwen3-235b-a22b")        # its first batch of structures holds no plan that fits
    cluster = autopar.make_cluster(gpu="h100", num_gpus=2048)
    training = TrainingSpec(seq_len=4096, global_batch_size=1024)
    space = build_space(model, cluster, training, Controls())
    result = oracle.solve_oracle(space, Problem(model, cluster, training), active_rules(), time_budget_s=1e-9)
    assert len(result.time_units) > 0 and result.fitting_plans > 0
    assert not result.complete


# ---- nothing fits ------------------------------------------------------------------------------------------

def test_405b_on_eight_a100_40gb_is_infeasible_with_memory_shortfall():
    model = autopar.load_model("llama-3.1-405b")
    with pytest.raises(autopar.Infeasible) as info:
        autopar.solve(model, autopar.make_cluster(gpu="a100-40gb", num_gpus=8), TrainingSpec(seq_len=8192,
                                                                                      global_batch_size=256))
    assert "memory" in info.value.rules
    assert any("over the limit" in line and "GiB" in line for line in info.value.details)


def test_conflicting_pins_name_the_rules():
    model = autopar.load_model("llama-3.1-8b")
    with pytest.raises(autopar.Infeasible) as info:
        autopar.solve(model, autopar.make_cluster(gpu="h100", num_gpus=8), TrainingSpec(seq_len=8192,
                                                                                  global_batch_size=256),
                      fix={"tp": 3})
    assert set(info.value.rules) == {"world", "fix tp=3"}      # 8 % 3 != 0: minimal, so heads is not listed


def assert_sound_front(front, model, cluster, training) -> None:
    """What every returned front must satisfy, each of which a wrong search or rescoring would break: fastest first
    and non-dominated (time strictly rising, memory strictly falling), every point fits its memory limit and breaks
    no rule, its layout tiles the GPUs and the batch, and scoring its plan alone gives the front's numbers."""
    assert len(front) >= 1
    times = [p.step_time_s for p in front]
    memories = [p.peak_memory_bytes for p in front]
    assert all(a < b for a, b in zip(times, times[1:])), times
    assert all(a > b for a, b in zip(memories, memories[1:])), memories
    for point in front:
        plan = point.plan
        assert point.violations == () and point.fits
        assert point.peak_memory_bytes <= point.memory_limit_bytes
        assert cluster.num_gpus % (plan.tp * plan.cp * plan.pp) == 0
        assert training.global_batch_size % (point.dp * plan.mbs) == 0
        alone = autopar.estimate(model, cluster, training, plan)
        assert alone.step_time_s == pytest.approx(point.step_time_s, rel=1e-9)
        assert alone.peak_memory_bytes == pytest.approx(point.peak_memory_bytes, rel=1e-9)


@pytest.mark.parametrize("gpus", [1, 7, 13])
def test_single_and_prime_gpu_counts(gpus):
    model = ModelSpec(name="small", hidden_size=1024, num_layers=13, num_attention_heads=16,
                      ffn_hidden_size=4096, vocab_size=32000)        # a prime number of layers too
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus, gpus_per_node=gpus if gpus > 8 else 0)
    training = TrainingSpec(seq_len=2048, global_batch_size=gpus * 4)
    front = autopar.solve(model, cluster, training)
    assert_sound_front(front, model, cluster, training)
    for point in front:       # a prime count: all GPUs in one dimension (tp only divides 16 heads, so tp = 1)
        assert point.plan.tp == 1
        assert sorted([point.dp, point.plan.cp, point.plan.pp]) in ([1, 1, gpus], [1, 1, 1])


def test_131072_gpus_answers():
    model = autopar.load_model("llama-3.1-405b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=131072), TrainingSpec(seq_len=8192,
                                                                                 global_batch_size=16384)
    front = autopar.solve(model, cluster, training, bounds={"mbs": (None, 2)})
    assert_sound_front(front, model, cluster, training)
    assert all(p.plan.mbs <= 2 for p in front)                # the user's bound reaches the search
    # 16384 sequences over 131072 GPUs: at most 16384 replicas, so tp·cp·pp >= 8 on every point
    assert all(p.plan.tp * p.plan.cp * p.plan.pp >= 8 for p in front)


# ---- explain -----------------------------------------------------------------------------------------------

def test_explain_dominated_plan_names_terms(llama8b_front):
    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=32), TrainingSpec(seq_len=8192, global_batch_size=256)
    slow = Plan(tp=8, pp=4, sp=True, recompute=Recompute.FULL)
    explanation = explain_plan(model, cluster, training, slow, llama8b_front)
    assert explanation.verdict == "dominated"
    assert explanation.term_differences_s
    assert any("tp_comm" in line or "pp_bubble" in line or "compute" in line for line in explanation.lines)
    on = explain_plan(model, cluster, training, llama8b_front[0].plan, llama8b_front)
    assert on.verdict == "on_front" and on.front_index == 0
    broken = explain_plan(model, cluster, training, Plan(tp=3), llama8b_front)
    assert broken.verdict == "breaks_rules" and "world" in broken.broken_rules
    # each broken rule is worded with the plan's numbers (32 GPUs, tp 3), not only its generic reason
    assert "breaks rule world: num_gpus=32 is not divisible by tp·cp·pp=3·1·1=3" in broken.lines[0]


def test_explain_says_when_the_plan_leaves_the_users_controls(llama8b_front):
    from autopar.search.explain import outside_controls
    from autopar.search.solve import controls_from

    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=32), TrainingSpec(seq_len=8192, global_batch_size=256)
    controls = controls_from({"sp": False, "recompute": "full"}, {"pp": (2, 4)})
    plan = Plan(tp=8, pp=8, sp=True, recompute=Recompute.FULL)
    assert outside_controls(plan, controls) == ("fix sp=false", "max pp=4")   # labels show the user's control
    explanation = explain_plan(model, cluster, training, plan, llama8b_front, controls=controls)
    assert explanation.lines[0].startswith("outside your search controls (")
    inside = Plan(tp=8, pp=2, sp=False, recompute=Recompute.FULL)
    assert outside_controls(inside, controls) == ()
    assert not explain_plan(model, cluster, training, inside, llama8b_front,
                            controls=controls).lines[0].startswith("outside")


def test_explain_does_not_call_a_plan_that_beats_the_controlled_front_a_tie():
    """A plan outside the controls can beat the front searched within them (here tp2 pp2 against a tp=4 front): it is
    not a rounding tie, and explain says so with both times."""
    from autopar.search.solve import controls_from

    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="h100", num_gpus=16), TrainingSpec()
    front = autopar.solve(model, cluster, training, fix={"tp": 4})
    plan = Plan(tp=2, pp=2, sp=True)
    explanation = explain_plan(model, cluster, training, plan, front, controls=controls_from({"tp": 4}, {}))
    assert explanation.verdict == "beats_front", explanation.lines
    assert "ties" not in " ".join(explanation.lines)
    mine = autopar.estimate(model, cluster, training, plan)
    assert f"against its {mine.step_time_s:.3f} s" in explanation.lines[1]


# ---- the command line --------------------------------------------------------------------------------------

def autopar_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_solve_json_and_table():
    done = autopar_cli("solve", "llama-3.1-8b", "--gpus", "32", "--seq-len", "8192", "--global-batch", "256",
                       "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["points"] and document["solver"]["proven_optimal"]
    table = autopar_cli("solve", "llama-3.1-8b", "--gpus", "32", "--top", "3", "--fix", "tp=2")
    assert table.returncode == 0 and "Pareto front" in table.stdout and "tp2" in table.stdout


def test_cli_infeasible_and_bad_input_exit_codes():
    done = autopar_cli("solve", "llama-3.1-405b", "--gpu", "a100-40gb", "--gpus", "8")
    assert done.returncode == 1
    assert "memory" in done.stderr and "over the limit" in done.stderr
    bad = autopar_cli("solve", "llama-3.1-8b", "--gpus", "8", "--relax", "nonsense")
    assert bad.returncode == 2 and "relax" in bad.stderr and "Traceback" not in bad.stderr
    bad_fix = autopar_cli("solve", "llama-3.1-8b", "--gpus", "8", "--fix", "tp")
    assert bad_fix.returncode == 2


@pytest.mark.parametrize("controls, names", [
    (("--fix", "tp=0"), "tp"), (("--fix", "tp=-2"), "tp"), (("--min", "mbs=-5"), "mbs"), (("--fix", "zero=5"), "zero"),
    (("--fix", "=4"), "knob"), (("--fix", "tp=4", "--max", "tp=2"), "max tp=2"),
    (("--min", "pp=4", "--max", "pp=2"), "min pp=4"),
])
def test_out_of_range_and_contradictory_controls_are_bad_input(controls, names):
    """A pin no plan can take is bad input (exit 2), not 'nothing fits' (exit 1); a pin outside a bound of the same
    knob is not silently kept over the bound."""
    from autopar.search.solve import controls_from

    done = autopar_cli("solve", "llama-3.1-8b", "--gpus", "16", *controls)
    assert done.returncode == 2, (controls, done.returncode, done.stderr)
    assert names in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    with pytest.raises(InputError):
        controls_from({"tp": 4}, {"tp": (None, 2)})


def test_cli_explain_and_scaling_front():
    done = autopar_cli("explain", "llama-3.1-8b", "--gpus", "32", "--seq-len", "8192", "--global-batch", "256",
                       "--tp", "8", "--pp", "4", "--recompute", "full")
    assert done.returncode == 0, done.stderr
    assert "dominated by front point" in done.stdout
    scaling = autopar_cli("solve", "llama-3.1-8b", "--gpus", "8-32", "--seq-len", "4096", "--global-batch", "128",
                          "--json")
    assert scaling.returncode == 0, scaling.stderr
    counts = {p["plan"]["dp"] * p["plan"]["tp"] * p["plan"]["cp"] * p["plan"]["pp"]
              for p in json.loads(scaling.stdout)["points"]}
    assert len(counts) >= 2


def test_cli_solve_json_is_the_schema_validated_report_document():
    import jsonschema

    done = autopar_cli("solve", "llama-3.1-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    schema_path = Path(autopar.__file__).parent / "schemas" / "front.schema.json"
    jsonschema.validate(document, json.loads(schema_path.read_text()))
    assert document["points"] and document["solver"]["status"] == "optimal"


def test_cli_explain_takes_a_running_megatron_job():
    # the same plan typed as flags and as a Megatron-LM command line gets the same explanation
    megatron = ("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
                "--pipeline-model-parallel-size 4 --sequence-parallel --recompute-granularity full "
                "--recompute-method uniform --micro-batch-size 1 --global-batch-size 256 --seq-length 8192 --bf16")
    imported = autopar_cli("explain", "llama-3.1-8b", "--from-megatron-args", megatron, "--json")
    # (the command has no --cross-entropy-loss-fusion: Megatron-LM's default unfused loss)
    typed = autopar_cli("explain", "llama-3.1-8b", "--gpus", "32", "--seq-len", "8192", "--global-batch", "256",
                        "--tp", "8", "--pp", "4", "--recompute", "full", "--cross-entropy", "unfused", "--json")
    assert imported.returncode == 0 and typed.returncode == 0, imported.stderr + typed.stderr
    assert json.loads(imported.stdout) == json.loads(typed.stdout)
    assert json.loads(imported.stdout)["verdict"] == "dominated"
    refused = autopar_cli("explain", "llama-3.1-8b", "--from-megatron-args", megatron, "--tp", "2")
    assert refused.returncode == 2 and "drop --tp" in refused.stderr


def test_memory_conflict_is_minimal_over_pins():
    # 8B on 8 × A100-40GB with tp, pp, zero and recompute all pinned to their plainest values: 8e9 params × 18 bytes
    # on one GPU is ~134 GiB, far over the 32 GiB limit; the conflict names memory and pins, each one necessary
    from autopar.search.explain import least_memory_plan, without_control
    from autopar.search.solve import controls_from

    model = autopar.load_model("llama-3.1-8b")
    cluster, training = autopar.make_cluster(gpu="a100-40gb", num_gpus=8), TrainingSpec(seq_len=4096, global_batch_size=64)
    fix = {"tp": 1, "pp": 1, "zero": 0, "recompute": "none"}
    with pytest.raises(autopar.Infeasible) as info:
        autopar.solve(model, cluster, training, fix=fix)
    rules = info.value.rules
    assert rules[0] == "memory" and len(rules) >= 2
    assert all(name.startswith("fix ") for name in rules[1:])
    # minimal: with only the named constraints (the unnamed pins dropped, the unnamed guide rules relaxed), dropping
    # any one named pin lets a plan fit
    controls = controls_from(fix, relax=[r for r in ("tp_node", "cp_needs_sp_tp") if r not in rules])
    for name in rules[1:]:
        kept = controls
        for label in [f"fix {k}={v}" for k, v in controls.fix.items()]:
            if label not in rules or label == name:
                kept = without_control(kept, label)
        nearest = least_memory_plan(model, cluster, training, kept)
        assert nearest is not None and nearest.peak_memory_bytes <= cluster.memory_limit_bytes


def test_a_compute_gap_from_recompute_names_what_the_better_point_does():
    """The guide's 'selective instead of full' only where the better point recomputes selectively; against a point
    that recomputes nothing (or fewer layers) the cause says so."""
    from autopar.search.explain import _compute_cause
    from costmodels.plan import Plan

    full, selective, none = (Plan(recompute=r) for r in ("full", "selective", "none"))
    assert "'selective' instead of 'full'" in _compute_cause(full, selective)
    assert "does without (selective recompute" in _compute_cause(selective, none)
    assert "does without (full recompute re-runs whole layers" in _compute_cause(full, none)
    assert "re-runs some of them" in _compute_cause(full, Plan(recompute="full", recompute_layers=1))


def test_batches_cover_every_structure_once_and_grow_under_a_time_limit():
    """oracle.chunk_spans: contiguous spans over every structure; CHUNK_PLANS plans a batch without a limit; under
    one, a first batch of TIME_LIMITED_CHUNK_PLANS, then batches sized from the pace (fast batches: the largest)."""
    from autopar.search import oracle

    def spans(n, per, budget):
        return list(oracle.chunk_spans(n, per, budget))

    for budget in (None, 100.0):
        got = spans(10_000, 100, budget)
        assert got[0][0] == 0 and got[-1][1] == 10_000
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    assert {e - s for s, e in spans(10_000, 100, None)[:-1]} == {oracle.CHUNK_PLANS // 100}
    limited = spans(100_000, 100, 100.0)
    assert limited[0][1] - limited[0][0] == oracle.TIME_LIMITED_CHUNK_PLANS // 100
    assert limited[1][1] - limited[1][0] == oracle.CHUNK_PLANS // 100      # an instant batch: the largest next
    assert spans(0, 100, None) == [] and spans(5, 0, None) == [(0, 5)]
