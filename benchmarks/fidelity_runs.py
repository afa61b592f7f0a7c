"""Fidelity of the step-time model against published end-to-end training runs (shared/reference/runs/, 600 rows).

Validation only: nothing here is fitted, and no row changes a profile. Each source's row is turned into autopar's
inputs (model, cluster, training, and the layout the source states); the measured figure is turned into a step time
with the source's own convention, and compared with the predicted step time.

Metric per source (the one the source measured; README of shared/reference/runs/):
- step time (MegaScale, Nemotron-4, Megatron MoE ModelZoo): compared as is.
- tokens/s/GPU (llm-foundry, torchtitan, torchao) and samples/s/GPU (Zero Bubble): step = tokens per step /
  (rate · GPUs); the rate is a measured throughput, free of any FLOP convention.
- TFLOP/s/GPU or MFU (Megatron-LM README, Megatron-Core MoE README, MoE Parallel Folding): model TFLOP/s by
  Megatron-LM's `num_floating_point_operations` of the software version the source ran. Before Megatron-LM commit
  8873b55d (2025-03-06, "Fixes in number of floating-point operation estimates for MoE and attention layer") the
  formula counted the full s×s attention matrix; from then on only the causal half. MFU is converted with the
  source's own peak (989.5 TFLOP/s for MoE Parallel Folding, §4.1). MoE Parallel Folding (arXiv 2504.14960, April
  2025) ran in the window of that change and does not say which formula it used: its rows are read with the causal
  formula, and `convention_table` prints them under both readings with the evidence (FOLDING_FLOP_READING).

Knobs the source does not state (micro-batch, interleaving, recompute, sequence parallelism, distributed optimizer)
are left to autopar: the prediction is the fastest layout that agrees with everything the source states and fits in
memory, as a tuned production run would be. Rows autopar cannot express (a GPU without a profile, an architecture or
layout the source does not state, a pipeline schedule autopar does not model) are counted and listed with the reason.

Within every group of runs of one model on one cluster (same GPU type and count, same sequence length), the measured
and predicted per-token times are ranked: Spearman's rank correlation (groups of >= 3 runs autopar tells apart, by
their layout or another input it prices, a pipeline schedule, a kernel: runs with the same inputs and layout differ
only in what autopar does not read, a software version, so their order ranks nothing autopar chooses) and the top-1
regret, the measured time of the run autopar predicts fastest over the measured fastest, minus 1 (groups of >= 2
runs).

Peak memory per GPU is compared too where a source reports it in a comparable form (memory_table: Zero Bubble Table 4).

    python benchmarks/fidelity_runs.py [--verbose]

Ends with `fidelity-runs: mape=X% max=Y% rows=N spearman_median=R regret_mean=Z%`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from autopar.calibrate.from_runs import same_run_groups  # noqa: E402
from autopar.runs import MEMORY_HEADROOM, choose_plan, cluster_for, gpu_profile  # noqa: E402
from autopar.runs import integer as _int  # noqa: E402
from autopar.runs import number as _num  # noqa: E402
from autopar.runs import precision_fields as _precision_fields  # noqa: E402
from autopar.runs import precision_of as _precision  # noqa: E402
from autopar.runs import read_run_rows  # noqa: E402
from benchmarks.reference import reference_dir  # noqa: E402
from costmodels import compute as compute_model  # noqa: E402
from costmodels.engines import engine_loss  # noqa: E402
from costmodels.errors import InputError  # noqa: E402
from costmodels.hardware import HardwareProfile, load_profile  # noqa: E402
from costmodels.memory import fixed_overheads_bytes, peak_memory  # noqa: E402
from costmodels.params import total_params  # noqa: E402
from costmodels.plan import Plan, PlanArrays, Recompute, RecomputeModule  # noqa: E402
from costmodels.specs import (AttentionKernel, ClusterSpec, CrossEntropyKernel, Engine, ExpertGemm,  # noqa: E402
                              LaunchPath, MlpKind, ModelSpec, NormKind, PipelineSchedule, PositionEmbedding,
                              Precision, TrainingSpec)

CATEGORIES = ("dense A100", "dense H100/H200", "dense B200/GB200", "MoE", "small-kernel")
"""Each row's GPU-and-kind category (Case.category), and the small-kernel regime across them (`is_small_kernel`)."""
SMALL_MODEL_PARAMS = 3e9
"""The small-kernel category's models: under 3B parameters (issue 42)."""
FINE_GRAINED_EXPERTS = 64
FINE_GRAINED_EXPERT_WIDTH = 2048
"""... and MoE models with at least 64 experts or experts at most 2048 wide."""


def is_small_kernel(case: "Case") -> bool:
    """The small-kernel regime: a row of its six files, a model under SMALL_MODEL_PARAMS, or a fine-grained MoE."""
    moe = case.model.moe
    fine = moe is not None and (moe.num_experts >= FINE_GRAINED_EXPERTS
                                or moe.expert_ffn_hidden_size <= FINE_GRAINED_EXPERT_WIDTH)
    return case.small_kernel or fine or total_params(case.model) < SMALL_MODEL_PARAMS


def in_category(case: "Case", name: str) -> bool:
    return is_small_kernel(case) if name == "small-kernel" else case.category == name


# ---- rows ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One expressible published run: autopar's inputs, what is fixed, what is left free, and the measured step."""

    source: str
    row_id: str
    label: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    fixed: dict
    """Plan fields the source states."""
    free: dict
    """Plan fields the source leaves open -> candidate values autopar chooses from."""
    metric: str
    measured_step_s: float
    category: str
    group: tuple
    assumptions: tuple[str, ...] = ()
    measured_peak_memory_bytes: float = 0.0
    """Peak memory per GPU as the source reports it (0: not stated, or not comparable: see memory_table)."""
    routing: str = ""
    """An MoE row's token routing as its source states it (ROUTINGS); empty for a dense row."""
    full_matrix_step_s: float = 0.0
    """For a source read with the causal formula it does not state (FOLDING_FLOP_READING): the measured step had it
    counted the full attention matrix; 0 where the source states its convention or measured time directly."""
    logged_reserved_bytes: float = 0.0
    """torchtitan's logged `memory` figure: the caching allocator's peak reserved bytes (reserved_bytes.all.peak),
    which holds every allocated tensor at the peak plus the allocator's slack, and not the CUDA context or NCCL's
    own buffers (reserved_table); 0 where the row logs none."""
    small_kernel: bool = False
    """A row of the small-kernel regime's files (the category `small-kernel` holds them, and every row of a model
    under SMALL_MODEL_PARAMS or of a fine-grained MoE: `is_small_kernel`)."""


ROUTING_CAPPED = "capacity-capped"
ROUTING_BALANCED = "forced balance"
ROUTING_DROPLESS = "dropless, imbalance unstated"
ROUTINGS = (ROUTING_CAPPED, ROUTING_BALANCED, ROUTING_DROPLESS)
"""How an MoE row routed its tokens: a capacity factor caps the busiest expert at the balanced load (token drop);
--moe-router-force-load-balancing makes the load balanced; a dropless router lets the trained router's imbalance
through, which no source here states (autopar prices it balanced, --moe-imbalance-factor 1). The per-routing table
tells the cost of a balanced layer (the first two) from the imbalance autopar is not told (the third). A row that
states no routing runs its framework's default: dropless for Megatron-Core (no --moe-expert-capacity-factor) and
for torchtitan's token-choice router."""


@dataclass(frozen=True)
class Unexpressed:
    source: str
    row_id: str
    label: str
    reason: str


@dataclass(frozen=True)
class Result:
    case: Case
    plan: Plan
    predicted_step_s: float
    fits: bool
    predicted_peak_memory_bytes: float = 0.0

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_step_s - self.case.measured_step_s) / self.case.measured_step_s

    @property
    def memory_error_pct(self) -> float:
        measured = self.case.measured_peak_memory_bytes
        return 100.0 * (self.predicted_peak_memory_bytes - measured) / measured

    @property
    def measured_token_s(self) -> float:
        """Measured GPU-seconds per token (comparable across batch sizes within a group)."""
        return self.case.measured_step_s * self.case.cluster.num_gpus / self.case.training.tokens_per_step

    @property
    def predicted_token_s(self) -> float:
        return self.predicted_step_s * self.case.cluster.num_gpus / self.case.training.tokens_per_step


def _read(name: str) -> list[dict[str, str]]:
    return read_run_rows(reference_dir() / "runs" / name)


# ---- hardware ------------------------------------------------------------------------------------------------------

def category(profile: HardwareProfile, moe: bool) -> str:
    if moe:
        return "MoE"
    name = profile.name.lower()
    if name.startswith(("a100", "a800")):
        return "dense A100"
    if name.startswith(("h100", "h200", "h800")):
        return "dense H100/H200"
    return "dense B200/GB200"


# ---- models --------------------------------------------------------------------------------------------------------

def gpt(name: str, hidden: int, layers: int, heads: int, vocab: int, seq: int, ffn: int = 0) -> ModelSpec:
    """Megatron GPT: 4h GELU MLP, LayerNorm, biases, learned positions, tied embeddings."""
    return ModelSpec(name=name, hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     ffn_hidden_size=ffn or 4 * hidden, vocab_size=vocab, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                     position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=seq,
                     tied_embeddings=True, linear_bias=True)


def mpt(name: str, hidden: int, layers: int, heads: int, ffn: int, vocab: int, seq: int) -> ModelSpec:
    """MPT (llm-foundry mpt-<size>.yaml): GELU MLP of expansion_ratio·d, LayerNorm, no_bias, tied embeddings; the
    README's NumParams grows with the sequence length, so a learned position table of seq × d is counted. No dropout:
    the yamls leave it at MPTConfig's defaults, resid_pdrop = emb_pdrop = attn_pdrop = 0.0
    (llmfoundry/models/mpt/configuration_mpt.py and models/utils/config_defaults.py at the README's commit)."""
    return ModelSpec(name=name, hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     ffn_hidden_size=ffn, vocab_size=vocab, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                     position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=seq,
                     tied_embeddings=True, linear_bias=False, dropout=0.0)


def preset(name: str) -> ModelSpec:
    from autopar.models import load_preset
    return load_preset(name)


LLAMA_PRESETS = (("405b", "llama-3.1-405b"), ("70b", "llama-3.1-70b"), ("8b", "llama-3.1-8b"))


def llama(model: str) -> "ModelSpec | None":
    text = model.lower().replace(" ", "")
    if "llama3" not in text and "llama-3" not in text:
        return None
    if "x70b" in text or "scout" in text or "llama4" in text:
        return None
    for size, name in LLAMA_PRESETS:
        if size in text:
            return preset(name)
    return None


# ---- FLOP conventions ----------------------------------------------------------------------------------------------

def megatron_flops_per_step(model: ModelSpec, training: TrainingSpec, causal: bool) -> float:
    """Megatron-LM `num_floating_point_operations` for one step: autopar's model FLOPs (Megatron's formula with the
    causal half of the attention matrix, commit 8873b55d onward); before that commit the full matrix was counted,
    i.e. the attention core once more."""
    flops = compute_model.model_flops_per_step(model, training)
    if not causal:
        core = compute_model.attention_core_flops_per_sequence(model, training)
        flops += (1.0 + compute_model.BACKWARD_TO_FORWARD) * core * training.global_batch_size
    return flops


