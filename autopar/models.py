"""Model loading: `load_model(source)` turns a bundled preset, a config.json, a model directory or a cached Hugging Face
id into a `ModelSpec`.

One mapping, `spec_from_config`, reads every source: a dict of Hugging Face config keys -> `ModelSpec`.

- Bundled presets (`autopar/presets/<name>.json`, real HF-style config.json files) are read as plain JSON, so loading
  one never imports transformers (fast CLI start-up).
- A user's config.json (a file, a model directory, or a snapshot in the local HF cache) is read as JSON too (bounded:
  a regular file of at most MAX_CONFIG_BYTES, nesting at most MAX_CONFIG_DEPTH deep), with the model type's own
  defaults for keys the file leaves out taken from `CONFIG_CLASS_DEFAULTS` (what transformers' config class would
  fill in; tests/test_models.py checks every entry against `AutoConfig`), so loading it never imports transformers.
  A supported type without an entry there is parsed with transformers `AutoConfig` (`config.to_dict()`): adding a
  model type is one line in SUPPORTED_MODEL_TYPES, and one more in CONFIG_CLASS_DEFAULTS for the fast path.
  A `model_type` transformers does not know falls back to the JSON itself, read the same way, as long as it
  declares a causal-LM architecture, with a warning (`UnknownModelTypeWarning`).
- Hugging Face ids are looked up in the local cache only (HF_HUB_OFFLINE=1); the network is used only with
  `allow_network=True`.

Which config keys mean what (the HF modeling files of each model type):
- llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, phi3: RMSNorm, rotary positions, gated (SwiGLU /
  GeGLU) MLP of `intermediate_size`; `num_key_value_heads` for GQA; `head_dim` when it is not hidden/heads.
  Qwen2 has a bias on Q, K, V (hard-coded in Qwen2Attention; `qkv_bias` in Qwen2-MoE), others `attention_bias`.
- MoE: routed experts `num_local_experts` (Mixtral) / `num_experts` (Qwen-MoE) / `n_routed_experts` (DeepSeek),
  `num_experts_per_tok`, expert width `moe_intermediate_size` (Mixtral: `intermediate_size`), shared experts
  `n_shared_experts` × `moe_intermediate_size` (DeepSeek) or one gated expert of `shared_expert_intermediate_size`
  (Qwen2-MoE), dense first layers `first_k_dense_replace` (DeepSeek) or `mlp_only_layers` (Qwen-MoE, a prefix only),
  MoE every `decoder_sparse_step` layers (Qwen-MoE).
- DeepSeek MLA: `q_lora_rank` (null: direct Q projection), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
  `v_head_dim`; multi-token prediction modules `num_nextn_predict_layers`.
- gpt2 (GPT-2/3 and the Megatron GPT shapes): `n_embd`, `n_layer`, `n_head`, `n_inner` (null: 4·n_embd), learned
  positions over `n_positions`, LayerNorm, bias on every linear layer, plain GELU MLP, tied embeddings by default.
- bloom (HF `BloomConfig`, `modeling_bloom.py`): GPT-2-like (`n_layer`, `n_head`, LayerNorm, biases, 4h GELU MLP,
  tied embeddings) but ALiBi instead of a position table (no parameters); the embedding LayerNorm (2h) is not
  counted.
- nemotron (HF `NemotronConfig`, Nemotron-4, arXiv 2402.16819 §2): squared-ReLU MLP of `intermediate_size` without
  a gate (`hidden_act` relu2), LayerNorm (layernorm1p, scale and bias), rotary positions, no linear biases
  (`attention_bias`, `mlp_bias`), GQA, untied embeddings.
- gpt_oss (HF `GptOssConfig`, OpenAI gpt-oss model card arXiv 2508.10925): Llama-like attention with biases
  (`attention_bias`), `num_local_experts` routed experts of width `intermediate_size` (like Mixtral; the experts, the
  router and the output projection carry biases), `layer_types` alternating `sliding_attention` (window
  `sliding_window`) and `full_attention`; the per-head attention-sink logits (one scalar per head) are not counted.
- llama4 (HF `Llama4Config`, a multimodal wrapper: its `text_config` is the language model, the vision tower is not
  trained here and not counted) and llama4_text (`Llama4TextConfig`, modeling_llama4.py): Llama-like attention (GQA,
  `head_dim`), `num_local_experts` routed experts of width `intermediate_size` with `num_experts_per_tok` (top-1,
  sigmoid router) plus one always-on shared expert of the same width (Llama4TextMoe.shared_expert), MoE on the layers
  `moe_layers` lists (by default every `interleave_moe_layer_step`-th), the other layers dense of
  `intermediate_size_mlp`; `attention_chunk_size` chunked attention on the RoPE layers (`layer_types`, else
  `no_rope_layers`, else all but every `no_rope_layer_interval`-th); the QK L2 norm (no weights) and attention
  temperature tuning are elementwise and left out.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from costmodels.errors import InputError
from costmodels.specs import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind, PositionEmbedding, RopeSpec, RouterSpec

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
"""The one place the preset list lives: every `<name>.json` in this folder is the preset `<name>`."""

LLAMA_LIKE = "llama-like"
"""RMSNorm, rotary positions, gated MLP, no linear biases (Llama and its descendants)."""
GPT2_LIKE = "gpt2-like"
"""LayerNorm, learned positions, plain GELU MLP, biases everywhere (GPT-2/3, Megatron GPT)."""
BLOOM_LIKE = "bloom-like"
"""GPT-2-like with ALiBi positions (BLOOM)."""
NEMOTRON_LIKE = "nemotron-like"
"""LayerNorm, rotary positions, squared-ReLU MLP without gate, no biases (Nemotron-4)."""

SUPPORTED_MODEL_TYPES: Mapping[str, str] = {
    "llama": LLAMA_LIKE, "mistral": LLAMA_LIKE, "mixtral": LLAMA_LIKE, "qwen2": LLAMA_LIKE, "qwen2_moe": LLAMA_LIKE,
    "qwen3": LLAMA_LIKE, "qwen3_moe": LLAMA_LIKE, "deepseek_v2": LLAMA_LIKE, "deepseek_v3": LLAMA_LIKE,
    "gemma": LLAMA_LIKE, "phi3": LLAMA_LIKE, "gpt2": GPT2_LIKE, "gpt_oss": LLAMA_LIKE, "bloom": BLOOM_LIKE,
    "nemotron": NEMOTRON_LIKE, "llama4_text": LLAMA_LIKE,
}
"""model_type -> family (a multimodal wrapper of one, LANGUAGE_MODEL_OF_WRAPPER, is read as its text model). Anything
else known to transformers is refused (encoders, hybrids, ...)."""

CONFIG_CLASS_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    # What transformers' config class (5.x, `<Type>Config.__init__`) fills in for the keys the mapping reads when a
    # config.json leaves them out. Only literal defaults: where the class derives a value (num_key_value_heads =
    # num_attention_heads, head_dim = hidden_size / num_attention_heads), ModelSpec derives the same when absent.
    "llama": {"max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False},
    "mistral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
    "mixtral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "num_local_experts": 8,
                "num_experts_per_tok": 2, "rope_theta": 1e6},
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen2_moe": {"num_key_value_heads": 16, "max_position_embeddings": 32768, "qkv_bias": True, "num_experts": 60,
                  "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768, "attention_bias": False},
    "qwen3_moe": {"num_key_value_heads": 4, "max_position_embeddings": 32768, "attention_bias": False,
                  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False},
    "deepseek_v2": {"max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False,
                    "n_routed_experts": 64, "moe_intermediate_size": 1407, "n_shared_experts": 2,
                    "first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "topk_method": "greedy", "norm_topk_prob": False,
                    "routed_scaling_factor": 1.0},
    "deepseek_v3": {"max_position_embeddings": 4096, "attention_bias": False, "n_routed_experts": 256,
                    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
                    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1, "n_group": 8,
                    "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": True},
    "gemma": {"num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192, "attention_bias": False},
    "phi3": {"max_position_embeddings": 4096},
    "gpt2": {"n_positions": 1024, "n_inner": None},
    "llama4_text": {"num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096 * 32,
                    "intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "no_rope_layer_interval": 4,
                    "attention_bias": False, "rope_theta": 500000.0},
}
"""model_type -> the config class's literal defaults (the fast path); a supported type missing here goes through
transformers AutoConfig."""

MAX_CONFIG_BYTES = 4 * 2**20
"""A config.json is a few KB; larger files (or /dev/zero) are refused before reading them whole."""
MAX_CONFIG_DEPTH = 64
"""Real configs nest 3 deep (rope_scaling, quantization_config); deeper JSON is refused before parsing."""


class LaunchSemanticsWarning(UserWarning):
    """A config value only the launch configs read (router, rotary positions) that autopar cannot take: the model
    loads, and the exports leave that part at the framework's default."""


