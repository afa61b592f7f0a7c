"""Megatron-LM's cross-flag asserts, encoded, checked on every emitted launch line (no framework installed).

Megatron-LM's `validate_args` (megatron/training/arguments.py; the copy shipped in megatron-core 0.19.2 is the one of
Megatron-LM's core_v0.19.0 tag, line numbers below) refuses a command line at start-up when flags disagree. The asserts
that involve the flags and environment autopar writes are encoded here as predicates, each with the line it comes
from and Megatron's own message; every emitted command for many plans must pass all of them, and each predicate is
shown to fire on a command that breaks it (so none can pass vacuously). With the `conformance` extra installed,
tests/test_conformance_frameworks.py runs Megatron-LM's real parser and validate_args on the same commands, and
`test_the_flag_names_are_megatron_lms` below checks the encoded flag list against the real parser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.export import emit
from autopar.export.conformance import megatron_command
from costmodels.plan import Plan, Recompute
from costmodels.specs import TrainingSpec
from test_report_support import DENSE_PLANS, MOE_PLANS, cluster, dense_model, moe_model, synthetic_estimate

Args = dict[str, object]
Env = dict[str, "str | None"]


def parse_flags(flags: list[str]) -> Args:
    """--flag value / --flag (store_true) into {dest: value}, as argparse names them."""
    args: Args = {}
    i = 0
    while i < len(flags):
        name = flags[i][2:].replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value: object = flags[i + 1]
            args[name] = int(value) if str(value).lstrip("-").isdigit() else value
            i += 2
        else:
            args[name] = True
            i += 1
    return args


def _slots(a: Args) -> int:
    return int(bool(a.get("account_for_embedding_in_pipeline_split"))) + int(
        bool(a.get("account_for_loss_in_pipeline_split")))


def _fsdp(a: Args) -> bool:
    return bool(a.get("use_megatron_fsdp"))


MEGATRON_ASSERTS: tuple[tuple[int, str, Callable[[Args, Env], bool]], ...] = (
    (899, "No more than one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
          "--pipeline-model-parallel-layout",
     lambda a, e: sum(k in a for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                                       "pipeline_model_parallel_layout")) <= 1),
    (922, "please use --num-virtual-stages-per-pipeline-rank ... when enable uneven pipeline parallelism",
     lambda a, e: "num_layers_per_virtual_pipeline_stage" not in a
     or ("decoder_first_pipeline_num_layers" not in a and "decoder_last_pipeline_num_layers" not in a)),
    (935, "number of layers of the model must be divisible pipeline model parallel size",
     lambda a, e: "num_layers_per_virtual_pipeline_stage" not in a
     or (a["num_layers"] + _slots(a)) % a["pipeline_model_parallel_size"] == 0),
    (939, "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage",
     lambda a, e: "num_layers_per_virtual_pipeline_stage" not in a
     or ((a["num_layers"] + _slots(a)) // a["pipeline_model_parallel_size"])
     % a["num_layers_per_virtual_pipeline_stage"] == 0),
    (964, "Number of layers should be divisible by the pipeline-model-parallel size",
     lambda a, e: any(k in a for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                                       "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"))
     or (a["num_layers"] + _slots(a)) % a["pipeline_model_parallel_size"] == 0),
    (993, "--overlap-param-gather only supported with distributed optimizer, megatron fsdp, or dist_muon",
     lambda a, e: not a.get("overlap_param_gather") or bool(a.get("use_distributed_optimizer")) or _fsdp(a)),
    (995, "Must use --overlap-param-gather with --overlap-grad-reduce",
     lambda a, e: not a.get("overlap_param_gather") or bool(a.get("overlap_grad_reduce"))),
    (1144, "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.",
     lambda a, e: not _fsdp(a) or e.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"),
    (1147, "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.",
     lambda a, e: not _fsdp(a) or a.get("ckpt_format") == "fsdp_dtensor"),
    (1439, "Using tensor model parallelism or context parallelism require setting the environment variable "
           "CUDA_DEVICE_MAX_CONNECTIONS to 1 (devices before Blackwell; Megatron-FSDP only warns)",
     lambda a, e: _fsdp(a) or bool(a.get("overlap_moe_expert_parallel_comm"))   # (1426: only a warning then)
     or (a.get("tensor_model_parallel_size", 1) == 1 and a.get("context_parallel_size", 1) == 1)
     or e.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"),
    (1621, "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.",
     lambda a, e: a.get("ckpt_format") != "fsdp_dtensor" or _fsdp(a)),
)
"""(line in megatron/training/arguments.py, Megatron's message, predicate over (flags, launch environment))."""

MEGATRON_FLAGS = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank", "--sequence-parallel",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size",
    "--global-batch-size", "--seq-length", "--max-position-embeddings", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--megatron-fsdp-main-grads-dtype", "--grad-reduce-in-bf16",
    "--no-gradient-accumulation-fusion", "--ckpt-format", "--bf16",
    "--fp8-format", "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm", "--no-overlap-p2p-communication", "--cross-entropy-loss-fusion",
    "--recompute-modules", "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention", "--num-query-groups", "--kv-channels",
    "--swiglu", "--normalization", "--attention-dropout", "--hidden-dropout", "--position-embedding-type",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-grouped-gemm", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--multi-latent-attention", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--mtp-num-layers",
})
"""Every flag the Megatron-LM exporter may write (checked against Megatron-LM's parser when it is installed)."""


