"""Model loading (autopar/models.py): presets, config.json files through transformers AutoConfig, the local Hugging
Face cache (offline), and one-line InputErrors for every bad source."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.errors import InputError
from autopar.models import (
    CONFIG_CLASS_DEFAULTS,
    PRESETS_DIR,
    SUPPORTED_MODEL_TYPES,
    UnknownModelTypeWarning,
    load_model,
    preset_names,
    spec_from_config,
)
from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding

# one preset per supported model_type (gemma and phi3 have no preset; they are checked with small configs below)
PRESET_OF_MODEL_TYPE = {
    "llama": "llama-3.1-8b", "mistral": "mistral-7b", "mixtral": "mixtral-8x7b", "qwen2": "qwen2.5-7b",
    "qwen2_moe": "qwen1.5-moe-a2.7b", "qwen3": "qwen3-8b", "qwen3_moe": "qwen3-30b-a3b",
    "deepseek_v2": "deepseek-v2-lite", "deepseek_v3": "deepseek-v3", "gpt2": "gpt-3-175b",
    "nemotron": "nemotron-4-15b", "gpt_oss": "gpt-oss-120b", "bloom": "bloom-176b",
    "llama4_text": "llama-4-maverick-17b-128e",
}


def same_shape(a: ModelSpec, b: ModelSpec) -> bool:
    """Equal in everything but the name (source is not compared by ModelSpec)."""
    return dataclasses.replace(a, name=b.name) == b


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def preset_json(name: str) -> dict:
    return json.loads((PRESETS_DIR / f"{name}.json").read_text())


def load_error(source: str, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        load_model(source, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ---- presets ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads(name: str) -> None:
    model = load_model(name)
    assert model.name == name
    assert model.source == f"preset {name}"
    assert preset_json(name)["model_type"] in SUPPORTED_MODEL_TYPES


def test_preset_list_covers_the_reference_models() -> None:
    names = set(preset_names())
    for name in ("llama-2-7b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                 "mixtral-8x7b", "mixtral-8x22b",
                 "qwen2.5-7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v2-lite", "deepseek-v3", "gpt-3-175b",
                 "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b", "gpt-145.6b",
                 "gpt-310.1b", "gpt-530b", "gpt-1t", "gpt-22b", "gpt-175b"):
        assert name in names


def test_preset_names_are_case_insensitive() -> None:
    assert load_model("Llama-3.1-70B") == load_model("llama-3.1-70b")


def test_loading_a_preset_does_not_import_transformers() -> None:
    code = ("import sys; from autopar.models import load_model; load_model('deepseek-v3'); "
            "assert 'transformers' not in sys.modules and 'huggingface_hub' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_preset_mapping_details() -> None:
    qwen2 = load_model("qwen2.5-7b")
    assert qwen2.qkv_bias and not qwen2.linear_bias and qwen2.head_dim == 128
    qwen_moe = load_model("qwen1.5-moe-a2.7b")
    assert qwen_moe.moe.num_shared_experts == 1 and qwen_moe.moe.shared_expert_ffn_hidden_size == 5632
    assert qwen_moe.moe.shared_expert_gate and qwen_moe.qkv_bias
    mixtral = load_model("mixtral-8x7b")
    assert mixtral.moe.expert_ffn_hidden_size == 14336 and mixtral.moe.top_k == 2 and mixtral.num_kv_heads == 8
    v3 = load_model("deepseek-v3")
    assert v3.mla.q_lora_rank == 1536 and v3.mla.kv_lora_rank == 512 and v3.num_mtp_layers == 1
    assert v3.moe.first_dense_layers == 3 and v3.moe.num_shared_experts == 1
    assert v3.moe.shared_expert_ffn_hidden_size == 2048 and v3.num_moe_layers == 58
    lite = load_model("deepseek-v2-lite")
    assert lite.mla.q_lora_rank == 0 and lite.moe.shared_expert_ffn_hidden_size == 2 * 1408
    assert lite.num_mtp_layers == 0
    qwen3 = load_model("qwen3-235b-a22b")
    assert qwen3.head_dim == 128 and qwen3.q_size == 64 * 128 != qwen3.hidden_size
    gpt = load_model("gpt-175b")
    assert (gpt.mlp, gpt.norm, gpt.position_embedding) == (MlpKind.PLAIN, NormKind.LAYERNORM,
                                                             PositionEmbedding.LEARNED)
    assert gpt.linear_bias and gpt.tied_embeddings and gpt.max_position_embeddings == 2048
    assert gpt.ffn_hidden_size == 4 * 12288
    llama = load_model("llama-3.1-405b")
    assert (llama.mlp, llama.norm, llama.position_embedding) == (MlpKind.GATED, NormKind.RMSNORM,
                                                                 PositionEmbedding.ROPE)
    assert not llama.tied_embeddings and not llama.qkv_bias and not llama.linear_bias


# ---- config.json files through AutoConfig ----------------------------------------------------------------------

def test_every_supported_model_type_has_a_check() -> None:
    assert set(PRESET_OF_MODEL_TYPE) | {"gemma", "phi3"} == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type,preset", sorted(PRESET_OF_MODEL_TYPE.items()))
def test_config_through_autoconfig_matches_preset(tmp_path: Path, model_type: str, preset: str) -> None:
    config = preset_json(preset)
    assert config["model_type"] == model_type
    folder = tmp_path / preset
    path = write_config(folder, config)
    from_dir = load_model(str(folder))
    from_file = load_model(path)                                          # a Path works as well as a str
    assert same_shape(from_dir, load_model(preset))
    assert from_file == from_dir
    assert from_dir.name == config["_name_or_path"]
    assert from_dir.source == str(path)


def test_config_file_with_any_name(tmp_path: Path) -> None:
    path = tmp_path / "my-model.json"
    config = preset_json("llama-3.1-8b")
    del config["_name_or_path"]
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    assert model.name == "my-model" and same_shape(model, load_model("llama-3.1-8b"))


def test_directory_name_when_config_has_no_name(tmp_path: Path) -> None:
    config = preset_json("mixtral-8x7b")
    del config["_name_or_path"]
    write_config(tmp_path / "my-mixtral", config)
    assert load_model(str(tmp_path / "my-mixtral")).name == "my-mixtral"


def test_autoconfig_fills_model_type_defaults(tmp_path: Path) -> None:
    # a bare GPT-2 config: transformers fills n_positions 1024, tie_word_embeddings true, n_inner null (-> 4h)
    write_config(tmp_path / "bare-gpt2", {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                          "vocab_size": 100, "architectures": ["GPT2LMHeadModel"]})
    gpt = load_model(str(tmp_path / "bare-gpt2"))
    assert gpt.tied_embeddings and gpt.max_position_embeddings == 1024 and gpt.ffn_hidden_size == 256
    # a bare Llama config: untied, MHA, head_dim = hidden / heads
    write_config(tmp_path / "bare-llama", {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})
    llama = load_model(str(tmp_path / "bare-llama"))
    assert not llama.tied_embeddings and llama.num_kv_heads == 4 and llama.head_dim == 16


def test_dropout_read_from_the_config(tmp_path: Path) -> None:
    # GPT-2 names its dropouts resid_pdrop / attn_pdrop / embd_pdrop: the largest is the model's; unstated, a
    # learned-position model gets GPT's 0.1 and a RoPE model none
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
            "architectures": ["GPT2LMHeadModel"]}
    write_config(tmp_path / "gpt2-no-dropout", {**gpt2, "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0})
    assert load_model(str(tmp_path / "gpt2-no-dropout")).dropout == 0.0
    write_config(tmp_path / "gpt2-mixed", {**gpt2, "resid_pdrop": 0.05, "attn_pdrop": 0.2})
    assert load_model(str(tmp_path / "gpt2-mixed")).dropout == pytest.approx(0.2)
    assert load_model("gpt-3-175b").dropout == pytest.approx(0.1)
    assert load_model("llama-3.1-8b").dropout == 0.0 and load_model("bloom-176b").dropout == 0.0


@pytest.mark.parametrize("value", [1.0, -0.1, "0.1", True])
def test_bad_dropout_is_refused_by_name(tmp_path: Path, value) -> None:
    config = preset_json("llama-3.1-8b")
    config["attention_dropout"] = value
    write_config(tmp_path / "bad-dropout", config)
    with pytest.raises(InputError, match="attention_dropout"):
        load_model(str(tmp_path / "bad-dropout"))


@pytest.mark.parametrize("name, score, pre_softmax, bias, groups, scaling, on_input", [
    ("mixtral-8x7b", "softmax", False, False, (0, 0), 1.0, False),       # softmax, top-k, renormalised
    ("qwen3-30b-a3b", "softmax", False, False, (0, 0), 1.0, False),      # norm_topk_prob: true
    ("qwen2-57b-a14b", "softmax", True, False, (0, 0), 1.0, False),      # norm_topk_prob: false
    ("deepseek-v2-lite", "softmax", True, False, (0, 0), 1.0, False),    # greedy top-k of the softmax
    ("deepseek-v3", "sigmoid", False, True, (8, 4), 2.5, False),         # noaux_tc, n_group 8 / topk_group 4
    ("llama-4-scout-17b-16e", "sigmoid", False, False, (0, 0), 1.0, True),
    ("gpt-oss-120b", "softmax", False, False, (0, 0), 1.0, False),
])
def test_router_read_as_the_model_routes(name, score, pre_softmax, bias, groups, scaling, on_input) -> None:
    router = load_model(name).moe.router
    assert (router.score_function, router.pre_softmax, router.expert_bias, (router.num_groups, router.group_topk),
            router.topk_scaling_factor, router.probs_on_input) == (score, pre_softmax, bias, groups, scaling, on_input)


def test_rotary_positions_and_qk_norms_read_from_the_config() -> None:
    llama = load_model("llama-3.1-8b").rope
    assert (llama.theta, llama.scaling, llama.factor, llama.low_freq_factor, llama.high_freq_factor,
            llama.original_max_positions) == (500000.0, "llama3", 8.0, 1.0, 4.0, 8192)
    assert load_model("nemotron-4-15b").rope.rotary_fraction == 0.5
    assert load_model("gpt-oss-120b").rope.scaling == "yarn" and load_model("gpt-oss-120b").rope.factor == 32.0
    assert load_model("gpt-3-175b").rope is None                         # learned positions
    assert load_model("qwen3-8b").qk_layernorm and load_model("deepseek-v3").qk_layernorm   # MLA's latent norms
    assert not load_model("llama-3.1-8b").qk_layernorm


def test_transformers_5_rope_parameters_read_like_rope_theta_and_rope_scaling() -> None:
    config = preset_json("llama-3.1-8b")
    scaling, theta = config.pop("rope_scaling"), config.pop("rope_theta")
    config["rope_parameters"] = {**scaling, "rope_theta": theta}
    assert spec_from_config(config, name="x", source="x").rope == load_model("llama-3.1-8b").rope


@pytest.mark.parametrize("key, value, field", [
    ("scoring_func", "tanh", "router_score_function"), ("routed_scaling_factor", "2.5", "router_topk_scaling_factor"),
    ("norm_topk_prob", "yes", "norm_topk_prob"), ("n_group", 3, "n_group"), ("partial_rotary_factor", 0,
                                                                             "partial_rotary_factor")])
def test_bad_launch_only_keys_warn_and_leave_the_frameworks_default(key, value, field) -> None:
    """Router and rotary keys feed no cost term: a bad one does not refuse the model; it is named in a warning and
    the exports leave that part at Megatron-Core's default (n_group 3 does not divide the 256 experts)."""
    from autopar.models import LaunchSemanticsWarning
    from costmodels.specs import RouterSpec

    config = {**preset_json("deepseek-v3"), key: value}
    with pytest.warns(LaunchSemanticsWarning, match=f"^{field}: "):
        model = spec_from_config(config, name="x", source="x")
    assert model.moe.router == RouterSpec() if field != "partial_rotary_factor" else model.rope is None
    assert model.moe.num_experts == 256 and model.num_layers == 61


