"""benchmarks/fidelity_runs.py: every published row is either compared or listed with a reason, metrics are
converted with each source's convention, and the ranking statistics are right on hand-made data."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import fidelity_runs
from costmodels.params import total_params


@pytest.fixture(scope="module")
def rows():
    try:
        fidelity_runs.reference_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference is not next to this checkout")
    if not (fidelity_runs.reference_dir() / "runs").is_dir():
        pytest.skip("shared/reference/runs not present")
    return fidelity_runs.all_rows()


def test_every_row_is_compared_or_listed(rows):
    # the README's count: 600 rows over 22 files (the last six the small-kernel regime's); none silently dropped
    assert len(rows) == 600
    refused = [r for r in rows if isinstance(r, fidelity_runs.Unexpressed)]
    assert all(r.reason for r in refused)
    assert len(rows) - len(refused) >= 300


def test_tokens_per_second_becomes_step_time(rows):
    # llm-foundry row 1: MPT-70b on 512 H100, 4096 x 2048 tokens per step at 1007 tokens/s/GPU
    case = next(r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "llm-foundry"
                and r.row_id == "1")
    assert case.measured_step_s == pytest.approx(4096 * 2048 / (1007 * 512))
    assert case.fixed["zero"] == 3 and case.category == "dense H100/H200"


def test_megatron_flop_convention_counts_the_full_matrix_before_2025(rows):
    case = next(r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "megatron-lm-readme")
    causal = fidelity_runs.megatron_flops_per_step(case.model, case.training, causal=True)
    full = fidelity_runs.megatron_flops_per_step(case.model, case.training, causal=False)
    core = fidelity_runs.compute_model.attention_core_flops_per_sequence(case.model, case.training)
    assert full - causal == pytest.approx(3 * core * case.training.global_batch_size)


def test_folding_rows_are_read_causally_and_keep_the_full_matrix_reading(rows):
    """MoE Parallel Folding names no FLOP formula (FOLDING_FLOP_READING): its MFU becomes a step with the causal
    formula, and the full-matrix step rides along for convention_table; the longer the sequence, the further apart
    (Table 5: 16K -> 128K at constant tokens per step)."""
    cases = [r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "moe-parallel-folding"]
    assert cases and all(r.full_matrix_step_s > r.measured_step_s for r in cases)
    row85 = next(r for r in cases if r.row_id == "85")                  # Mixtral-8x22B, 1024 H100, seq 128K, 38.2%
    causal = fidelity_runs.megatron_flops_per_step(row85.model, row85.training, causal=True)
    assert row85.measured_step_s == pytest.approx(causal / (0.382 * 989.5e12 * 1024))
    ratio = {r.training.seq_len: r.full_matrix_step_s / r.measured_step_s for r in cases}
    assert ratio[4096] < ratio[16384] < ratio[32768] < ratio[65536] < ratio[131072]
    assert all(r.full_matrix_step_s == 0.0 for r in rows
               if isinstance(r, fidelity_runs.Case) and r.source != "moe-parallel-folding")


def test_unexpressible_reasons_name_the_gap(rows):
    reasons = {r.source: r.reason for r in rows if isinstance(r, fidelity_runs.Unexpressed)}
    assert "DualPipe" in reasons["deepseek-v3"]


def test_zero_bubble_rows_are_priced_with_their_schedule(rows):
    cases = [r for r in rows if r.source == "zero-bubble-pp"]
    assert all(isinstance(r, fidelity_runs.Case) for r in cases) and len(cases) == 48
    schedules = [r.training.pipeline_schedule.value for r in cases]
    assert schedules.count("zb-1p") == schedules.count("zb-2p") == 12 and schedules.count("1f1b") == 24
    assert all(r.fixed["vpp"] == 1 for r in cases if r.training.pipeline_schedule.value != "1f1b")


def test_zero_bubble_memory_is_compared_with_unfused_attention(rows):
    """Table 4's peak memory (GB) rides on every Zero Bubble row; the rows are priced with unfused attention, whose
    a·s² activations the paper's figures carry, and the memory table compares them (and the FlashAttention
    alternative) in the source's unit."""
    cases = [r for r in rows if r.source == "zero-bubble-pp"]
    assert all(not r.training.flash_attention for r in cases)
    first = next(r for r in cases if r.row_id == "1")                    # 1.5B pp8 m24 1F1B: 30 GB
    assert first.measured_peak_memory_bytes == pytest.approx(30e9)
    assert all(r.measured_peak_memory_bytes == 0.0 for r in rows
               if isinstance(r, fidelity_runs.Case) and r.source != "zero-bubble-pp")
    result = fidelity_runs.predict(first)
    assert result.predicted_peak_memory_bytes > 0
    assert result.memory_error_pct == pytest.approx(100 * (result.predicted_peak_memory_bytes / 30e9 - 1))
    assert fidelity_runs._flash_attention_memory_error_pct(result) < result.memory_error_pct


def test_spearman_and_ranks_by_hand():
    assert fidelity_runs.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fidelity_runs.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert fidelity_runs._ranks([5.0, 1.0, 5.0]) == [1.5, 0.0, 1.5]