# ---- sources -------------------------------------------------------------------------------------------------------

def _cluster(profile: HardwareProfile, num_gpus: int, gpus_per_node: int = 0) -> ClusterSpec:
    return cluster_for(profile, num_gpus, gpus_per_node)


TUNED_OVERLAP = dict(overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True)
"""Megatron runs whose source does not state the DP/TP overlap switches: a tuned production run turns them on
(NeMo's and Megatron-Bridge's recipes do by default), like the other unstated knobs autopar chooses."""
OVERLAP_NOTE = "DP/TP overlap unstated: on (tuned run)"
# Attention kernel of the Megatron-LM / Megatron-Core / NeMo sources: TrainingSpec's default `auto`, what
# --attention-backend auto gets from Transformer Engine (cuDNN fused attention on Hopper+, FlashAttention-2 on
# Ampere; costmodels.compute.resolve_attention_kernel); none of them states another backend.


def llm_foundry() -> "list[Case | Unexpressed]":
    """mosaicml/llm-foundry MPT benchmarks: FSDP only (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2), micro-batch
    per GPU, activation checkpointing on = full recompute; measured tokens/s/GPU. Attention: see
    llm_foundry_attention. Gradient reduce dtype: the table's 'MP Mode' (LLM_FOUNDRY_REDUCE_IN_FP32)."""
    source, out = "llm-foundry", []
    for r in _read("llm_foundry_mpt_benchmarks.csv"):
        profile, why, _ = gpu_profile(r["gpu"])
        label = f"{r['model']} {r['gpu']} x{r['num_gpus']} s{r['seq_len']} mbs{r['micro_batch']}"
        if profile is None:
            out.append(Unexpressed(source, r["row_id"], label, why))
            continue
        seq, gpus = _int(r, "seq_len"), _int(r, "num_gpus")
        model = mpt(r["model"], _int(r, "hidden"), _int(r, "layers"), _int(r, "heads"), _int(r, "ffn"),
                    _int(r, "vocab"), seq)
        kernel, attention_note = llm_foundry_attention(r, profile)
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                **_precision_fields(r["precision"]), attention_kernel=kernel,
                                cross_entropy=LLM_FOUNDRY_LOSS,
                                grad_reduce_in_fp32=LLM_FOUNDRY_REDUCE_IN_FP32[_fsdp_mp_mode(r["method"])],
                                engine=Engine.PYTORCH)   # Composer's training loop, PyTorch FSDP over an eager MPT
        zero = 2 if "SHARD_GRAD_OP" in r["sharding"] else 3
        recompute = Recompute.FULL if "checkpointing True" in r["recompute"] else Recompute.NONE
        fixed = dict(tp=1, pp=1, cp=1, ep=1, mbs=_int(r, "micro_batch"), zero=zero, recompute=recompute)
        step = training.tokens_per_step / (_num(r, "tokens_per_s_per_gpu") * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {},
                        "tokens/s/GPU", step, category(profile, False),
                        (source, r["model"], profile.name, gpus, seq), (attention_note,)))
    return out


LLM_FOUNDRY_REDUCE_IN_FP32 = {"PURE": False, "DEFAULT": True}
"""Whether an llm-foundry run reduced its gradients in fp32, by the FSDP 'MP Mode' its table states (Composer's
get_mixed_precision, composer/trainer/mosaic_fsdp_utils.py): PURE sets param, reduce and buffer dtypes all to the
autocast precision (bf16) in every Composer release; DEFAULT sets reduce_dtype = float32 from Composer 0.16.4
(d745fcb1b, 2023-10-10, 'patch default'), the lower bound llm-foundry pins from the commit that added the DEFAULT
tables (b2a43a147, 2023-10-19: mosaicml>=0.16.4,<0.17; 5e85bd62d, 2024-01: >=0.17.2). The PURE rows are A100 rows
already in the README on 2023-05-03 (300cc5c58). FSDP keeps the reduced shard in fp32 either way (it casts the
gradient back to the fp32 sharded parameter's dtype), which only the memory would see; these rows are timed."""


def _fsdp_mp_mode(method: str) -> str:
    """The FSDP 'MP Mode' of an llm-foundry row's method text ('... FSDP mixed_precision=PURE')."""
    mode = method.rpartition("mixed_precision=")[2].split()[0] if "mixed_precision=" in method else ""
    if mode not in LLM_FOUNDRY_REDUCE_IN_FP32:
        raise ValueError(f"llm-foundry row method {method!r}: no FSDP mixed_precision mode PURE or DEFAULT")
    return mode


LLM_FOUNDRY_LOSS = CrossEntropyKernel.XENTROPY
"""MPT's loss in llm-foundry: `om_model_config.get('loss_fn', 'fused_crossentropy')` (llmfoundry/models/mpt/
modeling_mpt.py, ComposerMPTCausalLM, the default since MosaicGPT, before the A100 tables; the benchmark yamls
scripts/train/yamls/pretrain/mpt-*.yaml and submit_benchmarks.py set no loss_fn) is flash-attn's
`flash_attn.losses.cross_entropy.CrossEntropyLoss`, apex's xentropy kernel (the `xentropy-cuda-lib` of the gpu
extra), on the bf16 logits."""

LLM_FOUNDRY_FLASH_MODELS = ("MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b")


def llm_foundry_attention(r: dict, profile: HardwareProfile) -> "tuple[AttentionKernel, str]":
    """The attention kernel of an llm-foundry table row, as the benchmark scripts that produced the tables set it,
    and the note saying how it is priced.

    The 'Large Scale' H100 table (added in 5e85bd62d, 2024-01) comes from benchmarking/sweep.py, which passes
    `--attn_impl flash` for 1b/3b/7b/70b (flash_attn 2.4.2, the gpu-flash2 extra) and `--attn_impl triton` for
    13b/30b; every other table comes from sweep.sh (b2a43a147, 2023-10, and earlier for A100), which leaves
    submit_benchmarks.py's default `--attn_impl triton`: MPT's copy of flash-attention's Triton kernel
    (flash_attn_triton.py), the FA2 paper's 'FlashAttention in Triton'. That kernel has an A100 curve (FlashAttention-2
    at the rate ratios the FA2 paper measured on A100, benchmarks/microbench_tables.py FA2_SPEEDUP); on H100 no
    source measured it, so there it is priced as FlashAttention-2, an upper bound on its speed."""
    if r["source_table"].startswith("H100 80GB BF16 (Large Scale") and r["model"] in LLM_FOUNDRY_FLASH_MODELS:
        return AttentionKernel.FA2, "attention FlashAttention-2 (sweep.py --attn_impl flash, flash-attn 2.4.2)"
    if "fa_triton" in compute_model.attention_kernels_of(profile):
        return AttentionKernel.FA_TRITON, ("attention MPT's Triton kernel (--attn_impl triton, submit_benchmarks "
                                           "default): FlashAttention in Triton")
    return AttentionKernel.FA2, TRITON_AS_FA2_NOTE


TRITON_AS_FA2_NOTE = ("attention MPT's Triton kernel (--attn_impl triton): no curve for it on this GPU, priced as "
                      "FlashAttention-2 (an upper bound on its speed)")
"""The note of an llm-foundry row whose Triton attention is priced as FlashAttention-2 (benchmarks/
fidelity_sensitivity.py prices those rows with a Triton curve instead, as one of its variants)."""


def megatron_readme() -> "list[Case | Unexpressed]":
    """Megatron-LM README weak scaling on H100 (Megatron-Core r0.8.0, 2024): GPT, vocab 131072, seq 4096; TFLOP/s
    by the pre-2025 formula (full attention matrix). MBS, VPP, recompute, distributed optimizer not stated."""
    source, out = "megatron-lm-readme", []
    profile = load_profile("h100-80gb")
    for r in _read("megatron_lm_readme_h100_scaling.csv"):
        label = f"{r['model']} x{r['num_gpus']}"
        if _num(r, "tflops_per_gpu") is None or _num(r, "tp") is None:
            out.append(Unexpressed(source, r["row_id"], label, "strong-scaling end point: layout and metric not "
                                                               "stated (MFU only, TP/PP/DP not given)"))
            continue
        seq, gpus, layers = 4096, _int(r, "num_gpus"), _int(r, "layers")
        model = gpt(r["model"], _int(r, "hidden"), layers, _int(r, "heads"), _int(r, "vocab"), seq)
        # README: "overlap of DP (--overlap-grad-reduce --overlap-param-gather), TP (--tp-comm-overlap) and PP
        # communication enabled"; the switches it does not list (--cross-entropy-loss-fusion) at Megatron's default
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"), overlap_grad_reduce=True,
                                overlap_param_gather=True, tp_comm_overlap=True,
                                cross_entropy=CrossEntropyKernel.UNFUSED)
        tp, pp = _int(r, "tp"), _int(r, "pp")
        fixed = dict(tp=tp, pp=pp, cp=1, ep=1, sp=tp > 1)
        free = dict(mbs=(1, 2, 4), vpp=_vpp_choices(layers, pp), zero=(0, 1),
                    recompute=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL))
        flops = megatron_flops_per_step(model, training, causal=False)
        step = flops / (_num(r, "tflops_per_gpu") * 1e12 * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, free,
                        "TFLOP/s/GPU (MCore r0.8)", step, category(profile, False),
                        (source, r["model"], profile.name, gpus, seq),
                        ("FFN 4h GELU, learned positions (not stated)",)))
    return out


def _vpp_choices(layers: int, pp: int) -> tuple[int, ...]:
    if pp <= 1:
        return (1,)
    per_stage = layers // pp
    return tuple(v for v in range(1, per_stage + 1) if layers % (pp * v) == 0) or (1,)


def megascale() -> "list[Case | Unexpressed]":
    """MegaScale Table 2/3: only the Megatron-LM baseline rows (MegaScale rows change the model and optimizer)."""
    source, out = "megascale", []
    for r in _read("megascale_2402.15627.csv"):
        label = f"{r['model']} x{r['num_gpus']} {r['method'][:20]}"
        if "Megatron-LM" not in r["method"]:
            out.append(Unexpressed(source, r["row_id"], label, "MegaScale system rows change the model (parallel "
                                                               "block, sliding window) and optimizer (LAMB)"))
            continue
        if _num(r, "step_time_s") is None:
            out.append(Unexpressed(source, r["row_id"], label, "no step time"))
            continue
        profile, _, note = gpu_profile(r["gpu"])
        seq, gpus, layers = _int(r, "seq_len"), _int(r, "num_gpus"), _int(r, "layers")
        model = gpt(r["model"], _int(r, "hidden"), layers, _int(r, "heads"), _int(r, "vocab"), seq)
        # The baseline runs without DP/TP overlap: "3D-parallel communication overlap" is one of the things MegaScale
        # adds to Megatron-LM (the file's header; arXiv 2402.15627, "Communication overlapping in 3D parallelism"),
        # so the overlap switches stay off here; the pipeline's P2P overlap too: the baseline's Megatron-LM commit
        # 285068c8 (2023-01-11) predates --overlap-p2p-communication, and Megatron-Core's p2p (39b83c7, 2023-01-31):
        # its megatron/p2p_communication.py still scatters and gathers the stage-to-stage tensor without SP.
        # (nor a fused cross entropy: Megatron-LM had none in 2023). Attention: 285068c8 is the merge of
        # 'tridao-flashattn', which adds --use-flash-attn over flash-attn 1.x's flash_attn_unpadded_func (renamed in
        # flash-attn 2.0, six months later). The source does not say whether the baseline turned it on: assumed on,
        # FlashAttention v1, the fastest core that commit runs (unfused without the flag).
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                cross_entropy=CrossEntropyKernel.UNFUSED, overlap_p2p_comm=False,
                                p2p_scatter_gather=True, attention_kernel=AttentionKernel.FA1)
        tp, pp, vpp = _int(r, "tp"), _int(r, "pp"), _int(r, "vpp", 1)
        fixed = dict(tp=tp, pp=pp, vpp=vpp, cp=1, ep=1)
        free = dict(mbs=(1, 2, 4), sp=(False, True), zero=(0, 1),
                    recompute=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL))
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, free,
                        "step s", _num(r, "step_time_s"), category(profile, False),
                        (source, r["model"], profile.name, gpus, seq, r["global_batch_seqs"]),
                        (note, "bf16 assumed (precision not stated)", "DP/TP/PP overlap off (MegaScale's addition)",
                         "attention FlashAttention v1 assumed (the commit's --use-flash-attn; not stated)")))
    return out


