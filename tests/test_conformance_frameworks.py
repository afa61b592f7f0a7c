"""Each framework's OWN launch path on the configs autopar emits (the `conformance` extra: pip install -e
'.[conformance]', and NeMo's own venv, .venv-nemo, as .ci/run builds it; without them these tests skip, naming what
is missing).

For a bounded sample of the fourteen fronts (autopar/export/fronts.py; `benchmarks/conformance.py` runs every point)
every config must be accepted by the framework's launch path with the plan's values intact, or refused by autopar
with the knob named; and each framework's checker is shown to catch a config changed in one field (the defects of
issues 13 and 44), so these checks can fail.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import json
import re

import pytest

from autopar.export import launch_config
from autopar.export.conformance import (CHECKERS, NotInstalled, _nemo_compare, _nemo_job, _nemo_values, _python_312_names,
                                       check, check_all, nemo_launch, nemo_python)
from autopar.export.fronts import FRONT_CASES, solve_case

SAMPLE = 2
"""Points per front here; benchmarks/conformance.py checks them all."""

MODULES = {"megatron": "megatron.training.arguments", "nemo": "megatron.core", "bridge": "megatron.core",
           "verl": "verl.utils.config", "torchtitan": "torchtitan.config.manager",
           "deepspeed": "deepspeed.runtime.config"}


@functools.cache
def missing(framework: str) -> str | None:
    _python_312_names()
    try:
        importlib.import_module(MODULES[framework])
        if framework == "bridge":
            importlib.metadata.distribution("megatron-bridge")
        if framework == "nemo":
            nemo_python()
    except Exception as error:  # noqa: BLE001 - any import failure means "not installed here"
        return f"{framework}: {MODULES[framework]} not importable ({type(error).__name__}: {error}); " \
               "pip install -e '.[conformance]'"
    return None


def needs(framework: str) -> None:
    reason = missing(framework)
    if reason:
        pytest.skip(reason)


@functools.cache
def front(name: str, framework: str | None = None):
    case = next(c for c in FRONT_CASES if c.name == name)
    return solve_case(case, framework=framework).points


@pytest.mark.parametrize("framework", list(MODULES))
def test_a_sample_of_every_front_is_accepted_or_refused_with_the_reason(framework):
    needs(framework)
    points = [point for case in FRONT_CASES for point in front(case.name)[:SAMPLE]]
    for verdict in check_all(points, framework):
        assert verdict.outcome in ("accepted", "refused_with_reason"), verdict


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_the_front_searched_for_a_framework_is_accepted_whole(framework):
    needs(framework)
    for point in front("mixtral", framework)[:SAMPLE] + front("dense-70b", framework)[:SAMPLE]:
        assert check(point, framework).outcome == "accepted"


@pytest.mark.parametrize("framework", ["megatron", "nemo", "bridge", "verl"])
def test_the_fp8_parameter_front_searched_for_a_megatron_core_framework_is_accepted(framework):
    """The fp8-params front's first points run under Megatron-FSDP, which NeMo, Bridge and verl refuse with fp32
    gradients; the front each framework's own search returns has plans they launch with fp8 parameters."""
    needs(framework)
    points = front("fp8-params", framework)[:SAMPLE]
    assert points and all(point.training.fp8_param_gather for point in points)
    for point, verdict in zip(points, check_all(points, framework)):
        assert verdict.outcome == "accepted", point.plan.short()


def _run(framework: str, estimate, text: str) -> str:
    return _runs(framework, estimate, text)[0]


def _runs(framework: str, estimate, *texts: str) -> list[str]:
    """The outcome of each text launched for `estimate` (NeMo's in one process of its environment)."""
    config = launch_config(estimate, framework)
    priced = config.priced or estimate
    if framework == "nemo":
        jobs = [_nemo_job(dataclasses.replace(config, text=text)) for text in texts]
        outcomes = []
        for result in nemo_launch(jobs):
            try:
                changed = _nemo_compare(priced, _nemo_values(result))
            except Exception:  # noqa: BLE001 - NeMo refused the config
                outcomes.append("rejected")
                continue
            outcomes.append("silently_changed" if changed else "accepted")
        return outcomes
    outcomes = []
    for text in texts:
        try:
            changed = CHECKERS[framework](priced, dataclasses.replace(config, text=text))
        except NotInstalled:
            raise
        except (Exception, SystemExit):
            outcomes.append("rejected")
            continue
        outcomes.append("silently_changed" if changed else "accepted")
    return outcomes


