"""The pipeline schedule knob: Megatron-Core's 1F1B against the zero-bubble schedules ZB-1p / ZB-2p (arXiv 2401.10241).

Bubble (Table 2 of the paper): 1F1B (p-1)(T_F+T_B+T_W), ZB-1p (p-1)(T_F+T_B-T_W), ZB-2p none once the micro-batches
fill its warm-up (2p-1); memory: ZB-1p holds p micro-batches on every rank, ZB-2p 2p-1. The schedule reaches the
search (a rule: not interleaved; an unfactored bubble term), the exports (refused where the framework lacks it),
the CLI and the JSON.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import autopar
from autopar.cli import main
from autopar.export.capabilities import refusals
from costmodels import memory, steptime
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.rules import Problem, check_plan
from costmodels.scoring import estimate
from costmodels.specs import ClusterSpec, ModelSpec, PipelineSchedule, TrainingSpec

MODEL = ModelSpec(name="gpt-6b", hidden_size=4096, num_layers=30, num_attention_heads=32, ffn_hidden_size=16384,
                  vocab_size=50257)
CLUSTER = ClusterSpec(profile=load_profile("a100-80gb"), num_gpus=8)
PLAN = Plan(tp=1, pp=8, mbs=2, zero=0, first_stage_layers=3, last_stage_layers=3)


def training(schedule: str, global_batch: int = 48) -> TrainingSpec:
    return TrainingSpec(seq_len=1024, global_batch_size=global_batch, pipeline_schedule=schedule)


def stage_pieces(train: TrainingSpec, plan: Plan = PLAN):
    """Every candidate stage's (micro-batch time T, weight-gradient time W) and the 1F1B worst-term time."""
    plans = PlanArrays.from_plans([plan])
    times, comm = steptime.layer_pieces(MODEL, CLUSTER, train, plans)
    pieces = [steptime.stage_microbatch(MODEL, CLUSTER, train, plans, times, s, comm)
              for s in steptime.candidate_stages(plans)]
    stages = [(float((p.compute_s + p.tp_comm_s + p.cp_comm_s + p.ep_comm_s + p.host_s)[0]),
               float(np.broadcast_to(p.weight_grad_s, (1,))[0])) for p in pieces]
    worst = max(float(p.compute_s[0]) for p in pieces) + max(float(p.tp_comm_s[0]) for p in pieces) \
        + max(float(p.cp_comm_s[0]) for p in pieces) + max(float(p.ep_comm_s[0]) for p in pieces) \
        + max(float(p.host_s[0]) for p in pieces)
    return stages, worst, pieces


def test_schedule_is_read_case_insensitively_and_refuses_unknown_names():
    assert TrainingSpec(pipeline_schedule="ZB-2P").pipeline_schedule is PipelineSchedule.ZB_2P
    assert TrainingSpec().pipeline_schedule is PipelineSchedule.ONE_F_ONE_B
    with pytest.raises(InputError, match="pipeline_schedule.*1f1b, zb-1p, zb-2p"):
        TrainingSpec(pipeline_schedule="zbv")


def test_weight_gradient_pass_is_the_weight_gemms_forward():
    _, _, pieces = stage_pieces(training("zb-1p"))
    middle = pieces[1]
    # W is part of the backward, about a third of a GEMM-dominated stage (F = B = W in FLOPs for the linear layers)
    assert 0.0 < float(middle.weight_grad_s[0]) < float(middle.backward_s[0])
    assert 0.25 < float(middle.weight_grad_s[0]) / float(middle.compute_s[0]) < 1 / 3
    # first and last stage hold 3 layers, the middle 4; the last adds the output layer's weight gradient
    plans = PlanArrays.from_plans([PLAN])
    times, _ = steptime.layer_pieces(MODEL, CLUSTER, training("zb-1p"), plans)
    first, last = float(pieces[0].weight_grad_s[0]), float(pieces[-1].weight_grad_s[0])
    assert first == pytest.approx(0.75 * float(middle.weight_grad_s[0]))
    assert last - first == pytest.approx(float(times.logits_fwd_s[0]))