def nemotron() -> "list[Case | Unexpressed]":
    """Nemotron-4 15B Table 2: TP8 + distributed optimizer over DP, step time per batch-ramp stage."""
    source, out = "nemotron-4-15b", []
    profile = load_profile("h100-80gb")
    model = nemotron4_15b()
    for r in _read("nemotron4_15b_2402.16819.csv"):
        gpus, seq = _int(r, "num_gpus"), _int(r, "seq_len")
        label = f"{r['model']} x{gpus} gbs{r['global_batch_seqs']}"
        if model is None:
            out.append(Unexpressed(source, r["row_id"], label, "model_type nemotron not supported"))
            continue
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"), **TUNED_OVERLAP)
        fixed = dict(tp=_int(r, "tp"), pp=1, cp=1, ep=1, zero=1)
        free = dict(mbs=(1, 2, 4), sp=(False, True), recompute=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL))
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, free,
                        "step s", _num(r, "step_time_s"), category(profile, False),
                        (source, r["model"], profile.name, gpus, seq), ("bf16 assumed (not stated)", OVERLAP_NOTE)))
    return out


def nemotron4_15b() -> "ModelSpec | None":
    try:
        return preset("nemotron-4-15b")
    except InputError:
        return None


ZERO_BUBBLE_VOCAB = 32000
ZERO_BUBBLE_VOCAB_NOTE = (
    "vocab 32000 (not stated): the paper's script (sail-sg/zero-bubble-pipeline-parallelism 425b42e5, 2023-11, "
    "examples/pretrain_zero_bubble.sh: seq 1024, --fp16, --tokenizer-type GPTSentencePieceTokenizer) trains with a "
    "SentencePiece model, and Table 3's sizes are those of a 32000-token tied embedding: 1.48/6.18/14.65/28.30B "
    "against the stated 1.5/6.2/14.6/28.3B (GPT-2's 50257 gives 6.26/14.74/28.41B)")
"""The Zero Bubble models' vocabulary: Table 3 gives hidden, layers and heads and the parameter count, not the
vocabulary; the count L·(12h² + 13h) + (V + 2048)·h + 2h matches V = 32000 for all four models."""

ZERO_BUBBLE_FP16_NOTE = "fp16 in the paper's script, priced as bf16 (the same tensor-core rate and bytes on A100)"

ZERO_BUBBLE_SCHEDULES = {"Zero Bubble ZB-1p": PipelineSchedule.ZB_1P, "Zero Bubble ZB-2p": PipelineSchedule.ZB_2P}
"""The paper's zero-bubble rows by their `method` column (the others are Megatron-LM's 1F1B and 1F1B-I)."""


def zero_bubble() -> "list[Case | Unexpressed]":
    """Zero Bubble PP Table 4: pure PP on A100 80GB; Megatron 1F1B and interleaved 1F1B (each layer its own chunk;
    the first and last stage hold one layer fewer, i.e. Megatron's embedding/loss slots), and the paper's ZB-1p and
    ZB-2p on the same split (--pipeline-schedule zb-1p / zb-2p). Unfused attention: ZERO_BUBBLE_ATTENTION_NOTE; the
    table's peak memory is compared too (memory_table)."""
    source, out = "zero-bubble-pp", []
    profile = load_profile("a100-80gb")
    for r in _read("zero_bubble_pp_2401.10241.csv"):
        gpus, pp, layers = _int(r, "num_gpus"), _int(r, "pp"), _int(r, "layers")
        mbs, m = _int(r, "micro_batch"), _int(r, "num_microbatches")
        label = f"{r['model']} pp{pp} m{m} {r['method']}"
        schedule = ZERO_BUBBLE_SCHEDULES.get(r["method"], PipelineSchedule.ONE_F_ONE_B)
        seq = _int(r, "seq_len")
        model = gpt(r["model"], _int(r, "hidden"), layers, _int(r, "heads"), ZERO_BUBBLE_VOCAB, seq)
        training = TrainingSpec(seq_len=seq, global_batch_size=mbs * m, cross_entropy=CrossEntropyKernel.UNFUSED,
                                flash_attention=False, pipeline_schedule=schedule)   # 2023 Megatron
        fixed = dict(tp=1, pp=pp, cp=1, ep=1, mbs=mbs, recompute=Recompute.NONE, zero=0)
        # the layers do not split evenly (22 over 8, 30 over 8, ...): as in the paper's Megatron-LM, the embedding
        # and the loss each take one layer slot, so the first and last stage hold one layer fewer
        slots = (layers + 2) // pp
        if (layers + 2) % pp:
            out.append(Unexpressed(source, r["row_id"], label, "pipeline split not expressible"))
            continue
        fixed.update(first_stage_layers=slots - 1, last_stage_layers=slots - 1)
        # 1F1B-I: "each transformer layer serves as a chunk"
        fixed.update(vpp=slots if r["method"].endswith("1F1B-I") else 1)
        step = training.global_batch_size / (_num(r, "samples_per_s_per_gpu") * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {},
                        "samples/s/GPU", step, category(profile, False),
                        (source, r["model"], profile.name, gpus, seq, m),
                        (ZERO_BUBBLE_VOCAB_NOTE, ZERO_BUBBLE_FP16_NOTE, ZERO_BUBBLE_ATTENTION_NOTE),
                        measured_peak_memory_bytes=_num(r, "peak_mem_gb") * 1e9))
    return out


ZERO_BUBBLE_ATTENTION_NOTE = (
    "attention unfused (Megatron-LM's core attention, no --use-flash-attn): the paper does not state its attention, "
    "and its peak memory (Table 4, every schedule) is that of the a·s² score and softmax activations unfused "
    "attention keeps, not FlashAttention's (the memory table below; the time is not used to choose)")


def torchtitan() -> "list[Case | Unexpressed]":
    """torchtitan benchmarks: FSDP2 (+TP/PP/CP); tokens/s/GPU. Rows on H100 96GB at 500 W have no profile."""
    source, out = "torchtitan", []
    for r in _read("torchtitan_benchmarks.csv"):
        label = f"{r['model']} x{r['num_gpus']} {r['method'][:40]}"
        profile, why, note = gpu_profile(r["gpu"])
        if profile is None:
            out.append(Unexpressed(source, r["row_id"], label, why))
            continue
        out.append(_fsdp_case(source, r, profile, label, note))
    return out


def torchao() -> "list[Case | Unexpressed]":
    source, out = "torchao-blackwell", []
    for r in _read("torchao_blackwell_benchmarks.csv"):
        label = f"{r['model']} x{r['num_gpus']} {r['precision']}"
        profile, why, note = gpu_profile(r["gpu"])
        if profile is None:
            out.append(Unexpressed(source, r["row_id"], label, why))
            continue
        if r["model"].startswith("Llama4"):
            out.append(_torchao_llama4(source, r, profile, label))
            continue
        out.append(_fsdp_case(source, r, profile, label, note))
    return out


def _torchao_llama4(source: str, r: dict, profile: HardwareProfile, label: str) -> "Case | Unexpressed":
    """pytorch/ao's Llama 4 rows: torchtitan's llama4 (experiments/llama4 at the README's torchtitan commit 6fc499f:
    flavor 17bx16e = Scout's shape, full causal SDPA in every layer (use_flex_attn off, no chunking; irope is another
    flavor), grouped-mm experts, EP over the FSDP ranks, expert TP 1), PyTorch's eager cross entropy. The 2-layer
    table (C) runs in bf16 or in MXFP8 on a part of the GEMMs; the GB200 case study (B) states its GPU count twice,
    differently."""
    if r["source_table"].startswith("(B)"):
        return Unexpressed(source, r["row_id"], label, "the GPU count contradicts itself: 512 in the table, 64 nodes "
                                                       "x 4 = 256 and FSDP=256 in the config text")
    if _precision(r["precision"]) is not Precision.BF16 or "MXFP8" in r["precision"]:
        return Unexpressed(source, r["row_id"], label, f"{r['precision']}: MXFP8 on a part of the GEMMs only; "
                                                       "autopar's precision applies to every GEMM")
    model = dataclasses.replace(preset("llama-4-scout-17b-16e"), name="llama4-17bx16e-2-layers",
                                num_layers=_int(r, "layers"), attention_chunk_size=0, chunked_attention_layers=0)
    gpus, seq, mbs = _int(r, "num_gpus"), _int(r, "seq_len"), _int(r, "micro_batch")
    training = TrainingSpec(seq_len=seq, global_batch_size=mbs * _int(r, "dp"), precision=Precision.BF16,
                            attention_kernel=AttentionKernel.CUDNN, cross_entropy=CrossEntropyKernel.UNFUSED,
                            expert_gemm=ExpertGemm.GROUPED, **torchtitan_engine(r["method"]))
    fixed = dict(tp=1, pp=1, cp=1, ep=_int(r, "ep"), etp=1, mbs=mbs, zero=3, recompute=Recompute.NONE)
    step = training.tokens_per_step / (_num(r, "tokens_per_s_per_gpu") * gpus)
    return Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {}, "tokens/s/GPU", step,
                "MoE", (source, r["model"], profile.name, gpus, seq), routing=ROUTING_DROPLESS, assumptions=
                ("Llama 4 Scout's shape with its 2 layers (the table's debug config)",
                 "attention SDPA cudnn (torchtitan backend priority)", "torchtitan's eager cross entropy (unfused)",
                 "experts in one torch._grouped_mm kernel (torchtitan's GroupedExperts)",
                 "B200 at its sustained clock: table (C) states no power limit (table (A)'s B200s are power limited)"))


def torchtitan_engine(method: str) -> dict:
    """TrainingSpec's engine fields for a torchtitan run: torch.compile'd blocks where the source says so."""
    return dict(engine=Engine.TORCHTITAN,
                launch=LaunchPath.COMPILE if "compile" in method.lower() else LaunchPath.EAGER)


