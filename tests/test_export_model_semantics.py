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
                 "--qk-layernorm", "--position-embedding-type rope",
                 # MLATransformerConfig's yarn (its rope_type by default) at the model's factor and attention scales
                 "--rotary-scaling-factor 40", "--mscale 1", "--mscale-all-dim 1"):
        assert flag in text
    assert "--position-embedding-type yarn" not in text and "# note: rope" not in text


def test_yarn_outside_mla_is_megatrons_yarn_position_type():
    text = megatron_text("gpt-oss-20b", tp=1, ep=8)
    for flag in ("--position-embedding-type yarn", "--rotary-base 150000", "--rotary-scaling-factor 32",
                 "--yarn-original-max-position-embeddings 4096", "--yarn-beta-fast 32", "--yarn-beta-slow 1",
                 "--no-yarn-correction-range-round-to-int", "--window-size '(127,0)'"):
        assert flag in text, flag


def test_llama4_nope_layers_qk_l2_norm_and_the_scaling_megatron_fixes():
    text = megatron_text("llama-4-scout-17b-16e", num_gpus=64, tp=4, sp=True, ep=16, etp=1, zero=1)
    for flag in ("--qk-l2-norm", "--no-rope-freq 4", "--use-rope-scaling", "--rope-scaling-factor 16"):
        assert flag in text, flag
    # Scout's llama3 scaling has high_freq_factor 1; Megatron's --use-rope-scaling fixes 4: said, not hidden
    assert "high_freq_factor 1 (Megatron 4)" in text