@pytest.mark.parametrize("key", ["tie_word_embeddings", "attention_bias", "mlp_bias"])
def test_a_string_where_a_boolean_belongs_is_refused(tmp_path: Path, key) -> None:
    config = preset_json("llama-3.1-8b")
    config[key] = "yes"                      # truthy as a string: it used to tie the embeddings silently
    write_config(tmp_path / "bad-bool", config)
    assert key in load_error(str(tmp_path / "bad-bool"))


@pytest.mark.parametrize("config", [
    {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 256,
     "vocab_size": 256, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192},
    {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256, "vocab_size": 256,
     "tie_word_embeddings": False, "max_position_embeddings": 4096},
], ids=["gemma", "phi3"])
def test_small_model_types_read_the_same_with_and_without_autoconfig(tmp_path: Path, config: dict) -> None:
    path = write_config(tmp_path / config["model_type"], config)
    through_autoconfig = load_model(str(path))
    plain = spec_from_config(config, name=through_autoconfig.name, source="x")
    assert through_autoconfig == plain
    assert through_autoconfig.tied_embeddings == (config["model_type"] == "gemma")   # gemma ties by default


@st.composite
def complete_configs(draw: st.DrawFn) -> dict:
    """Random configs of the llama-like types with every key the mapping reads written out."""
    model_type = draw(st.sampled_from(["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe"]))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    config = {"model_type": model_type, "hidden_size": heads * 8 * draw(st.integers(1, 8)),  # transformers: h % a == 0
              "num_hidden_layers": draw(st.integers(1, 12)), "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": draw(st.sampled_from([8, 16, 32])),
              "intermediate_size": draw(st.integers(1, 512)), "vocab_size": draw(st.integers(1, 5000)),
              "max_position_embeddings": 4096, "tie_word_embeddings": draw(st.booleans()),
              "rope_theta": draw(st.sampled_from([10000.0, 500000.0, 1e6]))}
    if model_type in ("mixtral", "qwen3_moe", "qwen2_moe"):
        experts = draw(st.integers(2, 16))
        config.update({"num_local_experts" if model_type == "mixtral" else "num_experts": experts,
                       "num_experts_per_tok": draw(st.integers(1, experts))})
        if model_type != "mixtral":
            config.update(moe_intermediate_size=draw(st.integers(1, 256)), decoder_sparse_step=1, mlp_only_layers=[])
        if model_type == "qwen2_moe":
            config["shared_expert_intermediate_size"] = draw(st.integers(1, 256))
    return config