def _fsdp_case(source: str, r: dict, profile: HardwareProfile, label: str, note: str) -> "Case | Unexpressed":
    """A torchtitan-style run: FSDP2 over dp (ZeRO-3), optional TP/PP/CP; per-op selective AC = selective.
    Attention: PyTorch SDPA with torchtitan's backend priority (torchtitan/models/attention.py
    ScaledDotProductAttention._init_backend at e7c0cae and 6fc499f: FLASH_ATTENTION first, CUDNN_ATTENTION put ahead
    of it on compute capability 10.0), i.e. PyTorch's FlashAttention-2 on Hopper, cuDNN on B200."""
    model = llama(r["model"])
    seq = _int(r, "seq_len")
    if model is None or seq is None:
        return Unexpressed(source, r["row_id"], label, "model or sequence length not stated")
    gpus = _int(r, "num_gpus")
    tp, pp, cp = _int(r, "tp", 1), _int(r, "pp", 1), _int(r, "cp", 1)
    mbs = _int(r, "micro_batch")
    dp = gpus // (tp * pp * cp)
    gbs = _int(r, "global_batch_seqs") or mbs * dp
    # torchtitan's loss: PyTorch's cross entropy on the logits, outside the compiled blocks (no fused kernel)
    kernel = AttentionKernel.CUDNN if profile.name.startswith("b200") else AttentionKernel.FA2
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs, **_precision_fields(r["precision"]),
                            attention_kernel=kernel, cross_entropy=CrossEntropyKernel.UNFUSED,
                            **torchtitan_engine(r["method"]))
    recompute = Recompute.FULL if "full" in r["recompute"] else (
        Recompute.SELECTIVE if "selective" in r["recompute"] else Recompute.NONE)
    fixed = dict(tp=tp, pp=pp, cp=cp, ep=1, mbs=mbs, zero=3, recompute=recompute, sp=tp > 1)
    free = dict(vpp=_vpp_choices(model.num_layers, pp)) if pp > 1 else {}
    step = training.tokens_per_step / (_num(r, "tokens_per_s_per_gpu") * gpus)
    moe = model.is_moe
    return Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, free, "tokens/s/GPU",
                step, category(profile, moe), (source, r["model"], profile.name, gpus, seq),
                tuple(n for n in (note, "torchtitan per-op SAC priced as selective recompute",
                                  f"attention SDPA {kernel.value} (torchtitan backend priority)") if n))


PRE_012_MOE_MEMORY_NOTE = ("memory as Megatron-Core >= 0.12 stores a MoE layer; a 2024 Megatron-Core also kept "
                           "the expert outputs at the combine (top_k x h bf16 per token per MoE layer)")

MCORE_2024_MOE_RECOMPUTE_MODULES = (0, int(RecomputeModule.MOE), int(RecomputeModule.CORE_ATTN | RecomputeModule.MOE))
"""Selective-recompute module sets open to a 2024 Megatron-Core MoE run that does not state its recompute: the default
(core_attn), and `--moe-layer-recompute` (checkpoint the whole MoE layer: Megatron-LM commit e61c384101, 2024-05-01,
"Extended TP for MOE + memory checkpointing"), alone or with core_attn. autopar's `moe` module is that checkpoint."""


def mixtral_readme() -> "list[Case | Unexpressed]":
    """Megatron-Core MoE README: Mixtral 8x7B, 64 H100, TP1 EP8 PP4 VP8, MBS1 GBS256, dropless; TFLOP/s by the
    pre-2025 formula."""
    source, out = "mcore-moe-readme", []
    profile = load_profile("h100-80gb")
    model = preset("mixtral-8x7b")
    for r in _read("megatron_core_moe_readme_mixtral8x7b.csv"):
        gpus, seq = _int(r, "num_gpus"), _int(r, "seq_len")
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"), **TUNED_OVERLAP)
        fixed = dict(tp=_int(r, "tp"), pp=_int(r, "pp"), vpp=_int(r, "vpp"), ep=_int(r, "ep"), cp=1,
                     mbs=_int(r, "micro_batch"))
        free = dict(zero=(0, 1), recompute=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
                    recompute_modules=MCORE_2024_MOE_RECOMPUTE_MODULES)
        step = megatron_flops_per_step(model, training, causal=False) / (_num(r, "tflops_per_gpu") * 1e12 * gpus)
        out.append(Case(source, r["row_id"], f"Mixtral 8x7B {r['method'][:10]}", model, _cluster(profile, gpus),
                        training, fixed, free, "TFLOP/s/GPU (MCore 2024)", step, "MoE",
                        (source, "mixtral-8x7b", profile.name, gpus, seq, r["row_id"]), (PRE_012_MOE_MEMORY_NOTE,),
                        routing=ROUTING_DROPLESS))
    return out


FOLDING_MICRO_BATCH = 1
FOLDING_MICRO_BATCH_NOTE = ("micro-batch 1: not stated, and not among the knobs the paper tuned (§4.2: each method at "
                            "'the optimal parallelism configuration found by tuning its supported parallelism "
                            "dimensions', Table 3 lists CP/TP/EP/PP/ETP); 1 as in the same team's Megatron-Core MoE "
                            "README benchmark (Mixtral 8x7B, MBS 1)")
"""The micro-batch of every MoE Parallel Folding row, held fixed rather than left to autopar: the paper tuned the
parallel dimensions only, so autopar's fastest micro-batch (4 for the FSDP baselines: a quarter of ZeRO-3's
per-micro-batch parameter gathers) would be a knob the authors did not tune."""

FOLDING_MODELS = {"Mixtral-8x22B": "mixtral-8x22b", "Qwen2-57B-A14B": "qwen2-57b-a14b"}


FOLDING_FLOP_READING = """MoE Parallel Folding's MFU is read with Megatron-Core's causal-attention formula (commit
8873b55d, 2025-03-06; the paper, April 2025, names no formula and no commit). The rows tell the two readings apart:
Table 5 holds the tokens per step constant while the sequence grows 16K -> 128K, so the full-matrix formula counts
1.13x -> 1.54x the causal FLOPs. Read with the full matrix, the error grows with that ratio (-10% at 16K to -34% at
128K: the causal attention core would have to take as long as the whole s x s matrix at the rate the attention
microbenchmarks give it, and the ModelZoo's long-context rows, on Megatron-Core after the change, show no such
loss); read causally, it stays flat (+1% to +9% over an 8x range of sequence length). convention_table prints both."""


def moe_folding() -> "list[Case | Unexpressed]":
    """MoE Parallel Folding (arXiv 2504.14960) Tables 1/3, 4 and 5: token-drop with capacity factor 1, GBS 256/1024,
    seq 4096 (Table 5: 16K-128K); MFU over 989.5 TFLOP/s by Megatron-Core's formula, causal (FOLDING_FLOP_READING).
    A blank layout cell is 1 (the table leaves unused dimensions blank). FSDP methods = ZeRO-3; TP+EP+DP = ZeRO-1."""
    source, out = "moe-parallel-folding", []
    profile = load_profile("h100-80gb")
    for r in _read("moe_parallel_folding_2504.14960.csv"):
        label = f"{r['model'][:24]} x{r['num_gpus']} {r['method']} {r['source_table'][:8]}"
        model = _folding_model(r["model"])
        mfu, tflops = _num(r, "mfu_pct"), _num(r, "tflops_per_gpu")
        if isinstance(model, str):
            out.append(Unexpressed(source, r["row_id"], label, model))
            continue
        if mfu is None and tflops is None:
            out.append(Unexpressed(source, r["row_id"], label, "no measurement (OOM or blank)"))
            continue
        if "Table 2" in r["source_table"] or _num(r, "tp") is None:
            out.append(Unexpressed(source, r["row_id"], label, "layout not restated for this table"))
            continue
        seq, gpus = _int(r, "seq_len"), _int(r, "num_gpus")
        notes = ()
        if seq is None:                          # Table 4: "same configurations as the performance experiments"
            seq, notes = 4096, ("seq 4096 of Table 3 (Table 4 does not restate it)",)
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                **_precision_fields(r["precision"]), moe_capacity_factor=1.0,
                                **(TUNED_OVERLAP if "FSDP" not in r["method"] else {}))
        tp, pp, cp, ep = _int(r, "tp", 1), _int(r, "pp", 1), _int(r, "cp", 1), _int(r, "ep", 1)
        etp = _int(r, "etp", 0) if "Folding" in r["method"] else tp
        zero = 3 if r["method"].startswith("FSDP") else None
        fixed = dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp or tp, sp=tp > 1)
        fixed["mbs"] = FOLDING_MICRO_BATCH
        notes += (FOLDING_MICRO_BATCH_NOTE, PRE_012_MOE_MEMORY_NOTE)
        free = dict(vpp=_vpp_choices(model.num_layers, pp),
                    recompute=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
                    recompute_modules=MCORE_2024_MOE_RECOMPUTE_MODULES)
        if zero is not None:
            fixed["zero"] = zero
        elif r["method"] == "TP + EP + DP":
            fixed["zero"] = 1
        else:
            free["zero"] = (0, 1)
        tflops = tflops if tflops is not None else mfu * 989.5 / 100.0
        step = megatron_flops_per_step(model, training, causal=True) / (tflops * 1e12 * gpus)
        full_matrix_step = megatron_flops_per_step(model, training, causal=False) / (tflops * 1e12 * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, free,
                        "MFU (MCore causal, 989.5)", step, "MoE",
                        (source, r["model"], profile.name, gpus, seq, r["global_batch_seqs"]), notes,
                        routing=ROUTING_CAPPED, full_matrix_step_s=full_matrix_step))
    return out


