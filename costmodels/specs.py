"""Frozen, validated specifications of the model, the cluster and the training run.

Base units inside: counts, bytes, seconds, FLOP/s. Conversion from GiB / TFLOP/s / Gb/s happens at the edges
(profile YAML parsing, CLI), never here. Validation lives in `__post_init__`, with the numbers in the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from costmodels.errors import InputError, require, require_non_negative_int, require_positive_int
from costmodels.hardware import HardwareProfile
import costmodels.limits as limits


class MlpKind(str, enum.Enum):
    """Shape of the feed-forward block."""

    GATED = "gated"
    """SwiGLU / GeGLU: gate, up and down projections, 3·h·F weights (Llama, Mistral, Qwen, DeepSeek)."""
    PLAIN = "plain"
    """GELU MLP: up and down projections, 2·h·F weights (GPT-2/3, Megatron GPT, BLOOM)."""
    SQUARED_RELU = "squared_relu"
    """relu(x)² MLP, no gate: up and down projections, 2·h·F weights (Nemotron-4, arXiv 2402.16819 §2;
    Megatron --squared-relu)."""


class NormKind(str, enum.Enum):
    """Normalisation layer; decides the per-norm parameter count."""

    RMSNORM = "rmsnorm"
    """Scale only: h parameters."""
    LAYERNORM = "layernorm"
    """Scale and bias: 2·h parameters."""


class PositionEmbedding(str, enum.Enum):
    ROPE = "rope"
    """Rotary: no parameters."""
    LEARNED = "learned"
    """Learned absolute table of max_position_embeddings × h (GPT-2/3, Megatron GPT)."""
    ALIBI = "alibi"
    """Attention biases linear in distance (Press et al., arXiv 2108.12409; BLOOM): no parameters."""


ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
"""Megatron-Core's moe_router_score_function values."""


@dataclass(frozen=True)
class RouterSpec:
    """How the router turns its logits into the weights of the chosen experts, in Megatron-Core's terms
    (TransformerConfig moe_router_*; megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function).
    The launch configs write it so the job routes the way the model was trained; cost terms read only where its
    group limit sends a token (num_groups, group_topk, group_by_max: the ranks and nodes DeepEP sends it to,
    comm.expected_destinations) and whether the weights multiply the input (probs_on_input: torchtitan's
    weighting pass, moe_kernels.torchtitan_token_movement_bytes)."""

    score_function: str = "softmax"
    """'softmax' (Mixtral, Qwen-MoE, DeepSeek-V2, GPT-OSS), 'sigmoid' (DeepSeek-V3 `scoring_func`, Llama 4) or
    'sqrtsoftplus'."""
    renormalised: bool = True
    """The chosen experts' weights rescaled to sum to 1 (Hugging Face `norm_topk_prob`; Mixtral and GPT-OSS always).
    A softmax router that does not is Megatron-Core's pre-softmax (`pre_softmax`)."""
    group_by_max: bool = False
    """Group-limited routing scores a group by its best expert (DeepSeek-V2's group_limited_greedy); Megatron-Core
    scores it by the sum of its top top_k / group_topk experts (DeepSeek-V3's noaux_tc)."""
    expert_bias: bool = False
    """Auxiliary-loss-free balancing: a per-expert bias added to the scores for the choice (DeepSeek-V3
    `topk_method: noaux_tc`)."""
    num_groups: int = 0
    """Group-limited routing: experts in `num_groups` groups, each token choosing among `group_topk` of them
    (DeepSeek `n_group`, `topk_group`); 0 = none."""
    group_topk: int = 0
    topk_scaling_factor: float = 1.0
    """Multiplier on the chosen weights (DeepSeek `routed_scaling_factor`)."""
    probs_on_input: bool = False
    """The weight multiplies the token before the expert, not the expert's output (Llama 4)."""

    @property
    def pre_softmax(self) -> bool:
        """Softmax over all experts before the top-k, the chosen weights kept as they are (Megatron-Core
        moe_router_pre_softmax)."""
        return self.score_function == "softmax" and not self.renormalised

    def __post_init__(self) -> None:
        require(self.score_function in ROUTER_SCORE_FUNCTIONS, "router_score_function",
                f"router score function {self.score_function!r}: use one of {', '.join(ROUTER_SCORE_FUNCTIONS)}")
        require_non_negative_int(self.num_groups, "router_num_groups")
        require_non_negative_int(self.group_topk, "router_group_topk")
        require((self.num_groups == 0) == (self.group_topk == 0), "router_group_topk",
                "give the router's groups and the groups each token chooses among together")
        require(self.group_topk <= self.num_groups, "router_group_topk",
                f"group_topk={self.group_topk} exceeds num_groups={self.num_groups}")
        require(isinstance(self.topk_scaling_factor, (int, float)) and not isinstance(self.topk_scaling_factor, bool)
                and 0.0 < self.topk_scaling_factor < 1e6, "router_topk_scaling_factor",
                f"routed scaling factor {self.topk_scaling_factor!r}: give a positive number")
        require(not self.expert_bias or self.score_function != "softmax", "router_expert_bias",
                "an expert bias needs sigmoid or sqrtsoftplus scores (Megatron-Core refuses it with softmax)")


@dataclass(frozen=True)
class MoESpec:
    """Routed mixture-of-experts feed-forward (GShard / Switch / DeepSeekMoE)."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    """Width of the shared-expert MLP (all shared experts together); 0 when there are none."""
    first_dense_layers: int = 0
    """The first k layers use a dense MLP (DeepSeek `first_k_dense_replace`)."""
    layer_freq: int = 1
    """Layer i (0-based, past the dense ones) is MoE when (i + 1) % layer_freq == 0 (Qwen2-MoE `decoder_sparse_step`)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE gates the shared expert with an h×1 projection."""
    router: RouterSpec = field(default_factory=RouterSpec)
    """How the chosen experts are weighted (launch configs only; see RouterSpec)."""

    def __post_init__(self) -> None:
        require_positive_int(self.num_experts, "num_experts")
        require_positive_int(self.top_k, "top_k")
        require_positive_int(self.expert_ffn_hidden_size, "moe_ffn_hidden_size")
        require_non_negative_int(self.num_shared_experts, "num_shared_experts")
        require_non_negative_int(self.shared_expert_ffn_hidden_size, "shared_expert_ffn_hidden_size")
        require_non_negative_int(self.first_dense_layers, "first_dense_layers")
        require_positive_int(self.layer_freq, "moe_layer_freq")
        for name, limit in (("num_experts", limits.MAX_NUM_EXPERTS), ("num_shared_experts", limits.MAX_NUM_EXPERTS),
                            ("expert_ffn_hidden_size", limits.MAX_FFN_HIDDEN_SIZE),
                            ("shared_expert_ffn_hidden_size", limits.MAX_FFN_HIDDEN_SIZE),
                            ("first_dense_layers", limits.MAX_NUM_LAYERS), ("layer_freq", limits.MAX_NUM_LAYERS)):
            limits.require_at_most(getattr(self, name), limit, name)
        require(self.top_k <= self.num_experts, "top_k",
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; lower top_k")
        require(isinstance(self.router, RouterSpec), "router", "give the router as a RouterSpec")
        if self.router.num_groups:
            require(self.num_experts % self.router.num_groups == 0, "router_num_groups",
                    f"num_experts={self.num_experts} does not split into {self.router.num_groups} router groups")
            eligible = self.router.group_topk * self.num_experts // self.router.num_groups
            require(self.top_k <= eligible, "router_group_topk",
                    f"top_k={self.top_k} exceeds the {eligible} experts of the {self.router.group_topk} chosen "
                    f"router groups; raise router_group_topk or lower top_k")
        require((self.num_shared_experts == 0) == (self.shared_expert_ffn_hidden_size == 0),
                "shared_expert_ffn_hidden_size",
                "give a shared-expert width exactly when num_shared_experts > 0")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary position embedding as the config states it (Hugging Face `rope_theta`, `rope_scaling` or
    `rope_parameters`, `partial_rotary_factor`). No cost term reads it: the launch configs write it so the job
    builds the model's positions."""

    theta: float = 10000.0
    """The base of the rotary frequencies."""
    scaling: str = ""
    """The frequency scaling's rope_type: '' none, 'llama3' (Llama 3.1 / 4), 'yarn' (DeepSeek-V3, GPT-OSS), ..."""
    factor: float = 0.0
    """The scaling factor (0 without scaling)."""
    low_freq_factor: float = 0.0
    high_freq_factor: float = 0.0
    original_max_positions: int = 0
    """llama3 / yarn: the context length the frequencies were trained for."""
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    """yarn's attention-scale terms (DeepSeek `mscale`, `mscale_all_dim`; absent: 1 and 0, Hugging Face's default
    attention factor 0.1·ln(factor) + 1)."""
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    """yarn's correction range (Hugging Face's defaults 32 and 1)."""
    round_to_int: bool = True
    """yarn rounds its correction range to whole dimensions (GPT-OSS `truncate: false` does not)."""
    rotary_fraction: float = 1.0
    """Share of each head's dimensions that rotate (Nemotron-4: 0.5)."""

    def __post_init__(self) -> None:
        require(isinstance(self.round_to_int, bool), "rope_scaling", "give truncate as true or false")
        for name in ("theta", "factor", "low_freq_factor", "high_freq_factor", "rotary_fraction", "mscale",
                     "mscale_all_dim", "beta_fast", "beta_slow"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1e12,
                    f"rope_{name}", f"rope {name}={value!r}: give a non-negative number")
        require(self.theta > 0, "rope_theta", f"rope_theta={self.theta!r} must be positive")
        require(0.0 < self.rotary_fraction <= 1.0, "partial_rotary_factor",
                f"partial_rotary_factor={self.rotary_fraction!r} must be in (0, 1]")
        require_non_negative_int(self.original_max_positions, "original_max_position_embeddings")
        require(isinstance(self.scaling, str), "rope_scaling", "give the rope scaling type as a string")


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention (arXiv 2405.04434 §2.1)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0
    """0 means queries are projected directly (DeepSeek-V2-Lite)."""

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            require_positive_int(getattr(self, name), name)
        require_non_negative_int(self.q_lora_rank, "q_lora_rank")
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"):
            limits.require_at_most(getattr(self, name), limits.MAX_HIDDEN_SIZE, name)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


