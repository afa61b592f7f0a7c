"""Megatron-Core's own TransformerConfig accepts every per-stage layout autopar emits, and builds the layers planned.

For the best layout of every structure the layout search refines on the scenarios of benchmarks/layouts.py (S2
llama-3.1-70b on 256 H100, S4 deepseek-v3 with its MTP layer on 2,048 H100, S5 llama-3.1-405b on 16,384 H100, Q8
qwen3-8b at pp 8; their definitions and search are the benchmark's own functions) and for generated layouts (empty
stages, MTP, interleaving), the Megatron-LM command `--emit megatron` writes is read back flag by flag, and
megatron-core's `TransformerConfig` is built from its --num-layers, --pipeline-model-parallel-size,
--pipeline-model-parallel-layout and --mtp-num-layers (its __post_init__ parses the string into a
`PipelineParallelLayerLayout` and runs `validate_layer_layout`: embedding first, loss last, every decoder and MTP
layer once, MTP after the decoder layers on a rank's last chunk). Then Megatron-Core's own `get_layer_id_list` says
which decoder layers each (pipeline rank, virtual stage) builds, and that must be exactly the layers autopar planned
there: virtual stage i = vp_stage · pp + rank holds layers [Σ_{j<i} layout_j, Σ_{j≤i} layout_j).

megatron-core comes from the package registry: the `megatron-layout` extra pins 0.16.1, the newest release that
installs on Python 3.11 with its dependencies (torch, numpy, packaging) and whose pipeline_parallel_layer_layout.py is
the same file as 0.19.2's (the release autopar/export targets). It needs torch, which the `test` extra leaves out, so
.ci/run installs it after torch's CPU build; without it these tests skip and say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.export import launch_config
from autopar.export.conformance import megatron_command
from costmodels.plan import Plan
from costmodels.scoring import estimate
from costmodels.specs import TrainingSpec


@functools.cache
def megatron_core():
    """(TransformerConfig, LayerType, parallel_state) of the installed megatron-core, or the reason it is absent."""
    try:
        import torch  # noqa: F401 - megatron.core imports it
        from megatron.core import parallel_state
        from megatron.core.transformer.enums import LayerType
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception as error:  # noqa: BLE001 - any import failure means "not installed here"
        return f"megatron-core not importable ({type(error).__name__}: {error}); pip install -e '.[megatron-layout]' " \
               "after torch's CPU build (.ci/run does)"
    return TransformerConfig, LayerType, parallel_state


def needs_megatron_core():
    found = megatron_core()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def flag_values(flags: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, word in enumerate(flags):
        if word.startswith("--"):
            value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
            out[word] = value
    return out


@contextlib.contextmanager
def virtual_pipeline_world_size(parallel_state, size: int | None):
    """Megatron-Core reads the virtual pipeline size from parallel_state when a layout is asked for a vp_stage."""
    saved = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    parallel_state.set_virtual_pipeline_model_parallel_world_size(size)
    try:
        yield
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(saved)


def check_with_megatron_core(point) -> str:
    """Emit `point` for Megatron-LM, build TransformerConfig from the emitted flags, and compare the layers Megatron-
    Core builds on every (rank, virtual stage) with the plan's layout. Returns the emitted layout string."""
    _, flags = megatron_command(launch_config(point, "megatron").text)
    return check_flags(flag_values(flags), point.plan, point.model)


def check_flags(values: dict[str, str | None], plan: Plan, model) -> str:
    import torch

    TransformerConfig, LayerType, parallel_state = needs_megatron_core()
    text = values["--pipeline-model-parallel-layout"]
    assert text, f"no layout string emitted for {plan.short()}"
    assert int(values["--pipeline-model-parallel-size"]) == plan.pp
    assert "--num-layers-per-virtual-pipeline-stage" not in values and \
        "--num-virtual-stages-per-pipeline-rank" not in values       # the layout gives vpp
    mtp = int(values["--mtp-num-layers"]) if "--mtp-num-layers" in values else None
    assert (mtp or 0) == model.num_mtp_layers
    with contextlib.redirect_stdout(io.StringIO()):
        config = TransformerConfig(
            num_layers=int(values["--num-layers"]), hidden_size=int(values["--hidden-size"]),
            num_attention_heads=int(values["--num-attention-heads"]),
            pipeline_model_parallel_size=int(values["--pipeline-model-parallel-size"]),
            pipeline_model_parallel_layout=text, mtp_num_layers=mtp, pipeline_dtype=torch.bfloat16)
    parsed = config.pipeline_model_parallel_layout
    assert parsed.virtual_pipeline_model_parallel_size == plan.vpp
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.vpp
    starts = [sum(plan.layout[:i]) for i in range(len(plan.layout))]
    last = len(plan.layout) - 1
    with virtual_pipeline_world_size(parallel_state, plan.vpp if plan.vpp > 1 else None):
        for stage, (start, count) in enumerate(zip(starts, plan.layout)):
            rank, vp_stage = stage % plan.pp, stage // plan.pp
            built = parsed.get_layer_id_list(LayerType.decoder, vp_stage=vp_stage, pp_rank=rank)
            assert built == list(range(start, start + count)), (text, rank, vp_stage, built, plan.layout)
            mtp_here = parsed.get_num_layers_to_build(LayerType.mtp, vp_stage=vp_stage, pp_rank=rank)
            assert mtp_here == (model.num_mtp_layers if stage == last else 0), (text, stage)
            for kind, where in ((LayerType.embedding, 0), (LayerType.loss, last)):
                assert parsed.get_num_layers_to_build(kind, vp_stage=vp_stage, pp_rank=rank) == int(stage == where)
    return text


