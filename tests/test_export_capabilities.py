"""The framework capability tables (autopar/export/capabilities.py): the search restricted to one framework keeps only
plans that framework runs, the exporters refuse the rest with the knob named, and nothing is emitted silently."""

from __future__ import annotations

import pytest

import autopar
from autopar.errors import Infeasible
from autopar.export import FRAMEWORKS, launch_config
from autopar.export.capabilities import CAPABILITIES, TARGET_VERSIONS, Unsupported, framework_rules, refusals
from autopar.export.names import PRICED_ONLY
from costmodels.rules import Problem as Context
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import TrainingSpec
from test_report_support import cluster, dense_model, moe_model


def test_every_framework_has_a_version_and_a_table():
    assert set(TARGET_VERSIONS) == set(FRAMEWORKS) == set(CAPABILITIES) - set(PRICED_ONLY)
    assert set(PRICED_ONLY) <= set(CAPABILITIES) and not set(PRICED_ONLY) & set(FRAMEWORKS)
    for rules in CAPABILITIES.values():
        for rule in rules:
            assert not rule.relaxable and rule.source and rule.reason


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_the_vectorised_rule_agrees_with_the_one_plan_check(framework):
    ctx = Context(moe_model(), cluster(64), TrainingSpec(seq_len=4096, global_batch_size=512))
    plans = [Plan(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, sp=tp > 1, zero=zero, recompute=recompute)
             for tp in (1, 2, 4) for pp in (1, 2) for vpp in ((1, 2) if pp > 1 else (1,)) for cp in (1, 2)
             for ep in (1, 4) for etp in {1, tp} for zero in (0, 1, 2, 3) for recompute in Recompute]
    arrays = PlanArrays.from_plans(plans)
    together = [all(bool(rule.holds(ctx, arrays)[i]) for rule in framework_rules(framework))
                for i in range(len(plans))]
    assert together == [not refusals(ctx, plan, framework) for plan in plans]
    assert any(together) and not all(together)  # the table cuts the space, and leaves some of it


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_solve_for_a_framework_keeps_only_plans_it_runs(framework):
    model = moe_model()
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    everything = autopar.solve(model, cluster(16), training)
    restricted = autopar.solve(model, cluster(16), training, extra_rules=framework_rules(framework))
    ctx = Context(model, cluster(16), training)
    assert any(refusals(ctx, point.plan, framework) for point in everything.points)   # the full front has some
    for point in restricted.points:
        assert not refusals(ctx, point.plan, framework)
        assert launch_config(point, framework).text                                    # and every one emits
    assert f"{framework}:" in " ".join(restricted.rules)
    # the restricted front is the front of the restricted space, not the full front filtered afterwards
    kept = [p for p in everything.points if not refusals(ctx, p.plan, framework)]
    assert restricted.points[0].step_time_s <= min((p.step_time_s for p in kept), default=float("inf")) + 1e-9


def test_solve_for_a_framework_that_can_run_nothing_says_so():
    # MoE, only ZeRO-3 allowed and only 1F1B pipeline, but DeepSpeed refuses MoE with ZeRO-3
    with pytest.raises(Infeasible, match="no plan fits once the added rules hold") as caught:
        autopar.solve(moe_model(), cluster(16), TrainingSpec(seq_len=4096, global_batch_size=256),
                      fix={"zero": 3}, extra_rules=framework_rules("deepspeed"))
    assert "deepspeed:moe_zero3" in caught.value.rules


def test_the_gradient_dtype_splits_only_verls_front_by_optimizer_sharding():
    """verl cannot set Megatron-FSDP's gradient dtype (bf16): with fp32 gradients its searched front keeps zero <= 1.
    NeMo 2.7.3 (megatron-core 0.16, whose Megatron-FSDP reads grad_reduce_in_fp32) and Bridge (a torch.float32 node
    for megatron_fsdp_main_grads_dtype; the dtype inside its mixed_precision node) run either dtype at any stage."""
    fp32 = TrainingSpec(seq_len=4096, global_batch_size=256)
    bf16 = TrainingSpec(seq_len=4096, global_batch_size=256, grad_reduce_in_fp32=False)
    assert any(p.plan.zero >= 2 for p in autopar.solve(dense_model(), cluster(16), fp32).points)
    front = autopar.solve(dense_model(), cluster(16), fp32, extra_rules=framework_rules("verl")).points
    assert front and all(p.plan.zero <= 1 for p in front)
    for framework in ("nemo", "bridge"):
        for training in (fp32, bf16):
            assert autopar.solve(dense_model(), cluster(16), training, extra_rules=framework_rules(framework)).points \
                == autopar.solve(dense_model(), cluster(16), training).points, framework


