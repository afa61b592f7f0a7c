"""The model the Megatron-LM command builds: its router, rotary positions and query/key norms come from the model's
config (RouterSpec, RopeSpec, ModelSpec.qk_layernorm), not from Megatron-LM's defaults (softmax router, base 10000,
no scaling, no qk norm). tests/test_conformance_frameworks.py runs the real parser on them where it is installed."""

from __future__ import annotations

import pytest

import autopar
from autopar.export import launch_config
from costmodels.plan import Plan
from costmodels.specs import TrainingSpec


def megatron_text(model: str, num_gpus: int = 8, **plan) -> str:
    estimate = autopar.estimate(autopar.load_model(model), autopar.make_cluster(gpu="h100", num_gpus=num_gpus),
                                TrainingSpec(seq_len=4096, global_batch_size=512), Plan(**plan))
    return launch_config(estimate, "megatron").text


@pytest.mark.parametrize("model, plan, present, absent", [
    ("llama-3.1-8b", dict(tp=2), ["--rotary-base 500000", "--use-rope-scaling", "--rope-scaling-factor 8"],
     ["--qk-layernorm", "--moe-router"]),
    ("qwen3-8b", dict(tp=2), ["--rotary-base 1000000", "--qk-layernorm"], ["--use-rope-scaling"]),
    ("nemotron-4-15b", dict(tp=8), ["--rotary-base 10000", "--rotary-percent 0.5"], ["--qk-layernorm"]),
    ("llama-4-scout-17b-16e", dict(tp=4, sp=True, ep=16, etp=1, zero=1),
     ["--moe-router-topk 1", "--moe-router-score-function sigmoid", "--moe-apply-probs-on-input"],
     ["--moe-router-pre-softmax"]),
    ("qwen2-57b-a14b", dict(tp=2, sp=True, ep=4, etp=1), ["--moe-router-pre-softmax"],
     ["--moe-router-score-function"]),
    ("qwen3-30b-a3b", dict(tp=2, sp=True, ep=8, etp=1), ["--qk-layernorm"],
     ["--moe-router-pre-softmax", "--moe-router-score-function"]),
    ("deepseek-v2-lite", dict(ep=8), ["--moe-router-pre-softmax", "--qk-layernorm"],
     ["--moe-router-enable-expert-bias"]),
])
def test_megatron_command_builds_the_models_router_and_positions(model, plan, present, absent):
    text = megatron_text(model, num_gpus=64, **plan)
    flags = {line.strip().rstrip(" \\") for line in text.splitlines()}
    for flag in present:
        assert flag in flags, (model, flag)
    for prefix in absent:
        assert not any(line.startswith(prefix) for line in flags), (model, prefix)


def test_deepseek_v3_routes_by_sigmoid_with_bias_groups_and_scaling():
    text = megatron_text("deepseek-v3", num_gpus=256, pp=8, ep=32, first_stage_layers=5, last_stage_layers=8)
    for flag in ("--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--moe-router-num-groups 8", "--moe-router-group-topk 4", "--moe-router-topk-scaling-factor 2.5",
                 "--qk-layernorm"):
        assert flag in text
    assert "rope scaling yarn (factor 40" in text        # not a Megatron-LM GPT flag: said, not dropped


def test_a_scaling_megatron_cannot_write_is_a_note():
    text = megatron_text("gpt-oss-20b", tp=1, ep=8)
    assert "# note: rope scaling yarn (factor 32, trained at 4096 tokens)" in text
    assert "--rotary-base 150000" in text and "--use-rope-scaling" not in text