@given(complete_configs())
def test_autoconfig_and_plain_json_agree_on_complete_configs(config: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write_config(Path(folder) / "random", config)
        through_autoconfig = load_model(str(path))
    assert through_autoconfig == spec_from_config(config, name="random", source="x")


# ---- the fast path (no transformers) reads every config as AutoConfig would ------------------------------------

REQUIRED_KEYS = {"model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "vocab_size", "intermediate_size", "n_embd", "n_layer", "n_head", "num_experts_per_tok",
                 "moe_intermediate_size", "num_local_experts", "num_experts", "n_routed_experts"}
SMALL_CONFIGS = {  # the model types without a preset
    "gemma": {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 16, "intermediate_size": 256, "vocab_size": 256},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 256},
}


def outcome(read) -> object:
    """The spec, or the InputError's field (both paths must refuse the same configs)."""
    try:
        return dataclasses.replace(read(), name="x")
    except InputError as error:
        return ("InputError", error.field)


def fast_and_autoconfig(tmp_path: Path, config: dict) -> tuple[object, object]:
    from autopar.models import _autoconfig_dict, _require_fields, load_config_file

    path = write_config(tmp_path / "m", config)

    def through_autoconfig() -> ModelSpec:  # what load_config_file did before the fast path: raw checks, AutoConfig
        _require_fields(config, config["model_type"], str(path))
        return spec_from_config(_autoconfig_dict(path, allow_network=False), name="x", source="x", where=str(path))

    fast = outcome(lambda: load_config_file(path, name="x"))
    slow = outcome(through_autoconfig)
    return fast, slow