def test_deepspeed_rejects_the_old_batch_accounting():
    needs("deepspeed")
    import autopar

    case = FRONT_CASES[0]
    point = autopar.estimate(autopar.load_model(case.model), autopar.make_cluster(gpu=case.gpu, num_gpus=case.num_gpus),
                             autopar.Training(seq_len=case.seq_len, global_batch_size=case.global_batch_size),
                             autopar.Plan(tp=4, sp=False, zero=1))
    text = launch_config(point, "deepspeed").text
    assert _run("deepspeed", point, text) == "accepted"
    config = json.loads(text)
    config["train_batch_size"] = point.training.global_batch_size   # what autopar used to write with tp > 1
    assert _run("deepspeed", point, json.dumps(config)) == "rejected"


def test_megatron_rejects_a_launch_line_without_the_connections_setting():
    needs("megatron")
    fsdp = next(p for p in front("dense-70b") if p.plan.zero >= 2)
    text = launch_config(fsdp, "megatron").text
    assert _run("megatron", fsdp, text) == "accepted"
    assert _run("megatron", fsdp, text.replace("env -u CUDA_DEVICE_MAX_CONNECTIONS ",
                                               "CUDA_DEVICE_MAX_CONNECTIONS=1 ")) == "rejected"
    tensor = next(p for p in front("mixtral") if p.plan.tp > 1 and p.plan.zero < 2)
    text = launch_config(tensor, "megatron").text
    assert _run("megatron", tensor, text.replace("CUDA_DEVICE_MAX_CONNECTIONS=1 ", "")) == "rejected"


def test_verl_rejects_overrides_without_plus_or_train_batch_size():
    needs("verl")
    point = front("dense-70b", "verl")[0]
    text = launch_config(point, "verl").text
    assert _run("verl", point, text.replace("+actor_rollout_ref", "actor_rollout_ref")) == "rejected"
    small = re.sub(r"data\.train_batch_size=\d+", "data.train_batch_size=8", text)
    assert _run("verl", point, small) == "rejected"


def test_bridge_recipe_split_must_be_cleared():
    needs("bridge")
    point = next(p for p in front("405b-interleaved") if p.plan.pp > 1 and not (
        "account_for_embedding_in_pipeline_split=true" in launch_config(p, "bridge").text))
    text = launch_config(point, "bridge").text
    assert _run("bridge", point, text) == "accepted"
    kept = "\n".join(line for line in text.splitlines() if "account_for" not in line and "layout" not in line)
    assert _run("bridge", point, kept) in ("rejected", "silently_changed")   # the recipe's slots stay


def test_nemo_runs_the_plans_pipeline_split_or_the_checker_says_so():
    """The split is the strategy's (MegatronStrategy.connect copies its parallelism over model.config and runs
    TransformerConfig.__post_init__ again): one layer moved from the last stage to the first, or the embedding slot
    dropped, is a different split."""
    needs("nemo")
    point = next(p for p in front("405b-interleaved") if p.plan.first_stage_layers or p.plan.last_stage_layers)
    text = launch_config(point, "nemo").text
    first = re.search(r"trainer\.strategy\.num_layers_in_first_pipeline_stage=(\d+)", text)
    if first:
        moved = text.replace(first.group(0), first.group(0)[:-len(first.group(1))] + str(int(first.group(1)) + 1))
    else:
        moved = text.replace("trainer.strategy.account_for_embedding_in_pipeline_split=true",
                             "trainer.strategy.account_for_embedding_in_pipeline_split=false")
    assert moved != text
    ran, changed = _runs("nemo", point, text, moved)
    assert ran == "accepted" and changed in ("rejected", "silently_changed")


def test_torchtitan_refuses_cuda_graphs_with_pipeline_parallelism():
    needs("torchtitan")
    point = next(p for p in front("dense-70b", "torchtitan") if p.plan.pp > 1)
    text = launch_config(point, "torchtitan").text
    assert _run("torchtitan", point, text) == "accepted"
    assert _run("torchtitan", point, text.replace("    config.training.disable_cuda_graphs = True\n", "")) == \
        "rejected"


def _estimate(model: str, num_gpus: int, training: dict | None = None, **plan):
    import autopar

    return autopar.estimate(autopar.load_model(model), autopar.make_cluster(gpu="h100", num_gpus=num_gpus),
                            autopar.Training(seq_len=4096, global_batch_size=1024, **(training or {})),
                            autopar.Plan(**plan))