def test_regret_is_measured_time_of_the_predicted_best(rows):
    case = next(r for r in rows if isinstance(r, fidelity_runs.Case))

    def result(measured, predicted, tp):
        c = fidelity_runs.dataclasses.replace(case, measured_step_s=measured, group=("g",))
        return fidelity_runs.Result(c, fidelity_runs.Plan(tp=tp), predicted, True)

    stats = fidelity_runs.group_stats([result(1.0, 3.0, 1), result(2.0, 1.0, 2), result(4.0, 2.0, 4)])
    (_, n, distinct, rho, regret), = stats
    assert n == 3 and distinct == 3 and regret == pytest.approx(100.0)   # predicted best measures 2.0 vs the best 1.0
    assert rho == pytest.approx(-0.5)


def test_runs_autopar_cannot_tell_apart_are_not_ranked(rows):
    """Spearman is for groups of >= 3 runs autopar tells apart: runs of one layout and the same inputs differ in what
    autopar does not read (a software version), so their order says nothing it chooses; the regret still counts.
    A priced input other than the layout (here the pipeline schedule) tells runs apart."""
    case = next(r for r in rows if isinstance(r, fidelity_runs.Case))

    def result(measured, predicted, tp):
        c = fidelity_runs.dataclasses.replace(case, measured_step_s=measured, group=("g",))
        return fidelity_runs.Result(c, fidelity_runs.Plan(tp=tp), predicted, True)

    (_, n, distinct, rho, regret), = fidelity_runs.group_stats(
        [result(1.0, 3.0, 1), result(2.0, 1.0, 1), result(4.0, 2.0, 2)])
    assert (n, distinct) == (3, 2) and fidelity_runs.math.isnan(rho) and regret == pytest.approx(100.0)
    zero_bubble = result(2.0, 1.0, 1)
    zero_bubble = dataclasses.replace(zero_bubble, case=dataclasses.replace(
        zero_bubble.case, training=dataclasses.replace(zero_bubble.case.training, pipeline_schedule="zb-1p")))
    (_, _, distinct, rho, _), = fidelity_runs.group_stats([result(1.0, 3.0, 1), zero_bubble, result(4.0, 2.0, 2)])
    assert distinct == 3 and rho == pytest.approx(-0.5)


def test_modded_nanogpt_groups_one_model_and_engine(rows):
    """The speedrun file holds llm.c's record (engine native), the 124M-class records and a 1.5B scale-up at the same
    sequence length and GPU count: three groups, not one. llm.c's scripts train four GPT-2 sizes: a group each."""
    groups = {r.group for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "modded-nanogpt"}
    assert len(groups) == 3
    llmc = [r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "llmc"]
    assert len({r.group for r in llmc}) == len({r.model.num_layers for r in llmc}) == len(llmc)


def test_each_source_row_is_priced_with_the_kernels_its_software_ran(rows):
    """llm-foundry's MPT trains with flash-attn's xentropy loss (its default loss_fn fused_crossentropy);
    MegaScale's baseline commit 285068c8 merges FlashAttention v1 (no FlashAttention-2 yet) and has no fused loss."""
    from costmodels.specs import AttentionKernel, CrossEntropyKernel
    cases = [r for r in rows if isinstance(r, fidelity_runs.Case)]
    assert {c.training.cross_entropy for c in cases if c.source == "llm-foundry"} == {CrossEntropyKernel.XENTROPY}
    megascale = [c for c in cases if c.source == "megascale"]
    assert megascale and all(c.training.attention_kernel is AttentionKernel.FA1
                             and c.training.cross_entropy is CrossEntropyKernel.UNFUSED for c in megascale)


def test_the_modelzoo_long_context_rows_run_on_256_h100(rows):
    """NNODES 32 of 8-GPU H100 servers (the source's H100 setup: 256 GPUs); micro-batch left free; the dropless
    rows are priced balanced with a note and grouped apart from the forced-balance rows of the same layout."""
    long_context = [r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "mcore-moe-modelzoo"
                    and r.training.seq_len >= 16384 and r.cluster.profile.name.startswith("h100")]
    assert len(long_context) == 8
    assert all(c.cluster.num_gpus == 256 and "mbs" in c.free for c in long_context)
    dropless = [c for c in long_context if any("dropless" in note for note in c.assumptions)]
    assert len(dropless) == 4 and all(c.training.moe_imbalance_factor == 1.0 for c in dropless)
    assert len({c.group for c in long_context}) == 8            # one group per routing and sequence length