def base_configs() -> list[tuple[str, dict]]:
    configs = [(preset, preset_json(preset)) for preset in PRESET_OF_MODEL_TYPE.values()]
    return configs + [(name, config) for name, config in SMALL_CONFIGS.items()]


def test_every_fast_path_type_is_checked() -> None:
    assert {config["model_type"] for _, config in base_configs()} >= set(CONFIG_CLASS_DEFAULTS)
    assert set(CONFIG_CLASS_DEFAULTS) <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("stripped", [False, True], ids=["whole", "required-keys-only"])
@pytest.mark.parametrize("name,config", base_configs(), ids=[n for n, _ in base_configs()])
def test_fast_path_reads_like_autoconfig(tmp_path: Path, name: str, config: dict, stripped: bool) -> None:
    # without the optional keys, the model type's defaults (CONFIG_CLASS_DEFAULTS) must equal the config class's
    if stripped:
        config = {k: v for k, v in config.items() if k in REQUIRED_KEYS}
    fast, slow = fast_and_autoconfig(tmp_path, config)
    assert fast == slow


@given(st.sampled_from(base_configs()), st.data())
def test_fast_path_reads_like_autoconfig_with_random_keys_left_out(named: tuple[str, dict], data) -> None:
    _, config = named
    optional = sorted(k for k in config if k not in REQUIRED_KEYS)
    dropped = data.draw(st.sets(st.sampled_from(optional))) if optional else set()
    with tempfile.TemporaryDirectory() as folder:
        fast, slow = fast_and_autoconfig(Path(folder), {k: v for k, v in config.items() if k not in dropped})
    assert fast == slow


