"""`emit megatron` then `parse_megatron_args` gives back the same plan, batch, precision and GPU count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.export import emit
from autopar.megatron_args import parse_megatron_args
from costmodels.plan import Plan, Recompute
from costmodels.specs import Precision, TrainingSpec
from test_report_support import (DENSE_PLANS, MOE_PLANS, cluster, dense_model, moe_model, synthetic_estimate,
                                 synthetic_front)

FRONTS = [
    ("dense-64", lambda: synthetic_front(dense_model(), DENSE_PLANS, num_gpus=64)),
    ("dense-fp8-long", lambda: synthetic_front(dense_model(), DENSE_PLANS, num_gpus=128,
                                               training=TrainingSpec(seq_len=16384, global_batch_size=256,
                                                                     precision=Precision.FP8))),
    ("dense-mxfp8-params", lambda: synthetic_front(dense_model(), [p for p in DENSE_PLANS if p.zero >= 1],
                                                   num_gpus=64, training=TrainingSpec(
                                                       seq_len=8192, global_batch_size=512, precision=Precision.FP8,
                                                       fp8_recipe="mxfp8", fp8_param_gather=True))),
    ("moe-64", lambda: synthetic_front(moe_model(), MOE_PLANS, num_gpus=64)),
    ("moe-64-bf16-grads", lambda: synthetic_front(moe_model(), MOE_PLANS, num_gpus=64,
                                                  training=TrainingSpec(seq_len=4096, global_batch_size=512,
                                                                        grad_reduce_in_fp32=False))),
    ("moe-8", lambda: synthetic_front(moe_model(), [Plan(tp=1, ep=8, etp=1, mbs=1),
                                                   Plan(tp=2, pp=2, vpp=2, ep=2, etp=2, sp=True)], num_gpus=8)),
]


@pytest.mark.parametrize("name, make_front", FRONTS, ids=[name for name, _ in FRONTS])
def test_every_front_point_round_trips_through_megatron_flags(name, make_front):
    front = make_front()
    assert len(front) >= 2
    for estimate in front:
        run = parse_megatron_args(emit(estimate, "megatron"))
        assert run.plan == estimate.plan, (estimate.plan.short(), run.plan.short())
        assert run.num_gpus == estimate.cluster.num_gpus
        expected = {"seq_len": estimate.training.seq_len,
                    "global_batch_size": estimate.training.global_batch_size,
                    "precision": estimate.training.precision.value,
                    "cross_entropy": estimate.training.cross_entropy.value,   # the default fused, written
                    "pipeline_schedule": "1f1b",                               # upstream's only schedules
                    "grad_reduce_in_fp32": estimate.training.grad_reduce_in_fp32,
                    "fp8_param_gather": estimate.training.fp8_param_gather}     # --fp8-param-gather
        if estimate.training.precision is Precision.FP8:   # the recipe the casts were priced for
            expected["fp8_recipe"] = estimate.training.fp8_recipe.value
        if estimate.model.is_moe:     # the dispatcher the step time priced is written for every MoE model
            expected["moe_dispatcher"] = estimate.training.moe_dispatcher.value
            expected["expert_gemm"] = estimate.training.expert_gemm.value      # Megatron-Core's: cuBLAS per expert
        assert run.training == expected
        assert run.model_mismatches(estimate.model) == []
        assert run.notes == ()


def _plans() -> st.SearchStrategy[Plan]:
    """Plans of a 32-layer model: any tp/pp/vpp/cp/ep/etp/mbs/sp/recompute/zero mix with a whole layer split."""

    @st.composite
    def build(draw) -> Plan:
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        pp = draw(st.sampled_from([1, 2, 4]))
        uneven = pp > 1 and draw(st.booleans())
        first, last = (0, 0)
        if uneven:
            # 32 layers: the middle stages share what the first/last leave, evenly
            first, last = draw(st.sampled_from([(6, 6), (4, 0), (0, 4), (8, 8), (2, 2)] if pp == 4
                                               else [(14, 0), (0, 14), (12, 0)]))
        vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
        recompute = draw(st.sampled_from(list(Recompute)))
        recompute_layers = draw(st.integers(0, 4)) if recompute is Recompute.FULL else 0
        return Plan(tp=tp, pp=pp, vpp=vpp, cp=draw(st.sampled_from([1, 2])), ep=draw(st.sampled_from([1, 2, 4, 8])),
                    etp=draw(st.sampled_from([0, 1, tp])), mbs=draw(st.integers(1, 4)),
                    sp=tp > 1 and draw(st.booleans()), recompute=recompute, recompute_layers=recompute_layers,
                    zero=draw(st.integers(0, 3)), first_stage_layers=first, last_stage_layers=last)

    return build()


@given(plan=_plans(), fp8=st.booleans(), recipe=st.sampled_from(["delayed", "tensorwise", "blockwise"]))
def test_any_plan_round_trips_through_megatron_flags(plan, fp8, recipe):
    training = TrainingSpec(seq_len=8192, global_batch_size=1024, precision=Precision.FP8 if fp8 else Precision.BF16,
                            fp8_recipe=recipe)
    estimate = synthetic_estimate(moe_model(), cluster(256), training, plan)
    run = parse_megatron_args(emit(estimate, "megatron"))
    assert run.plan == plan
    assert run.training["precision"] == training.precision.value
    assert run.training.get("fp8_recipe") == (recipe if fp8 else None)


def test_the_emitted_command_names_each_knob_once():
    estimate = synthetic_front(dense_model(), DENSE_PLANS)[0]
    text = emit(estimate, "megatron")
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                 "--global-batch-size", "--seq-length", "--context-parallel-size", "--bf16"):
        assert text.count(flag + " ") + text.count(flag + "\n") == 1, flag
    # comments come before the command, so the backslash-continued command is not cut by a comment line
    command = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert text.endswith(command + "\n") and "torchrun " in command.splitlines()[0]
    assert "#" not in command


def test_overlap_switches_round_trip():
    """The overlaps the step time assumed are written and read back as the same training options."""
    import dataclasses

    from test_report_support import cluster, moe_model, synthetic_estimate

    from costmodels.plan import Plan
    from costmodels.specs import TrainingSpec
    training = TrainingSpec(seq_len=4096, global_batch_size=256, overlap_grad_reduce=True, overlap_param_gather=True,
                            tp_comm_overlap=True, moe_a2a_overlap=True)
    estimate = synthetic_estimate(moe_model(), cluster(64), training, Plan(tp=2, sp=True, ep=8, zero=1))
    run = parse_megatron_args(emit(estimate, "megatron"))
    assert run.training_spec(dataclasses.replace(training, overlap_grad_reduce=False, overlap_param_gather=False,
                                                 tp_comm_overlap=False, moe_a2a_overlap=False)) == training


@pytest.mark.parametrize("overlap", [True, False])
def test_p2p_overlap_round_trips_and_the_pre_2023_10_switch_is_read(overlap):
    import dataclasses

    training = TrainingSpec(seq_len=4096, global_batch_size=256, overlap_p2p_comm=overlap)
    estimate = synthetic_estimate(dense_model(), cluster(64), training, Plan(tp=2, pp=4, vpp=2, sp=True, zero=1))
    run = parse_megatron_args(emit(estimate, "megatron"))
    assert run.training_spec(dataclasses.replace(training, overlap_p2p_comm=True)) == training
    # Megatron-LM before 4eeff55d1f (2023-10-12): overlap off unless --overlap-p2p-communication
    old = parse_megatron_args("pretrain_gpt.py --pipeline-model-parallel-size 4 --num-layers 16 "
                              "--num-layers-per-virtual-pipeline-stage 2 --overlap-p2p-communication")
    assert old.training.get("overlap_p2p_comm") is True


def test_expert_capacity_round_trips_and_is_written_for_every_megatron_core_framework():
    """A capped estimate launches capped (--moe-expert-capacity-factor / moe_expert_capacity_factor), and the command
    reads back as the same cap; a dropless one writes none (Megatron-Core's default)."""
    import dataclasses

    training = TrainingSpec(seq_len=4096, global_batch_size=256, moe_capacity_factor=1.25)
    estimate = synthetic_estimate(moe_model(), cluster(64), training, Plan(tp=2, sp=True, ep=8, zero=1))
    text = emit(estimate, "megatron")
    assert "--moe-expert-capacity-factor 1.25" in text
    run = parse_megatron_args(text)
    assert run.training["moe_capacity_factor"] == 1.25 and "moe_imbalance_factor" not in run.training
    assert run.training_spec(dataclasses.replace(training, moe_capacity_factor=None)) == training
    for framework, key in (("nemo", "model.config.moe_expert_capacity_factor=1.25"),
                           ("bridge", "model.moe_expert_capacity_factor=1.25"),
                           ("verl", "override_transformer_config.moe_expert_capacity_factor=1.25")):
        assert key in emit(estimate, framework), framework
    dropless = synthetic_estimate(moe_model(), cluster(64), dataclasses.replace(training, moe_capacity_factor=None),
                                  Plan(tp=2, sp=True, ep=8, zero=1))
    assert all("capacity" not in emit(dropless, framework) for framework in ("megatron", "nemo", "bridge", "verl"))


@pytest.mark.parametrize("capacity", [1.25, None])
def test_frameworks_outside_megatron_core_say_how_they_route_against_the_priced_cap(capacity):
    """DeepSpeed's MoE layer caps at capacity_factor=1.0 and drops by default, and pads every expert to its capacity:
    its note names the cap the estimate priced (and the load it pads to), or drop_tokens=False for a dropless one;
    torchtitan has no expert capacity, which a capped estimate is told."""
    import dataclasses

    from autopar.export import launch_config

    training = TrainingSpec(seq_len=4096, global_batch_size=256, moe_capacity_factor=capacity)
    estimate = synthetic_estimate(moe_model(), cluster(64), training, Plan(tp=1, ep=8, etp=1, zero=2, mbs=1))
    deepspeed = " ".join(launch_config(estimate, "deepspeed").unexpressed)   # JSON has no comments: the notes
    assert ("capacity_factor=1.25" if capacity else "drop_tokens=False") in deepspeed
    # DeepSpeed pads every expert to its capacity: 1.25x the balanced load against the 1x priced
    assert ("DeepSpeed pads every expert to its capacity" in deepspeed) is (capacity is not None)
    padded = synthetic_estimate(moe_model(), cluster(64), dataclasses.replace(training, moe_imbalance_factor=1.25),
                                Plan(tp=1, ep=8, etp=1, zero=2, mbs=1))
    assert "DeepSpeed pads" not in " ".join(launch_config(padded, "deepspeed").unexpressed)
    torchtitan = emit(estimate, "torchtitan")
    assert ("moe_capacity_factor 1.25: torchtitan's MoE has no expert capacity" in torchtitan) is (capacity is not None)