def test_megatron_rejects_a_top1_router_without_its_score_function():
    """Llama 4 routes top-1 through a sigmoid (Llama4Router); written without it, Megatron-Core's softmax at top-1
    is refused ('Please use --moe-router-pre-softmax when topk is 1')."""
    needs("megatron")
    point = _estimate("llama-4-scout-17b-16e", 64, tp=4, sp=True, ep=16, etp=1, mbs=1, zero=1)
    text = launch_config(point, "megatron").text
    assert "--moe-router-score-function sigmoid" in text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("--moe-router-score-function sigmoid", "")) == "rejected"


def test_bridge_rejects_a_layout_the_shell_unquoted():
    """The override reaches Hydra after the shell has stripped one level of quotes: a layout with '(' must still
    be a quoted Hydra string then."""
    needs("bridge")
    point = _estimate("llama-3.1-70b", 64, tp=8, sp=True, pp=4, vpp=2, mbs=1, layout=(8, 11, 11, 10, 11, 11, 11, 7))
    text = launch_config(point, "bridge").text
    assert "(t*11|)*3" in text
    assert _run("bridge", point, text) == "accepted"
    assert _run("bridge", point, text.replace("=\"'Et*8", "='Et*8").replace("t*7L'\"", "t*7L'")) == "rejected"


def test_nemo_run_rejects_a_hydra_style_list():
    """`nemo llm pretrain` reads a list value with ast.literal_eval (NeMo-Run's CLI parser): Hydra's bare-word list
    [moe_act,mla_up_proj] is refused, a Python list of strings is read."""
    needs("nemo")
    point = _estimate("deepseek-v2-lite", 16, tp=2, sp=True, ep=8, etp=1, mbs=1, recompute="selective",
                      recompute_modules=("mla_up_proj", "moe_act"))
    text = launch_config(point, "nemo").text
    assert "recompute_modules=\"['moe_act','mla_up_proj']\"" in text
    assert _runs("nemo", point, text, text.replace("\"['moe_act','mla_up_proj']\"", "[moe_act,mla_up_proj]")) == \
        ["accepted", "rejected"]


def test_megatron_ep_overlap_must_not_run_on_one_hardware_queue():
    """validate_args accepts --overlap-moe-expert-parallel-comm with CUDA_DEVICE_MAX_CONNECTIONS=1 (a warning only),
    and the all-to-all the step time hid then runs serialised: the checker calls it silently changed."""
    needs("megatron")
    point = _estimate("qwen3-30b-a3b", 64, dict(moe_a2a_overlap=True), tp=2, sp=True, pp=2, vpp=2, ep=8, etp=1,
                      mbs=1)
    text = launch_config(point, "megatron").text
    assert text.count("CUDA_DEVICE_MAX_CONNECTIONS=32 ") == 1 and "--overlap-moe-expert-parallel-comm" in text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("CUDA_DEVICE_MAX_CONNECTIONS=32 ", "CUDA_DEVICE_MAX_CONNECTIONS=1 ")) \
        == "silently_changed"


def test_megatron_builds_the_models_rotary_base_or_the_checker_says_so():
    """Without --rotary-base Megatron-LM builds RoPE at base 10000: a different model from Llama 3.1's 500000."""
    needs("megatron")
    point = _estimate("llama-3.1-8b", 8, tp=2, sp=True, mbs=1)
    text = launch_config(point, "megatron").text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("--rotary-base 500000", "")) == "silently_changed"


def test_megatron_builds_mla_yarn_at_the_models_factor_or_the_checker_says_so():
    """Under --multi-latent-attention Megatron-Core applies yarn at --rotary-scaling-factor (default 1): without it
    DeepSeek-V3's factor 40 and attention scale are lost."""
    needs("megatron")
    point = _estimate("deepseek-v3", 256, pp=8, ep=32, mbs=1, first_stage_layers=5, last_stage_layers=8)
    text = launch_config(point, "megatron").text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("--rotary-scaling-factor 40", "")) == "silently_changed"