def test_zero_bubble_1p_bubble_is_table_2s_formula_on_each_stage():
    one = estimate(MODEL, CLUSTER, training("1f1b"), PLAN).time_terms_s["pp_bubble"]
    zb1 = estimate(MODEL, CLUSTER, training("zb-1p"), PLAN).time_terms_s["pp_bubble"]
    stages, worst, _ = stage_pieces(training("zb-1p"))
    assert one == pytest.approx((PLAN.pp - 1) * worst, rel=1e-9)
    # each stage's T with its own W (a light first stage's small W is not paired with a middle stage's T)
    assert zb1 == pytest.approx(max((PLAN.pp - 1) * (t - 2 * w) for t, w in stages), rel=1e-9)
    # a third of 1F1B's when F = B = W (§2.1); the attention core and the memory-bound kernels have no W, so more:
    # the paper's computed bubble rates give ZB-1p / 1F1B 0.54-0.65 on its GPT models (Table 5)
    assert 1 / 3 < zb1 / one < 0.7


def test_with_fewer_micro_batches_than_stages_fewer_weight_passes_fill_the_bubble():
    pp = PLAN.pp
    for m in (1, 4, pp, 2 * pp):
        train = training("zb-1p", global_batch=2 * m)
        stages, _, _ = stage_pieces(train)
        held_back = (pp - 1) + min(m - 1, pp - 1)
        expected = max((pp - 1) * t - held_back * w for t, w in stages)
        assert estimate(MODEL, CLUSTER, train, PLAN).time_terms_s["pp_bubble"] == pytest.approx(expected), m
    # one micro-batch: the critical path is p·(T_F + T_B) + T_W, a bubble of (p - 1)·(T - W)
    stages, _, _ = stage_pieces(training("zb-1p", 2))
    assert estimate(MODEL, CLUSTER, training("zb-1p", 2), PLAN).time_terms_s["pp_bubble"] == \
        pytest.approx(max((pp - 1) * (t - w) for t, w in stages))


def test_zero_bubble_2p_has_no_bubble_once_the_warmup_fills():
    pp = PLAN.pp
    filled = 2 * (2 * pp - 1)                            # mbs 2, dp 1: 2p - 1 = 15 micro-batches
    assert estimate(MODEL, CLUSTER, training("zb-2p", filled), PLAN).time_terms_s["pp_bubble"] == 0.0
    # one micro-batch fewer: priced as ZB-1p (the looser memory limit cannot do worse)
    short = filled - 2
    zb2 = estimate(MODEL, CLUSTER, training("zb-2p", short), PLAN).time_terms_s["pp_bubble"]
    zb1 = estimate(MODEL, CLUSTER, training("zb-1p", short), PLAN).time_terms_s["pp_bubble"]
    assert zb2 == pytest.approx(zb1) and zb1 > 0.0


def test_step_times_order_and_only_the_bubble_changes():
    steps = {s: estimate(MODEL, CLUSTER, training(s), PLAN) for s in ("1f1b", "zb-1p", "zb-2p")}
    assert steps["1f1b"].step_time_s > steps["zb-1p"].step_time_s > steps["zb-2p"].step_time_s
    for name in steps["1f1b"].time_terms_s:
        if name != "pp_bubble":
            assert steps["zb-2p"].time_terms_s[name] == pytest.approx(steps["1f1b"].time_terms_s[name])


def test_without_a_pipeline_the_schedule_changes_nothing():
    flat = Plan(tp=8, pp=1, mbs=1, sp=True)
    base = estimate(MODEL, CLUSTER, training("1f1b"), flat)
    for schedule in ("zb-1p", "zb-2p"):
        other = estimate(MODEL, CLUSTER, training(schedule), flat)
        assert other.step_time_s == base.step_time_s and other.peak_memory_bytes == base.peak_memory_bytes


def test_in_flight_micro_batches_per_schedule():
    plans = PlanArrays.from_plans([PLAN, PLAN, PLAN, PLAN])
    stages = np.array([0, 1, 6, 7])
    many = np.full(4, 100.0)
    assert list(memory.in_flight_microbatches(plans, stages, many)) == [8, 7, 2, 1]
    assert list(memory.in_flight_microbatches(plans, stages, many, PipelineSchedule.ZB_1P)) == [8, 8, 8, 8]
    assert list(memory.in_flight_microbatches(plans, stages, many, PipelineSchedule.ZB_2P)) == [15, 15, 15, 15]
    assert list(memory.in_flight_microbatches(plans, stages, np.full(4, 10.0), PipelineSchedule.ZB_2P)) == [10] * 4