@pytest.mark.parametrize("framework", ["torchtitan"])
def test_an_input_the_framework_cannot_run_is_named_as_the_input_not_searched(framework):
    """bf16 gradient reduce: torchtitan 0.3.0 cannot set it, whatever the layout: the search says so by the rule
    alone (no other rule listed); the export writes the fp32 reduce torchtitan runs, priced again through the same
    estimate path, and says so in one line (export.capabilities.ADJUSTMENTS)."""
    from costmodels.scoring import estimate as score

    bf16 = TrainingSpec(seq_len=4096, global_batch_size=256, grad_reduce_in_fp32=False)
    with pytest.raises(Infeasible, match="refuses every plan") as caught:
        autopar.solve(dense_model(), cluster(16), bf16, extra_rules=framework_rules(framework))
    assert caught.value.rules == (f"{framework}:grad_reduce_in_fp32",)
    fp32 = TrainingSpec(seq_len=4096, global_batch_size=256)
    fp32_ctx = Context(dense_model(), cluster(16), fp32)
    # a layout the framework runs with fp32 gradients
    point = next(p for p in autopar.solve(dense_model(), cluster(16), bf16).points
                 if not refusals(fp32_ctx, p.plan, framework))
    config = launch_config(point, framework)
    assert config.priced.training.grad_reduce_in_fp32 and config.priced.plan == point.plan
    assert config.priced.peak_memory_bytes == score(point.model, point.cluster, fp32, point.plan).peak_memory_bytes
    assert config.text.startswith("# note: written with gradients reduced in fp32")
    assert config.priced.peak_memory_bytes > point.peak_memory_bytes      # fp32 gradients cost more
    assert autopar.solve(dense_model(), cluster(16), fp32, extra_rules=framework_rules(framework)).points


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_fp8_parameters_are_an_input_torchtitan_and_deepspeed_cannot_run(framework):
    """Neither keeps fp8 weights (torchao's fp8 linears and DeepSpeed's engine hold bf16 ones): with
    --fp8-param-gather the search names that rule alone, and the same inputs without it have a front. The
    Megatron-Core frameworks write the setting and refuse no plan for it."""
    params = TrainingSpec(seq_len=4096, global_batch_size=256, precision="fp8", fp8_param_gather=True)
    with pytest.raises(Infeasible, match="refuses every plan") as caught:
        autopar.solve(dense_model(), cluster(16), params, extra_rules=framework_rules(framework))
    assert caught.value.rules == (f"{framework}:fp8_param_gather",)
    without = TrainingSpec(seq_len=4096, global_batch_size=256, precision="fp8")
    assert autopar.solve(dense_model(), cluster(16), without, extra_rules=framework_rules(framework)).points
    ctx = Context(dense_model(), cluster(16), params)
    for megatron_core in ("megatron", "nemo", "bridge", "verl"):
        assert refusals(ctx, Plan(tp=2, sp=True, zero=1), megatron_core) == ()


def test_megatron_family_frameworks_refuse_no_layout():
    # every knob at once, under Megatron-FSDP (zero 3) with the bf16 gradients it runs
    estimate_plan = Plan(tp=4, pp=2, vpp=2, cp=2, ep=4, etp=2, sp=True, recompute=Recompute.FULL, zero=3)
    ctx = Context(moe_model(), cluster(64), TrainingSpec(seq_len=8192, global_batch_size=512,
                                                         grad_reduce_in_fp32=False))
    for framework in ("megatron", "nemo", "bridge", "verl"):
        assert refusals(ctx, estimate_plan, framework) == ()
    assert refusals(Context(dense_model(), cluster(64), TrainingSpec(seq_len=8192, global_batch_size=512)),
                    Plan(tp=8, sp=True, zero=1), "torchtitan") == (CAPABILITIES["torchtitan"][0].reason,)


def test_unsupported_is_an_input_error_with_the_reasons():
    error = Unsupported("deepspeed", Plan(tp=2, cp=2, sp=True), ("cp > 1: no ring CP",))
    assert isinstance(error, InputError)  # the CLI's exit 2 channel
    assert error.reasons == ("cp > 1: no ring CP",) and "--framework deepspeed" in str(error)


def test_a_refusal_names_the_nearest_plan_the_framework_runs_with_its_cost():
    model, training = moe_model(), TrainingSpec(seq_len=4096, global_batch_size=256)
    front = autopar.solve(model, cluster(16), training)
    ctx = Context(model, cluster(16), training)
    refused_point = next(p for p in front.points if refusals(ctx, p.plan, "deepspeed"))
    with pytest.raises(Unsupported) as caught:
        launch_config(refused_point, "deepspeed")
    message = str(caught.value.with_nearest(refused_point))
    restricted = autopar.solve(model, cluster(16), training, extra_rules=framework_rules("deepspeed")).points
    within = [p for p in restricted if p.peak_memory_bytes <= refused_point.peak_memory_bytes]
    nearest = within[0] if within else min(restricted, key=lambda p: p.peak_memory_bytes)
    assert f"the nearest plan it can run is '{nearest.plan.short()}'" in message
    assert f"predicted {nearest.step_time_s:.2f} s per step" in message
    assert not refusals(ctx, nearest.plan, "deepspeed")


def test_solve_framework_on_the_command_line(capsys):
    import json

    from autopar.cli import main

    assert main(["solve", "llama-3.1-8b", "--gpus", "8", "--framework", "ds", "--emit", "deepspeed", "--top", "2"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["zero_optimization"]["stage"] in (0, 1, 2, 3)
    assert "deepspeed:pipeline_zero" in err            # the framework's rules are listed with the search's
    assert main(["solve", "llama-3.1-8b", "--gpus", "8", "--framework", "jax"]) == 2
    assert "framework: unknown framework 'jax'" in capsys.readouterr().err