def test_megatron_runs_the_fp8_recipe_the_estimate_priced_or_the_checker_says_so():
    """Without --fp8-recipe Megatron-Core runs delayed scaling (TransformerConfig.fp8_recipe's default): a
    current-scaling estimate launched so would run other casts than it priced."""
    needs("megatron")
    point = _estimate("llama-3.1-8b", 8, dict(precision="fp8", fp8_recipe="tensorwise"), tp=2, sp=True, mbs=1)
    text = launch_config(point, "megatron").text
    assert "--fp8-recipe tensorwise \\\n" in text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("--fp8-recipe tensorwise", "")) == "silently_changed"
    assert _run("megatron", point, text.replace("--fp8-format hybrid", "")) == "silently_changed"


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_bridge_preset_sets_the_fp8_recipe_the_estimate_priced(recipe):
    """Each recipe's Megatron-Bridge preset sets that recipe (read from the installed mixed_precision.py); the
    current-scaling preset the export used to write for every fp8 plan does not run delayed scaling."""
    needs("bridge")
    point = _estimate("llama-3.1-8b", 8, dict(precision="fp8", fp8_recipe=recipe), tp=2, sp=True, mbs=1)
    text = launch_config(point, "bridge").text
    assert _run("bridge", point, text) == "accepted"
    if recipe == "delayed":
        current = re.sub(r"mixed_precision=\S+", "mixed_precision=bf16_with_fp8_current_scaling_mixed", text)
        assert _run("bridge", point, current) == "silently_changed"
    assert _run("bridge", point, re.sub(r"mixed_precision=\S+", "mixed_precision=bf16_with_fp8_nonexistent",
                                        text)) == "rejected"


def test_each_framework_reduces_gradients_in_the_dtype_the_estimate_priced_or_the_checker_says_so():
    """bf16 gradients: without the line that sets them each framework falls back to its own default, and the checker
    says so -- Megatron-LM's and verl's fp32; NeMo's preset's fp32, which the precision plugin applies over the
    ddp field (so the ddp line alone changes nothing); DeepSpeed's written dtype read back from DeepSpeedConfig."""
    point = _estimate("llama-3.1-8b", 32, {"grad_reduce_in_fp32": False}, tp=2, sp=True, zero=1, mbs=1)
    edits = {"megatron": ("    --grad-reduce-in-bf16 \\\n", ""),
             "nemo": (" \\\ntrainer.plugins.grad_reduce_in_fp32=false", ""),
             "verl": ("override_ddp_config.grad_reduce_in_fp32=False", "override_ddp_config.grad_reduce_in_fp32=True")}
    for framework, (old, new) in edits.items():
        needs(framework)
        text = launch_config(point, framework).text
        assert _run(framework, point, text) == "accepted", framework
        assert old in text, (framework, text)
        assert _run(framework, point, text.replace(old, new)) == "silently_changed", framework
    needs("deepspeed")
    flat = _estimate("llama-3.1-8b", 32, {"grad_reduce_in_fp32": False}, zero=2, mbs=1)
    config = json.loads(launch_config(flat, "deepspeed").text)
    assert _run("deepspeed", flat, json.dumps(config)) == "accepted"
    assert _run("deepspeed", flat, json.dumps({**config, "communication_data_type": "fp32"})) == "silently_changed"


def test_megatron_fsdp_keeps_its_gradients_in_the_dtype_the_estimate_priced_or_the_checker_says_so():
    """zero>=2 runs Megatron-FSDP, which (megatron-core 0.19) does not read grad_reduce_in_fp32: fp32 gradients need
    --megatron-fsdp-main-grads-dtype fp32 (without it, 'auto' is the parameters' bf16); NeMo 2.7.3, on megatron-core
    0.16, whose Megatron-FSDP reads grad_reduce_in_fp32, runs bf16 and fp32 zero>=2 plans as priced."""
    needs("megatron")
    point = _estimate("llama-3.1-8b", 32, {}, tp=2, sp=True, zero=2, mbs=1)
    text = launch_config(point, "megatron").text
    assert _run("megatron", point, text) == "accepted"
    assert "--megatron-fsdp-main-grads-dtype fp32" in text, text
    assert _run("megatron", point, text.replace("--megatron-fsdp-main-grads-dtype fp32", "")) == "silently_changed"
    needs("nemo")
    bf16 = _estimate("llama-3.1-8b", 32, {"grad_reduce_in_fp32": False}, tp=2, sp=True, zero=3, mbs=1)
    text = launch_config(bf16, "nemo").text
    assert _runs("nemo", bf16, text, text.replace("grad_reduce_in_fp32=false", "grad_reduce_in_fp32=true")) == \
        ["accepted", "silently_changed"]