def test_every_moe_row_says_how_its_source_routed_tokens(rows):
    cases = [r for r in rows if isinstance(r, fidelity_runs.Case)]
    for case in cases:
        if case.category == "MoE":
            assert case.routing in fidelity_runs.ROUTINGS, case.label
        else:
            assert case.routing == "", case.label
    routing = {(c.source, c.row_id): c.routing for c in cases}
    # MoE Parallel Folding benchmarks token drop at capacity factor 1 (§4.2) and sets it on every row
    folding = [c for c in cases if c.source == "moe-parallel-folding"]
    assert folding and all(c.routing == fidelity_runs.ROUTING_CAPPED for c in folding)
    assert all(c.training.moe_capacity_factor == 1.0 for c in folding)
    # the ModelZoo long-context table gives each layout twice: forced load balance, then dropless
    assert routing[("mcore-moe-modelzoo", "7")] == fidelity_runs.ROUTING_BALANCED
    assert routing[("mcore-moe-modelzoo", "8")] == fidelity_runs.ROUTING_DROPLESS
    assert routing[("mcore-moe-readme", "1")] == fidelity_runs.ROUTING_DROPLESS


def test_zero_bubble_vocabulary_matches_the_stated_parameter_counts(rows):
    # Table 3 states 1.5B/6.2B/14.6B/28.3B; the models the benchmark builds (a 32000-token tied embedding), counted
    # by costmodels.params, round to each, and GPT-2's 50257 would miss three
    models = {r.model.name: r.model for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "zero-bubble-pp"}
    stated = {"GPT-style 1.5B": 1.5, "GPT-style 6.2B": 6.2, "GPT-style 14.6B": 14.6, "GPT-style 28.3B": 28.3}
    assert sorted(models) == sorted(stated)

    def billions(model):
        return round(total_params(model) / 1e9, 1)
    assert all(billions(model) == stated[name] for name, model in models.items())
    gpt2_vocab = [dataclasses.replace(model, vocab_size=50257) for model in models.values()]
    assert sum(billions(model) != stated[model.name] for model in gpt2_vocab) == 3


def test_small_kernel_files_are_read_with_their_engines(rows):
    """The six small-kernel files: llm.c's scripts run natively (GPT-2 shapes from the depth), the modded-nanogpt
    records through torch.compile under DDP (the 64K-token FlexAttention records refused: their windows are not
    stated), torchtitan's DeepEP rows compiled with grouped experts and DeepEP; every row of them is in the
    small-kernel category, and so is any model under 3B parameters or a fine-grained MoE."""
    from costmodels.specs import Engine, ExpertGemm, LaunchPath, MoEDispatcher

    small = {"llmc", "modded-nanogpt", "tinyllama", "ms-swift", "torchtitan-deepep", "torchtitan-h200-ladder"}
    assert sum(1 for r in rows if r.source in small) == 78
    llmc = [r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "llmc"]
    assert len(llmc) == 4 and all(r.training.engine is Engine.NATIVE for r in llmc)
    assert {(r.model.num_layers, r.model.hidden_size) for r in llmc} == {(12, 768), (24, 1024), (36, 1280), (48, 1600)}
    nanogpt = [r for r in rows if r.source == "modded-nanogpt"]
    flex = [r for r in nanogpt if isinstance(r, fidelity_runs.Unexpressed) and "FlexAttention" in r.reason]
    assert flex and all(isinstance(r, fidelity_runs.Case) for r in nanogpt if r.row_id in ("3", "4", "47"))
    compiled = [r for r in nanogpt if isinstance(r, fidelity_runs.Case) and r.training.engine is Engine.PYTORCH]
    assert compiled and all(r.training.launch is LaunchPath.COMPILE for r in compiled)
    deepep = [r for r in rows if isinstance(r, fidelity_runs.Case) and r.source == "torchtitan-deepep"]
    assert all(r.training.engine is Engine.TORCHTITAN and r.training.expert_gemm is ExpertGemm.GROUPED
               for r in deepep)
    assert sum(r.training.moe_dispatcher is MoEDispatcher.ALLTOALL for r in deepep) == 1     # row 8's baseline
    cases = [r for r in rows if isinstance(r, fidelity_runs.Case)]
    assert all(fidelity_runs.is_small_kernel(r) for r in cases if r.source in small)
    assert fidelity_runs.is_small_kernel(next(r for r in cases if r.model.name == "qwen2-57b-a14b"))  # 64 experts
    assert not fidelity_runs.is_small_kernel(next(r for r in cases if r.source == "megatron-lm-readme"
                                                   and total_params(r.model) > 100e9))


def test_modded_nanogpt_attention_follows_each_records_trainer(rows):
    """PyTorch 2.4.1's records run the flash backend; 2.5.0 (record 7) picks cuDNN by default; from the 2024-11-03
    record on the trainer forces cuDNN (enable_cudnn_sdp(True), enable_flash_sdp(False)) under 2.5.1, whose default
    order is flash again."""
    from costmodels.specs import AttentionKernel
    kernels = {r.label.split(":")[0]: r.training.attention_kernel for r in rows
               if isinstance(r, fidelity_runs.Case) and r.source == "modded-nanogpt" and "record" in r.label}
    assert kernels["GPT-2 124M-class (record 4"] is AttentionKernel.FA2
    assert kernels["GPT-2 124M-class (record 6"] is AttentionKernel.FA2
    assert kernels["GPT-2 124M-class (record 7"] is AttentionKernel.CUDNN
    assert all(kernels[f"GPT-2 124M-class (record {n}"] is AttentionKernel.CUDNN for n in (8, 9, 10, 11))