def broken(text: str) -> list[str]:
    env, flags = megatron_command(text)
    for name in flags:
        if name.startswith("--"):
            assert name in MEGATRON_FLAGS, f"unknown Megatron-LM flag {name}"
    args = parse_flags(flags)
    return [f"arguments.py:{line}: {message}" for line, message, holds in MEGATRON_ASSERTS if not holds(args, env)]


PLANS = DENSE_PLANS + MOE_PLANS


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.short())
def test_emitted_commands_pass_megatron_lms_asserts(plan):
    model = moe_model() if plan in MOE_PLANS else dense_model()
    estimate = synthetic_estimate(model, cluster(64), TrainingSpec(seq_len=4096, global_batch_size=512), plan)
    assert broken(emit(estimate, "megatron")) == []


@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]), zero=st.integers(0, 3),
       pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]), recompute=st.sampled_from(list(Recompute)))
def test_any_plan_passes_megatron_lms_asserts(tp, cp, zero, pp, vpp, recompute):
    plan = Plan(tp=tp, cp=cp, pp=pp, vpp=vpp if pp > 1 else 1, sp=tp > 1, zero=zero, recompute=recompute,
                ep=4, etp=1)
    estimate = synthetic_estimate(moe_model(), cluster(64), TrainingSpec(seq_len=8192, global_batch_size=512), plan)
    assert broken(emit(estimate, "megatron")) == []


def test_each_encoded_assert_fires_on_a_command_that_breaks_it():
    fsdp = synthetic_estimate(dense_model(), cluster(64), TrainingSpec(seq_len=4096, global_batch_size=512),
                              Plan(tp=2, sp=True, zero=3))
    text = emit(fsdp, "megatron")
    assert broken(text.replace("env -u CUDA_DEVICE_MAX_CONNECTIONS ", "CUDA_DEVICE_MAX_CONNECTIONS=1 ")) == [
        "arguments.py:1144: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."]
    assert any(":1147:" in b for b in broken(text.replace("--ckpt-format fsdp_dtensor", "--ckpt-format torch_dist")))
    overlapped = TrainingSpec(seq_len=4096, global_batch_size=512, overlap_grad_reduce=True, overlap_param_gather=True)
    tp = synthetic_estimate(dense_model(), cluster(64), overlapped, Plan(tp=2, sp=True, zero=1))
    text = emit(tp, "megatron")
    assert "--overlap-grad-reduce" in text and "--overlap-param-gather" in text
    assert any(":1439:" in b for b in broken(text.replace("CUDA_DEVICE_MAX_CONNECTIONS=1 ", "")))
    assert any(":995:" in b for b in broken(text.replace("--overlap-grad-reduce", "")))
    assert any(":993:" in b for b in broken(text.replace("--use-distributed-optimizer", "")))
    assert any(":1621:" in b for b in broken(text.replace("--bf16", "--bf16 --ckpt-format fsdp_dtensor")))
    vpp = synthetic_estimate(dense_model(), cluster(64), TrainingSpec(seq_len=4096, global_batch_size=512),
                             Plan(tp=2, pp=4, vpp=2, sp=True, zero=1))
    text = emit(vpp, "megatron")
    assert "--num-layers-per-virtual-pipeline-stage 4" in text
    assert any(":899:" in b for b in broken(text + " --num-virtual-stages-per-pipeline-rank 2"))
    assert any(":922:" in b for b in broken(text.replace("--bf16", "--bf16 --decoder-first-pipeline-num-layers 2")))
    assert any(":939:" in b for b in broken(text.replace("--num-layers-per-virtual-pipeline-stage 4",
                                                         "--num-layers-per-virtual-pipeline-stage 3")))
    assert any(":935:" in b for b in broken(text.replace("--num-layers 32", "--num-layers 30")))
    plain = emit(dataclasses.replace(vpp, plan=Plan(tp=2, pp=4, sp=True, zero=1)), "megatron")
    assert any(":964:" in b for b in broken(plain.replace("--num-layers 32", "--num-layers 30")))


def test_the_flag_names_are_megatron_lms():
    """With the conformance extra: every encoded flag is one of Megatron-LM's own parser's options."""
    import argparse

    from autopar.export.conformance import NotInstalled, _require

    try:
        arguments = _require("megatron.training.arguments", "megatron-core (Megatron-LM's megatron/training)")
    except NotInstalled as missing:
        pytest.skip(str(missing))
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    options = {option for action in parser._actions for option in action.option_strings}
    assert MEGATRON_FLAGS <= options, sorted(MEGATRON_FLAGS - options)


def test_the_launch_line_is_read_as_megatron_would_see_it():
    env, flags = megatron_command("# comment\nCUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc-per-node 8 pretrain_gpt.py "
                                  "\\\n    --tensor-model-parallel-size 2 \\\n    --moe-layer-freq '([0]*3+[1]*58)'\n")
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert flags == ["--tensor-model-parallel-size", "2", "--moe-layer-freq", "([0]*3+[1]*58)"]
    env, _ = megatron_command("env -u CUDA_DEVICE_MAX_CONNECTIONS torchrun pretrain_gpt.py --bf16")
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