class UnknownModelTypeWarning(UserWarning):
    """A config.json whose model_type transformers does not know, read as the nearest supported family."""


class AssumptionWarning(UserWarning):
    """A config value autopar cannot read as stated, and what it was priced as instead (an unknown activation)."""


ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")
"""Where a config names its MLP activation (Llama-family, Gemma, GPT-2)."""
KNOWN_ACTIVATIONS = frozenset({
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh",
    "gelu_accurate", "hardswish", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6",
    "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "prelu", "xielu"})
"""The activations transformers builds (transformers/activations.py ACT2CLS, 5.x). Which one a model uses does not
change its GEMMs: the MLP's shape (gated or not, MlpKind) comes from the model type, as in its modeling file."""
MOE_MODEL_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss",
                             "llama4_text"})
"""Model types whose layers route tokens to experts: a routed expert count of 0 is not a dense model for them (their
modeling files build a router over 0 experts, or fail)."""


TIED_BY_DEFAULT = frozenset({"gpt2", "gemma", "bloom"})
"""Model types whose config class defaults `tie_word_embeddings` to true (the others default to false)."""

HF_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
"""`org/name` as on the Hugging Face Hub."""
MAX_HF_ID_CHARS = 96
"""huggingface_hub's limit on a repo id's length."""

# Config keys, in the order they are looked up: one entry per ModelSpec quantity (first present, non-null key wins).
HIDDEN_KEYS = ("hidden_size", "n_embd", "n_embed")
LAYERS_KEYS = ("num_hidden_layers", "n_layer")
HEADS_KEYS = ("num_attention_heads", "n_head")
VOCAB_KEYS = ("vocab_size",)
FFN_KEYS = ("intermediate_size", "n_inner")
DENSE_FFN_KEYS = {"llama4_text": ("intermediate_size_mlp",)}
"""Model types whose dense layers' MLP width is not FFN_KEYS (Llama 4: `intermediate_size` is the expert width)."""
EXPERTS_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions")
DROPOUT_KEYS = ("resid_pdrop", "attn_pdrop", "embd_pdrop", "hidden_dropout", "attention_dropout")
"""Dropout probabilities of the decoder (GPT-2, BLOOM, Llama-family names); the largest is ModelSpec.dropout."""
EXPERT_WIDTH_IN_INTERMEDIATE = frozenset({"mixtral", "gpt_oss", "llama4_text"})
"""Model types whose routed-expert width is `intermediate_size` (no `moe_intermediate_size`)."""


LANGUAGE_MODEL_OF_WRAPPER = {"llama4": "llama4_text"}
"""Multimodal model types whose `text_config` is the language model autopar lays out -> its model type."""


# ---- public ----------------------------------------------------------------------------------------------------