LEARNED_POSITIONS_DROPOUT = 0.1
"""Dropout of a model with learned absolute positions that does not state its own: Megatron-LM's --attention-dropout
and --hidden-dropout default, GPT-2's resid_pdrop / attn_pdrop."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory and time are concerned."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    """Dense MLP width (for MoE models: the width of the dense first layers)."""
    vocab_size: int
    num_kv_heads: int = 0
    """0 means equal to num_attention_heads (MHA)."""
    head_dim: int = 0
    """0 means hidden_size // num_attention_heads."""
    mlp: MlpKind = MlpKind.GATED
    norm: NormKind = NormKind.RMSNORM
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    max_position_embeddings: int = 0
    tied_embeddings: bool = False
    qkv_bias: bool = False
    """Bias on the Q, K, V projections (Qwen2)."""
    linear_bias: bool = False
    """Bias on every linear layer (GPT-2/3, Megatron GPT)."""
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    num_mtp_layers: int = 0
    """DeepSeek-V3 multi-token-prediction modules (each: two norms, a 2h→h projection and one transformer layer)."""
    rope: RopeSpec | None = None
    """Rotary positions as stated (launch configs only); None: learned or ALiBi positions, or a spec built in code."""
    qk_layernorm: bool = False
    """Norms on the queries and keys before attention (Qwen3's q_norm / k_norm; MLA's latent q / kv norms), launch
    configs only (Megatron --qk-layernorm)."""
    qk_l2_norm: bool = False
    """An L2 norm without weights on the queries and keys of the RoPE layers (Llama 4 `use_qk_norm`), launch configs
    only (Megatron --qk-l2-norm)."""
    nope_layer_interval: int = 0
    """Every k-th layer has no position encoding (Llama 4's NoPE layers, `no_rope_layer_interval`); 0 = none.
    Launch configs only (Megatron --no-rope-freq)."""
    sliding_window: int = 0
    """Tokens a sliding-window attention layer looks back over; 0 = none (GPT-OSS: 128)."""
    sliding_window_layers: int = 0
    """How many of the layers use the sliding window (GPT-OSS alternates sliding and full: half of them)."""
    attention_chunk_size: int = 0
    """Tokens of one attention chunk for layers that attend only within their chunk of the sequence (Llama 4's
    `attention_chunk_size`, 8192: its RoPE layers); 0 = none."""
    chunked_attention_layers: int = 0
    """How many of the layers attend within chunks (Llama 4: three of every four; every fourth, a NoPE layer, attends
    over the whole sequence)."""
    dropout: float | None = None
    """Attention and hidden dropout probability (Megatron's --attention-dropout / --hidden-dropout; Hugging Face
    resid_pdrop, attn_pdrop, embd_pdrop, attention_dropout, hidden_dropout: the largest). None: as the position
    embedding suggests: 0.1 with learned positions (GPT-2/3, Megatron GPT's default), 0 otherwise (Llama, Qwen,
    DeepSeek, BLOOM configs: 0). Resolved when the spec is built: dataclasses.replace keeps it."""
    source: str = field(default="", compare=False)
    """Where the spec came from (preset name, path, HF id): for reports only."""

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and self.name != "", "name", "give the model a non-empty name")
        for name in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "vocab_size"):
            require_positive_int(getattr(self, name), name)
        for name in ("num_kv_heads", "head_dim", "max_position_embeddings", "num_mtp_layers", "sliding_window",
                     "sliding_window_layers", "attention_chunk_size", "chunked_attention_layers", "nope_layer_interval"):
            require_non_negative_int(getattr(self, name), name)
        for name, limit in (("hidden_size", limits.MAX_HIDDEN_SIZE), ("num_layers", limits.MAX_NUM_LAYERS),
                            ("num_attention_heads", limits.MAX_NUM_HEADS), ("num_kv_heads", limits.MAX_NUM_HEADS),
                            ("head_dim", limits.MAX_HEAD_DIM), ("ffn_hidden_size", limits.MAX_FFN_HIDDEN_SIZE),
                            ("vocab_size", limits.MAX_VOCAB_SIZE), ("num_mtp_layers", limits.MAX_NUM_LAYERS)):
            limits.require_at_most(getattr(self, name), limit, name)
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.head_dim == 0:
            require(self.hidden_size % self.num_attention_heads == 0, "head_dim",
                    f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                    f"{self.num_attention_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        require(self.num_attention_heads % self.num_kv_heads == 0, "num_kv_heads",
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads="
                f"{self.num_kv_heads}")
        if self.position_embedding is PositionEmbedding.LEARNED:
            require(self.max_position_embeddings > 0, "max_position_embeddings",
                    "learned position embeddings need max_position_embeddings > 0")
        if self.dropout is None:
            object.__setattr__(self, "dropout", LEARNED_POSITIONS_DROPOUT
                               if self.position_embedding is PositionEmbedding.LEARNED else 0.0)
        require(isinstance(self.dropout, (int, float)) and not isinstance(self.dropout, bool)
                and 0.0 <= self.dropout < 1.0, "dropout", f"dropout={self.dropout!r}: give a probability in [0, 1)")
        require(self.sliding_window_layers <= self.num_layers, "sliding_window_layers",
                f"sliding_window_layers={self.sliding_window_layers} exceeds num_layers={self.num_layers}")
        require((self.sliding_window == 0) == (self.sliding_window_layers == 0), "sliding_window",
                "give a sliding window exactly when some layers use one")
        limits.require_at_most(self.attention_chunk_size, limits.MAX_SEQ_LEN, "attention_chunk_size", " tokens")
        require((self.attention_chunk_size == 0) == (self.chunked_attention_layers == 0), "attention_chunk_size",
                "give an attention chunk size exactly when some layers attend within chunks")
        require(self.sliding_window_layers + self.chunked_attention_layers <= self.num_layers,
                "chunked_attention_layers",
                f"sliding_window_layers={self.sliding_window_layers} + chunked_attention_layers="
                f"{self.chunked_attention_layers} exceed num_layers={self.num_layers}")
        if self.moe is not None:
            require(self.moe.first_dense_layers <= self.num_layers, "first_dense_layers",
                    f"first_dense_layers={self.moe.first_dense_layers} exceeds num_layers={self.num_layers}")

    # ---- derived shape -------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def q_size(self) -> int:
        """Width of all query heads together (a·d); equals hidden_size for standard MHA."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.qk_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of all key (or value) heads together (g·d)."""
        return self.num_kv_heads * self.head_dim

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether decoder layer `layer_index` (0-based) has a routed-expert MLP."""
        if self.moe is None or layer_index < self.moe.first_dense_layers:
            return False
        return (layer_index + 1) % self.moe.layer_freq == 0

    def num_separate_norms(self, moe_layer: bool) -> int:
        """Norms of a decoder layer that Megatron-Core's Transformer Engine layer spec runs as modules of their own
        (models/gpt/gpt_layer_specs.py): the input norm only under MLA (otherwise it is fused into linear_qkv,
        TELayerNormColumnParallelLinear, and input_layernorm is IdentityOp), the pre-MLP norm only in a MoE layer
        (the router reads its output; a dense MLP fuses it into fc1). `--recompute-modules layernorm` recomputes
        these only (transformer_layer.py: `if not isinstance(self.input_layernorm, IdentityOp)`)."""
        return int(self.mla is not None) + int(moe_layer)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers


class Precision(str, enum.Enum):
    """Compute precision of the GEMMs. Weights are bf16, gradients and Adam states fp32 in both (Megatron)."""

    BF16 = "bf16"
    """bf16 mixed precision."""
    FP8 = "fp8"
    """fp8 GEMMs via Transformer Engine (H100 and later); master weights and optimizer as for bf16. How the tensors
    are scaled is TrainingSpec.fp8_recipe."""


class Fp8Recipe(str, enum.Enum):
    """How Transformer Engine scales the FP8 tensors (Megatron-Core `--fp8-recipe`, TransformerConfig.fp8_recipe,
    default 'delayed'; megatron/core/fp8_utils.py maps each to a transformer_engine.common.recipe class). Each quantizes
    a linear layer's inputs in its own kernels (costmodels.compute.fp8_cast_bytes_per_element prices them) and runs
    on its own GPUs (HardwareProfile.require_fp8_recipe, after TE's pytorch/quantization.py checks)."""

    DELAYED = "delayed"
    """DelayedScaling: one scale per tensor from the amax history of earlier steps, so the cast needs no pass of its
    own to find the amax (it updates the history in the same kernel); the amaxes a pass recorded are all-reduced over
    the stage's ranks when it leaves the fp8 autocast (costmodels.steptime.fp8_delayed_amax_reduction_s)."""
    TENSORWISE = "tensorwise"
    """Float8CurrentScaling: one scale per tensor from this tensor's own amax, found by a separate reduction kernel
    before the cast (TE csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax, then
    nvte_quantize), and with sequence parallelism all-reduced over the TP group first."""
    BLOCKWISE = "blockwise"
    """Float8BlockScaling (DeepSeek-V3's): an fp32 scale per 1×128 block of activations and gradients (128×128 of
    weights), found inside the cast kernel; Hopper and later with CUDA 12.9 (on Blackwell TE runs it through MXFP8's
    GEMMs with power-of-2 scales)."""
    MXFP8 = "mxfp8"
    """MXFP8BlockScaling (OCP microscaling): an E8M0 scale per 32 elements, applied by the tensor cores; Blackwell
    (compute capability 10.x) only."""

    @property
    def block_scaled(self) -> bool:
        """Scales per block along one axis (mxfp8, blockwise): a tensor's two layouts are two quantized copies."""
        return self in (Fp8Recipe.MXFP8, Fp8Recipe.BLOCKWISE)


FP8_SCALE_BYTES_PER_ELEMENT = {Fp8Recipe.MXFP8: 1.0 / 32.0, Fp8Recipe.BLOCKWISE: 4.0 / 128.0}
"""Scale bytes each FP8 copy of a tensor carries: MXFP8 an E8M0 byte per 32 elements (OCP Microscaling Formats v1.0
§5.2; TE MXFP8BlockScaling), block scaling an fp32 per 1×128 block of activations and gradients (TE
Float8BlockScaling, the recipe of DeepSeek-V3, arXiv 2412.19437 §3.3.2); the per-tensor recipes one scale a tensor,
nothing per element."""


FP8_WEIGHT_SCALE_BYTES_PER_ELEMENT = {**FP8_SCALE_BYTES_PER_ELEMENT, Fp8Recipe.BLOCKWISE: 4.0 / (128 * 128)}
"""The same for a weight: block scaling scales one per 128×128 block (TE Float8BlockScaling w_block_scaling_dim 2;
DeepSeek-V3 §3.3.2), MXFP8 per 32 elements as for any tensor."""


def fp8_copy_bytes_per_element(recipe: Fp8Recipe, weight: bool = False) -> float:
    """Bytes per element of one FP8 copy of a tensor (a `weight`) under `recipe`: the byte and its share of the
    scales."""
    scales = FP8_WEIGHT_SCALE_BYTES_PER_ELEMENT if weight else FP8_SCALE_BYTES_PER_ELEMENT
    return 1.0 + scales.get(recipe, 0.0)


class AttentionKernel(str, enum.Enum):
    """The fused attention kernel the core runs (costmodels.compute.attention_efficiency prices each with its own
    measured curve); ignored without flash attention."""

    AUTO = "auto"
    """What Megatron-Core's default (--attention-backend auto) gets from Transformer Engine: cuDNN fused attention on
    Hopper and later, FlashAttention-2 on Ampere (compute.resolve_attention_kernel)."""
    FA2 = "fa2"
    """FlashAttention-2 (flash_attn 2.x, PyTorch SDPA's flash backend; mma.sync on every GPU since Ampere)."""
    FA1 = "fa1"
    """FlashAttention (v1, flash_attn 0.x/1.x CUDA kernels); priced on A100 only, from FlashAttention-2's curve."""
    FA_TRITON = "fa_triton"
    """FlashAttention in Triton (flash-attention's flash_attn_triton.py, copied into llm-foundry as MPT's
    `attn_impl: triton`); priced on A100 only, from FlashAttention-2's curve."""
    FA3 = "fa3"
    """FlashAttention-3 (flash_attn_3 / hopper; wgmma + TMA, sm90 only)."""
    CUDNN = "cudnn"
    """cuDNN fused attention (TE FusedAttention = --attention-backend fused, PyTorch SDPA's cuDNN backend)."""


class MoEDispatcher(str, enum.Enum):
    """How a MoE layer's tokens reach their experts' GPUs (Megatron-Core --moe-token-dispatcher-type, with
    --moe-flex-dispatcher-backend for `flex`); costmodels.steptime.ep_all_to_all_one_s prices each."""

    ALLTOALL = "alltoall"
    """NCCL all-to-all over the EP group (alltoall dispatcher): top_k copies of a token, one per routed expert."""
    DEEPEP = "deepep"
    """DeepEP's normal kernels (flex dispatcher, deepep backend): a token crosses to another node once per
    destination node over RDMA and is forwarded to that node's expert GPUs over NVLink (DeepEP README, 'kernels
    for asymmetric-domain bandwidth forwarding'); inside a node as the all-to-all."""


class ExpertGemm(str, enum.Enum):
    """How a MoE layer's routed-expert GEMMs run on a GPU (costmodels.compute prices each)."""

    CUBLAS = "cublas"
    """One cuBLAS GEMM per local expert: Megatron-Core's --moe-grouped-gemm through Transformer Engine's
    GroupedLinear, whose grouped GEMM is nvte_multi_stream_cublas_gemm (TE PR #853, v1.9: 'Grouped GEMM ... via
    multi-stream cuBLAS'; pytorch/csrc/extensions/gemm.cpp: 'For now, we only have multi-stream cublas backend'; the
    single-launch cuBLASLt grouped path of later TE is opt-in, NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM=1), and
    its SequentialMLP (a TE Linear per expert): each expert's GEMM on the dense curve at its own shape."""
    GROUPED = "grouped"
    """One grouped kernel over all local experts (torchtitan's torch._grouped_mm, a CUTLASS grouped GEMM; DeepGEMM):
    the grouped-GEMM roofline fitted to DeepGEMM's grouped tables (costmodels.moe_kernels)."""
    LOOP = "loop"
    """A Python loop over the experts, each an eager MLP on the tokens routed to it (Hugging Face transformers'
    eager MoE blocks, e.g. Qwen3MoeSparseMoeBlock; DeepSpeed-MoE's Experts): the GEMMs as cublas, and per expert a
    host synchronisation (`torch.where` on the routing mask has a data-dependent size) and its own launches
    (costmodels.engines)."""


class Engine(str, enum.Enum):
    """The software that runs the step: which kernels it launches for a layer, from where (Python, C++, a compiled
    graph), and where it makes the host wait for the GPU (costmodels.engines prices each; costmodels.host the
    timeline). The GPU's arithmetic is the same in every engine; the host's share is not."""

    MEGATRON = "megatron"
    """Megatron-Core with Transformer Engine (Megatron-LM, NeMo 2, Megatron-Bridge, verl's Megatron backend)."""
    TORCHTITAN = "torchtitan"
    """torchtitan: FSDP2 (fully_shard per block), DTensor TP, torch._grouped_mm experts, torch.compile per block."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's engine over an eager PyTorch model (Hugging Face transformers, Megatron-DeepSpeed): ZeRO's
    per-module parameter fetch hooks, its pipeline engine's blocking stage-to-stage transfers."""
    PYTORCH = "pytorch"
    """A plain PyTorch training loop (DDP or FSDP, eager modules, nanoGPT / Hugging Face style), no framework."""
    NATIVE = "native"
    """A trainer written in CUDA C/C++ (llm.c): every kernel launched from C, no Python on the host path."""


class LaunchPath(str, enum.Enum):
    """How the engine's kernels reach the GPU (costmodels.host.HostCosts prices each path)."""

    EAGER = "eager"
    """One launch per op as the Python code runs it (TE's modules and C++ kernels under Megatron-Core)."""
    COMPILE = "compile"
    """torch.compile'd blocks (torchtitan's compile.enable, a compiled nanoGPT): Inductor's fused Triton kernels
    launched from its generated Python wrapper, one guarded graph call per block and pass."""
    CUDA_GRAPH = "cuda_graph"
    """Megatron-Core CUDA graphs (--cuda-graph-impl transformer_engine / local): the captured modules replay as one
    graph each (--cuda-graph-modules; none named = the whole layer)."""


CUDA_GRAPH_IMPLS = ("transformer_engine", "local")
"""Megatron-Core's per-layer capture paths (--cuda-graph-impl): Transformer Engine's make_graphed_callables driven by
TECudaGraphHelper, or Megatron-Core's own CudaGraphManager (transformer/cuda_graphs.py). They capture the same
modules and replay them alike; they differ in the static inputs they keep (memory.cuda_graph_attention_masks_bytes)."""

CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
"""Megatron-Core 0.19's --cuda-graph-modules choices for a transformer layer (transformer_config.py
cuda_graph_modules; 'mamba' has no layer here)."""


OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                   "fused_group_mlp")
"""Megatron-Core's fine-grained activation offloading modules (transformer_config.py offload_modules; Megatron-LM
--offload-modules): each moves what its module saves for the backward (its input, and for core_attn the attention
kernel's saved tensors) to host memory (memory.offloaded_bytes_per_layer)."""