def _folding_model(name: str) -> "ModelSpec | str":
    if name.startswith("Mixtral-8x22B-G8T8"):
        base = preset("mixtral-8x22b")
        # §4.1: Mixtral 8x22B re-parameterised to 64 experts, 8 active, each 1/8 of the expert hidden size
        moe = dataclasses.replace(base.moe, num_experts=64, top_k=8,
                                  expert_ffn_hidden_size=base.moe.expert_ffn_hidden_size // 8)
        return dataclasses.replace(base, name="mixtral-8x22b-g8t8", moe=moe)
    if name in FOLDING_MODELS:
        return preset(FOLDING_MODELS[name])
    return f"{name}: top-k / shapes not stated"


GB200_NODE_NOTE = ("GB200 node = one NVL72 compute tray of 4 GPUs (the profile's gpus_per_node; not stated by the "
                   "source, which gives nodes)")


H100_NODE_NOTE = ("H100 node = 8 GPUs (NNODES 32 × 8 = the '256 H100 GPUS' of the source's H100 experiment setup, "
                  "8x50 GB/s InfiniBand per node: a NIC per GPU)")


def _modelzoo_gpus(r: dict, profile: HardwareProfile) -> "tuple[int | None, tuple[str, ...]]":
    """GPU count: as stated, or (the long-context and GB200 rows give nodes only) nodes × the profile's node: the
    NVL72 tray's 4 GPUs, an H100 server's 8."""
    if _num(r, "num_gpus") is not None:
        return _int(r, "num_gpus"), ()
    if _num(r, "num_nodes") is not None and profile.name.startswith("gb200"):
        return _int(r, "num_nodes") * profile.gpus_per_node, (GB200_NODE_NOTE,)
    if _num(r, "num_nodes") is not None and profile.name.startswith("h100"):
        return _int(r, "num_nodes") * profile.gpus_per_node, (H100_NODE_NOTE,)
    return None, ()


MODELZOO_MICRO_BATCHES = (1, 2, 4)
"""Micro-batch choices where the long-context table states none (the fastest that fits, as for other unstated knobs)."""
DROPLESS_NOTE = ("dropless routing priced balanced (--moe-imbalance-factor 1): the trained router's load imbalance is "
                 "not stated; the forced-balance row of the same layout is its twin")


def _modelzoo_recompute(text: str) -> "tuple[Recompute, str]":
    """(recompute, --recompute-modules) of the source's recompute cell: 'full', 'none in command', the H100 table's
    abbreviations ('norm, act' = layernorm moe_act, its header) or 'selective: a, b[; other techniques]'."""
    text = text.strip()
    if text == "full":
        return Recompute.FULL, ""
    if not text or text.startswith("none"):
        return Recompute.NONE, ""
    words = text.split(";")[0].removeprefix("selective:").split(",")
    return Recompute.SELECTIVE, " ".join({"norm": "layernorm", "act": "moe_act"}.get(w.strip(), w.strip())
                                         for w in words)


def _modelzoo_offload(text: str) -> tuple[str, ...]:
    """The modules of 'fine-grained activation offloading (expert_fc1, moe_act)' in a ModelZoo recompute cell."""
    found = re.search(r"activation offloading \(([^)]*)\)", text or "")
    return tuple(name.strip() for name in found.group(1).split(",")) if found else ()


def modelzoo() -> "list[Case | Unexpressed]":
    """Megatron MoE ModelZoo, Qwen3 best practice: measured step time (H100 tables); the GB200 table gives TFLOP/s
    and the global batch, so the step is Megatron-Core's model FLOPs (causal attention: the ModelZoo's H100 rows,
    which state both, agree with that formula within 1%) over TFLOP/s × GPUs; GB200/GB300 rows give nodes, not GPUs."""
    source, out = "mcore-moe-modelzoo", []
    for r in _read("megatron_moe_modelzoo_qwen3.csv"):
        label = f"{r['model']} {r['gpu']} x{r['num_gpus'] or r['num_nodes'] + 'n'} {r['notes'][:20]}"
        profile, why, _ = gpu_profile(r["gpu"])
        if not r["model"].startswith("Qwen3-235B"):
            out.append(Unexpressed(source, r["row_id"], label, f"{r['model']}: hybrid linear attention, no preset"))
            continue
        gpus, notes = _modelzoo_gpus(r, profile) if profile is not None else (None, ())
        if profile is None or gpus is None:
            out.append(Unexpressed(source, r["row_id"], label, why if profile is None else "GPU count not stated"))
            continue
        if _num(r, "step_time_s") is None and (_num(r, "tflops_per_gpu") is None
                                               or _num(r, "global_batch_seqs") is None):
            out.append(Unexpressed(source, r["row_id"], label, "no step time (TFLOP/s only, batch not stated)"))
            continue
        if "FSDP" in (r["sharding"] or ""):
            out.append(Unexpressed(source, r["row_id"], label, "Megatron-FSDP with EP inside the node: "
                                                               "expert sharding over edp not expressible"))
            continue
        model = preset("qwen3-235b-a22b")
        seq = _int(r, "seq_len")
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                **_precision_fields(r["precision"]),
                                moe_a2a_overlap="1f1b overlap" in (r["notes"] or ""),
                                moe_dispatcher="deepep" if "DeepEP" in r["method"] else "alltoall", **TUNED_OVERLAP,
                                **modelzoo_graphs(r["method"]), offload_modules=_modelzoo_offload(r["recompute"]))
        recompute, modules = _modelzoo_recompute(r["recompute"])
        fixed = dict(tp=_int(r, "tp"), pp=_int(r, "pp"), vpp=_int(r, "vpp", 1), cp=_int(r, "cp", 1),
                     ep=_int(r, "ep"), etp=_int(r, "etp", 1), recompute=recompute,
                     recompute_modules=modules or 0, sp=_int(r, "tp") > 1, zero=1)
        free = {}
        if _num(r, "micro_batch") is not None:
            fixed["mbs"] = _int(r, "micro_batch")
        else:
            free["mbs"] = MODELZOO_MICRO_BATCHES
            notes += ("micro-batch not stated: 1, 2 or 4, the fastest that fits",)
        if "dropless" in r["method"]:
            notes += (DROPLESS_NOTE,)
        fixed, split_note = slot_split(model.num_layers, fixed)
        notes += split_note
        if _num(r, "step_time_s") is not None:
            metric, step = "step s", _num(r, "step_time_s")
        else:
            metric = "TFLOP/s/GPU (MCore causal)"
            step = megatron_flops_per_step(model, training, causal=True) / (_num(r, "tflops_per_gpu") * 1e12 * gpus)
        if "mxfp8" in r["precision"]:
            notes += (MXFP8_NOTE,)
        if training.offload_modules:
            notes += (f"fine-grained activation offloading ({', '.join(training.offload_modules)}): priced in memory, "
                      "its copies beyond the layers' compute in the step time (offload_copies)",)
        cluster = _cluster(profile, gpus)
        if profile.nvlink_domain_size > profile.gpus_per_node:
            notes += (f"NVLink domain size 72 (source): {cluster.nvlink_domain_gpus} GPUs of the job per domain "
                      "(the job split evenly over NVL72 racks, costmodels.specs.job_nvlink_domain_gpus)",)
        routing = "dropless" if "dropless" in r["method"] else ""     # a group compares layouts, not routers
        out.append(Case(source, r["row_id"], label, model, cluster, training, fixed, free, metric, step, "MoE",
                        (source, r["model"], profile.name, gpus, seq, routing), notes,
                        routing=ROUTING_BALANCED if "forced load balanc" in r["method"] else ROUTING_DROPLESS))
    return out


MODELZOO_GRAPH_MODULES = ("attn", "moe_router", "moe_preprocess")
"""The CUDA-graph scope of the ModelZoo's GB200/GB300 commands (the file's header: 'commands include ... CUDA graphs
(attn, moe_router, moe_preprocess)'), as the DeepSeek-V3 GB200 guide's final configuration."""


def modelzoo_graphs(method: str) -> dict:
    """TrainingSpec's launch fields for a Megatron-Core row whose method names CUDA graphs."""
    if "CUDA graphs" not in method:
        return {}
    return dict(launch=LaunchPath.CUDA_GRAPH, cuda_graph_modules=MODELZOO_GRAPH_MODULES)


MXFP8_NOTE = ("MXFP8 priced as fp8 recipe mxfp8 (FP8 GEMMs at the fp8 peak, the casts with both layouts and "
              "their 1x32 block scales, SP all-gathers in fp8)")


def dsv3_gb200() -> "list[Case | Unexpressed]":
    """Megatron-LM's DeepSeek-V3 on 256 GB200 optimization history: one layout (TP1 PP8 VPP4 EP32, MBS1 GBS2048,
    seq 4096, layout 'Et|(tt|)*30L', MXFP8, distributed optimizer), each row adding a software optimization. The
    cost model prices one software stack, so the final row (the doc's optimized stack; the runs README: 'use the
    final row') is compared; the earlier rows are listed. TFLOP/s by Megatron-Core's formula (2025, causal)."""
    from autopar.megatron_args import parse_megatron_layout

    source, out = "mcore-dsv3-gb200", []
    rows = _read("megatron_dsv3_gb200_optimization.csv")
    final = rows[-1]["row_id"]
    profile = load_profile("gb200")
    # the guide's model: DeepSeek-V3 without MTP ('No MTP flag in the guide')
    model = dataclasses.replace(preset("deepseek-v3"), num_mtp_layers=0)
    for r in rows:
        label = f"DeepSeek-V3 x{r['num_gpus']} {r['method'].split('step: ')[-1][:30]}"
        if r["row_id"] != final:
            out.append(Unexpressed(source, r["row_id"], label, "earlier step of the doc's optimization ladder (same "
                                                               "layout as the final row; kernels, fusions, CUDA "
                                                               "graphs and dispatcher are not inputs)"))
            continue
        gpus, seq, pp = _int(r, "num_gpus"), _int(r, "seq_len"), _int(r, "pp")
        layout, mtp = parse_megatron_layout("Et|(tt|)*30L", pp)
        # the source's header: 'MXFP8 (--fp8-recipe mxfp8, fp8 param gather)'
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                **_precision_fields(r["precision"]), **TUNED_OVERLAP, fp8_param_gather=True,
                                **modelzoo_graphs("CUDA graphs"))   # the header: graphs on attn/moe_router/moe_preprocess
        recompute, modules = _modelzoo_recompute(r["recompute"])
        fixed = dict(tp=_int(r, "tp"), pp=pp, vpp=_int(r, "vpp"), cp=_int(r, "cp"), ep=_int(r, "ep"),
                     etp=_int(r, "etp"), mbs=_int(r, "micro_batch"), recompute=recompute,
                     recompute_modules=modules or 0, zero=1, layout=layout)
        # 'Every 32 GB200 GPUs (8 nodes) are in the same NVL domain' (the source's header)
        cluster = ClusterSpec(profile=profile, num_gpus=gpus, gpus_per_node=_int(r, "gpus_per_node"),
                              headroom=MEMORY_HEADROOM, nvlink_domain=32)
        step = megatron_flops_per_step(model, training, causal=True) / (_num(r, "tflops_per_gpu") * 1e12 * gpus)
        out.append(Case(source, r["row_id"], label, model, cluster, training, fixed, {},
                        "TFLOP/s/GPU (MCore causal)", step, "MoE", (source, "deepseek-v3", profile.name, gpus, seq),
                        (MXFP8_NOTE, "fp8 parameters as the source states (MXFP8 weights with no bf16 copy, "
                         "gathered in bf16)", "bf16 Adam moments priced as fp32 (memory only)",
                         "HybridEP dispatcher priced as all-to-all; forced load balancing = no imbalance",
                         "no MTP layer (the guide passes no MTP flag)", OVERLAP_NOTE),
                        routing=ROUTING_BALANCED))    # the source: --moe-router-force-load-balancing (benchmark)
    return out


def slot_split(layers: int, fixed: dict) -> tuple[dict, tuple[str, ...]]:
    """94 layers over pp·vpp = 32 chunks: Megatron-Core's account-for-embedding/loss split ((94 + 2) / 32 = 3 per
    chunk, the first and last rank one layer fewer), the only even split that exists (not stated by the source)."""
    pp, vpp = fixed.get("pp", 1), fixed.get("vpp", 1)
    if pp == 1 or layers % (pp * vpp) == 0 or (layers + 2) % (pp * vpp):
        return fixed, ()
    middle = (layers + 2) // pp
    return dict(fixed, first_stage_layers=middle - 1, last_stage_layers=middle - 1), (
        "embedding/loss pipeline slots assumed (uneven split)",)


def refused_file(name: str, source: str, reason: str) -> "list[Unexpressed]":
    return [Unexpressed(source, r["row_id"], r["model"], reason) for r in _read(name)]


def internevo() -> "list[Case | Unexpressed]":
    """InternEvo: the '7B model' architecture is not stated (configs/7B_sft.py is not said to be the benchmarked
    one)."""
    return refused_file("internevo_train_performance.csv", "internevo",
                        "architecture of the '7B model' not stated; ZeRO-1 group smaller than DP not expressible")



# ---- the small-kernel regime (the last six files of shared/reference/runs/) --------------------------------------

