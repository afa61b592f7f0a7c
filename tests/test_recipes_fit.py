"""Issue 43: the frameworks' own recipes read through autopar's readers (autopar.bridge_config for Megatron-Bridge
ConfigContainers), and the memory terms their layouts exposed (costmodels.memory.in_flight_microbatches with the
embedding/loss layer slots and the micro-batch group; TrainingSpec.optimizer_state_bytes), each with hand-derived
arithmetic.

tests/data/bridge_*.yaml are Megatron-Bridge 0.6.2's own ConfigContainers of two performance recipes
(perf_recipes/llama/h100/llama31.py llama31_405b_pretrain_1024gpu_h100_fp8cs_config and
perf_recipes/deepseek/h100/deepseek_v3.py deepseek_v3_pretrain_1024gpu_h100_bf16_config), written by
`ConfigContainer.to_yaml` (benchmarks/bridge_recipes.py builds them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autopar
from autopar.bridge_config import bridge_model_spec, read_bridge_config
from autopar.megatron_args import optimizer_state_bytes, parse_megatron_args
from autopar.models import preset_for_hub_id
from costmodels import memory
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays, RecomputeModule
from costmodels.specs import TrainingSpec

DATA = Path(__file__).parent / "data"
LLAMA = DATA / "bridge_llama31_405b_pretrain_1024gpu_h100_fp8cs.yaml"
DSV3 = DATA / "bridge_deepseek_v3_pretrain_1024gpu_h100_bf16.yaml"


def test_the_reader_takes_a_real_bridge_recipe():
    run = read_bridge_config(LLAMA)
    # cfg.model: TP=8 PP=8 CP=2 VPP=8 SP; the 405B base recipe counts the embedding and the loss as layers:
    # (126 + 2) / 8 = 16 slots a rank, so the first and last ranks hold 15 decoder layers
    assert run.plan == Plan(tp=8, pp=8, vpp=8, cp=2, mbs=1, sp=True, zero=1, first_stage_layers=15,
                            last_stage_layers=15)
    # _perf_precision("fp8_cs"): tensorwise with fp8 parameters; _benchmark_common: bf16 gradients; the TP
    # userbuffers config and CommOverlapConfig's defaults for an interleaved pipeline under the distributed optimizer
    assert run.training == {**run.training, "precision": "fp8", "fp8_recipe": "tensorwise", "fp8_param_gather": True,
                            "seq_len": 8192, "global_batch_size": 1536, "grad_reduce_in_fp32": False,
                            "tp_comm_overlap": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
                            "overlap_p2p_comm": True, "cross_entropy": "fused"}
    assert "optimizer_state_bytes" not in run.training           # fp32 states: not the precision-aware optimizer
    assert run.hf_model_id == "meta-llama/Meta-Llama-3.1-405B"
    assert preset_for_hub_id(run.hf_model_id) == "llama-3.1-405b"    # the Hub's renamed repository
    assert any(switch.startswith("env_vars.PYTORCH_CUDA_ALLOC_CONF") for switch in run.not_priced)
    model = bridge_model_spec(run, autopar.load_model("llama-3.1-405b"))
    assert model.num_layers == 126 and model.vocab_size == 128256
    result = autopar.estimate(model, autopar.make_cluster(gpu="h100", num_gpus=1024),
                              run.training_spec(TrainingSpec()), run.plan)
    assert result.peak_memory_bytes < 80 * 2**30          # it ran on 80 GB H100s


def test_the_reader_takes_deepseek_v3s_own_layout_and_precision_aware_optimizer():
    run = read_bridge_config(DSV3)
    assert run.plan.layout == (1,) + (2,) * 30 + (0,) and run.plan.pp == 8 and run.plan.vpp == 4
    assert RecomputeModule.names(run.plan.recompute_modules) == ["mlp", "mla_up_proj"]
    # use_precision_aware_optimizer, bf16 moments, fp32 masters kept as the 16 remainder bits of the bf16 weights
    assert run.training["optimizer_state_bytes"] == (2, 2, 2)
    assert run.training["moe_dispatcher"] == "deepep"
    model = bridge_model_spec(run, autopar.load_model("deepseek-v3"))
    assert model.mla is not None and model.num_mtp_layers == 1
    result = autopar.estimate(model, autopar.make_cluster(gpu="h100", num_gpus=1024),
                              run.training_spec(TrainingSpec()), run.plan)
    assert "layers" not in result.violations


def test_a_preset_name_for_mixed_precision_and_bad_configs():
    base = {"model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "num_layers": 32,
                      "sequence_parallel": True}, "train": {"micro_batch_size": 1, "global_batch_size": 64}}
    run = read_bridge_config({**base, "mixed_precision": "bf16_with_fp8_current_scaling_mixed"})
    assert run.training["precision"] == "fp8" and run.training["fp8_recipe"] == "tensorwise"
    with pytest.raises(InputError, match="mixed_precision 'fp4_mixed'"):
        read_bridge_config({**base, "mixed_precision": "fp4_mixed"})
    with pytest.raises(InputError, match="no `model:` section"):
        read_bridge_config("train: {micro_batch_size: 1}")
    with pytest.raises(InputError, match="below pp=4"):
        read_bridge_config({"model": {**base["model"], "pipeline_model_parallel_size": 4,
                                      "virtual_pipeline_model_parallel_size": 2,
                                      "microbatch_group_size_per_vp_stage": 2}, "train": base["train"]})


def test_precision_aware_optimizer_state_bytes():
    # fp32 masters beside bf16 weights: the remainder bits, 2 bytes (TE FusedAdam store_param_remainders)
    assert optimizer_state_bytes("fp32", "bf16", "bf16", False, None) == (2, 2, 2)
    assert optimizer_state_bytes("fp32", "fp32", "fp32", False, None, store_param_remainders=False) == (4, 4, 4)
    # fp8 weights of a recipe other than delayed: Megatron-Core keeps fp32 masters (no remainders)
    assert optimizer_state_bytes("fp32", "bf16", "fp8", True, "tensorwise") == (4, 2, 1)
    assert optimizer_state_bytes("fp32", "bf16", "bf16", True, "delayed") == (2, 2, 2)
    run = parse_megatron_args("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --bf16 "
                              "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64")
    assert run.training["optimizer_state_bytes"] == (2, 2, 2)
    # memory: a 1B-parameter stage, zero 1 over dp 8: 12/8 bytes a parameter in fp32, 6/8 with (2, 2, 2)
    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=8)
    plan = PlanArrays.from_plans([Plan(zero=1)])
    fp32 = memory.memory_terms_bytes(model, cluster, TrainingSpec(), plan, 0)["optimizer_states"][0]
    low = memory.memory_terms_bytes(model, cluster, TrainingSpec(optimizer_state_bytes=(2, 2, 2)), plan,
                                    0)["optimizer_states"][0]
    assert low == pytest.approx(fp32 * 6 / 12)
    with pytest.raises(InputError, match="optimizer_state_bytes"):
        TrainingSpec(optimizer_state_bytes=(4, 4, 3))


def test_in_flight_with_the_embedding_and_loss_slots_and_micro_batch_groups():
    """Llama-3.1-405B on pp 16, vpp 8 with the embedding and loss slots (126 + 2 = 128 = 16 · 8 slots: ranks 0 and 15
    hold 7 decoder layers, one per chunk but the slot's, which holds none). Megatron-Core's warm-up, g = pp = 16:
    rank 0: W = 2·15 + 7·16 = 142, N = 143 entries: chunk 0 of micro-batches 0-15, chunks 1-7 of 0-15 (128 entries),
    then chunk 0 of 16-30 (15): chunk 0 (no layer) 31 entries, chunks 1-7 16 each: 7·16 = 112 layer-micro-batches,
    112 / 7 = 16 whole-rank micro-batches (the equal-chunk formula: 143 / 8 = 17.875).
    rank 15: W = 0 + 112, N = 113: chunks 0-6 16 each, chunk 7 (the loss, no layer) 1: 7·16 = 112 at the first
    steady step (equal chunks: 113 / 8 = 14.125); the steady state then swaps loss-chunk entries for each other
    until the forward of micro-batch 16's chunk 0 (a layer) comes before the backward of micro-batch 0's chunk 6
    takes one: the peak is 113 -> 113 / 7 (the schedule walked, interleaved_held_layers). rank 1 (8 layers, no
    slot): N = 2·14 + 112 + 1 = 141 -> 141 / 8. With g = 32: rank 1 W = 28 + 7·32 = 252, N = 253 -> 253 / 8."""
    model = autopar.load_model("llama-3.1-405b")
    plan = Plan(tp=4, pp=16, vpp=8, sp=True, zero=1, first_stage_layers=7, last_stage_layers=7)
    plans = PlanArrays.from_plans([plan] * 3)
    stage = np.array([0, 15, 1])
    layers = np.array([7.0, 7.0, 8.0])
    held = memory.in_flight_microbatches(plans, stage, np.full(3, 384.0), layers=layers,
                                         embedding_slot=np.ones(3, bool), loss_slot=np.ones(3, bool))
    assert held.tolist() == pytest.approx([16.0, 113 / 7, 141 / 8])
    grouped = memory.in_flight_microbatches(plans, stage, np.full(3, 384.0), group=32, layers=layers)
    assert grouped[2] == pytest.approx(253 / 8)
    # through the cost model: rank 0's layer activations are 112 layer-micro-batches of one layer's
    cluster = autopar.make_cluster(gpu="b200", num_gpus=128)
    training = TrainingSpec(seq_len=8192, global_batch_size=768)
    one = PlanArrays.from_plans([plan])
    first = memory.memory_terms_bytes(model, cluster, training, one, 0)["layer_activations"][0]
    middle = memory.memory_terms_bytes(model, cluster, training, one, 1)["layer_activations"][0]
    assert first / 112 == pytest.approx(middle / 141, rel=1e-9)


def test_estimate_reads_a_bridge_config_from_the_cli():
    done = subprocess.run([sys.executable, "-m", "autopar", "estimate", "llama-3.1-405b", "--gpus", "1024",
                           "--from-bridge-config", str(LLAMA), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert "not priced: env_vars.PYTORCH_CUDA_ALLOC_CONF" in done.stderr
    clash = subprocess.run([sys.executable, "-m", "autopar", "estimate", "llama-3.1-405b", "--gpus", "1024",
                            "--from-bridge-config", str(LLAMA), "--tp", "4"], capture_output=True, text=True,
                           timeout=300)
    assert clash.returncode == 2 and "the plan comes from the Megatron-Bridge config" in clash.stderr


def test_a_recipe_whose_docstring_states_another_layout_is_named():
    """Bridge 0.6.2's 128-GPU Llama 3.1 405B B200 recipes say 'TP=4 PP=8 CP=2' and set pp 16, cp 1: recipes_fit
    names the disagreement (the code is what is priced); a docstring that agrees, or states none, says nothing."""
    from benchmarks.recipes_fit import docstring_disagreement
    from costmodels.plan import Plan

    code = Plan(tp=4, pp=16, vpp=8, cp=1, mbs=1, sp=True, zero=1)
    doc = "Llama3.1 405B pretrain: 128× B200, BF16, TP=4 PP=8 CP=2."
    assert docstring_disagreement(doc, code) == "docstring TP=4 PP=8 CP=2, code tp4 pp16 cp1"
    assert docstring_disagreement("Llama3.1 405B pretrain: 256× GB200, BF16, TP=4 PP=16.", code) == ""
    assert docstring_disagreement("Qwen3 30B-A3B pretrain on 8 GPUs.", code) == ""
    assert docstring_disagreement("TP=4 PP=16 VP=4", code) == "docstring TP=4 PP=16 VP=4, code tp4 pp16 vpp8"