OFFLOAD_INSIDE_MOE = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})
"""The offload modules inside the routed experts, which recompute module `moe` leaves nothing to offload in."""


class CrossEntropyKernel(str, enum.Enum):
    """The softmax cross-entropy's kernels over the logits (costmodels.compute.LOSS_BYTES_PER_LOGIT prices the bytes
    each moves; costmodels.memory.logits_bytes keeps what each saves for the backward)."""

    FUSED = "fused"
    """Megatron-Core's fused vocab-parallel cross entropy (--cross-entropy-loss-fusion; Megatron-Bridge's and NeMo
    2's default): a few jit-fused kernels, the bf16 logits kept."""
    UNFUSED = "unfused"
    """Megatron-Core's vocab-parallel cross entropy without the fusion (Megatron-LM's default), or PyTorch's eager
    F.cross_entropy on upcast logits (torchtitan): one kernel per op on an fp32 copy of the logits, which is kept."""
    XENTROPY = "xentropy"
    """apex's softmax_xentropy kernel (flash-attn's `flash_attn.losses.cross_entropy` over xentropy_cuda_lib;
    llm-foundry's default `loss_fn: fused_crossentropy` for MPT): one kernel each way on the bf16 logits -- the
    forward reads them twice (max and sum, then the sum of exponentials), the backward reads them and writes the
    gradient -- with the bf16 logits kept."""