# ---- the benchmark scenarios ------------------------------------------------------------------------------------

SCENARIO_BUDGET_S = 2.0
"""Layout search budget per scenario here (benchmarks/layouts.py uses 60 s; every plan found within it is checked)."""


@pytest.mark.parametrize("name", ["S2", "S4", "S5", "Q8"])
def test_megatron_core_accepts_every_layout_of_the_benchmark_scenarios(name):
    needs_megatron_core()
    from benchmarks.layouts import layout_plans

    points = layout_plans(name, SCENARIO_BUDGET_S)
    assert points, f"{name}: the layout search refined no pipelined structure"
    texts = [check_with_megatron_core(point) for point in points]
    if name == "S4":      # DeepSeek-V3's MTP layer sits with the loss on the last virtual stage
        assert all(t.endswith("mL") for t in texts)


# ---- generated layouts ------------------------------------------------------------------------------------------

@functools.cache
def generated_setting(model_name: str):
    return autopar.load_model(model_name), autopar.make_cluster(gpu="h100", num_gpus=64)


GENERATED_TRAINING = TrainingSpec(seq_len=4096, global_batch_size=512)


@functools.cache
def pipelines(model_name: str) -> list[tuple[int, int]]:
    """(pp, vpp) pairs of which the model has a plan Megatron can build (a layout plan is priced on its parent plan,
    costmodels.layout.parent_plan, which must pass the rules)."""
    from costmodels.errors import InputError

    model, cluster = generated_setting(model_name)
    found = []
    for pp in (2, 4, 8):
        for vpp in (1, 2, 3):
            layout = [model.num_layers // (pp * vpp)] * (pp * vpp)
            layout[-1] += model.num_layers - sum(layout)
            try:
                estimate(model, cluster, GENERATED_TRAINING, Plan(tp=1, pp=pp, vpp=vpp, ep=8 if model.is_moe else 1,
                                                                  mbs=1, layout=tuple(layout)))
            except InputError:
                continue
            found.append((pp, vpp))
    assert found, model_name
    return found


@st.composite
def layouts(draw):
    """A plan of a real model (dense, or MoE with MTP) with any composition of its layers into pp·vpp virtual
    stages, empty stages included."""
    model_name = draw(st.sampled_from(["llama-3.1-8b", "qwen3-8b", "deepseek-v3"]))
    model, cluster = generated_setting(model_name)
    pp, vpp = draw(st.sampled_from(pipelines(model_name)))
    stages = pp * vpp
    cuts = sorted(draw(st.lists(st.integers(0, model.num_layers), min_size=stages - 1, max_size=stages - 1)))
    bounds = [0, *cuts, model.num_layers]
    layout = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    ep = 8 if model.is_moe else 1
    return model, cluster, Plan(tp=1, pp=pp, vpp=vpp, ep=ep, mbs=1, layout=layout)


@settings(max_examples=40)
@given(layouts())
def test_megatron_core_accepts_generated_layouts(case):
    needs_megatron_core()
    model, cluster, plan = case
    point = estimate(model, cluster, GENERATED_TRAINING, plan)
    check_with_megatron_core(point)


def test_a_layout_megatron_core_would_build_differently_is_caught():
    """The check is not vacuous: the emitted flags of one layout, checked against another plan's layout, fail; and
    Megatron-Core itself refuses a string that breaks its rules (the MTP layer away from the loss's rank)."""
    needs_megatron_core()
    model, cluster = generated_setting("llama-3.1-8b")
    training = TrainingSpec(seq_len=4096, global_batch_size=512)
    plan = Plan(tp=1, pp=4, mbs=1, layout=(7, 9, 9, 7))
    point = estimate(model, cluster, training, plan)
    assert check_with_megatron_core(point) == "Et*7|t*9|t*9|t*7L"
    _, flags = megatron_command(launch_config(point, "megatron").text)
    values = flag_values(flags)
    with pytest.raises(AssertionError):
        check_flags(values, dataclasses.replace(plan, layout=(8, 8, 9, 7)), model)
    deepseek, _ = generated_setting("deepseek-v3")
    broken = {**values, "--num-layers": "61", "--mtp-num-layers": "1",
              "--pipeline-model-parallel-layout": "Et*15|t*15m|t*16|t*15L"}
    with pytest.raises((AssertionError, ValueError)):
        check_flags(broken, Plan(tp=1, pp=4, ep=8, mbs=1, layout=(15, 15, 16, 15)), deepseek)