def test_loading_a_config_file_does_not_import_transformers(tmp_path: Path) -> None:
    path = write_config(tmp_path / "llama", preset_json("llama-3.1-8b"))
    code = (f"import sys; from autopar.models import load_model; load_model({str(path)!r}); "
            "assert 'transformers' not in sys.modules and 'huggingface_hub' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_explicit_zero_kv_heads_or_head_dim_is_refused(tmp_path: Path) -> None:
    for key in ("num_key_value_heads", "head_dim"):
        write_config(tmp_path / key, dict(preset_json("llama-3.1-8b"), **{key: 0}))
        message = load_error(str(tmp_path / key))
        assert message.startswith(f"{key}: must be a positive integer, got 0")


def test_unknown_model_type_falls_back_to_the_json(tmp_path: Path) -> None:
    # a model type transformers has never heard of, with Llama's keys: read as Llama
    config = dict(preset_json("llama-3.1-8b"), model_type="acme_llama", architectures=["AcmeLlamaForCausalLM"])
    write_config(tmp_path / "acme", config)
    with pytest.warns(UnknownModelTypeWarning, match="'acme_llama' is unknown to transformers; read as a llama-like"):
        model = load_model(str(tmp_path / "acme"))
    assert same_shape(model, load_model("llama-3.1-8b"))


# ---- the local Hugging Face cache ------------------------------------------------------------------------------

def fake_hub_cache(root: Path, repo_id: str, config: dict, revision: str = "0123456789abcdef") -> Path:
    """The standard layout: models--org--name/{refs/main, snapshots/<rev>/config.json}."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    write_config(repo / "snapshots" / revision, config)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return root


def test_cached_hf_id_loads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> None:
    cache = fake_hub_cache(tmp_path / "hub", "meta-llama/Llama-3.1-8B", preset_json("llama-3.1-8b"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    model = load_model("meta-llama/Llama-3.1-8B")
    assert model.name == "meta-llama/Llama-3.1-8B"
    assert same_shape(model, load_model("llama-3.1-8b"))
    assert "snapshots" in model.source


def test_cached_hf_id_through_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> None:
    fake_hub_cache(tmp_path / "home" / "hub", "deepseek-ai/DeepSeek-V3", preset_json("deepseek-v3"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert same_shape(load_model("deepseek-ai/DeepSeek-V3"), load_model("deepseek-v3"))


def test_uncached_hf_id_is_an_input_error_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          no_network: None) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    message = load_error("meta-llama/Llama-3.1-70B")
    assert "not in the local Hugging Face cache" in message and "--allow-network" in message
    assert "llama-3.1-70b" in message                                    # the preset of the same name


# ---- bad sources: one-line InputErrors -------------------------------------------------------------------------

def test_unknown_preset_suggests_close_names() -> None:
    message = load_error("llama-3.1-7b")
    assert "did you mean" in message and "llama-3.1-70b" in message and "autopar models" in message


def test_unknown_name_without_close_match() -> None:
    message = load_error("zzzz")
    assert "unknown model 'zzzz'" in message and "autopar models" in message


def test_empty_source() -> None:
    assert "preset" in load_error("  ")


def test_missing_path(tmp_path: Path) -> None:
    assert "does not exist" in load_error(str(tmp_path / "nope" / "config.json"))
    assert "does not exist" in load_error("./no/such/model/dir")


def test_directory_without_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in load_error(str(tmp_path / "empty"))


def test_malformed_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    message = load_error(str(path))
    assert "malformed JSON at line 3" in message


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    assert "expected a JSON object" in load_error(str(path))


def test_missing_required_fields_are_named(tmp_path: Path) -> None:
    config = preset_json("llama-3.1-8b")
    del config["hidden_size"], config["vocab_size"]
    message = load_error(str(write_config(tmp_path / "m", config)))
    assert "missing required fields hidden_size, vocab_size" in message


def test_missing_moe_fields_are_named(tmp_path: Path) -> None:
    config = preset_json("qwen3-30b-a3b")
    del config["moe_intermediate_size"]
    assert "moe_intermediate_size" in load_error(str(write_config(tmp_path / "m", config)))


def test_missing_model_type(tmp_path: Path) -> None:
    config = preset_json("llama-3.1-8b")
    del config["model_type"]
    assert "has no model_type" in load_error(str(write_config(tmp_path / "m", config)))


def test_encoder_known_to_transformers_is_unsupported(tmp_path: Path) -> None:
    bert = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768,
            "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522}
    message = load_error(str(write_config(tmp_path / "bert", bert)))
    assert "model_type 'bert'" in message and "not supported" in message and "BertForMaskedLM" in message


def test_unknown_encoder_is_unsupported(tmp_path: Path) -> None:
    config = {"model_type": "acme_encoder", "architectures": ["AcmeForMaskedLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    assert "not supported" in load_error(str(write_config(tmp_path / "acme", config)))


@pytest.mark.parametrize("key,value", [("hidden_size", 0), ("num_hidden_layers", -2), ("vocab_size", 0),
                                       ("num_key_value_heads", -1), ("intermediate_size", 1.5)])
def test_non_positive_sizes(tmp_path: Path, key: str, value: object) -> None:
    config = dict(preset_json("llama-3.1-8b"), **{key: value})
    message = load_error(str(write_config(tmp_path / "m", config)))
    assert key in message or "transformers could not parse" in message


def test_non_positive_sizes_in_plain_mapping() -> None:
    with pytest.raises(InputError, match="hidden_size: must be a positive integer, got 0"):
        spec_from_config(dict(preset_json("llama-3.1-8b"), hidden_size=0), name="m", source="x")


def test_inconsistent_heads_name_the_file(tmp_path: Path) -> None:
    config = dict(preset_json("llama-3.1-8b"), num_key_value_heads=5)     # 32 heads are not a multiple of 5
    message = load_error(str(write_config(tmp_path / "m", config)))
    assert "num_kv_heads" in message or "num_key_value_heads" in message


def test_unsupported_moe_layouts(tmp_path: Path) -> None:
    freq = dict(preset_json("deepseek-v2-lite"), moe_layer_freq=2)
    with pytest.raises(InputError, match="moe_layer_freq"):
        spec_from_config(freq, name="m", source="x")
    sparse = dict(preset_json("qwen3-30b-a3b"), mlp_only_layers=[5, 7])
    with pytest.raises(InputError, match="mlp_only_layers"):
        spec_from_config(sparse, name="m", source="x")
    prefix = spec_from_config(dict(preset_json("qwen3-30b-a3b"), mlp_only_layers=[0, 1]), name="m", source="x")
    assert prefix.moe.first_dense_layers == 2 and prefix.num_moe_layers == 46


# ---- `autopar models` ------------------------------------------------------------------------------------------

def run_models_command(*argv: str) -> int:
    from autopar.commands import models as command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["models", *argv])
    return args.run(args)


def test_models_command_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models_command() == 0
    out = capsys.readouterr().out
    assert "deepseek-v3" in out and "671.0B" in out and "37.6B" in out and "256+1s top8" in out
    assert "llama-3.1-70b" in out and "64/8" in out


def test_models_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models_command("--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(row["name"] for row in rows) == list(preset_names())
    mixtral = next(row for row in rows if row["name"] == "mixtral-8x7b")
    assert mixtral["num_experts"] == 8 and mixtral["top_k"] == 2
    assert abs(mixtral["total_params"] - 46.7e9) < 0.01 * 46.7e9


def test_copying_presets_keeps_them_loadable(tmp_path: Path) -> None:
    # presets are real config.json files: a copy anywhere is a valid model directory
    shutil.copy(PRESETS_DIR / "gpt-22b.json", tmp_path / "config.json")
    assert same_shape(load_model(str(tmp_path)), load_model("gpt-22b"))


# ---- nemotron, gpt_oss, bloom ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,total_billion", [("nemotron-4-15b", 15.6), ("nemotron-4-340b", 341.0),
                                                ("bloom-176b", 176.2), ("gpt-oss-120b", 116.8),
                                                ("gpt-oss-20b", 20.9), ("llama-3.2-1b", 1.24)])
def test_new_presets_match_published_parameter_counts(name: str, total_billion: float) -> None:
    """Nemotron-4 15B: 3.2B embedding + 12.5B other (arXiv 2402.16819); BLOOM 176B; gpt-oss 116.8B / 20.9B total
    (arXiv 2508.10925 Table 1); Llama 3.2 1B, 1.24B with its tied embedding (Meta's model card lists 1.23B)."""
    from costmodels.params import total_params
    assert total_params(load_model(name)) / 1e9 == pytest.approx(total_billion, abs=0.1)


def test_nemotron_is_a_squared_relu_mlp_without_gate() -> None:
    model = load_model("nemotron-4-15b")
    assert model.mlp is MlpKind.SQUARED_RELU and model.norm is NormKind.LAYERNORM
    assert model.position_embedding is PositionEmbedding.ROPE and not model.linear_bias
    assert model.num_kv_heads == 8 and model.ffn_hidden_size == 24576 and not model.tied_embeddings


def test_bloom_has_alibi_and_no_position_table() -> None:
    model = load_model("bloom-176b")
    assert model.position_embedding is PositionEmbedding.ALIBI and model.mlp is MlpKind.PLAIN
    assert model.tied_embeddings and model.linear_bias and model.ffn_hidden_size == 4 * 14336
    from costmodels.params import embedding_params
    learned = dataclasses.replace(model, position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=2048)
    assert embedding_params(learned) > embedding_params(model)


def test_gpt_oss_keeps_expert_width_in_intermediate_size() -> None:
    model = load_model("gpt-oss-120b")
    assert model.moe.num_experts == 128 and model.moe.top_k == 4 and model.moe.expert_ffn_hidden_size == 2880
    assert model.head_dim == 64 and model.q_size == 4096 != model.hidden_size
    assert model.sliding_window == 128 and model.sliding_window_layers == 18
    assert model.qkv_bias and model.linear_bias


def test_gpt_oss_layer_types_count_the_window_layers(tmp_path: Path) -> None:
    config = preset_json("gpt-oss-20b")
    config["layer_types"] = ["sliding_attention"] * 20 + ["full_attention"] * 4
    assert load_model(str(write_config(tmp_path / "a", config))).sliding_window_layers == 20
    config["layer_types"] = ["sliding_attention"] * 3
    with pytest.raises(InputError, match="layer_types"):
        load_model(str(write_config(tmp_path / "b", config)))


def test_sliding_window_cuts_attention_core_flops() -> None:
    from costmodels.compute import local_attention_core_fraction
    from costmodels.specs import TrainingSpec
    model = load_model("gpt-oss-120b")
    long = TrainingSpec(seq_len=8192, global_batch_size=8)
    # half the layers full, half see 128 of 8192 keys: (1 + (8192·128 - 128²/2)/(8192²/2)) / 2
    expected = (1 + (8192 * 128 - 128 * 128 / 2) / (8192 * 8192 / 2)) / 2
    assert local_attention_core_fraction(model, long) == pytest.approx(expected)
    full = dataclasses.replace(model, sliding_window=0, sliding_window_layers=0)
    assert local_attention_core_fraction(full, long) == 1.0


# ---- llama4 -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,total_billion,active_billion", [("llama-4-scout-17b-16e", 107.8, 17.2),
                                                               ("llama-4-maverick-17b-128e", 400.7, 17.2)])