class PipelineSchedule(str, enum.Enum):
    """The pipeline schedule the stages run (costmodels.pipeline prices its bubble, costmodels.memory the micro-batches
    each rank holds). The zero-bubble schedules split each backward into B (the activation gradient, on the critical
    path between stages) and W (the weight gradient, free to run later) and fill the pipeline's fill and drain
    with W passes (Qi et al., 'Zero Bubble Pipeline Parallelism', arXiv 2401.10241, ICLR 2024)."""

    ONE_F_ONE_B = "1f1b"
    """Megatron-Core's 1F1B (PipeDream-Flush), interleaved 1F1B when a plan has vpp > 1."""
    ZB_1P = "zb-1p"
    """The automatic zero-bubble schedule under a memory limit of p micro-batches of activations (1F1B's peak):
    sail-sg's Megatron-LM fork, --enable-zero-bubble --zero-bubble-max-pending-backward p. Not interleaved."""
    ZB_2P = "zb-2p"
    """The same under 2p micro-batches (--zero-bubble-max-pending-backward 2p), which the paper finds the least
    memory that reaches a bubble close to zero; with --enable-optimizer-post-validation. Not interleaved."""


MAX_NCCL_CTAS = 64
"""NCCL_MAX_CTAS accepts 1..64 (NCCL env.rst: 'up to 64 (32 prior to 2.25)'; src/include/device.h MAXCHANNELS)."""


DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH = 1024
"""TrainingSpec's sequence length and global batch (sequences) when not given; the CLI's defaults too."""