def _fp8_estimate(recipe: str, params: bool, zero: int = 1):
    import autopar

    gpu = "b200" if recipe == "mxfp8" else "h100"
    return autopar.estimate(autopar.load_model("llama-3.1-8b"), autopar.make_cluster(gpu=gpu, num_gpus=32),
                            autopar.Training(seq_len=4096, global_batch_size=256, precision="fp8", fp8_recipe=recipe,
                                             fp8_param_gather=params, grad_reduce_in_fp32=zero <= 1),
                            autopar.Plan(tp=2, sp=True, mbs=1, zero=zero))


def test_megatron_runs_the_fp8_parameters_the_estimate_priced_or_the_checker_says_so():
    """MXFP8 fp8 parameters under the distributed optimizer: --fp8-param-gather with the gradient-buffer reuse.
    Without the reuse flag the job gathers through a buffer of its own (silently changed); without the fp8
    parameters Megatron-Core's DDP config refuses the reuse flag ('Reuse grad buffer only when keeping params in
    MXFP8.'); fp8 parameters where bf16 weights were priced are silently changed too."""
    needs("megatron")
    point = _fp8_estimate("mxfp8", True)
    text = launch_config(point, "megatron").text
    assert "--fp8-param-gather \\\n" in text and "--reuse-grad-buf-for-mxfp8-param-ag \\\n" in text
    assert _run("megatron", point, text) == "accepted"
    assert _run("megatron", point, text.replace("--reuse-grad-buf-for-mxfp8-param-ag \\\n", "")) == \
        "silently_changed"
    assert _run("megatron", point, text.replace("--fp8-param-gather \\\n", "")) == "rejected"
    bf16_weights = _fp8_estimate("delayed", False)
    text = launch_config(bf16_weights, "megatron").text
    assert "--fp8-param-gather" not in text and _run("megatron", bf16_weights, text) == "accepted"
    assert _run("megatron", bf16_weights, text.replace("--fp8-recipe delayed", "--fp8-recipe delayed "
                                                       "--fp8-param-gather")) == "silently_changed"


def test_nemo_overrides_its_presets_fp8_parameters_or_the_checker_says_so():
    """NeMo 2.7.3's MXFP8 preset keeps fp8 parameters (and the gradient-buffer reuse): an estimate priced with bf16
    weights writes both off after it, and without those lines the preset's run. The fp8 presets are no NeMo-Run CLI
    factories: named bare, NeMo-Run finds none; fp8_params beside a differing fp8_param_gather is
    MegatronMixedPrecision's ValueError."""
    needs("nemo")
    point = _fp8_estimate("mxfp8", False)
    text = launch_config(point, "nemo").text
    off = " \\\ntrainer.plugins.fp8_param_gather=false \\\ntrainer.plugins.reuse_grad_buf_for_mxfp8_param_ag=false"
    assert off in text
    assert _runs("nemo", point, text, text.replace(off, ""),
                 text.replace("nemo.collections.llm.recipes.precision.mixed_precision.", ""),
                 text.rstrip("\n") + " \\\ntrainer.plugins.fp8_params=true\n") == \
        ["accepted", "silently_changed", "rejected", "rejected"]
    params = _fp8_estimate("delayed", True)
    text = launch_config(params, "nemo").text
    assert _runs("nemo", params, text, text.replace("fp8_param_gather=true", "fp8_param_gather=false")) == \
        ["accepted", "silently_changed"]