def preset_names() -> tuple[str, ...]:
    """Names of the bundled presets, sorted."""
    return tuple(sorted(path.stem for path in PRESETS_DIR.glob("*.json")))


def load_model(source: "str | os.PathLike[str]", *, allow_network: bool = False) -> ModelSpec:
    """A `ModelSpec` from a bundled preset name, a config.json path, a model directory, or a Hugging Face id that is
    in the local cache (downloaded only when `allow_network`). Raises `InputError` with a one-line message.

    A preset name (any case) wins over a local folder of the same name; write `./name` for the folder."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise InputError("model", "give a preset name (see `autopar models`), a config.json path, a model "
                                  "directory or a Hugging Face id")
    text = source.strip()
    if text.lower() in preset_names():
        return load_preset(text.lower())
    path = Path(text).expanduser()
    if _path_exists(path):
        return load_config_file(_config_file_in(path), allow_network=allow_network)
    if _looks_like_path(text):
        raise InputError("model", f"path {_shown(text)} does not exist; give an existing config.json file or model "
                                  "directory")
    if HF_ID_PATTERN.match(text) and len(text) <= MAX_HF_ID_CHARS:
        return load_cached_hf_model(text, allow_network=allow_network)
    raise InputError("model", _unknown_preset_message(text))


HUB_RENAMES = {"meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
               "meta-llama/Meta-Llama-3.1-70B": "meta-llama/Llama-3.1-70B",
               "meta-llama/Meta-Llama-3.1-405B": "meta-llama/Llama-3.1-405B"}
"""Hugging Face repositories renamed since frameworks' recipes named them (the Hub redirects the old name)."""


def preset_for_hub_id(repo_id: str) -> "str | None":
    """The bundled preset whose config.json is that Hub repository's (its `autopar_source`), by the repository's
    current or former name (HUB_RENAMES), any case; None when autopar bundles none."""
    renames = {old.lower(): new.lower() for old, new in HUB_RENAMES.items()}
    wanted = repo_id.strip().lower()
    wanted = renames.get(wanted, wanted)
    for name in preset_names():
        source = str(json.loads((PRESETS_DIR / f"{name}.json").read_text()).get("autopar_source", ""))
        match = re.match(r"https://huggingface\.co/([^/]+/[^/]+)/", source)
        if match and match.group(1).lower() == wanted:
            return name
    return None


def load_preset(name: str) -> ModelSpec:
    """A bundled preset, read as plain JSON through the same mapping as every config (no transformers import)."""
    path = PRESETS_DIR / f"{name}.json"
    if not path.is_file():
        raise InputError("model", _unknown_preset_message(name))
    config = language_model_config(read_config_json(path), f"preset {name}")
    return spec_from_config(config, name=name, source=f"preset {name}", where=f"preset {name}")


def load_config_file(config_path: Path, *, allow_network: bool = False, name: str = "") -> ModelSpec:
    """A user's config.json: parsed with transformers AutoConfig when it knows the model type, else as plain JSON."""
    where = str(config_path)
    raw = language_model_config(read_config_json(config_path), where)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError("model_type", f"{where} has no model_type; is it a Hugging Face config.json?")
    _require_fields(raw, model_type, where)
    name = name or _name_from_config(raw, config_path)
    if model_type in CONFIG_CLASS_DEFAULTS:                               # the fast path: no transformers import
        config = {**CONFIG_CLASS_DEFAULTS[model_type], **raw}
    elif model_type in SUPPORTED_MODEL_TYPES:
        config = _autoconfig_dict(config_path, allow_network=allow_network)
    elif _transformers_knows(model_type):
        raise InputError("model_type", _unsupported_message(raw, where))
    else:
        config = raw                                                        # unknown to transformers: read it as is
        family = _inferred_family(config, where)
        warnings.warn(f"{where}: model_type {_shown(model_type)} is unknown to transformers; read as a "
                      f"{family} decoder ({', '.join(sorted(SUPPORTED_MODEL_TYPES))} are supported); check the "
                      "numbers", UnknownModelTypeWarning, stacklevel=2)
    return spec_from_config(config, name=name, source=where, where=where)


def load_cached_hf_model(repo_id: str, *, allow_network: bool = False) -> ModelSpec:
    """`org/name` from the local Hugging Face cache (offline); downloaded only when `allow_network`."""
    config_path = _cached_config_path(repo_id, allow_network=allow_network)
    return load_config_file(config_path, allow_network=allow_network, name=repo_id)