GPT2_HIDDEN_BY_DEPTH = {12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
"""llm.c's GPT-2 shapes by depth (-e dN): train_gpt2.cu gpt2_build_from_descriptor, 'd12' -> channels 768 and 12
heads, d24 -> 1024 / 16, d36 -> 1280 / 20, d48 -> 1600 / 25 (GPT-2 small, medium, large, XL)."""
LLMC_VOCAB = 50304
"""llm.c pads GPT-2's 50257-token vocabulary to 50304 (train_gpt2.cu: padded_vocab_size, a multiple of 128)."""
NATIVE_NOTE = ("llm.c: every kernel launched from C (engine native), cuDNN attention, fused classifier, ZeRO-1 over "
               "the 8 ranks")


def llmc_training(seq: int, gbs: int, profile: HardwareProfile) -> TrainingSpec:
    """llm.c's run: engine native, cuDNN attention (FlashAttention-2's curve where the profile has no cuDNN one:
    LLMC_ATTENTION_NOTE), its fused classifier priced as the single-kernel xentropy loss."""
    kernel = AttentionKernel.CUDNN if "cudnn" in compute_model.attention_kernels_of(profile) else AttentionKernel.FA2
    return TrainingSpec(seq_len=seq, global_batch_size=gbs, engine=Engine.NATIVE, attention_kernel=kernel,
                        cross_entropy=CrossEntropyKernel.XENTROPY)


LLMC_ATTENTION_NOTE = "cuDNN attention priced with FlashAttention-2's curve on A100 (no cuDNN curve measured there)"


def llmc_gpt2(name: str, layers: int, seq: int) -> ModelSpec:
    hidden, heads = GPT2_HIDDEN_BY_DEPTH[layers]
    return gpt(name, hidden, layers, heads, LLMC_VOCAB, seq)


def llmc_scripts() -> "list[Case | Unexpressed]":
    """llm.c's scripts/run_gpt2_*.sh header comments: the maintainer's approximate step time for GPT-2 124M-1558M
    on 8 A100 80GB (the 1558M on 8 H100), micro-batch -b, sequence -t, tokens per step -d, ZeRO-1, no recompute."""
    source, out = "llmc", []
    for r in _read("llmc_gpt2_scripts.csv"):
        label = f"{r['model'][:40]} {r['gpu']}"
        layers = _int(r, "layers")
        if layers not in GPT2_HIDDEN_BY_DEPTH:
            out.append(Unexpressed(source, r["row_id"], label, "model flags (-e) not stated; the source's step time "
                                                               "is flagged as inconsistent"))
            continue
        profile, _, _ = gpu_profile(r["gpu"])
        gpus, seq, mbs = _int(r, "num_gpus"), _int(r, "seq_len"), _int(r, "micro_batch")
        gbs = _int(r, "global_batch_tokens") // seq
        model = llmc_gpt2(r["model"], layers, seq)
        training = llmc_training(seq, gbs, profile)
        fixed = dict(tp=1, pp=1, cp=1, ep=1, mbs=mbs, zero=1, recompute=Recompute.NONE)
        notes = (NATIVE_NOTE, "an approximate ('~') step time in a script comment") + (
            (LLMC_ATTENTION_NOTE,) if training.attention_kernel is AttentionKernel.FA2 else ())
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {}, "step s",
                        _num(r, "step_time_s"), category(profile, False),
                        (source, f"gpt-2 d{layers}", profile.name, gpus, seq),
                        notes, small_kernel=True))
    return out


def sdpa_kernel(method: str, profile: HardwareProfile, cudnn_forced: bool = False) -> AttentionKernel:
    """The kernel PyTorch's F.scaled_dot_product_attention runs, from the PyTorch version the row states and the
    trainer's own backend switches: 2.5.0 put cuDNN attention first on sm90 ('enabled by default for all users of SDPA
    on H100 or newer GPUs', PyTorch 2.5 release blog); pytorch#138522, cherry-picked into 2.5.1, made it opt-in
    again, so 2.4 and 2.5.1 onwards (up to the cuDNN 9.15 threshold of later releases) run the flash backend
    (FlashAttention-2) unless the trainer opts in (`cudnn_forced`: enable_cudnn_sdp(True), enable_flash_sdp(False))."""
    cudnn = "cudnn" in compute_model.attention_kernels_of(profile)
    if cudnn and (cudnn_forced or "PyTorch 2.5.0" in method):
        return AttentionKernel.CUDNN
    return AttentionKernel.FA2


MODDED_NANOGPT_CUDNN_SINCE = "2024-11-03"
"""The first record whose trainer forces cuDNN attention: from records/track_1_short/2024-11-03_UntieEmbed on, the
source printed at the top of each record's log sets enable_cudnn_sdp(True), enable_flash_sdp(False),
enable_mem_efficient_sdp(False) ('CUDNN attention is ~4ms faster than Flash, but doesn't get selected by default in
PyTorch 2.5.1'); the earlier logs (2024-10-10_Muon .. 2024-10-18_PyTorch25) leave the backend order alone
(KellerJordan/modded-nanogpt at the records' logs)."""


def record_date(row: dict) -> str:
    """The record's date (YYYY-MM-DD) from the log path the row cites ('records/track_1_short/2024-11-03_...'), or
    ''."""
    found = re.search(r"records/track_\w+/(\d{4}-\d{2}-\d{2})_", row.get("notes", "") + row.get("source_table", ""))
    return found.group(1) if found else ""


MODDED_NANOGPT_LOSS_NOTE = ("the loss inside torch.compile: Inductor fuses upcast, log-softmax and NLL into one "
                            "two-loop reduction over the bf16 logits forward and one kernel backward that writes the "
                            "bf16 gradient, the bytes of the xentropy kernel (4 + 4 per logit)")
MODDED_NANOGPT_NOTES = (
    "modded-nanogpt: a torch.compile'd GPT, DDP over 8 ranks (engine pytorch, launch compile), PyTorch SDPA with "
    "its default backend order of the row's PyTorch, or cuDNN where the record's trainer forces it (sdpa_kernel, "
    "MODDED_NANOGPT_CUDNN_SINCE)",
    MODDED_NANOGPT_LOSS_NOTE,
    "Muon's Newton-Schulz iterations priced as Adam: ~1.5 TFLOP per step for the 124M model before record 6 spread "
    "them over the ranks, ~2% of the step (derived)",
    "architecture tweaks of the record (rotary, QK-norm, ReLU^2, value/skip connections) priced as a GPT of the same "
    "width and depth")


def modded_nanogpt() -> "list[Case | Unexpressed]":
    """modded-nanogpt speedrun records on 8 H100 (README tables and the records' logs). Record 1 is llm.c (engine
    native). Records 4-11 train a 124M-class GPT at 64 x 1024 tokens per rank with dense causal attention; record 12
    onwards packs one 64K-token sequence per rank with FlexAttention block masks whose windows the rows do not state,
    and the medium track likewise; the 1.5B scale-up is the 10/18/24 trainer at 52 layers x 1536."""
    source, out = "modded-nanogpt", []
    for r in _read("modded_nanogpt_speedrun_8xh100.csv"):
        label = r["model"][:60]
        profile, _, _ = gpu_profile(r["gpu"])
        seq, hidden, layers, heads = _int(r, "seq_len"), _int(r, "hidden"), _int(r, "layers"), _int(r, "heads")
        step = _num(r, "step_time_s")
        if step is None or hidden is None or seq is None:
            out.append(Unexpressed(source, r["row_id"], label, "no logged step time or architecture"))
            continue
        if seq > 1024 and "1.5B" not in r["model"]:
            out.append(Unexpressed(source, r["row_id"], label, "FlexAttention over a packed 64K-token sequence with "
                                                               "sliding-window block masks: the windows, and so the "
                                                               "attention's work, are not stated"))
            continue
        gpus = _int(r, "num_gpus")
        gbs = _int(r, "global_batch_tokens") // seq
        if "llm.c" in r["method"]:
            model = llmc_gpt2(r["model"], layers, seq)
            training, notes, mbs, zero = llmc_training(seq, gbs, profile), (NATIVE_NOTE,), _int(r, "micro_batch"), 1
        else:
            heads = heads or 12
            model = dataclasses.replace(gpt(r["model"], hidden, layers, heads, LLMC_VOCAB, seq), linear_bias=False,
                                        dropout=0.0)
            training = TrainingSpec(seq_len=seq, global_batch_size=gbs, engine=Engine.PYTORCH,
                                    launch=LaunchPath.COMPILE,
                                    attention_kernel=sdpa_kernel(r["method"], profile,
                                                                 record_date(r) >= MODDED_NANOGPT_CUDNN_SINCE),
                                    cross_entropy=CrossEntropyKernel.XENTROPY)   # MODDED_NANOGPT_LOSS_NOTE
            notes, mbs, zero = MODDED_NANOGPT_NOTES, _int(r, "micro_batch"), 0
        fixed = dict(tp=1, pp=1, cp=1, ep=1, mbs=mbs, zero=zero, recompute=Recompute.NONE)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {}, "step s", step,
                        category(profile, False),
                        # one model and engine a group: llm.c's record, the 124M-class records, the 1.5B scale-up
                        (source, f"d{hidden} L{layers}", profile.name, gpus, seq, training.engine.value), notes,
                        small_kernel=True))
    return out


TINYLLAMA_NOTE = ("TinyLlama: lit-gpt under Lightning Fabric's FSDP (engine pytorch, full sharding assumed), "
                  "FlashAttention-2, fused RMSNorm, SwiGLU, RoPE and cross entropy (xentropy), no recompute")


def tinyllama() -> "list[Case | Unexpressed]":
    """TinyLlama README: 24k tokens/s per A100-40G for the 1.1B model, 16k tokens per GPU per micro-batch (8 x 2048),
    2M tokens per step on 16 GPUs; the GPU-hour rows are run averages quoted second-hand."""
    source, out = "tinyllama", []
    for r in _read("tinyllama_pythia_a100_readme.csv"):
        label = f"{r['model']} {r['gpu']}"
        if r["row_id"] != "1":
            out.append(Unexpressed(source, r["row_id"], label, "a run-level GPU-hour average over 300B tokens "
                                                               "(quoted second-hand, no layout of the measured run)"))
            continue
        profile, _, _ = gpu_profile(r["gpu"])
        seq, gpus = _int(r, "seq_len"), _int(r, "num_gpus")
        model = ModelSpec(name="tinyllama-1.1b", hidden_size=_int(r, "hidden"), num_layers=_int(r, "layers"),
                          num_attention_heads=_int(r, "heads"), num_kv_heads=_int(r, "kv_heads"),
                          ffn_hidden_size=_int(r, "ffn"), vocab_size=32000, max_position_embeddings=seq)
        training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"), engine=Engine.PYTORCH,
                                attention_kernel=AttentionKernel.FA2, cross_entropy=CrossEntropyKernel.XENTROPY,
                                fused_kernels=True)
        fixed = dict(tp=1, pp=1, cp=1, ep=1, mbs=8, zero=3, recompute=Recompute.NONE)
        step = training.tokens_per_step / (_num(r, "tokens_per_s_per_gpu") * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {},
                        "tokens/s/GPU", step, category(profile, False), (source, r["model"], profile.name, gpus, seq),
                        (TINYLLAMA_NOTE, "vocabulary 32000 (Llama 2's tokenizer, the README's)",
                         "micro-batch 8 from the README's 16k tokens per GPU"), small_kernel=True))
    return out