def test_bridge_runs_its_preset_with_the_fp8_parameters_the_estimate_priced_or_the_checker_says_so():
    """Bridge's delayed preset keeps fp8 parameters: an estimate priced with bf16 weights gets the preset's
    MixedPrecisionConfig with fp8_param_gather off, which Bridge's own override loader instantiates. Named instead,
    the preset runs fp8 parameters (silently changed); a node missing a preset field runs other scaling than the
    preset's (silently changed); a node Bridge cannot instantiate is rejected; MXFP8 fp8 parameters without the
    gradient-buffer reuse fail Bridge's assert."""
    needs("bridge")
    point = _fp8_estimate("delayed", False)
    text = launch_config(point, "bridge").text
    node = re.search(r'mixed_precision=("\{_target_:\S+)', text).group(1)
    assert "fp8_param_gather:false" in node and _run("bridge", point, text) == "accepted"
    assert _run("bridge", point, text.replace(node, "bf16_with_fp8_delayed_scaling_mixed")) == "silently_changed"
    assert _run("bridge", point, text.replace("fp8_amax_history_len:1024,", "")) == "silently_changed"
    assert _run("bridge", point, text.replace("MixedPrecisionConfig", "MixedPrecisionConfigs")) == "rejected"
    params = _fp8_estimate("mxfp8", True)
    text = launch_config(params, "bridge").text
    assert "mixed_precision=bf16_with_mxfp8_mixed\n" in text and _run("bridge", params, text) == "accepted"
    node = ('"{_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,bf16:true,'
            'params_dtype:{_target_:torch.bfloat16,_call_:false},pipeline_dtype:{_target_:torch.bfloat16,_call_:false},'
            'fp8:e4m3,fp8_recipe:mxfp8,fp8_param_gather:true}"')
    assert _run("bridge", params, text.replace("bf16_with_mxfp8_mixed", node)) == "rejected"


def test_verl_runs_the_fp8_and_fp8_parameters_the_estimate_priced_or_the_checker_says_so():
    """verl takes fp8 as TransformerConfig, DDP and optimizer overrides: without the fp8_param line the model keeps
    bf16 weights (silently changed), without fp8 Megatron-Core refuses fp8_param ('fp8_param must be used together
    with fp8 mode'), and MXFP8's gradient-buffer reuse must be on in the DDP and optimizer configs alike."""
    needs("verl")
    point = _fp8_estimate("mxfp8", True)
    text = launch_config(point, "verl").text
    assert _run("verl", point, text) == "accepted"
    prefix = "+actor_rollout_ref.actor.megatron.override_transformer_config."
    assert _run("verl", point, text.replace(f"{prefix}fp8_param=True", f"{prefix}fp8_param=False")) == \
        "silently_changed"
    assert _run("verl", point, re.sub(rf"{re.escape(prefix)}fp8=hybrid \\\n", "", text)) == "rejected"
    ddp_reuse = "override_ddp_config.reuse_grad_buf_for_mxfp8_param_ag=True"
    assert _run("verl", point, text.replace(ddp_reuse, ddp_reuse.replace("True", "False"))) == "silently_changed"
    bf16_weights = _fp8_estimate("tensorwise", False)
    text = launch_config(bf16_weights, "verl").text
    assert _run("verl", bf16_weights, text) == "accepted"
    assert _run("verl", bf16_weights, text.replace("fp8_recipe=tensorwise", "fp8_recipe=delayed")) == \
        "silently_changed"


# ---- issue 44: what each framework's launch path changed or refused, each shown caught ------------------------

def test_nemo_refuses_the_bf16_preset_by_bare_name():
    """NeMo-Run cannot parse a bare 'bf16_mixed' as trainer.plugins (a Union of Lightning plugin types: ParseError);
    the export names it by its dotted path, which resolves."""
    needs("nemo")
    point = front("dense-70b")[0]
    text = launch_config(point, "nemo").text
    dotted = "trainer.plugins=nemo.collections.llm.recipes.precision.mixed_precision.bf16_mixed"
    assert dotted in text
    assert _runs("nemo", point, text, text.replace(dotted, "trainer.plugins=bf16_mixed")) == ["accepted", "rejected"]


def test_bridge_comm_overlap_setup_would_turn_the_overlaps_back_on():
    """The Llama 3.1 70B recipe sets a CommOverlapConfig; runtime_config_update runs its setup after the overrides,
    which turns overlap_grad_reduce / overlap_param_gather on for dp > 1 and keeps the recipe's tp_comm_overlap:
    without the ++comm_overlap node the job runs overlaps the plan priced off. A plain `comm_overlap=` cannot replace
    the recipe's node (Hydra: 'Could not override')."""
    needs("bridge")
    point = next(p for p in front("dense-70b") if p.dp > 1 and p.plan.zero <= 1)
    text = launch_config(point, "bridge").text
    line = next(line for line in text.splitlines() if line.startswith("++comm_overlap="))
    assert "overlap_grad_reduce:false" in line
    dropped = "\n".join(other for other in text.splitlines() if other != line and other != line.rstrip(" \\"))
    assert _runs("bridge", point, text, dropped, text.replace("++comm_overlap=", "comm_overlap=")) == \
        ["accepted", "silently_changed", "rejected"]


