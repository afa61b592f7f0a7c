"""What the exports write for each framework's launch path (issue 44), checked without the frameworks installed
(tests/test_conformance_frameworks.py runs the frameworks' own code on the same texts where they are)."""

from __future__ import annotations

import pytest

from autopar.export import launch_config
from autopar.export.capabilities import Unsupported
from autopar.export.conformance import header_value
from autopar.export.fronts import CONFIG_MODELS
from autopar.export.verl import sequence_lengths
from costmodels.errors import InputError
from costmodels.plan import Plan


def _estimate(model_name: str, num_gpus: int, plan: Plan, **training):
    import autopar

    return autopar.estimate(autopar.load_model(model_name), autopar.make_cluster(gpu="h100", num_gpus=num_gpus),
                            autopar.Training(seq_len=4096, global_batch_size=512, **training), plan)


def test_nemo_names_every_precision_preset_by_its_dotted_path():
    text = launch_config(_estimate("llama-3.1-8b", 32, Plan(tp=2, sp=True, zero=1)), "nemo").text
    assert "trainer.plugins=nemo.collections.llm.recipes.precision.mixed_precision.bf16_mixed" in text
    assert "trainer.plugins=bf16_mixed" not in text


@pytest.mark.parametrize("zero, policy", [(0, "never"), (2, "never"), (3, "always")])
def test_torchtitan_writes_the_reshard_policy_for_every_zero_stage(zero, policy):
    plan = Plan(tp=2, pp=2, sp=True, zero=zero)
    text = launch_config(_estimate("llama-3.1-8b", 32, plan), "torchtitan").text
    assert f"fsdp_reshard_after_forward={policy!r}" in text


def test_verl_writes_the_algorithm_its_critic_and_the_priced_sequence():
    estimate = _estimate("llama-3.1-8b", 32, Plan(tp=2, sp=True, zero=1))
    prompt, response = sequence_lengths(estimate.training.seq_len)
    assert prompt + response == estimate.training.seq_len
    gae = launch_config(estimate, "verl").text
    assert "algorithm.adv_estimator=gae" in gae            # verl's default and its quickstart's PPO
    assert f"data.max_prompt_length={prompt}" in gae and f"data.max_response_length={response}" in gae
    assert "critic.ppo_micro_batch_size_per_gpu=" in gae and "critic.megatron.tensor_model_parallel_size=2" in gae
    grpo = launch_config(estimate, "verl", verl_algorithm="GRPO").text
    assert "algorithm.adv_estimator=grpo" in grpo and "critic." not in grpo and "use_kl_loss=True" in grpo
    with pytest.raises(InputError, match="unknown verl algorithm 'ppo2'"):
        launch_config(estimate, "verl", verl_algorithm="ppo2")


def test_bridge_writes_every_overlap_in_a_comm_overlap_node_as_priced():
    """CommOverlapConfig.setup runs after the overrides and sets overlaps wherever its own field is unset: the node
    sets each one the step time priced (off here: the user asked for none)."""
    estimate = _estimate("llama-3.1-8b", 32, Plan(tp=4, pp=2, vpp=2, sp=True, zero=1))
    line = next(line for line in launch_config(estimate, "bridge").text.splitlines()
                if line.startswith("++comm_overlap="))
    for field in ("tp_comm_overlap:false", "overlap_grad_reduce:false", "overlap_param_gather:false",
                  "overlap_p2p_comm:true", "batch_p2p_comm:false"):
        assert field in line


def test_models_without_a_recipe_are_built_from_the_frameworks_model_classes():
    """Mixtral-8x22B has no Megatron-Bridge 0.6.2 recipe (and no AutoBridge converter): a GPTModelProvider node with
    its shape; GPT-OSS-120B has a NeMo 2.7.3 model factory but no pretraining recipe; a config.json model is
    converted by AutoBridge from its folder and, in NeMo, written over a family recipe's config class."""
    mixtral = _estimate("mixtral-8x22b", 64, Plan(tp=2, sp=True, ep=8, etp=1, pp=4, zero=1))
    bridge = launch_config(mixtral, "bridge").text
    assert header_value(bridge, "provider") == "GPTModelProvider" and header_value(bridge, "recipe") is None
    node = next(line for line in bridge.splitlines() if line.startswith("++model="))
    for field in ("_target_:megatron.bridge.models.gpt_provider.GPTModelProvider", "num_layers:56",
                  "num_moe_experts:8", "moe_router_topk:2", "gated_linear_unit:true",
                  "activation_func:{_target_:torch.nn.functional.silu,_call_:false}", "tensor_model_parallel_size:2"):
        assert field in node
    assert header_value(launch_config(mixtral, "nemo").text, "recipe") == "mixtral_8x22b"
    gpt_oss = _estimate("gpt-oss-120b", 64, Plan(tp=1, pp=4, ep=8, etp=1, zero=1))
    with pytest.raises(Unsupported, match="quick_gelu"):   # NeMo 2.7.3's GPT-OSS config needs a newer Megatron-Core
        launch_config(gpt_oss, "nemo")
    assert header_value(launch_config(gpt_oss, "bridge").text, "recipe") == "gpt_oss_120b_pretrain_config"
    small = _estimate(str(CONFIG_MODELS / "llama-3.2-1b" / "config.json"), 8, Plan(zero=1))
    assert header_value(launch_config(small, "bridge").text, "autobridge") == str(CONFIG_MODELS / "llama-3.2-1b")
    nemo = launch_config(small, "nemo").text
    assert header_value(nemo, "recipe") == "llama3_8b"
    for field in ("num_layers=16", "hidden_size=2048", "num_query_groups=8", "rotary_base=500000",
                  "share_embeddings_and_output_weights=true"):
        assert f"model.config.{field} \\" in nemo


def test_recipes_optimizer_and_shared_expert_overlap_are_cleared():
    """DeepSeek-V3's NeMo and Bridge recipes run the precision-aware optimizer (bf16 moments) and overlap the shared
    experts, neither of which the estimate prices: both exports write them off."""
    estimate = _estimate("deepseek-v2-lite", 16, Plan(tp=2, sp=True, ep=8, etp=1, zero=1))
    nemo, bridge = launch_config(estimate, "nemo").text, launch_config(estimate, "bridge").text
    assert "optim.config.use_precision_aware_optimizer=false" in nemo
    assert "optim.config.exp_avg_dtype=torch.float32" in nemo
    assert "optimizer.use_precision_aware_optimizer=false" in bridge
    assert estimate.model.moe.num_shared_experts
    assert "model.config.moe_shared_expert_overlap=false" in nemo and "moe_shared_expert_overlap=false" in bridge