def test_llama4_presets_match_the_model_card(name: str, total_billion: float, active_billion: float) -> None:
    """Llama 4 model card: 17B active; 400B total (Maverick), 109B total (Scout, with its ~1B vision tower, which is
    not laid out here). Scout by hand: experts 48·16·3·5120·8192 = 96.64B, shared experts 48·3·5120·8192 = 6.04B,
    attention 48·(2·5120² + 2·5120·1024) = 3.02B, embedding and head 2·202048·5120 = 2.07B -> 107.8B."""
    from costmodels.params import active_params, total_params
    model = load_model(name)
    assert total_params(model) / 1e9 == pytest.approx(total_billion, abs=0.1)
    assert active_params(model) / 1e9 == pytest.approx(active_billion, abs=0.1)
    assert model.moe.top_k == 1 and model.moe.num_shared_experts == 1
    assert model.moe.shared_expert_ffn_hidden_size == model.moe.expert_ffn_hidden_size == 8192
    assert model.attention_chunk_size == 8192 and model.chunked_attention_layers == 36    # all but every 4th layer


def test_maverick_interleaves_dense_and_moe_layers() -> None:
    model = load_model("llama-4-maverick-17b-128e")
    # HF Llama4TextConfig: moe_layers = range(step - 1, layers, step) with step 2 -> layers 1, 3, ..., 47
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert model.num_moe_layers == 24 and model.ffn_hidden_size == 16384     # dense layers: intermediate_size_mlp