def test_verl_needs_the_critic_for_gae_and_trains_the_priced_sequence():
    """GAE (verl's default) trains a critic: without its micro-batch verl's validate_config refuses the config; without
    the data lengths verl trains 512 + 512 tokens, not the priced sequence."""
    needs("verl")
    point = front("dense-70b", "verl")[0]
    text = launch_config(point, "verl").text
    assert "algorithm.adv_estimator=gae" in text and "critic.ppo_micro_batch_size_per_gpu=" in text
    no_critic = re.sub(r"critic\.ppo_micro_batch_size_per_gpu=\d+ \\\n", "", text)
    no_length = re.sub(r"data\.max_(prompt|response)_length=\d+ \\\n", "", text)
    assert _runs("verl", point, text, no_critic, no_length) == ["accepted", "rejected", "silently_changed"]
    grpo = launch_config(point, "verl", verl_algorithm="grpo").text
    assert "critic." not in grpo and "use_kl_loss=True" in grpo
    assert check(point, "verl", verl_algorithm="grpo").outcome == "accepted"


def test_torchtitan_default_reshard_policy_keeps_zero3_parameters_gathered_under_pp():
    """torchtitan's 'default' fsdp_reshard_after_forward is False with pp > 1: a ZeRO-3 plan written without the
    explicit 'always' would run as ZeRO-2 (the checker resolves the policy as apply_fsdp_to_decoder does)."""
    needs("torchtitan")
    point = next(p for p in front("dense-70b", "torchtitan") if p.plan.pp > 1 and p.plan.zero == 3)
    text = launch_config(point, "torchtitan").text
    assert "fsdp_reshard_after_forward='always'" in text
    assert _runs("torchtitan", point, text, text.replace("'always'", "'default'")) == ["accepted", "silently_changed"]


def test_torchtitan_runs_the_activation_checkpointing_and_compile_the_estimate_priced_or_the_checker_says_so():
    """Per-op SAC priced (engine torchtitan, recompute selective) must launch as SelectiveAC, a compiled estimate
    compiled: a config with FullAC, or with compile off, runs something else."""
    needs("torchtitan")
    from costmodels.plan import Recompute
    from costmodels.scoring import estimate as score
    from costmodels.specs import Engine

    base = front("qwen3-moe-h200", "torchtitan")[0]
    training = dataclasses.replace(base.training, engine=Engine.TORCHTITAN, launch="compile", cross_entropy="xentropy")
    point = score(base.model, base.cluster, training,
                  dataclasses.replace(base.plan, recompute=Recompute.SELECTIVE, recompute_modules=0))
    text = launch_config(point, "torchtitan").text
    assert "SelectiveAC.Config()" in text and "CompileConfig(enable=True)" in text
    full = text.replace("import SelectiveAC", "import FullAC").replace("SelectiveAC.Config()", "FullAC.Config()")
    eager = text.replace("CompileConfig(enable=True)", "CompileConfig(enable=False)")
    assert _runs("torchtitan", point, text, full, eager) == ["accepted", "silently_changed", "silently_changed"]


def test_bridge_runs_the_cuda_graphs_the_estimate_priced_or_the_checker_says_so():
    """Megatron-Bridge's Qwen3-30B-A3B recipe turns on Transformer Engine CUDA graphs (moe_router, moe_preprocess):
    an eager estimate written without cuda_graph_impl=none launches graphed (and with full recompute Megatron-Core
    refuses it: 'full recompute is only supported with full iteration CUDA graph', found by the full conformance
    run); a graphed estimate launched without its modules captures the whole layer instead."""
    needs("bridge")
    from costmodels.plan import Recompute
    from costmodels.scoring import estimate as score

    point = next(p for p in front("qwen3-moe-h200") if p.plan.recompute is not Recompute.FULL)
    text = launch_config(point, "bridge").text
    assert "model.cuda_graph_impl=none" in text and "model.cuda_graph_scope=null" in text
    recipes = text.replace("model.cuda_graph_impl=none", "model.pipeline_model_parallel_layout=null") \
        .replace("model.cuda_graph_scope=null", "model.pipeline_model_parallel_layout=null")
    full = next(p for p in front("qwen3-moe-h200") if p.plan.recompute is Recompute.FULL)
    full_text = launch_config(full, "bridge").text
    assert _runs("bridge", point, text, recipes) == ["accepted", "silently_changed"]
    assert _runs("bridge", full, full_text, full_text.replace("model.cuda_graph_impl=none",
                                                              "model.pipeline_model_parallel_layout=null")) == \
        ["accepted", "rejected"]
    graphed = score(point.model, point.cluster, dataclasses.replace(
        point.training, launch="cuda_graph", cuda_graph_modules=("moe_router", "moe_preprocess")), point.plan)
    graphed_text = launch_config(graphed, "bridge").text
    assert "model.cuda_graph_impl=transformer_engine" in graphed_text
    whole_layer = re.sub(r"model\.cuda_graph_modules=\S+", "model.cuda_graph_modules=[]", graphed_text)
    assert _runs("bridge", graphed, graphed_text, whole_layer) == ["accepted", "silently_changed"]