def language_model_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The language model's keys of a config: a multimodal wrapper's `text_config` (LANGUAGE_MODEL_OF_WRAPPER; the
    vision tower is not laid out), else the config itself."""
    text_type = LANGUAGE_MODEL_OF_WRAPPER.get(str(config.get("model_type", "")))
    if text_type is None:
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise InputError("text_config", f"{where}: model_type {config['model_type']} keeps its language model in "
                                        "text_config, which is missing or not a mapping")
    return {**text, "model_type": text.get("model_type") or text_type}


def read_config_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (a regular file of at most MAX_CONFIG_BYTES, nested at most MAX_CONFIG_DEPTH deep);
    malformed JSON names the line and column."""
    shown = _shown(str(path))
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise InputError("model", f"{shown} is a directory, not a config.json file; give the file, or the "
                                      "model directory that holds it")
        if not stat.S_ISREG(info.st_mode):          # /dev/zero, a FIFO, a socket: never read (could be endless)
            raise InputError("model", f"{shown} is not a regular file (a device, FIFO or socket); give a "
                                      "config.json file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise InputError("model", f"{shown} is {info.st_size:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte limit "
                                      "for a config.json; give the model's config.json, not its weights")
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError("model", f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError("model", f"{shown} is over the {MAX_CONFIG_BYTES:,}-byte limit for a config.json")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("model", f"{shown} is not UTF-8 text; give a config.json file") from None
    depth = _json_depth(text)
    if depth > MAX_CONFIG_DEPTH:
        raise InputError("model", f"{shown} nests {depth} levels deep, over the limit of {MAX_CONFIG_DEPTH}; give a "
                                  "Hugging Face config.json")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("model", f"{shown}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") \
            from None
    except (ValueError, RecursionError):            # an integer of more than 4,300 digits (sys.int_info)
        raise InputError("model", f"{shown} holds a number too long to read (over 4,300 digits); give a Hugging "
                                  "Face config.json") from None
    if not isinstance(config, dict):
        raise InputError("model", f"{path}: expected a JSON object of config keys, got {type(config).__name__}")
    return config


# ---- the mapping: config keys -> ModelSpec ---------------------------------------------------------------------

def spec_from_config(config: Mapping[str, Any], *, name: str, source: str, where: str = "config") -> ModelSpec:
    """Map Hugging Face config keys (a raw config.json or `AutoConfig(...).to_dict()`) to a `ModelSpec`.

    `where` names the file in error messages."""
    model_type = str(config.get("model_type", ""))
    family = SUPPORTED_MODEL_TYPES.get(model_type) or _inferred_family(config, where)
    _require_fields(config, model_type, where)
    hidden = _positive(config, HIDDEN_KEYS, where)
    heads = _positive(config, HEADS_KEYS, where)
    moe = _moe_spec(config, model_type, where)
    mla = _mla_spec(config, where)
    gpt2_like = family in (GPT2_LIKE, BLOOM_LIKE)
    ffn_keys = DENSE_FFN_KEYS.get(model_type, FFN_KEYS)
    ffn = _first(config, ffn_keys)
    if ffn is None and gpt2_like:
        ffn = 4 * hidden                                                    # GPT-2: n_inner null means 4·n_embd
    mlp = {GPT2_LIKE: MlpKind.PLAIN, BLOOM_LIKE: MlpKind.PLAIN, NEMOTRON_LIKE: MlpKind.SQUARED_RELU}.get(
        family, MlpKind.GATED)
    _check_activation(config, mlp, where)
    position = {GPT2_LIKE: PositionEmbedding.LEARNED, BLOOM_LIKE: PositionEmbedding.ALIBI}.get(
        family, PositionEmbedding.ROPE)
    fields = dict(
        hidden_size=hidden,
        num_layers=_positive(config, LAYERS_KEYS, where),
        num_attention_heads=heads,
        ffn_hidden_size=_positive_value(ffn, ffn_keys[0], where),
        vocab_size=_positive(config, VOCAB_KEYS, where),
        num_kv_heads=0 if mla is not None else _positive_if_given(config, "num_key_value_heads", where),
        head_dim=0 if mla is not None else _positive_if_given(config, "head_dim", where),
        mlp=mlp,
        norm=NormKind.LAYERNORM if family in (GPT2_LIKE, BLOOM_LIKE, NEMOTRON_LIKE) else NormKind.RMSNORM,
        position_embedding=position,
        max_position_embeddings=_optional_positive(config, MAX_POSITION_KEYS, where),
        tied_embeddings=_bool(config, "tie_word_embeddings", model_type in TIED_BY_DEFAULT, where),
        qkv_bias=_qkv_bias(config, model_type, where),
        linear_bias=gpt2_like or _linear_bias(config, model_type, where),
        moe=moe,
        mla=mla,
        num_mtp_layers=_optional_positive(config, "num_nextn_predict_layers", where),
        rope=_rope_spec(config, where) if position is PositionEmbedding.ROPE else None,
        qk_layernorm=model_type in QK_NORM_TYPES or mla is not None,
        qk_l2_norm=model_type == "llama4_text" and _bool(config, "use_qk_norm", True, where),
        nope_layer_interval=_nope_layer_interval(config, model_type, where),
        dropout=_dropout(config, where),
        **_local_attention(config, model_type, where),
    )
    return _spec_in(where, ModelSpec, name=name, source=source, **fields)


def _spec_in(where: str, spec_class: type, **fields: Any) -> Any:
    """`spec_class(**fields)`; its own consistency checks (heads vs kv heads, top_k vs experts, ...) name the file."""
    try:
        return spec_class(**fields)
    except InputError as exc:
        raise InputError(exc.field, f"{exc.message} (in {where})") from None


QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
"""Model types whose attention normalises each head's queries and keys (Qwen3Attention q_norm / k_norm; MLA models
normalise their latents, q_a_layernorm / kv_a_layernorm, which Megatron-Core builds under the same switch)."""


def _rope_spec(config: Mapping[str, Any], where: str) -> RopeSpec | None:
    """Rotary positions from `rope_theta` / `rope_scaling` (transformers 4 configs) or `rope_parameters`
    (transformers 5) and `partial_rotary_factor`; absent, the config class's default base (CONFIG_CLASS_DEFAULTS
    or AutoConfig) or 10000. A value RopeSpec refuses does not refuse the model (no cost term reads it): it is
    warned about (LaunchSemanticsWarning) and no rotary settings are exported."""
    parameters = config.get("rope_parameters")
    parameters = parameters if isinstance(parameters, Mapping) else {}
    scaling = config.get("rope_scaling")
    scaling = scaling if isinstance(scaling, Mapping) else parameters
    kind = scaling.get("rope_type") or scaling.get("type") or ""
    fields: dict[str, Any] = dict(theta=_first(config, ("rope_theta",), parameters.get("rope_theta", 10000.0)),
                                  rotary_fraction=_first(config, ("partial_rotary_factor",),
                                                         parameters.get("partial_rotary_factor", 1.0)))
    if kind and kind != "default":
        defaults = RopeSpec()
        fields.update(scaling=kind, factor=scaling.get("factor", 0.0),
                      low_freq_factor=scaling.get("low_freq_factor", 0.0),
                      high_freq_factor=scaling.get("high_freq_factor", 0.0),
                      original_max_positions=scaling.get("original_max_position_embeddings")
                      or config.get("original_max_position_embeddings") or 0,
                      mscale=_first(scaling, ("mscale",), defaults.mscale),
                      mscale_all_dim=_first(scaling, ("mscale_all_dim",), defaults.mscale_all_dim),
                      beta_fast=_first(scaling, ("beta_fast",), defaults.beta_fast),
                      beta_slow=_first(scaling, ("beta_slow",), defaults.beta_slow),
                      round_to_int=_first(scaling, ("truncate",), defaults.round_to_int))
    if isinstance(fields.get("original_max_positions"), float) and fields["original_max_positions"].is_integer():
        fields["original_max_positions"] = int(fields["original_max_positions"])
    try:
        return _spec_in(where, RopeSpec, **fields)
    except InputError as error:
        warnings.warn(f"{error.field}: {error.message}; the launch configs write no rotary settings (no cost term "
                      "reads them)", LaunchSemanticsWarning, stacklevel=2)
        return None


def _nope_layer_interval(config: Mapping[str, Any], model_type: str, where: str) -> int:
    """Llama 4's NoPE layers as Megatron's --no-rope-freq takes them: every `no_rope_layer_interval`-th layer
    (Llama4TextConfig's default pattern; a `no_rope_layers` list of another shape is warned about and left out)."""
    if model_type != "llama4_text":
        return 0
    interval = _optional_positive(config, "no_rope_layer_interval", where) or 4
    listed = config.get("no_rope_layers")
    if listed and listed != [int((i + 1) % interval != 0) for i in range(len(listed))]:
        warnings.warn("no_rope_layers is not every layer but each no_rope_layer_interval-th: the launch configs "
                      "write no NoPE pattern (no cost term reads it)", LaunchSemanticsWarning, stacklevel=2)
        return 0
    return interval


def _qkv_bias(config: Mapping[str, Any], model_type: str, where: str) -> bool:
    """Bias on the Q, K, V projections: always in Qwen2 (Qwen2Attention), `qkv_bias` in Qwen2-MoE (default true),
    `attention_bias` elsewhere."""
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":
        return _bool(config, "qkv_bias", True, where)
    return _bool(config, "attention_bias", False, where)


def _linear_bias(config: Mapping[str, Any], model_type: str, where: str) -> bool:
    """Bias on every linear layer: GPT-OSS's `attention_bias` covers attention, and its experts and router always
    carry biases (HF GptOssExperts gate_up_proj_bias / down_proj_bias, GptOssTopKRouter bias); elsewhere both
    `attention_bias` and `mlp_bias`."""
    if model_type == "gpt_oss":
        return _bool(config, "attention_bias", True, where)
    attention, mlp = _bool(config, "attention_bias", False, where), _bool(config, "mlp_bias", False, where)
    return attention and mlp


LOCAL_ATTENTION = {"gpt_oss": ("sliding_window", "sliding_attention", "sliding_window", "sliding_window_layers"),
                   "llama4_text": ("attention_chunk_size", "chunked_attention", "attention_chunk_size",
                                   "chunked_attention_layers")}
"""model_type -> (config key of its local attention's size, its `layer_types` entry, ModelSpec size and layer-count
fields): GPT-OSS's sliding windows, Llama 4's chunks. Other model types: none (Mistral's and Qwen's `sliding_window`
is off unless `use_sliding_window`, which autopar does not read)."""


def _local_attention(config: Mapping[str, Any], model_type: str, where: str) -> dict[str, int]:
    """The ModelSpec fields of a model type's local attention (LOCAL_ATTENTION): its size (no local attention where
    the config sets none) and how many layers use it, from `layer_types` (HF: 'sliding_attention' /
    'chunked_attention' / 'full_attention') when the config lists them, else the config class's own default
    (`_default_local_layers`)."""
    if model_type not in LOCAL_ATTENTION:
        return {}
    size_key, layer_type, size_field, layers_field = LOCAL_ATTENTION[model_type]
    size = _optional_positive(config, size_key, where)
    if not size:
        return {}
    layers = _positive(config, LAYERS_KEYS, where)
    types = config.get("layer_types")
    if types:
        if not isinstance(types, list) or len(types) != layers:
            raise InputError("layer_types", f"layer_types must list one entry per layer ({layers}) (in {where})")
        count = sum(1 for t in types if t == layer_type)
    else:
        count = _default_local_layers(config, model_type, layers, where)
    return {size_field: size, layers_field: count}


def _default_local_layers(config: Mapping[str, Any], model_type: str, layers: int, where: str) -> int:
    """Local-attention layers where `layer_types` is not given: GPT-OSS alternates, sliding first (GptOssConfig);
    Llama 4 chunks its RoPE layers, `no_rope_layers` (1 = RoPE), by default every layer but each
    `no_rope_layer_interval`-th (Llama4TextConfig)."""
    if model_type == "gpt_oss":
        return (layers + 1) // 2
    rope = config.get("no_rope_layers")
    if rope:
        if not isinstance(rope, list) or len(rope) != layers or any(v not in (0, 1) for v in rope):
            raise InputError("no_rope_layers", f"no_rope_layers must list 0 or 1 for each of the {layers} layers "
                                               f"(in {where})")
        return sum(rope)
    interval = _optional_positive(config, "no_rope_layer_interval", where) or 4
    return sum(1 for i in range(layers) if (i + 1) % interval != 0)


def _moe_layer_freq(config: Mapping[str, Any], model_type: str, where: str) -> int:
    """Every how many layers the MoE layers come: `decoder_sparse_step` (Qwen-MoE), Llama 4's
    `interleave_moe_layer_step`, or its `moe_layers` list when that is such a pattern (HF Llama4TextConfig's
    default: range(step - 1, layers, step)); other lists are refused."""
    if model_type != "llama4_text":
        return _step(config, "decoder_sparse_step", where)
    step = _step(config, "interleave_moe_layer_step", where)
    listed = config.get("moe_layers")
    if listed is None:
        return step
    layers = _positive(config, LAYERS_KEYS, where)
    for freq in range(1, layers + 1):
        if listed == list(range(freq - 1, layers, freq)):
            return freq
    raise InputError("moe_layers", f"moe_layers={_shown(str(listed))} is not supported: only every k-th layer "
                                   f"(k-1, 2k-1, ...) (in {where})")


def _step(config: Mapping[str, Any], key: str, where: str) -> int:
    """A layer interval (MoE every `key`-th layer), at least 1; absent or null: 1. 0 is refused: transformers'
    modeling files take `(layer_idx + 1) % step` (a ZeroDivisionError), and no layer could be MoE."""
    step = _optional_positive(config, key, where)
    if key in config and config[key] is not None and step == 0:
        raise InputError(key, f"must be >= 1 (MoE on every {key}-th layer; 1 = every layer), got 0 (in {where})")
    return step or 1


def _check_activation(config: Mapping[str, Any], mlp: MlpKind, where: str) -> None:
    """Warn (AssumptionWarning) where the config names an activation transformers does not build: the MLP is priced
    with the model type's shape (MlpKind), which the activation does not change."""
    key = next((key for key in ACTIVATION_KEYS if config.get(key) is not None), None)
    if key is None:
        return
    value = config[key]
    if isinstance(value, str) and value in KNOWN_ACTIVATIONS:
        return
    shape = {MlpKind.GATED: "a gated MLP (SwiGLU's three h x ffn GEMMs)", MlpKind.PLAIN: "a plain two-GEMM MLP",
             MlpKind.SQUARED_RELU: "a squared-ReLU MLP without a gate"}[mlp]
    warnings.warn(f"{where}: {key} {_shown(str(value))} is not an activation transformers builds; priced as {shape}, "
                  "the model type's MLP (the activation itself does not change the GEMMs); check the config",
                  AssumptionWarning, stacklevel=3)


def _moe_spec(config: Mapping[str, Any], model_type: str, where: str) -> MoESpec | None:
    num_experts = _first(config, EXPERTS_KEYS)
    if num_experts == 0 and not isinstance(num_experts, bool) and (
            model_type in MOE_MODEL_TYPES or config.get("num_experts_per_tok")):
        key = next(key for key in EXPERTS_KEYS if config.get(key) is not None)
        raise InputError(key, f"{key} is 0, but {_shown(model_type)} routes every token to "
                              f"num_experts_per_tok={config.get('num_experts_per_tok')!r} experts: give the number of "
                              f"routed experts (the published config's), or a dense model type (in {where})")
    if not num_experts:                                                     # absent, null or 0: a dense model
        return None
    num_experts = _positive_value(num_experts, "num_experts", where)
    expert_width_key = "intermediate_size" if model_type in EXPERT_WIDTH_IN_INTERMEDIATE \
        else "moe_intermediate_size"
    expert_width = _positive(config, (expert_width_key,), where)
    num_shared = _optional_positive(config, "n_shared_experts", where)
    shared_width = num_shared * expert_width
    shared_gate = False
    qwen_shared_width = _optional_positive(config, "shared_expert_intermediate_size", where)
    if qwen_shared_width:                                                   # Qwen2-MoE: one shared expert, gated
        num_shared, shared_width, shared_gate = 1, qwen_shared_width, True
    if model_type == "llama4_text":                                         # Llama4TextMoe.shared_expert, ungated
        num_shared, shared_width = 1, expert_width
    layer_freq = _moe_layer_freq(config, model_type, where)
    deepseek_freq = _optional_positive(config, "moe_layer_freq", where) or 1
    if deepseek_freq != 1:
        raise InputError("moe_layer_freq", f"moe_layer_freq={deepseek_freq} is not supported (only 1, MoE in every "
                                           f"layer past first_k_dense_replace) (in {where})")
    return _spec_in(
        where, MoESpec,
        num_experts=num_experts,
        top_k=_positive(config, ("num_experts_per_tok",), where),
        expert_ffn_hidden_size=expert_width,
        num_shared_experts=num_shared,
        shared_expert_ffn_hidden_size=shared_width,
        first_dense_layers=_first_dense_layers(config, where),
        layer_freq=layer_freq,
        shared_expert_gate=shared_gate,
        router=_router_spec(config, model_type, num_experts, where),
    )


SIGMOID_ROUTER_TYPES = frozenset({"deepseek_v3", "llama4_text"})
"""Routers that score experts with a sigmoid where the config names no `scoring_func`: DeepSeek-V3
(DeepseekV3TopkRouter, `scores = router_logits.sigmoid()`) and Llama 4 (Llama4Router: `torch.sigmoid` of the top-1
logit)."""
RENORMALISED_ROUTER_TYPES = frozenset({"mixtral", "gpt_oss"})
"""Routers that always weight the chosen experts by a softmax over them alone: Mixtral (MixtralSparseMoeBlock:
softmax, top-k, `routing_weights /= routing_weights.sum(...)`) and GPT-OSS (GptOssTopKRouter: top-k of the logits,
then softmax)."""
PROBS_ON_INPUT_TYPES = frozenset({"llama4_text"})
"""Routers whose weight multiplies the token before the expert instead of the expert's output (Llama4TextMoe:
`routed_in = hidden_states * router_scores`; Megatron-Core moe_apply_probs_on_input)."""
GROUPED_TOPK_METHODS = ("group_limited_greedy", "noaux_tc")
"""DeepSeek `topk_method`s that choose experts within the `topk_group` best of `n_group` groups."""


def _router_spec(config: Mapping[str, Any], model_type: str, num_experts: int, where: str) -> RouterSpec:
    """How the router weights the chosen experts (RouterSpec): `scoring_func`, `norm_topk_prob`, `topk_method`
    (noaux_tc: an expert bias; group_limited_greedy: groups scored by their best expert), `n_group` / `topk_group`,
    `routed_scaling_factor` (their config classes' defaults filled in as for every key: CONFIG_CLASS_DEFAULTS or
    AutoConfig), with each model type's own rule where the class has no such key (SIGMOID_ROUTER_TYPES,
    RENORMALISED_ROUTER_TYPES, DeepSeek-V3's noaux_tc). Few cost terms read it (RouterSpec), so a value RouterSpec
    refuses does not refuse the model: it is warned about (LaunchSemanticsWarning) and the router left at
    Megatron-Core's default."""
    score = config.get("scoring_func") or ("sigmoid" if model_type in SIGMOID_ROUTER_TYPES else "softmax")
    method = config.get("topk_method") or ("noaux_tc" if model_type == "deepseek_v3" else "greedy")
    groups = (config.get("n_group") or 0) if method in GROUPED_TOPK_METHODS else 0
    scaling = config.get("routed_scaling_factor")
    try:
        if isinstance(groups, int) and groups > 1 and num_experts % groups:
            raise InputError("n_group", f"n_group={groups} does not divide the {num_experts} experts")
        return _spec_in(where, RouterSpec, score_function=score,
                        renormalised=model_type in RENORMALISED_ROUTER_TYPES or _bool(config, "norm_topk_prob",
                                                                                       False, where),
                        expert_bias=method == "noaux_tc", num_groups=groups if groups != 1 else 0,
                        group_topk=(config.get("topk_group") or 0) if groups not in (0, 1) else 0,
                        topk_scaling_factor=1.0 if scaling is None else scaling,
                        probs_on_input=model_type in PROBS_ON_INPUT_TYPES, group_by_max=method ==
                        "group_limited_greedy")
    except InputError as error:
        warnings.warn(f"{error.field}: {error.message}; the launch configs leave the router at Megatron-Core's "
                      "default (no cost term reads it)", LaunchSemanticsWarning, stacklevel=2)
        return RouterSpec()


def _first_dense_layers(config: Mapping[str, Any], where: str) -> int:
    """`first_k_dense_replace` (DeepSeek), or `mlp_only_layers` (Qwen-MoE) when it lists a prefix 0..k-1."""
    first_k = _optional_positive(config, "first_k_dense_replace", where)
    mlp_only = config.get("mlp_only_layers") or []
    if mlp_only:
        if not isinstance(mlp_only, list) or sorted(mlp_only) != list(range(len(mlp_only))):
            raise InputError("mlp_only_layers", f"mlp_only_layers={mlp_only} is not supported: only dense layers "
                                                f"0..k-1 at the start of the model (in {where})")
        first_k = max(first_k, len(mlp_only))
    return first_k


def _mla_spec(config: Mapping[str, Any], where: str) -> MLASpec | None:
    if config.get("kv_lora_rank") is None:
        return None
    return _spec_in(
        where, MLASpec,
        kv_lora_rank=_positive(config, ("kv_lora_rank",), where),
        qk_nope_head_dim=_positive(config, ("qk_nope_head_dim",), where),
        qk_rope_head_dim=_positive(config, ("qk_rope_head_dim",), where),
        v_head_dim=_positive(config, ("v_head_dim",), where),
        q_lora_rank=_optional_positive(config, "q_lora_rank", where),      # null: direct Q projection
    )


# ---- validation helpers ----------------------------------------------------------------------------------------

def _require_fields(config: Mapping[str, Any], model_type: str, where: str) -> None:
    """Every key the mapping cannot do without, checked on the raw file (AutoConfig would silently default them)."""
    required = [HIDDEN_KEYS, LAYERS_KEYS, HEADS_KEYS, VOCAB_KEYS]
    family = SUPPORTED_MODEL_TYPES.get(model_type, GPT2_LIKE if "n_embd" in config else LLAMA_LIKE)
    if family in (LLAMA_LIKE, NEMOTRON_LIKE):
        required.append(FFN_KEYS)
    if _first(config, EXPERTS_KEYS):
        required.append(("num_experts_per_tok",))
        if model_type not in EXPERT_WIDTH_IN_INTERMEDIATE:
            required.append(("moe_intermediate_size",))
    if config.get("kv_lora_rank") is not None:
        required += [("qk_nope_head_dim",), ("qk_rope_head_dim",), ("v_head_dim",)]
    missing = [keys[0] for keys in required if _first(config, keys) is None]
    if missing:
        raise InputError("config", f"{where} is missing required field{'s' if len(missing) > 1 else ''} "
                                   f"{', '.join(missing)}")


def _first(config: Mapping[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    """The value of the first of `keys` present and not null."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _positive_value(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(key, f"must be a positive integer, got {value!r} (in {where})")
    return value


def _positive(config: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int:
    present = next((key for key in keys if config.get(key) is not None), keys[0])
    return _positive_value(config.get(present), present, where)


def _optional_positive(config: Mapping[str, Any], keys: "str | tuple[str, ...]", where: str) -> int:
    """A non-negative integer key; absent or null gives 0."""
    keys = (keys,) if isinstance(keys, str) else keys
    present = next((key for key in keys if config.get(key) is not None), None)
    if present is None:
        return 0
    value = config[present]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(present, f"must be a non-negative integer, got {value!r} (in {where})")
    return value


def _bool(config: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """A JSON boolean key; absent or null gives `default`. A string such as "yes" is an error, not a truthy value."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, int) and value in (0, 1):              # some configs write 0 / 1
        return bool(value)
    if not isinstance(value, bool):
        raise InputError(key, f"must be true or false, got {_shown(str(value))} (in {where})")
    return value


def _dropout(config: Mapping[str, Any], where: str) -> "float | None":
    """The largest dropout probability the config states (DROPOUT_KEYS), None when it states none."""
    values = []
    for key in DROPOUT_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise InputError(key, f"must be a dropout probability in [0, 1), got {value!r} (in {where})")
        values.append(float(value))
    return max(values) if values else None


def _positive_if_given(config: Mapping[str, Any], key: str, where: str) -> int:
    """A key whose absence (or null) means "derive it" (0 in ModelSpec); given, it must be a positive integer: an
    explicit 0 is an error, not a silent "same as the default"."""
    if config.get(key) is None:
        return 0
    return _positive_value(config[key], key, where)


def _json_depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings (checked before json.loads, which recurses per level)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _path_exists(path: Path) -> bool:
    """`path.exists()`, with a path the OS refuses (too long, NUL byte) reported as bad input."""
    try:
        return path.exists()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a valid path"
        raise InputError("model", f"{_shown(str(path))}: {reason}; give a preset name, a config.json path or a "
                                  "Hugging Face id") from None


def _shown(text: str) -> str:
    """A user's text in a message: quoted, long ones shortened to one readable line."""
    return repr(text if len(text) <= 80 else text[:60] + "…" + text[-15:])


def _is_causal_lm(config: Mapping[str, Any]) -> bool:
    architectures = config.get("architectures") or []
    return (not config.get("is_encoder_decoder")
            and any(isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures))


def _inferred_family(config: Mapping[str, Any], where: str) -> str:
    """For a model_type transformers does not know: a causal LM with GPT-2 keys reads as GPT-2, else as Llama."""
    if not _is_causal_lm(config):
        raise InputError("model_type", _unsupported_message(config, where))
    return GPT2_LIKE if "n_embd" in config else LLAMA_LIKE


def _unsupported_message(config: Mapping[str, Any], where: str) -> str:
    architectures = ", ".join(str(a) for a in config.get("architectures") or []) or "none given"
    return (f"{where}: model_type {config.get('model_type')!r} (architectures: {architectures}) is not supported; "
            f"autopar models decoder-only LMs of types {', '.join(sorted(SUPPORTED_MODEL_TYPES))}")


def _unknown_preset_message(text: str) -> str:
    names = preset_names()
    close = difflib.get_close_matches(text.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (f"unknown model {_shown(text)}: not a bundled preset, an existing path or a Hugging Face id (org/name); "
            f"{hint}run `autopar models` to list the presets")


def _name_from_config(config: Mapping[str, Any], config_path: Path) -> str:
    """`_name_or_path` when the file has one, else the folder the config.json sits in (or the file's stem)."""
    name = config.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        return name.strip()
    return config_path.parent.name if config_path.name == "config.json" else config_path.stem


def _looks_like_path(text: str) -> bool:
    """A file name or a path rather than a preset name or an `org/name` Hugging Face id."""
    return (text.endswith(".json") or text.startswith((".", "/", "~")) or text.count("/") > 1
            or (os.sep != "/" and os.sep in text))


def _config_file_in(path: Path) -> Path:
    if path.is_dir():
        config = path / "config.json"
        if not config.exists():                      # one that exists but is no file is refused by the reader
            raise InputError("model", f"{path} has no config.json; give a model directory that contains one")
        return config
    return path


# ---- transformers and the Hugging Face cache (imported lazily) -------------------------------------------------

@contextlib.contextmanager
def _hub_environment(offline: bool) -> Iterator[None]:
    """HF_HUB_OFFLINE=1 unless the network is allowed, and transformers' start-up chatter silenced; restored after."""
    wanted = {"TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error")}
    if offline:
        wanted["HF_HUB_OFFLINE"] = "1"
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _autoconfig_dict(config_path: Path, *, allow_network: bool) -> dict[str, Any]:
    """`AutoConfig.from_pretrained(config_path).to_dict()`: the file with its model type's defaults filled in."""
    with _hub_environment(offline=not allow_network):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(config_path), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types; the user gets one line
            detail = " ".join(str(exc).split())[:300]
            raise InputError("model", f"transformers could not parse {config_path}: {detail}") from None
    return config.to_dict()


def _transformers_knows(model_type: str) -> bool:
    with _hub_environment(offline=True):
        from transformers import CONFIG_MAPPING

        return model_type in CONFIG_MAPPING


def _hf_cache_dir() -> Path:
    """The hub cache folder as huggingface_hub resolves it, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _cached_config_path(repo_id: str, *, allow_network: bool) -> Path:
    cache_dir = _hf_cache_dir()
    with _hub_environment(offline=not allow_network):
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache_dir))
        except Exception as exc:  # noqa: BLE001 - HFValidationError (bad id) and OS errors: one line for the user
            detail = " ".join(str(exc).split())[:200]
            raise InputError("model", f"{_shown(repo_id)} is not a valid Hugging Face id ({detail}); give org/name, "
                                      "a preset name or a config.json path") from None
        if isinstance(cached, str):
            return Path(cached)
        if allow_network:
            return _download_config(repo_id, cache_dir)
    preset_hint = ""
    same_name = repo_id.split("/")[-1].lower()
    if same_name in preset_names():
        preset_hint = f" (or use the bundled preset {same_name})"
    raise InputError("model", f"{repo_id} is not in the local Hugging Face cache ({cache_dir}); download it first "
                              f"or pass --allow-network{preset_hint}")


def _download_config(repo_id: str, cache_dir: Path) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json", cache_dir=str(cache_dir)))
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: one line for the user
        detail = " ".join(str(exc).split())[:300]
        raise InputError("model", f"could not download config.json of {repo_id}: {detail}") from None
