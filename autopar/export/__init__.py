"""Launch configurations for the training frameworks: `emit(estimate, framework) -> str`.

    from autopar.export import emit
    print(emit(front[0], "megatron"))

Frameworks (FRAMEWORKS): megatron (Megatron-LM flags), nemo (NeMo 2 recipe overrides), bridge (Megatron-Bridge
config overrides), verl (Hydra overrides), torchtitan (Python config), deepspeed (config JSON), each written for the
release named in export.capabilities.TARGET_VERSIONS. Each module cites the upstream file its key names come from.
`launch_config` returns the text with notes (also comments where the format has them); a plan the framework cannot
run raises export.capabilities.Unsupported (an InputError naming the knob), never a silently different config.
export.conformance runs each framework's own validator on the text (benchmarks/conformance.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from autopar.export.common import LaunchConfig
    from costmodels.scoring import Estimate

from autopar.export.names import ALIASES, FRAMEWORKS, framework_name  # noqa: F401 - the package's face


LAYOUT_FRAMEWORKS = ("megatron", "nemo", "bridge", "torchtitan")
"""Frameworks that take a per-stage pipeline layout (Plan.layout): Megatron-LM --pipeline-model-parallel-layout,
NeMo 2's MegatronStrategy and Megatron-Bridge's model provider pipeline_model_parallel_layout (Megatron-Core's
TransformerConfig field), torchtitan's per-stage module lists. verl and DeepSpeed get the nearest split they can
express, and say so (`layout_fallback`)."""


def takes_layouts(framework: str) -> bool:
    """Whether `framework`'s configs express a per-stage pipeline layout (LAYOUT_FRAMEWORKS); the frameworks autopar
    prices but does not export (names.PRICED_ONLY) run no pipeline of autopar's making either."""
    return framework_name(framework, field="framework") in LAYOUT_FRAMEWORKS


def layout_fallback(estimate: "Estimate") -> "Estimate":
    """The plan without its layout, with the first/last split nearest to it (costmodels.layout.parent_plan); an
    InputError where no first/last split runs the structure (a layer count only a layout places, issue 43)."""
    from costmodels.errors import InputError
    from costmodels.layout import parent_plan, split_is_whole
    from costmodels.scoring import estimate as score

    parent = parent_plan(estimate.model, estimate.cluster, estimate.training, estimate.plan)
    if not split_is_whole(estimate.model, parent):
        plan = estimate.plan
        raise InputError("emit", f"no first/last split runs {estimate.model.num_layers} layers on pp={plan.pp} × "
                                 f"vpp={plan.vpp}, and only a per-stage layout does, which this framework cannot "
                                 f"express; emit for one of {', '.join(LAYOUT_FRAMEWORKS)}, or change pp or vpp")
    return score(estimate.model, estimate.cluster, estimate.training, parent)


def launch_config(estimate: "Estimate", framework: str, **options: object) -> "LaunchConfig":
    """The launch config of `estimate` for `framework`. Where the framework runs the plan only with a setting autopar
    chooses (export.capabilities.ADJUSTMENTS: the gradient dtype), it is written with that setting, priced again,
    and said in one line (LaunchConfig.priced is that estimate). `options`: verl_algorithm (export.verl)."""
    import dataclasses

    from autopar.export.capabilities import runnable_estimate

    name = framework_name(framework)
    runnable, note = runnable_estimate(estimate, name)
    if note is not None:
        config = launch_config(runnable, name, **options)
        text = config.text if name == "deepspeed" else f"# note: {note}\n{config.text}"
        return dataclasses.replace(config, text=text, unexpressed=(note,) + config.unexpressed, priced=runnable)
    if estimate.plan.layout and name not in LAYOUT_FRAMEWORKS:
        fallback = layout_fallback(estimate)
        config = launch_config(fallback, name, **options)
        note = (f"{name} cannot express a per-stage pipeline layout ({'|'.join(map(str, estimate.plan.layout))}): "
                f"written with the nearest split it can run, {fallback.plan.short()} (predicted "
                f"{fallback.step_time_s:.3g} s per step instead of {estimate.step_time_s:.3g} s)")
        text = config.text if config.text.lstrip().startswith("{") else f"# {note}\n{config.text}"
        return dataclasses.replace(config, text=text, unexpressed=config.unexpressed + (note,),
                                   priced=config.priced or fallback)
    if name == "megatron":
        from autopar.export.megatron import launch_config as build
    elif name == "nemo":
        from autopar.export.nemo import nemo2_config as build
    elif name == "bridge":
        from autopar.export.nemo import bridge_config as build
    elif name == "verl":
        from autopar.export.verl import launch_config as build
    elif name == "torchtitan":
        from autopar.export.torchtitan import launch_config as build
    else:
        from autopar.export.deepspeed import launch_config as build
    if name == "verl":
        return build(estimate, options.get("verl_algorithm"))
    return build(estimate)


def emit(estimate: "Estimate", framework: str) -> str:
    """The plan of `estimate` as `framework`'s launch configuration text."""
    return launch_config(estimate, framework).text