@dataclass(frozen=True)
class TrainingSpec:
    """The run: sequence length, global batch, precision and training-side switches."""

    seq_len: int = DEFAULT_SEQ_LEN
    global_batch_size: int = DEFAULT_GLOBAL_BATCH
    """Sequences per optimizer step."""
    precision: Precision = Precision.BF16
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """How the FP8 tensors are scaled (read with precision fp8 only): Megatron-Core's default, delayed scaling."""
    flash_attention: bool = True
    """Fused attention never materialises the a·s² score matrix (FlashAttention, TE fused attention)."""
    attention_kernel: AttentionKernel = AttentionKernel.AUTO
    """Which fused kernel (with flash_attention): auto (Megatron-Core / TE's choice), fa2, fa3, cudnn."""
    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.FUSED
    """The loss kernels: fused (Megatron --cross-entropy-loss-fusion), unfused (an fp32 copy of the logits, kept)
    or xentropy (apex / flash-attn's single-kernel loss)."""
    moe_capacity_factor: float | None = None
    """None: dropless routing (the busiest expert sets the pace). A float caps tokens per expert (GShard/Switch)."""
    moe_imbalance_factor: float = 1.0
    """Load on the busiest expert rank relative to a perfectly balanced one, with dropless routing (≥ 1)."""
    moe_pad_to_capacity: bool = False
    """Every expert padded to its capacity (Megatron-Core --moe-pad-expert-input-to-capacity, drop-and-pad): the
    dispatcher knows its split sizes on the host, so it never waits for the GPU (costmodels.engines); needs a
    capacity factor."""
    moe_dispatcher: MoEDispatcher = MoEDispatcher.ALLTOALL
    """Token dispatcher of the MoE layers: alltoall (NCCL) or deepep (DeepEP through the flex dispatcher)."""
    moe_hybridep: bool = False
    """The flex dispatcher runs DeepEP's HybridEP backend (--moe-flex-dispatcher-backend hybridep): its persistent
    NVLink buffers are priced (memory.moe_dispatcher_buffers_bytes); the exchange is priced as DeepEP's
    (moe_dispatcher deepep)."""
    moe_rank_capacity_factor: float | None = None
    """A static token budget per expert-parallel rank (Megatron-Core TransformerConfig.moe_expert_rank_capacity_factor,
    --moe-expert-rank-capacity-factor; the flex dispatcher's HybridEP and NCCL-EP backends): the tokens a rank's
    experts receive sit in buffers of num_tokens · top_k · factor rows, the tokens a balanced rank receives times
    the factor (token_dispatcher.py, _HybridEPManager.setup_metadata: `budget = padded_num_tokens *
    moe_router_topk * moe_expert_rank_capacity_factor`, rounded up to the quantization alignment), whatever the
    routing; tokens above it are dropped. None: buffers sized by the tokens routed (dropless)."""
    moe_paged_stash_factor: float | None = None
    """Megatron-Core's paged stash of the routed experts' saved activations (TransformerConfig.moe_paged_stash,
    --moe-paged-stash, which needs moe_rank_capacity_factor): the grouped MLP's tensors saved for the backward, each
    the rank's budget long, are copied into one paged CUDA buffer sized this factor
    (moe_paged_stash_buffer_size_factor_cuda, default 1.10) times the expected tokens (budget / rank capacity factor)
    summed over the layer-micro-batches in flight (transformer/moe/paged_stash.py: allocate_stash_buffers sizes it
    from max_avg_tokens_across_vp_stages, the running sum of avg_num_tokens that on_save_for_backward records over
    the schedule; a negative factor sizes it from the actual tokens, which balanced routing makes the same: its
    magnitude is given here); what overflows goes to a pinned host buffer. None: no stash."""
    expert_gemm: ExpertGemm = ExpertGemm.CUBLAS
    """How the routed experts' GEMMs run: cublas (a cuBLAS GEMM per expert, Megatron-Core with Transformer Engine)
    or grouped (one grouped kernel, torchtitan's torch._grouped_mm)."""
    # Communication overlap, as the framework runs it. Defaults are Megatron-LM's: off for
    # DistributedDataParallelConfig.overlap_grad_reduce / overlap_param_gather, ModelParallelConfig.tp_comm_overlap
    # and overlap_moe_expert_parallel_comm; on for the interleaved schedule's P2P (overlap_p2p_comm, see below).
    overlap_grad_reduce: bool = False
    """Reduce gradients bucket by bucket during the backward pass (--overlap-grad-reduce); off: after it."""
    overlap_param_gather: bool = False
    """All-gather the distributed optimizer's updated parameters during the next forward (--overlap-param-gather,
    needs overlap_grad_reduce); off: right after the optimizer step."""
    tp_comm_overlap: bool = False
    """Split the sequence-parallel all-gather / reduce-scatter into chunks pipelined with the linear layers' GEMMs
    (--tp-comm-overlap, Transformer Engine userbuffers; needs sequence parallelism)."""
    moe_a2a_overlap: bool = False
    """Overlap the expert-parallel all-to-all of one micro-batch with the computation of another
    (--overlap-moe-expert-parallel-comm)."""
    grad_reduce_in_fp32: bool = True
    """Accumulate the main gradients and reduce them over the data-parallel group in fp32, 4 bytes per parameter
    (Megatron-LM's default for bf16: validate_args sets accumulate_allreduce_grads_in_fp32, which becomes
    DistributedDataParallelConfig.grad_reduce_in_fp32; NeMo's and Megatron-Bridge's bf16 presets set it). False:
    the gradient buffer and its reduce-scatter / all-reduce in bf16, 2 bytes (--grad-reduce-in-bf16; NeMo
    MegatronMixedPrecision(grad_reduce_in_fp32=False); Megatron-Bridge's performance recipes, perf_recipes/
    _common.py `cfg.ddp.grad_reduce_in_fp32 = False`; FSDP MixedPrecision(reduce_dtype=bfloat16), llm-foundry's
    mixed_precision PURE, torchtitan's mixed_precision_reduce = "bfloat16")."""
    fp8_param_gather: bool = False
    """Keep the weights as Transformer Engine fp8 tensors, with no bf16 copy, and all-gather them over data parallel
    in fp8 (Megatron-LM --fp8-param-gather, TransformerConfig.fp8_param; NeMo's and Megatron-Bridge's fp8 presets
    set it, their MXFP8 ones with reuse_grad_buf_for_mxfp8_param_ag). Each weight is then stored in the layouts
    Transformer Engine would otherwise cache beside the bf16 one: under the distributed optimizer the per-tensor
    recipes' uint8 parameter buffer and, on a TN-only GPU, the transpose made after the gather, block scaling's
    rowwise and columnwise data (Megatron-Core fp8_utils.post_all_gather_processing); under Megatron-FSDP one
    layout, MXFP8 two (memory.layer_weight_bytes_per_param). What a gather carries: `param_gather_bytes_by_zero`.
    Needs fp8 (TransformerConfig: 'fp8_param must be used together with fp8 mode') and the distributed optimizer or
    FSDP, zero >= 1 (validate_args; rule fp8_param_gather)."""
    pipeline_schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    """The pipeline schedule (PipelineSchedule): 1f1b (Megatron-Core's, interleaved with vpp > 1), zb-1p or zb-2p."""
    overlap_p2p_comm: bool = True
    """Leave the interleaved schedule's steady-state stage-to-stage sends in flight beside the next chunk's compute
    (Megatron-LM's default since 2023-10-12, commit 4eeff55d1f 'Make overlap_p2p_comm the default';
    --no-overlap-p2p-communication turns it off; NeMo's MegatronCommOverlapCallback and Megatron-Bridge's
    CommOverlapConfig set it for vpp > 1). Only the interleaved schedule has it (pipeline.overlaps_p2p; which
    transfers it hides: pipeline.p2p_transfer_counts); off: every transfer blocks, as in Megatron before then."""
    p2p_scatter_gather: bool = False
    """Megatron-LM's pipeline scatter/gather of the stage-to-stage activation without sequence parallelism (arXiv
    2104.04473 §4.1: each TP rank sends 1/tp of the replicated tensor and the receiving stage all-gathers it over
    its TP group): on by default in Megatron-LM's megatron/p2p_communication.py (--no-scatter-gather-tensors-in-
    pipeline turned it off) until p2p_communication.py moved into Megatron-Core (39b83c7, 2023-01-31), which sends
    each rank's whole tensor (schedules.py get_tensor_shapes divides the sequence by tp only under sequence
    parallelism). Off for today's Megatron-Core; on to price runs of the Megatron-LM before (pipeline.p2p_bytes)."""
    engine: Engine = Engine.MEGATRON
    """The software that runs the step (Engine): its launches and host synchronisations are priced
    (costmodels.engines, the `host` term)."""
    launch: LaunchPath = LaunchPath.EAGER
    """How its kernels are launched: eager, compile (torch.compile'd blocks) or cuda_graph (Megatron-Core)."""
    cuda_graph_modules: tuple[str, ...] = ()
    """With launch cuda_graph: the modules of a layer captured (CUDA_GRAPH_MODULES; empty = the whole layer)."""
    cuda_graph_full_iteration: bool = False
    """With launch cuda_graph: the whole forward-backward captured as one graph (Megatron-Core's --cuda-graph-impl
    full_iteration), priced as every module of every layer captured; unlike per-layer graphs it takes full
    recompute (rule cuda_graph_recompute)."""
    dataloader_attention_mask: bool = True
    """The data loader builds each sample's (1, s, s) causal mask (Megatron-Core GPTDatasetConfig.create_attention_mask,
    on by default; Megatron-LM's --no-create-attention-mask-in-dataloader, Megatron-Bridge's
    dataset.create_attention_mask turn it off): kept for every micro-batch by a whole-iteration CUDA graph's static
    buffers (memory.cuda_graph_loader_batches_bytes); an eager step reads one batch at a time."""
    dataloader_on_every_rank: bool = False
    """The data loader is built on every pipeline rank (Megatron-Bridge: data/utils.py builds the dataset on every
    rank, "TP-replicated loading"), so a whole-iteration CUDA graph keeps the step's batches on every rank; off:
    Megatron-LM's pretrain_gpt.py is_dataset_built_on_rank, tensor-parallel rank 0 of the first and last stages."""
    cuda_graph_impl: str = "transformer_engine"
    """With launch cuda_graph and per-layer capture: which of Megatron-Core's capture paths (CUDA_GRAPH_IMPLS) runs
    it; transformer_engine keeps an attention mask among each in-flight layer's static inputs
    (memory.cuda_graph_attention_masks_bytes)."""
    fused_kernels: bool = False
    """The model code's norms, RoPE and activations are fused kernels (apex / Transformer Engine / xformers /
    flash-attn / Liger ops, one kernel each, as Megatron-Core runs them) rather than eager PyTorch ops: the elementwise
    HBM traffic of a Megatron-Core layer (costmodels.engines.elementwise_bytes_per_token). Eager engines only
    (pytorch, deepspeed)."""
    zero3_serial_fetch: bool = False
    """DeepSpeed's ZeRO-3 as released in 2021 (v0.3.13-v0.5.10): every parameter all-gathered on its own after a
    torch.cuda.synchronize(), every submodule's fetch ending in another, no prefetch ahead of the compute
    (partition_parameters.py _allgather_param, stage3.py _synchronize_communication); from v0.6 the fetch is
    coalesced per module and prefetched. Engine deepspeed only."""
    zero3_moe_leaf: bool = True
    """DeepSpeed's ZeRO-3 over a Hugging Face MoE model (engine deepspeed, zero 3): the MoE block registered as a
    ZeRO-3 leaf module, so one coalesced all-gather brings every expert of the block (deepspeed.utils.
    set_z3_leaf_modules; ms-swift registers its MoE blocks since 2025-10, LlamaFactory likewise, and transformers'
    loop over the experts that received tokens needs it: ranks that route differently would fetch different experts
    and hang). Off: each expert linear fetched by hooks of its own (384 all-gathers a layer for 128 experts), as
    DeepSpeed ran transformers' loops over every expert before the frameworks set leaf modules. Priced in
    costmodels.engines._deepspeed_expert_fetch and costmodels.steptime.zero3_collectives_per_layer."""
    sac_saves_all_to_all: bool = True
    """Under torchtitan's per-op selective activation checkpointing (engine torchtitan, recompute selective:
    costmodels.engines.per_op_sac), whether the policy keeps the MoE all-to-all outputs: torchtitan's default save
    set has `_c10d_functional.all_to_all_single` among its comm ops since the per-model lists were centralised
    (#2357, 2026-03; torchtitan 0.3.0 distributed/activation_checkpoint.py _get_default_save_ops), so the dispatched
    and combined tokens stay stored and are not sent again in the backward; the per-model lists before it
    (Qwen3's `_op_sac_save_list`, models/qwen3/infra/parallelize.py in 2025-12) did not name it: the all-to-alls
    re-run with the recompute and nothing of theirs is kept. Engine torchtitan only."""
    optimizer_state_bytes: tuple[int, int, int] = (4, 4, 4)
    """Bytes per parameter of the optimizer's (master weights, Adam first moment, Adam second moment): fp32 each,
    Megatron-Core's default. Megatron-Core's precision-aware optimizer (OptimizerConfig.use_precision_aware_optimizer
    with main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype; Megatron-LM --use-precision-aware-optimizer
    --exp-avg-dtype ...) keeps them in those dtypes in Transformer Engine's FusedAdam (optimizer/__init__.py passes
    exp_avg_dtype, exp_avg_sq_dtype and master_weight_dtype); with bf16 weights and store_param_remainders (its
    default) an fp32 master weight is kept as the 16 bits the bf16 weight lacks, 2 bytes (distrib_optimizer.py:
    `init_shard(torch.int16)`), unless fp8 weights with a recipe other than delayed scaling leave the master weights
    to Megatron-Core (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8)."""
    deallocate_pipeline_outputs: bool = True
    """Free each pipeline stage's output once it is sent to the next stage, keeping only its autograd node
    (Megatron-Core ModelParallelConfig.deallocate_pipeline_outputs: schedules.py deallocate_output_tensor sets its
    .data to a scalar; Megatron-LM and Megatron-Bridge's GPT provider set it). False: every micro-batch a rank holds
    keeps its chunk's output until its backward (memory.pipeline_outputs_bytes)."""
    cpu_offload_layers: int = 0
    """Decoder layers whose activations Transformer Engine's CPU offloading moves to host memory (Megatron-Core
    TransformerConfig.cpu_offloading with cpu_offloading_num_layers, activations only: cpu_offloading_weights off;
    Megatron-LM --cpu-offloading-num-layers). The first N of the model's L layers are offloaded in the forward and
    reloaded in the backward, and 'at most (model_layers - num_layers) sets of activations are on GPU at any time'
    (Transformer Engine docs, features/other_optimizations/cpu_offloading, Default Offloading Scheduling;
    transformer_block.py passes num_layers=cpu_offloading_num_layers, model_layers=config.num_layers). Megatron-Core
    runs it only with pp = 1, no recompute and fewer than L layers (TransformerConfig.__post_init__; rule
    cpu_offloading). 0: none."""
    offload_modules: tuple[str, ...] = ()
    """Megatron-Core's fine-grained activation offloading (TransformerConfig.fine_grained_activation_offloading with
    offload_modules; Megatron-LM --fine-grained-activation-offloading --offload-modules, OFFLOAD_MODULES): the saved
    tensors of these modules go to pinned host memory on a side stream after each layer's forward and come back one
    layer ahead in its backward (pipeline_parallel/fine_grained_activation_offload.py). Priced in memory
    (memory.offloaded_bytes_per_layer) and in time where the copies outlast the layers they overlap
    (steptime.offload_copies_s, at the profile's host link). Empty: none.
    Megatron-Core refuses attn_proj without core_attn, fused_group_mlp with expert_fc1 or moe_act, and any of it
    with layer-wise cpu_offloading (TransformerConfig.__post_init__)."""
    offload_fraction: float = 1.0
    """With offload_modules: the share of their offload groups offloaded (Megatron-Core
    TransformerConfig.activation_offload_fraction, --activation-offload-fraction): per model chunk the first f of
    the groups in forward order go to the host and the later ones stay (fine_grained_activation_offload.py
    post_warmup_callback), priced as f of every layer's offloaded bytes and copies. 1: all."""
    defer_output_wgrad: bool = False
    """Defer the output layer's weight-gradient GEMMs to the pipeline flush (Megatron-Core
    ModelParallelConfig.defer_embedding_wgrad_compute, --defer-embedding-wgrad-compute; NeMo's
    MegatronCommOverlapCallback(defer_embedding_wgrad_compute=True) in its Nemotron-4 and GPT-3 performance recipes):
    the last pipeline rank keeps each micro-batch's output-layer input and logit gradient until then
    (memory.deferred_output_wgrad_bytes). Megatron-Core allows it only with pp > 1."""
    wgrad_deferral_limit: int = 0
    """With defer_output_wgrad, how many micro-batches are deferred (the others compute their weight gradient at
    once); 0 = all of them (ModelParallelConfig.wgrad_deferral_limit, --wgrad-deferral-limit)."""
    microbatch_group_size_per_vp_stage: int = 0
    """Micro-batches the interleaved schedule runs through one virtual stage before the next (Megatron-Core
    TransformerConfig.microbatch_group_size_per_vp_stage, --microbatch-group-size-per-virtual-pipeline-stage);
    0 = pp, Megatron-Core's default. Each rank warms up (vpp - 1) groups more than pp (schedules.py
    get_pp_rank_microbatches), so a larger group holds more micro-batches in flight
    (memory.in_flight_microbatches). Megatron-Core refuses a group outside [pp, micro-batches per step]."""
    nccl_ctas: int = 16
    """SMs one NCCL collective holds while it runs beside compute: NCCL launches one CTA (thread block, one SM)
    per channel, and an overlapped collective's CTAs take those SMs from the kernels beside it (NCCL env.rst,
    NCCL_MAX_CTAS: 'Increasing the number of CTAs will consume more GPU resources'). NCCL_DEBUG=INFO prints the
    count per communicator ('N coll channels'): 16 to 32 on 8-GPU H100 nodes; 16, the low end, is the default.
    NCCL_MAX_CTAS / NCCL_MIN_CTAS set it; 0 prices NCCL overlap as free (Transformer Engine's 16 userbuffer SMs
    under tp_comm_overlap stay, costmodels.steptime.TE_USERBUFFERS_SM_MARGIN)."""

    @property
    def optimizer_bytes_per_param(self) -> int:
        """Master weights + Adam m + v per parameter (12 in fp32; `optimizer_state_bytes`)."""
        return sum(self.optimizer_state_bytes)

    def __post_init__(self) -> None:
        require_positive_int(self.seq_len, "seq_len")
        require_positive_int(self.global_batch_size, "global_batch_size")
        limits.require_at_most(self.seq_len, limits.MAX_SEQ_LEN, "seq_len", " tokens")
        limits.require_at_most(self.global_batch_size, limits.MAX_GLOBAL_BATCH, "global_batch_size", " sequences")
        if not isinstance(self.precision, Precision):
            try:
                object.__setattr__(self, "precision", Precision(str(self.precision).lower()))
            except ValueError:
                raise InputError("precision", f"unknown precision {self.precision!r}; use bf16 or fp8") from None
        self._coerce_choice("fp8_recipe", Fp8Recipe, "fp8 recipe")
        self._coerce_choice("attention_kernel", AttentionKernel, "attention kernel")
        self._coerce_choice("moe_dispatcher", MoEDispatcher, "MoE token dispatcher")
        self._coerce_choice("expert_gemm", ExpertGemm, "expert GEMM kernel")
        self._coerce_choice("cross_entropy", CrossEntropyKernel, "cross-entropy kernel")
        self._coerce_choice("pipeline_schedule", PipelineSchedule, "pipeline schedule")
        self._coerce_choice("engine", Engine, "engine")
        self._coerce_choice("launch", LaunchPath, "launch path")
        modules = self.cuda_graph_modules
        require(isinstance(modules, (tuple, list, frozenset, set)) and all(m in CUDA_GRAPH_MODULES for m in modules),
                "cuda_graph_modules", f"must name modules among {', '.join(CUDA_GRAPH_MODULES)}, got {modules!r}")
        object.__setattr__(self, "cuda_graph_modules", tuple(m for m in CUDA_GRAPH_MODULES if m in modules))
        require(not self.cuda_graph_modules or self.launch is LaunchPath.CUDA_GRAPH, "cuda_graph_modules",
                "names the modules CUDA graphs capture; add --cuda-graph-impl transformer_engine (launch cuda_graph)")
        require(not self.cuda_graph_full_iteration or (self.launch is LaunchPath.CUDA_GRAPH
                                                       and not self.cuda_graph_modules),
                "cuda_graph_full_iteration", "captures the whole iteration: it goes with launch cuda_graph and no "
                                             "modules named (Megatron-Core: 'cuda_graph_modules must be empty when "
                                             "cuda_graph_impl=\"full_iteration\"')")
        require(self.cuda_graph_impl in CUDA_GRAPH_IMPLS, "cuda_graph_impl",
                f"must be one of {', '.join(CUDA_GRAPH_IMPLS)} (full_iteration: cuda_graph_full_iteration), got "
                f"{self.cuda_graph_impl!r}")
        require(self.launch is not LaunchPath.CUDA_GRAPH or self.engine is Engine.MEGATRON, "launch",
                f"CUDA-graph capture is priced for Megatron-Core's per-layer graphs only, not for {self.engine.value}; "
                "use launch eager or compile")
        require(self.launch is not LaunchPath.COMPILE or self.engine in (Engine.TORCHTITAN, Engine.PYTORCH,
                                                                         Engine.DEEPSPEED), "launch",
                f"torch.compile of whole blocks is not how {self.engine.value} runs (Megatron-Core compiles its "
                "small fusions itself, priced under eager); use launch eager")
        if self.moe_capacity_factor is not None:
            require(self.moe_capacity_factor > 0, "moe_capacity_factor",
                    f"must be > 0, got {self.moe_capacity_factor}")
        require(self.moe_imbalance_factor >= 1.0, "moe_imbalance_factor",
                f"must be >= 1, got {self.moe_imbalance_factor}")
        if self.moe_rank_capacity_factor is not None:
            require(isinstance(self.moe_rank_capacity_factor, (int, float))
                    and not isinstance(self.moe_rank_capacity_factor, bool) and self.moe_rank_capacity_factor > 0,
                    "moe_rank_capacity_factor", f"must be > 0, got {self.moe_rank_capacity_factor!r}")
        if self.moe_paged_stash_factor is not None:
            require(isinstance(self.moe_paged_stash_factor, (int, float))
                    and not isinstance(self.moe_paged_stash_factor, bool) and self.moe_paged_stash_factor >= 0,
                    "moe_paged_stash_factor", f"must be >= 0 (None: no paged stash), got "
                                              f"{self.moe_paged_stash_factor!r}")
        require(isinstance(self.moe_hybridep, bool) and (not self.moe_hybridep
                                                         or self.moe_dispatcher is MoEDispatcher.DEEPEP),
                "moe_hybridep", "HybridEP is a backend of the flex dispatcher; use --moe-dispatcher deepep")
        require(self.moe_rank_capacity_factor is None or self.moe_dispatcher is MoEDispatcher.DEEPEP,
                "moe_rank_capacity_factor", "a rank token budget is the flex dispatcher's (Megatron-Core "
                "TransformerConfig: 'moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend to be "
                "hybridep or ncclep'); use --moe-dispatcher deepep")
        require(self.moe_paged_stash_factor is None or self.moe_rank_capacity_factor is not None,
                "moe_paged_stash_factor", "the paged stash needs a rank capacity factor (Megatron-Core "
                "TransformerConfig: 'moe_paged_stash requires moe_expert_rank_capacity_factor to be set'); add "
                "--moe-expert-rank-capacity-factor")
        for name in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "moe_a2a_overlap",
                     "deallocate_pipeline_outputs", "overlap_p2p_comm", "p2p_scatter_gather", "grad_reduce_in_fp32",
                     "fp8_param_gather", "moe_pad_to_capacity", "zero3_serial_fetch", "fused_kernels",
                     "sac_saves_all_to_all", "cuda_graph_full_iteration", "zero3_moe_leaf",
                     "dataloader_attention_mask", "dataloader_on_every_rank"):
            require(isinstance(getattr(self, name), bool), name, f"must be true or false, got {getattr(self, name)!r}")
        require_non_negative_int(self.microbatch_group_size_per_vp_stage, "microbatch_group_size_per_vp_stage")
        require_non_negative_int(self.cpu_offload_layers, "cpu_offload_layers")
        offload = self.offload_modules
        require(isinstance(offload, (tuple, list, frozenset, set)) and all(m in OFFLOAD_MODULES for m in offload),
                "offload_modules", f"must name modules among {', '.join(OFFLOAD_MODULES)}, got {offload!r}")
        object.__setattr__(self, "offload_modules", tuple(m for m in OFFLOAD_MODULES if m in offload))
        offload = self.offload_modules
        require("attn_proj" not in offload or "core_attn" in offload, "offload_modules",
                "attn_proj offloads the output core_attn keeps too (Megatron-Core: 'attn_proj cannot be set to "
                "offload_modules alone without core_attn'); add core_attn")
        require("fused_group_mlp" not in offload or not {"expert_fc1", "moe_act"} & set(offload), "offload_modules",
                "fused_group_mlp offloads the whole routed MLP (Megatron-Core: 'cannot be combined with expert_fc1 "
                "or moe_act'); name one or the other")
        require(not offload or self.engine is Engine.MEGATRON, "offload_modules",
                f"fine-grained activation offloading is Megatron-Core's; {self.engine.value} has none")
        require(self.moe_paged_stash_factor is None or not OFFLOAD_INSIDE_MOE & set(offload), "offload_modules",
                "the paged stash holds the routed experts' activations (Megatron-Core: 'When moe_paged_stash is "
                "enabled, offload_modules must not include expert_fc1, moe_act, or fused_group_mlp'); drop them")
        fraction = self.offload_fraction
        require(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 <= fraction <= 1.0,
                "offload_fraction", f"must be a share from 0 to 1 (Megatron-Core: 'activation_offload_fraction must "
                                    f"be in range [0, 1]'), got {fraction!r}")
        require(fraction == 1.0 or offload, "offload_fraction",
                "is the share of the offload modules' groups offloaded; add --offload-modules")
        require(not offload or not self.cpu_offload_layers, "offload_modules",
                "fine-grained activation offloading cannot run with layer-wise CPU offloading (Megatron-Core: "
                "'fine_grained_activation_offloading cannot be enabled with cpu_offloading'); drop one")
        require(isinstance(self.defer_output_wgrad, bool), "defer_output_wgrad",
                f"must be true or false, got {self.defer_output_wgrad!r}")
        require_non_negative_int(self.wgrad_deferral_limit, "wgrad_deferral_limit")
        state = tuple(self.optimizer_state_bytes)
        require(len(state) == 3 and all(isinstance(b, int) and not isinstance(b, bool) and b in (1, 2, 4)
                                        for b in state), "optimizer_state_bytes",
                f"give (master weights, exp_avg, exp_avg_sq) bytes per parameter, each 1, 2 or 4; got {state!r}")
        object.__setattr__(self, "optimizer_state_bytes", state)
        require(isinstance(self.nccl_ctas, int) and not isinstance(self.nccl_ctas, bool)
                and 0 <= self.nccl_ctas <= MAX_NCCL_CTAS, "nccl_ctas",
                f"must be a whole number of SMs from 0 to {MAX_NCCL_CTAS} (NCCL_MAX_CTAS's range), got "
                f"{self.nccl_ctas!r}")
        require(self.precision is Precision.FP8 or not self.fp8_param_gather, "fp8_param_gather",
                "fp8 parameters need fp8 GEMMs (Megatron-Core TransformerConfig: 'fp8_param must be used together "
                "with fp8 mode'); add --precision fp8 or drop --fp8-param-gather")
        require(not self.moe_pad_to_capacity or self.moe_capacity_factor is not None, "moe_pad_to_capacity",
                "padding every expert to its capacity needs a capacity factor (Megatron-Core: "
                "'moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity'); add "
                "--moe-capacity-factor")
        require(not self.zero3_serial_fetch or self.engine is Engine.DEEPSPEED, "zero3_serial_fetch",
                "the 2021 ZeRO-3 fetch is DeepSpeed's (before v0.6); use it with engine deepspeed")
        require(self.overlap_grad_reduce or not self.overlap_param_gather, "overlap_param_gather",
                "overlap_param_gather needs overlap_grad_reduce (Megatron-LM validate_args: 'Must use "
                "--overlap-param-gather with --overlap-grad-reduce'); turn both on")

    def _coerce_choice(self, name: str, choices: type[enum.Enum], what: str) -> None:
        """Field `name` as a member of `choices` (a string such as 'FA2' or 'deepep' is read case-insensitively);
        anything else is an InputError listing the choices."""
        value = getattr(self, name)
        if isinstance(value, choices):
            return
        try:
            object.__setattr__(self, name, choices(str(value).lower()))
        except ValueError:
            raise InputError(name, f"unknown {what} {value!r}; use "
                                   f"{', '.join(member.value for member in choices)}") from None

    @property
    def fp8_scaling(self) -> "Fp8Recipe | None":
        """The recipe the fp8 GEMMs run (fp8_recipe), None in bf16."""
        return self.fp8_recipe if self.precision is Precision.FP8 else None

    @property
    def param_gather_bytes_by_zero(self) -> tuple[float, float, float, float]:
        """Bytes of one decoder-layer weight element in one data-parallel parameter all-gather, at zero 0, 1, 2, 3
        (zero 0 gathers nothing): bf16, 2, without fp8 parameters. With them (fp8_param_gather) one fp8 layout with
        its scales: the distributed optimizer's uint8 buffer (zero 1, param_and_grad_buffer.py `param_dtype =
        torch.uint8`) and Megatron-FSDP's (zero >= 2, megatron_fsdp/param_and_grad_buffer.py), the transpose made
        after the gather (fp8_utils.post_all_gather_processing, megatron_fsdp.py fp8_create_transpose_cache).
        MXFP8 differs: the distributed optimizer gathers it in bf16 through the gradient buffer (its
        `shared_buffer`, reuse_grad_buf_for_mxfp8_param_ag) and quantizes after (`_post_param_sync`); Megatron-FSDP
        keeps a rowwise and a transpose buffer and gathers both once a step at zero 2 (optim_grads), one a gather at
        zero 3 (the forward's rowwise, the backward's transpose: get_fsdp_buffer)."""
        recipe = self.fp8_scaling
        if not self.fp8_param_gather or recipe is None:
            return (2.0, 2.0, 2.0, 2.0)
        layout = fp8_copy_bytes_per_element(recipe, weight=True)
        if recipe is Fp8Recipe.MXFP8:
            return (2.0, 2.0, 2 * layout, layout)
        return (layout, layout, layout, layout)

    @property
    def gradient_bytes_per_param(self) -> int:
        """Bytes of one main-gradient element, in the gradient buffer and on the wire (grad_reduce_in_fp32)."""
        return 4 if self.grad_reduce_in_fp32 else 2

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