@pytest.mark.parametrize("framework", ["megatron", "nemo", "verl"])
def test_a_graphed_estimate_launches_graphed_or_the_checker_says_so(framework):
    """An estimate priced with CUDA graphs (--cuda-graph-impl) is written with them: the same config without the
    graph settings launches eager, and the checker flags it."""
    needs(framework)
    from costmodels.plan import Recompute
    from costmodels.scoring import estimate as score

    base = next(p for p in front("dense-70b") if p.plan.recompute is not Recompute.FULL)
    graphed = score(base.model, base.cluster, dataclasses.replace(base.training, launch="cuda_graph",
                                                                  cuda_graph_modules=("attn",)), base.plan)
    text = launch_config(graphed, framework).text
    eager = "\n".join(line for line in text.splitlines() if "cuda_graph" not in line.replace("-", "_"))
    assert eager != text
    assert _runs(framework, graphed, text, eager) == ["accepted", "silently_changed"]


@pytest.mark.parametrize("framework", ["megatron", "bridge", "verl", "nemo"])
def test_a_whole_iteration_graph_with_full_recompute_launches_as_priced(framework):
    """Megatron-Core takes full recompute only under a whole-iteration graph (--cuda-graph-impl full_iteration;
    megatron-core 0.16, NeMo's: impl local with scope full_iteration): written so, each framework accepts it; written
    as per-layer graphs, Megatron-Core refuses it."""
    needs(framework)
    from costmodels.plan import Recompute
    from costmodels.scoring import estimate as score

    base = next(p for p in front("bf16-grads") if p.plan.recompute is Recompute.FULL)
    graphed = score(base.model, base.cluster, dataclasses.replace(base.training, launch="cuda_graph",
                                                                  cuda_graph_full_iteration=True), base.plan)
    text = launch_config(graphed, framework).text
    impl = "local" if framework == "nemo" else "full_iteration"
    assert f"cuda_graph_impl={impl}" in text.replace("--cuda-graph-impl ", "cuda_graph_impl=")
    if framework == "nemo":
        per_layer = text.replace("model.config.cuda_graph_scope=full_iteration", "model.config.cuda_graph_scope=full")
    else:
        per_layer = text.replace("full_iteration", "transformer_engine")
    assert _runs(framework, graphed, text, per_layer) == ["accepted", "rejected"]


@pytest.mark.parametrize("framework", ["megatron", "bridge", "verl"])
def test_the_offloading_a_plan_was_priced_with_is_what_the_framework_runs(framework):
    """A plan priced with fine-grained activation offloading (TrainingSpec.offload_modules) launches with it: the
    framework's TransformerConfig offloads the same modules; the same config without the offloading is caught as
    silently changed (it would hold what was priced on the host)."""
    needs(framework)
    import autopar

    point = autopar.estimate(autopar.load_model("qwen3-30b-a3b"), autopar.make_cluster(gpu="h100", num_gpus=16),
                             autopar.Training(seq_len=4096, global_batch_size=64, offload_fraction=0.5,
                                              offload_modules=("core_attn", "attn_proj", "expert_fc1")),
                             autopar.Plan(ep=8, zero=1))
    text = launch_config(point, framework).text
    assert "offload" in text
    plain = {"megatron": lambda t: "\n".join(line for line in t.splitlines() if "offload" not in line),
             "bridge": lambda t: t.replace("fine_grained_activation_offloading=true", "fine_grained_activation_"
                                                                                     "offloading=false"),
             "verl": lambda t: t.replace("fine_grained_activation_offloading=True", "fine_grained_activation_"
                                                                                   "offloading=False")}[framework]
    assert plain(text) != text
    assert _runs(framework, point, text, plain(text)) == ["accepted", "silently_changed"]