def ms_swift() -> "list[Case | Unexpressed]":
    """ms-swift's Megatron-SWIFT benchmark on A800: Qwen3-30B-A3B full-parameter SFT, Megatron-Core (TP2 SP EP8,
    grouped GEMM, full recompute of every layer, distributed optimizer; MSWIFT_MEGATRON_NOTE) against transformers +
    DeepSpeed ZeRO-3 (Hugging Face's per-expert loop; MSWIFT_DEEPSPEED_NOTE); packed 8192-token samples, 16 a step,
    so the tokens per step are an upper bound, priced full. The dense Qwen2.5-14B rows state neither layout nor
    batch."""
    source, out = "ms-swift", []
    model = preset("qwen3-30b-a3b")
    for r in _read("ms_swift_megatron_vs_deepspeed_a800.csv"):
        label = f"{r['model'][:30]} {r['method'][:40]}"
        step = _num(r, "step_time_s")
        if step is None:
            out.append(Unexpressed(source, r["row_id"], label, "no measurement (out of memory)"))
            continue
        if not r["model"].startswith("Qwen3-30B-A3B"):
            out.append(Unexpressed(source, r["row_id"], label, "layout, micro-batch and global batch not stated"))
            continue
        profile, why, _ = gpu_profile(r["gpu"])
        if profile is None:
            out.append(Unexpressed(source, r["row_id"], label, why))
            continue
        gpus, seq = _int(r, "num_gpus"), _int(r, "seq_len")
        cluster = _cluster(profile, gpus)
        if "DeepSpeed" in r["method"]:
            training = TrainingSpec(seq_len=seq, global_batch_size=16, engine=Engine.DEEPSPEED,
                                    expert_gemm=ExpertGemm.LOOP, cross_entropy=CrossEntropyKernel.UNFUSED,
                                    zero3_moe_leaf=False)        # MSWIFT_DEEPSPEED_NOTE
            fixed = dict(tp=1, pp=1, cp=1, ep=1, mbs=1, zero=3, recompute=Recompute.FULL)
            notes = (MSWIFT_DEEPSPEED_NOTE, MSWIFT_PACKING_NOTE)
        else:
            training = TrainingSpec(seq_len=seq, global_batch_size=_int(r, "global_batch_seqs"),
                                    expert_gemm=ExpertGemm.CUBLAS, cross_entropy=CrossEntropyKernel.FUSED)
            fixed = dict(tp=_int(r, "tp"), pp=1, cp=1, ep=_int(r, "ep"), etp=_int(r, "tp"), mbs=_int(r, "micro_batch"),
                         sp=True, zero=1, recompute=Recompute.FULL)
            notes = (MSWIFT_MEGATRON_NOTE, MSWIFT_PACKING_NOTE)
        out.append(Case(source, r["row_id"], label, model, cluster, training, fixed, {}, "step s", step, "MoE",
                        (source, "qwen3-30b-a3b", profile.name, gpus, seq), notes, routing=ROUTING_DROPLESS,
                        small_kernel=True))
    return out


MSWIFT_PACKING_NOTE = "16 packed samples of up to 8192 tokens a step, priced full (the source's upper bound)"
MSWIFT_MEGATRON_NOTE = ("Megatron-SWIFT: Megatron-Core with TE, TP2 with sequence parallelism, EP8, expert TP = TP "
                        "(Megatron's default), grouped GEMM, full recompute of every layer, distributed optimizer, "
                        "fused cross entropy")
MSWIFT_DEEPSPEED_NOTE = ("transformers + DeepSpeed ZeRO-3: Hugging Face's Qwen3MoeSparseMoeBlock loops over the "
                         "128 experts (engine deepspeed, expert GEMMs loop); at the commit that recorded 91.2 s/it "
                         "(ms-swift ad907793e, 2025-04-29) swift set no ZeRO-3 leaf module (its "
                         "_deepspeed_set_z3_leaf_modules came in 35663af60, 2025-10) and transformers 4.51 looped over "
                         "every expert, so each expert linear was fetched by hooks of its own (zero3_moe_leaf off); "
                         "every GPU a data-parallel rank of "
                         "micro-batch 1, gradient checkpointing (swift's default), batch as the Megatron row's "
                         "(the source: 'assumed comparable')")


DEEPEP_TITAN_NOTES = ("torchtitan: FSDP2 + EP 8, torch.compile, grouped-mm experts, forced load balance",
                      "micro-batch = the local batch size; global batch = local batch x GPUs")


def torchtitan_deepep() -> "list[Case | Unexpressed]":
    """torchtitan PR #2500's DeepEP README: Qwen3-30B-A3B on 8-128 B200, FSDP over every GPU + EP 8, seq 4096, full
    activation checkpointing, torch.compile, forced load balance; tokens/s per GPU (row 8: the default all-to-all
    baseline at EP 8; row 7 ran out of memory)."""
    source, out = "torchtitan-deepep", []
    model = preset("qwen3-30b-a3b")
    for r in _read("torchtitan_deepep_qwen3_30b_a3b_b200.csv"):
        gpus, seq = _int(r, "num_gpus"), _int(r, "seq_len")
        deepep = "DeepEP" in r["method"] and "no DeepEP" not in r["method"]
        label = f"Qwen3-30B-A3B x{gpus} lbs{r['micro_batch'] or '?'} {'DeepEP' if deepep else 'all-to-all'}"
        rate = _num(r, "tokens_per_s_per_gpu")
        if rate is None:
            out.append(Unexpressed(source, r["row_id"], label, "no measurement (out of memory)"))
            continue
        profile, _, _ = gpu_profile(r["gpu"])
        notes = DEEPEP_TITAN_NOTES
        mbs = _int(r, "micro_batch")
        if mbs is None:
            mbs, notes = 8, notes + ("local batch 8 (the PR config's, not restated for this row)",)
        training = TrainingSpec(seq_len=seq, global_batch_size=mbs * gpus, engine=Engine.TORCHTITAN,
                                launch=LaunchPath.COMPILE, expert_gemm=ExpertGemm.GROUPED,
                                moe_dispatcher="deepep" if deepep else "alltoall",
                                attention_kernel=AttentionKernel.CUDNN, cross_entropy=CrossEntropyKernel.UNFUSED)
        fixed = dict(tp=1, pp=1, cp=1, ep=_int(r, "ep"), etp=1, mbs=mbs, zero=3, recompute=Recompute.FULL)
        step = training.tokens_per_step / (rate * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {},
                        "tokens/s/GPU", step, "MoE",
                        # a group compares layouts: the dispatcher is software, so each has its own group
                        (source, "qwen3-30b-a3b", profile.name, gpus, seq, mbs, training.moe_dispatcher.value),
                        notes, routing=ROUTING_BALANCED, small_kernel=True))
    return out


LADDER_NOTES = (
    "torchtitan fork, FSDP2 over the remaining ranks, one logged step per configuration",
    "dropless token-choice routing priced balanced",
    "selective = torchtitan's per-op SAC (the fork's qwen3_30b_moe.toml: selective_ac_option 'op'), its save list "
    "of 2025-12 (models/qwen3/infra/parallelize.py _op_sac_save_list: no all-to-all, so the dispatch and combine "
    "re-run with the recompute and keep nothing: sac_saves_all_to_all off)",
    "compile on: the loss compiled with the model (toml [compile] components = ['model', 'loss']), Inductor's fused "
    "log-softmax + NLL on the bf16 logits priced as the single-kernel loss (MODDED_NANOGPT_LOSS_NOTE)")


def logged_memory_gib(notes: str) -> float:
    """The GiB of torchtitan's logged `memory: 116.82GiB (83.61%)` as a row's notes quote it (0 if none)."""
    found = re.search(r"memory:? ([0-9.]+) ?GiB", notes)
    return float(found.group(1)) if found else 0.0


def torchtitan_h200_ladder() -> "list[Case | Unexpressed]":
    """A user's torchtitan tuning ladder for Qwen3-30B-A3B on one 8-H200 node (torchtitan's logged tokens/s per GPU):
    FSDP2 over the ranks beside TP / EP / ETP; Experiments 2 and 3 do not restate their layout."""
    source, out = "torchtitan-h200-ladder", []
    model = preset("qwen3-30b-a3b")
    for r in _read("torchtitan_fork_qwen3_30b_a3b_h200_ladder.csv"):
        label = f"Qwen3-30B-A3B {r['source_table']}"
        if _num(r, "tp") is None or _num(r, "ep") is None:
            out.append(Unexpressed(source, r["row_id"], label, "parallel layout not restated for this experiment"))
            continue
        profile, _, _ = gpu_profile(r["gpu"])
        gpus, seq, lbs = _int(r, "num_gpus"), _int(r, "seq_len"), _int(r, "micro_batch")
        tp, ep, etp = _int(r, "tp"), _int(r, "ep"), _int(r, "etp")
        compiled = "compile on" in r["method"]
        training = TrainingSpec(seq_len=seq, global_batch_size=lbs * gpus // tp, engine=Engine.TORCHTITAN,
                                launch=LaunchPath.COMPILE if compiled else LaunchPath.EAGER,
                                expert_gemm=ExpertGemm.GROUPED, attention_kernel=AttentionKernel.FA2,
                                # LADDER_NOTES: the loss compiled with the model; the fork's SAC save list
                                cross_entropy=engine_loss(Engine.TORCHTITAN, compiled),
                                sac_saves_all_to_all=False)
        recompute = Recompute.FULL if r["recompute"] == "full" else Recompute.SELECTIVE
        fixed = dict(tp=tp, pp=1, cp=1, ep=ep, etp=etp, mbs=lbs, zero=3, recompute=recompute, sp=tp > 1)
        step = training.tokens_per_step / (_num(r, "tokens_per_s_per_gpu") * gpus)
        out.append(Case(source, r["row_id"], label, model, _cluster(profile, gpus), training, fixed, {},
                        "tokens/s/GPU", step, "MoE", (source, "qwen3-30b-a3b", profile.name, gpus, seq),
                        LADDER_NOTES, routing=ROUTING_DROPLESS, small_kernel=True,
                        logged_reserved_bytes=logged_memory_gib(r["notes"]) * 2**30))
    return out

def all_rows() -> "list[Case | Unexpressed]":
    rows: list = []
    rows += llm_foundry() + megatron_readme() + megascale() + nemotron() + zero_bubble() + torchtitan() + torchao()
    rows += mixtral_readme() + moe_folding() + modelzoo() + internevo()
    rows += refused_file("glm130b_2210.02414.csv", "glm-130b", "FFN width, heads and vocabulary not stated; "
                                                               "run-level MFU with PaLM's formula")
    rows += refused_file("opt175b_2205.01068.csv", "opt-175b", "TP degree not stated; 'up to' peak figure")
    rows += refused_file("skywork_moe_2406.06563.csv", "skywork-moe", "model shapes, sequence length and batch "
                                                                      "not stated")
    rows += refused_file("deepseek_v3_2412.19437.csv", "deepseek-v3",
                         "DualPipe schedule not modelled (bidirectional pipeline overlapping forward and backward "
                         "chunks); run average over a batch ramp 3072 -> 15360; micro-batch not stated")
    rows += dsv3_gb200()
    rows += modded_nanogpt() + llmc_scripts() + tinyllama() + ms_swift() + torchtitan_deepep() + torchtitan_h200_ladder()
    return rows


# ---- prediction ----------------------------------------------------------------------------------------------------