def job_nvlink_domain_gpus(num_gpus: int, gpus_per_node: int, profile_domain: int) -> int:
    """GPUs of a job in one NVLink domain when the user does not say: a node where NVLink stops at the node; on a
    multi-node NVLink system (GB200 NVL72, a domain of 72 GPUs on trays of 4) the largest whole number of nodes,
    at most one domain, that splits the job evenly — the job fills every domain it uses alike, as rank order
    (Megatron-Core's parallel_state: consecutive ranks, tp innermost) only keeps power-of-two groups inside a domain
    when each domain holds the same count (256 GPUs on NVL72 racks: 64 per rack, not 72 + 72 + 72 + 40)."""
    if profile_domain <= gpus_per_node or num_gpus <= gpus_per_node:
        return gpus_per_node
    if num_gpus <= profile_domain:
        return num_gpus
    return max(d for d in range(gpus_per_node, profile_domain + 1, gpus_per_node) if num_gpus % d == 0)


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs of one type, `gpus_per_node` to a node, `nvlink_domain_gpus` to one NVLink fabric (a node, or more on a
    multi-node NVLink system); NVLink inside a domain, InfiniBand between domains."""

    profile: HardwareProfile
    num_gpus: int
    gpus_per_node: int = 0
    """0 means the profile's default (8 for every bundled GPU)."""
    headroom: float = 0.2
    """Fraction of HBM kept free for fragmentation and framework overhead (the guide's 20%)."""
    nvlink_domain: int = 0
    """GPUs of this job on one NVLink fabric as stated (--nvlink-domain-gpus); 0 = by rule (`nvlink_domain_gpus`)."""

    def __post_init__(self) -> None:
        require_positive_int(self.num_gpus, "num_gpus")
        if isinstance(self.gpus_per_node, int):
            limits.require_at_most(self.gpus_per_node, limits.MAX_NUM_GPUS, "gpus_per_node", " GPUs")
        limits.require_at_most(self.num_gpus, limits.MAX_NUM_GPUS, "num_gpus", " GPUs")
        require_non_negative_int(self.gpus_per_node, "gpus_per_node")
        if self.gpus_per_node == 0:
            object.__setattr__(self, "gpus_per_node", min(self.profile.gpus_per_node, self.num_gpus))
        require(0.0 <= self.headroom < 1.0, "headroom", f"must be in [0, 1), got {self.headroom}")
        require(self.num_gpus <= self.gpus_per_node or self.num_gpus % self.gpus_per_node == 0, "num_gpus",
                f"num_gpus={self.num_gpus} is not a multiple of gpus_per_node={self.gpus_per_node}; "
                "use whole nodes or set --gpus-per-node")
        require_non_negative_int(self.nvlink_domain, "nvlink_domain_gpus")
        domain, largest = self.nvlink_domain_gpus, self._largest_nvlink_domain
        require(domain % self.gpus_per_node == 0 and self.gpus_per_node <= domain <= largest, "nvlink_domain_gpus",
                f"nvlink_domain_gpus={domain} must be whole nodes of {self.gpus_per_node} GPUs within one NVLink "
                f"domain of {largest} ({self.profile.name})")
        require(self.num_gpus <= domain or self.num_gpus % domain == 0, "nvlink_domain_gpus",
                f"num_gpus={self.num_gpus} is not a multiple of nvlink_domain_gpus={domain}; give the same number "
                "of GPUs in every NVLink domain")

    @property
    def _largest_nvlink_domain(self) -> int:
        """NVLink reaches beyond the node only where the profile says so (GB200 NVL72); elsewhere the node is the
        domain, whatever --gpus-per-node says."""
        profile = self.profile
        spans = profile.nvlink_domain_size > profile.gpus_per_node
        return max(profile.nvlink_domain_size if spans else 0, self.gpus_per_node)

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs of this job on one NVLink fabric: where collectives switch from NVLink to InfiniBand
        (costmodels.comm). As stated, else one node where NVLink stops at the node, or on a multi-node NVLink system
        (GB200 NVL72) the job's share of one domain by the rule of `job_nvlink_domain_gpus`."""
        return self.nvlink_domain or job_nvlink_domain_gpus(self.num_gpus, self.gpus_per_node,
                                                             self._largest_nvlink_domain)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def memory_limit_bytes(self) -> float:
        """Usable HBM per GPU: (1 - headroom) × capacity."""
        return (1.0 - self.headroom) * self.profile.hbm_bytes