def test_peak_memory_grows_with_the_schedules_memory_limit():
    peaks = {s: estimate(MODEL, CLUSTER, training(s), PLAN) for s in ("1f1b", "zb-1p", "zb-2p")}
    assert peaks["1f1b"].peak_memory_bytes <= peaks["zb-1p"].peak_memory_bytes < peaks["zb-2p"].peak_memory_bytes
    # the activations roughly double from p to 2p - 1 micro-batches (paper Table 4: 39 -> 70 GB for the 6.2B model)
    def activations(e):
        worst = e.stages[e.worst_stage].terms_bytes
        return worst["layer_activations"]

    assert 1.5 < activations(peaks["zb-2p"]) / activations(peaks["zb-1p"]) < 2.0


def test_zero_bubble_schedules_refuse_recompute_that_drops_gemm_inputs():
    for recompute, modules, broken in ((Recompute.FULL, 0, True), (Recompute.SELECTIVE, "core_attn,mlp", True),
                                       (Recompute.SELECTIVE, "layernorm", True), (Recompute.SELECTIVE, 0, False),
                                       (Recompute.SELECTIVE, "core_attn", False), (Recompute.NONE, 0, False)):
        plan = dataclasses.replace(PLAN, recompute=recompute, recompute_modules=modules)
        assert ("zero_bubble_recompute" in check_plan(MODEL, CLUSTER, training("zb-1p"), plan)) is broken, plan
        assert "zero_bubble_recompute" not in check_plan(MODEL, CLUSTER, training("1f1b"), plan)
    flat = Plan(tp=8, pp=1, mbs=1, sp=True, recompute=Recompute.FULL)      # no pipeline: nothing held back
    assert "zero_bubble_recompute" not in check_plan(MODEL, CLUSTER, training("zb-1p"), flat)
    front = autopar.solve(MODEL, CLUSTER, training("zb-1p"), fix={"pp": 1, "tp": 8, "recompute": "full"},
                          solver="cpsat")
    assert front.points and all(p.plan.recompute is Recompute.FULL for p in front.points)
    with pytest.raises(InputError, match="^recompute: recompute full with pipeline schedule zb-2p"):
        estimate(MODEL, CLUSTER, training("zb-2p"), dataclasses.replace(PLAN, recompute=Recompute.FULL))


def test_zero_bubble_schedules_are_not_interleaved():
    interleaved = dataclasses.replace(PLAN, vpp=2, first_stage_layers=0, last_stage_layers=0, pp=6)
    model = dataclasses.replace(MODEL, num_layers=24)
    cluster = ClusterSpec(profile=CLUSTER.profile, num_gpus=6)
    assert "zero_bubble_vpp" not in check_plan(model, cluster, training("1f1b"), interleaved)
    broken = check_plan(model, cluster, training("zb-1p"), interleaved)
    assert "zero_bubble_vpp" in broken


def test_search_with_a_zero_bubble_schedule_is_exact_and_never_interleaves():
    train = training("zb-2p")
    cpsat = autopar.solve(MODEL, CLUSTER, train, fix={"tp": 1}, solver="cpsat")
    oracle = autopar.solve(MODEL, CLUSTER, train, fix={"tp": 1}, solver="oracle")
    assert [p.plan for p in cpsat.points] == [p.plan for p in oracle.points]
    assert all(p.plan.vpp == 1 for p in cpsat.points)
    assert all(p.plan.recompute is not Recompute.FULL for p in cpsat.points if p.plan.pp > 1)
    assert any(p.plan.pp > 1 for p in cpsat.points)


def test_layouts_are_not_priced_under_zero_bubble():
    from autopar.search.refine import refine_front

    front = autopar.solve(MODEL, CLUSTER, training("zb-1p"), fix={"tp": 1, "pp": 8}, solver="oracle")
    refined, refinements = refine_front(front)
    assert refinements == [] and refined.points == front.points
    assert any("per-stage pipeline layouts not searched" in note for note in refined.notes)
    with pytest.raises(InputError, match="layout"):
        estimate(MODEL, CLUSTER, training("zb-1p"), dataclasses.replace(PLAN, layout=(3, 4, 4, 4, 4, 4, 4, 3)))


def test_every_framework_refuses_a_pipelined_zero_bubble_plan():
    ctx = Problem(MODEL, CLUSTER, training("zb-2p"))
    flat = Plan(tp=8, sp=True, zero=3)
    for framework in ("megatron", "nemo", "bridge", "verl", "torchtitan", "deepspeed"):
        reasons = refusals(ctx, PLAN, framework)
        assert any("zero-bubble" in r and "--enable-zero-bubble" in r for r in reasons), framework
        assert not any("zero-bubble" in r for r in refusals(ctx, flat, framework)), framework
    assert refusals(Problem(MODEL, CLUSTER, training("1f1b")), PLAN, "megatron") == ()