def predict(case: Case) -> "Result | None":
    choice = choose_plan(case)
    if choice is None:
        return None
    return Result(case, choice.plan, choice.step_s, choice.fits, choice.peak_memory_bytes)


# ---- statistics ----------------------------------------------------------------------------------------------------

def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return num / den if den else float("nan")


@dataclass
class Summary:
    mape: float
    max_err: float
    bias: float
    rows: int


def summarise(results: list[Result]) -> Summary:
    return _summary([r.error_pct for r in results])


def _summary(errors: list[float]) -> Summary:
    if not errors:
        return Summary(float("nan"), float("nan"), float("nan"), 0)
    return Summary(statistics.fmean(abs(e) for e in errors), max(abs(e) for e in errors), statistics.fmean(errors),
                   len(errors))


def group_stats(results: list[Result]) -> list[tuple[tuple, int, int, float, float]]:
    """(group key, runs, runs autopar tells apart, Spearman or nan, top-1 regret %) for every group of >= 2 runs;
    Spearman where >= 3 of its runs differ in their layout or in the model or training autopar prices
    (autopar.calibrate.from_runs.same_run_groups, as benchmarks/fit_runs.py tells them apart)."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault(r.case.group, []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        measured = [m.measured_token_s for m in members]
        predicted = [m.predicted_token_s for m in members]
        distinct = len(same_run_groups([m.case for m in members], [m.plan for m in members]))
        rho = spearman(measured, predicted) if distinct >= 3 else float("nan")
        chosen = members[min(range(len(members)), key=lambda i: predicted[i])]
        regret = 100.0 * (chosen.measured_token_s / min(measured) - 1.0)
        out.append((key, len(members), distinct, rho, regret))
    return out


# ---- report --------------------------------------------------------------------------------------------------------

def run(verbose: bool = False) -> dict:
    rows = all_rows()
    results: list[Result] = []
    refused: list[Unexpressed] = [r for r in rows if isinstance(r, Unexpressed)]
    for case in (r for r in rows if isinstance(r, Case)):
        result = predict(case)
        if result is None:
            refused.append(Unexpressed(case.source, case.row_id, case.label, "no buildable layout matches"))
        else:
            results.append(result)
    if verbose:
        print(f"{'source':<22} {'row':<52} {'metric':<16} {'meas s':>9} {'pred s':>9} {'err %':>7} "
              f"{'fits':>4}  plan")
        for r in results:
            print(f"{r.case.source:<22} {r.case.label[:52]:<52} {r.case.metric[:16]:<16} "
                  f"{r.case.measured_step_s:>9.3f} {r.predicted_step_s:>9.3f} {r.error_pct:>+7.1f} "
                  f"{'yes' if r.fits else 'NO':>4}  {r.plan.short()}")
        print()
    print(f"{'source':<22} {'rows':>5} {'MAPE %':>8} {'max %':>8} {'bias %':>8} {'groups':>7} {'rho med':>8} "
          f"{'regret %':>9}")
    sources = sorted({r.case.source for r in results})
    all_groups = group_stats(results)
    for source in sources:
        members = [r for r in results if r.case.source == source]
        s = summarise(members)
        g = [x for x in all_groups if x[0][0] == source]
        rhos = [x[3] for x in g if not math.isnan(x[3])]
        rho = f"{statistics.median(rhos):>8.2f}" if rhos else f"{'-':>8}"
        regret = f"{statistics.fmean(x[4] for x in g):>9.1f}" if g else f"{'-':>9}"
        print(f"{source:<22} {s.rows:>5} {s.mape:>8.1f} {s.max_err:>8.1f} {s.bias:>+8.1f} {len(g):>7} {rho} {regret}")
    print()
    # over memory: the published layout does not fit autopar's memory model (no candidate left free fits either)
    print(f"{'category':<22} {'rows':>5} {'MAPE %':>8} {'max %':>8} {'bias %':>8} {'over memory':>12}")
    per_category = {}
    for name in CATEGORIES:
        members = [r for r in results if in_category(r.case, name)]
        s = summarise(members)
        per_category[name] = s
        figures = f"{s.mape:>8.1f} {s.max_err:>8.1f} {s.bias:>+8.1f}" if s.rows else f"{'-':>8} {'-':>8} {'-':>8}"
        print(f"{name:<22} {s.rows:>5} {figures} {sum(not r.fits for r in members):>12}")
    print()
    routing_table(results)
    print()
    convention_table(results)
    print()
    memory = memory_table(results)
    print()
    reserved_rows, reserved_under = reserved_table(results)
    print()
    print(f"groups (one model on one cluster, >= 2 runs): {len(all_groups)}")
    for key, n, distinct, rho, regret in all_groups:
        label = " ".join(str(k) for k in key[1:])
        print(f"  {label[:70]:<70} n={n:<3} distinct={distinct:<3} rho={'  -  ' if math.isnan(rho) else f'{rho:+.2f}'} "
              f"regret={regret:5.1f}%")
    print()
    reasons: dict[str, list[Unexpressed]] = {}
    for u in refused:
        reasons.setdefault(f"{u.source}: {u.reason}", []).append(u)
    print(f"not expressible: {len(refused)} rows")
    for reason, members in sorted(reasons.items()):
        ids = ",".join(u.row_id for u in members)
        print(f"  {len(members):>4}  {reason}  [rows {ids if len(ids) < 60 else ids[:57] + '...'}]")
    overall = summarise(results)
    rhos = [x[3] for x in all_groups if not math.isnan(x[3])]
    rho_median = statistics.median(rhos) if rhos else float("nan")
    regret_mean = statistics.fmean(x[4] for x in all_groups) if all_groups else float("nan")
    print()
    print("fidelity-runs-categories: " + " ".join(
        f"{name.replace(' ', '_')}=" + (f"{s.mape:.1f}%" if s.rows else "none(0 rows)")
        for name, s in per_category.items()))
    print(f"fidelity-runs-memory: mape={memory.mape:.1f}% max={memory.max_err:.1f}% rows={memory.rows}")
    print(f"fidelity-runs-reserved: rows={reserved_rows} at_or_under_reserved={reserved_under}")
    print(f"fidelity-runs: mape={overall.mape:.1f}% max={overall.max_err:.1f}% rows={overall.rows} "
          f"spearman_median={rho_median:.2f} regret_mean={regret_mean:.1f}%")
    return dict(results=results, refused=refused, overall=overall, per_category=per_category,
                spearman_median=rho_median, regret_mean=regret_mean, groups=all_groups, memory=memory)


def routing_table(results: list[Result]) -> None:
    """The MoE rows by how their source routed tokens (ROUTINGS): the capped and forced-balance rows price a balanced
    MoE layer, the dropless rows add a router imbalance no source states."""
    print(f"{'MoE by routing':<30} {'rows':>5} {'MAPE %':>8} {'max %':>8} {'bias %':>8}")
    for routing in ROUTINGS:
        s = summarise([r for r in results if r.case.routing == routing])
        figures = f"{s.mape:>8.1f} {s.max_err:>8.1f} {s.bias:>+8.1f}" if s.rows else f"{'-':>8} {'-':>8} {'-':>8}"
        print(f"{routing:<30} {s.rows:>5} {figures}")


def convention_table(results: list[Result]) -> None:
    """The rows read with a causal formula their source does not state (full_matrix_step_s), by source and sequence
    length, under that reading and under the full-matrix one (FOLDING_FLOP_READING: the wrong reading's error
    tracks the attention share, which grows with the sequence)."""
    inferred = [r for r in results if r.case.full_matrix_step_s]
    print(f"{'FLOP formula not stated':<32} {'rows':>5} {'causal: MAPE %':>14} {'bias %':>8}   "
          f"{'full matrix: MAPE %':>19} {'bias %':>8}")
    for source, seq in sorted({(r.case.source, r.case.training.seq_len) for r in inferred}):
        members = [r for r in inferred if (r.case.source, r.case.training.seq_len) == (source, seq)]
        used = summarise(members)
        full = _summary([100.0 * (r.predicted_step_s - r.case.full_matrix_step_s) / r.case.full_matrix_step_s
                         for r in members])
        print(f"{source[:20] + f' seq {seq}':<32} {used.rows:>5} {used.mape:>14.1f} {used.bias:>+8.1f}   "
              f"{full.mape:>19.1f} {full.bias:>+8.1f}")


def memory_errors(results: list[Result]) -> list[float]:
    return [r.memory_error_pct for r in results if r.case.measured_peak_memory_bytes]


def memory_table(results: list[Result]) -> Summary:
    """Predicted peak memory per GPU (the worst stage) against the figure the source reports, for the rows that
    report one in a comparable form (Zero Bubble Table 4, GB; torchtitan and torchao report the caching allocator's
    reserved GiB, which no model of tensors predicts, and are left out). Under it, the same rows priced with
    FlashAttention: the evidence for the attention the Zero Bubble rows are priced with (ZERO_BUBBLE_ATTENTION_NOTE)."""
    print(f"{'peak memory vs published':<26} {'rows':>5} {'MAPE %':>8} {'max %':>8} {'bias %':>8}")
    with_memory = [r for r in results if r.case.measured_peak_memory_bytes]
    for source in sorted({r.case.source for r in with_memory}):
        members = [r for r in with_memory if r.case.source == source]
        s = _summary(memory_errors(members))
        print(f"{source:<26} {s.rows:>5} {s.mape:>8.1f} {s.max_err:>8.1f} {s.bias:>+8.1f}")
        flash = [_flash_attention_memory_error_pct(r) for r in members if not r.case.training.flash_attention]
        if flash:
            f = _summary(flash)
            print(f"{'  (with FlashAttention)':<26} {f.rows:>5} {f.mape:>8.1f} {f.max_err:>8.1f} {f.bias:>+8.1f}")
    return _summary(memory_errors(with_memory))


def reserved_table(results: list[Result]) -> "tuple[int, int]":
    """Rows that log torchtitan's reserved memory: autopar's peak of allocated tensors (the predicted peak less the
    profile's fixed overheads, which live outside PyTorch's allocator) against it. Reserved memory is the allocated
    peak plus the allocator's slack, so a prediction above it over-counts; well below it, the slack or a miss.
    Returns (rows, rows predicted at or under the reserved figure)."""
    rows = [r for r in results if r.case.logged_reserved_bytes]
    print(f"{'allocated peak vs torchtitan reserved':<60} {'reserved GiB':>13} {'predicted GiB':>14} {'ratio':>6}")
    under = 0
    for r in rows:
        overheads = sum(float(v[0]) for v in fixed_overheads_bytes(r.case.cluster, 1).values())
        predicted = (r.predicted_peak_memory_bytes - overheads) / 2**30
        reserved = r.case.logged_reserved_bytes / 2**30
        under += predicted <= reserved
        print(f"{r.case.source + ' ' + r.case.label:<60.60} {reserved:>13.1f} {predicted:>14.1f} "
              f"{predicted / reserved:>6.2f}")
    return len(rows), under


def _flash_attention_memory_error_pct(result: Result) -> float:
    training = dataclasses.replace(result.case.training, flash_attention=True)
    peak, _, _ = peak_memory(result.case.model, result.case.cluster, training, PlanArrays.from_plans([result.plan]))
    measured = result.case.measured_peak_memory_bytes
    return 100.0 * (float(peak[0]) - measured) / measured


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every row")
    args = parser.parse_args(argv)
    run(verbose=args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