def test_a_llama4_multimodal_config_is_read_as_its_text_model(tmp_path: Path) -> None:
    text = preset_json("llama-4-scout-17b-16e")
    wrapper = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text,
               "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408, "num_hidden_layers": 34}}
    assert same_shape(load_model(str(write_config(tmp_path / "mm", wrapper))), load_model("llama-4-scout-17b-16e"))
    broken = {k: v for k, v in wrapper.items() if k != "text_config"}
    message = load_error(str(write_config(tmp_path / "broken", broken)))
    assert "text_config" in message


def test_llama4_layer_patterns_are_read_from_every_key_that_states_them(tmp_path: Path) -> None:
    config = preset_json("llama-4-maverick-17b-128e")
    listed = {**config, "moe_layers": list(range(1, 48, 2))}
    assert load_model(str(write_config(tmp_path / "a", listed))).moe.layer_freq == 2
    irregular = {**config, "moe_layers": [0, 1, 5]}
    assert "moe_layers" in load_error(str(write_config(tmp_path / "b", irregular)))
    types = {**config, "layer_types": ["chunked_attention", "full_attention"] * 24}
    assert load_model(str(write_config(tmp_path / "c", types))).chunked_attention_layers == 24
    rope = {**config, "no_rope_layers": [1] * 40 + [0] * 8}
    assert load_model(str(write_config(tmp_path / "d", rope))).chunked_attention_layers == 40
    unchunked = {**config, "attention_chunk_size": None}
    model = load_model(str(write_config(tmp_path / "e", unchunked)))
    assert model.attention_chunk_size == 0 and model.chunked_attention_layers == 0


def test_chunked_attention_cuts_the_core_past_one_chunk() -> None:
    from costmodels.compute import local_attention_core_fraction
    from costmodels.specs import TrainingSpec
    model = load_model("llama-4-scout-17b-16e")
    # up to 8192 tokens a chunk is the whole sequence: full causal work
    assert local_attention_core_fraction(model, TrainingSpec(seq_len=8192, global_batch_size=8)) == 1.0
    # 20000 tokens = 2 chunks of 8192 and one of 3616: (2·8192² + 3616²) / 20000² of the causal pairs on 36 layers
    chunked = (2 * 8192**2 + 3616**2) / 20000**2
    expected = (12 + 36 * chunked) / 48
    assert local_attention_core_fraction(model, TrainingSpec(seq_len=20000, global_batch_size=8)) == \
        pytest.approx(expected)