def test_cli_prices_and_reports_the_schedule(capsys):
    argv = ["estimate", "gpt-1.7b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len", "1024", "--global-batch",
            "144", "--tp", "1", "--pp", "8", "--mbs", "6", "--zero", "0"]
    assert main(argv + ["--pipeline-schedule", "zb-2p", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["inputs"]["training"]["pipeline_schedule"] == "zb-2p"
    assert main(argv + ["--pipeline-schedule", "zb-1p"]) == 0
    assert "pipeline schedule zb-1p" in capsys.readouterr().out
    assert main(argv + ["--pipeline-schedule", "dualpipe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: error: pipeline_schedule: ") and err.count("\n") == 1
    assert main(argv + ["--pipeline-schedule", "zb-1p", "--emit", "megatron"]) == 2
    assert "--enable-zero-bubble" in capsys.readouterr().err


def test_the_zero_bubble_forks_flags_are_read_back(tmp_path, capsys):
    from autopar.megatron_args import parse_megatron_args

    base = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 --num-layers 24 --micro-batch-size 6 "
            "--global-batch-size 144 --seq-length 1024")
    assert parse_megatron_args(base).training["pipeline_schedule"] == "1f1b"
    fork = base + " --enable-zero-bubble --enable-optimizer-post-validation --zero-bubble-max-pending-backward "
    assert parse_megatron_args(fork + "8").training["pipeline_schedule"] == "zb-1p"
    assert parse_megatron_args(fork + "16").training["pipeline_schedule"] == "zb-2p"
    for refused in (fork + "auto", fork + "12", base + " --enable-zero-bubble --zero-bubble-v-schedule"):
        with pytest.raises(InputError, match="zero-bubble"):
            parse_megatron_args(refused)
    flat = base.replace("--pipeline-model-parallel-size 8", "--pipeline-model-parallel-size 1")
    assert parse_megatron_args(flat + " --enable-zero-bubble").training["pipeline_schedule"] == "1f1b"
    script = tmp_path / "zb.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py " + fork + "16\n")
    assert main(["estimate", "gpt-1.7b", "--gpu", "a100-80gb", "--from-megatron-args", str(script),
                 "--pipeline-schedule", "zb-1p", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["inputs"]["training"]["pipeline_schedule"] == "zb-2p"
    assert "--pipeline-schedule zb-1p ignored: the Megatron-LM command runs zb-2p" in captured.err


def test_the_last_rank_keeps_its_pending_output_layer_weight_gradients():
    last = PLAN.pp - 1
    plans = PlanArrays.from_plans([PLAN])
    plain = memory.memory_terms_bytes(MODEL, CLUSTER, training("1f1b"), plans, last)
    assert "pending_output_wgrad" not in plain
    for schedule, held in (("zb-1p", PLAN.pp), ("zb-2p", 2 * PLAN.pp - 1)):
        terms = memory.memory_terms_bytes(MODEL, CLUSTER, training(schedule), plans, last)
        vocab = 50304                                   # 50257 padded to a multiple of 128
        tokens = 2 * 1024                               # mbs 2, seq 1024, tp 1, cp 1
        per_microbatch = 2 * vocab * tokens + 2 * MODEL.hidden_size * tokens
        assert float(terms["pending_output_wgrad"][0]) == pytest.approx((held - 1) * per_microbatch)
        first = memory.memory_terms_bytes(MODEL, CLUSTER, training(schedule), plans, 0)
        assert float(first["pending_output_wgrad"][0]) == 0.0


def test_reports_give_a_zero_bubble_plan_the_forks_flags():
    from autopar.report.document import megatron_flags

    pipelined = estimate(MODEL, CLUSTER, training("zb-2p"), PLAN)
    words = megatron_flags(pipelined)
    assert words[words.index("--zero-bubble-max-pending-backward") + 1] == "16"
    assert "--enable-zero-bubble" in words and "--enable-optimizer-post-validation" in words
    assert "--enable-zero-bubble" not in megatron_flags(estimate(MODEL, CLUSTER, training("1f1b"), PLAN))
    assert "--enable-zero-bubble" not in megatron_flags(
        estimate(MODEL, CLUSTER, training("zb-2p"), Plan(tp=8, pp=1, mbs=1, sp=True)))
