"""Run each framework's OWN parser / validator on a launch config autopar emitted, and say what happened.

    verdict = check(estimate, "deepspeed")     # Verdict(outcome="accepted" | "refused_with_reason" | ...)

Outcomes: `accepted` (the framework's code took the config and the values it ended with are the plan's),
`refused_with_reason` (autopar refused to emit it, naming the knob the framework lacks: export.capabilities),
`rejected` (the framework's code raised: a broken config), `silently_changed` (accepted, but the framework ends with
values other than the plan's). The frameworks are the `conformance` extra (pyproject.toml); `NotInstalled` is raised
when one is missing, so tests skip with the reason. Each checker states what it runs:

* deepspeed (deepspeed 0.19.8): `DeepSpeedConfig(config, mpu)` as `deepspeed.initialize` builds it -- the pipeline
  topology (`PipeModelDataParallelTopology`) as mpu when pp > 1, none otherwise -- with `deepspeed.comm`'s world size
  set to the cluster's (no process group here); then its batch triple, ZeRO stage and AutoTP size.
* megatron (megatron-core 0.19.2, which ships Megatron-LM's megatron/training): Megatron-LM's own argument parser
  (`add_megatron_arguments`) on the emitted flags, `validate_args` under the emitted CUDA_DEVICE_MAX_CONNECTIONS on an
  H100 (device arch 9, compute capability 9.0), then `core_transformer_config_from_args`
  (TransformerConfig.__post_init__) and `get_megatron_ddp_config` (DistributedDataParallelConfig.__post_init__; the
  fp8 parameters and MXFP8's gradient-buffer reuse, `fp8_params_priced`).
* torchtitan (torchtitan 0.3.0): the emitted file loaded by `ConfigManager.parse_args(["--module", ...])` (tyro),
  `ParallelDims` on the cluster's world size, `build_mesh()` on PyTorch's fake process group, the reshard policy as
  apply_fsdp_to_decoder resolves it (get_fsdp_reshard_after_forward_policy), the shard degree of the FSDP mesh, the
  schedule class and the rank-to-stage map (_get_pp_rank_to_stage_indices_mapping).
* verl (verl 0.9.1): `main_ppo`'s path: Hydra composes `ppo_megatron_trainer` with the overrides, then
  `validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))`, OmegaConf.resolve, and per worker (actor;
  critic under GAE) the DDP config built by Megatron-Bridge's create_ddp_config and init_megatron_optim_config.
* nemo (nemo-toolkit 2.7.3 on megatron-core 0.16.1, in its own venv: export/nemo_entry.py): `LazyEntrypoint(
  llm.pretrain, factory=recipe, overwrites).resolve()` (the `nemo llm pretrain --factory` path), fdl.build of the
  model, strategy, plugin and optimizer, then `MegatronStrategy.connect`.
* bridge (megatron-bridge 0.6.2, imported whole with one stand-in, its TE-only LoRA layers): the recipe function
  (or _pretrain_common with a GPTModelProvider node or AutoBridge), `process_config_with_overrides`, then
  `runtime_config_update` (what pretrain() runs first: mixed precision and CommOverlapConfig setup, validate).

Only the harness's view of the machine is simulated (world size, device arch, Transformer Engine's presence for
Bridge's tp_comm_overlap check, TE-only kernel fusions off, the model's config.json in an offline Hugging Face cache,
a tokenizer without files for verl); nothing a plan sets in the emitted configs is changed before the framework
sees them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable
from unittest import mock

from autopar.export import launch_config
from autopar.export.capabilities import Unsupported
from autopar.export.common import (LaunchConfig, fp8_param_fields, gradient_accumulation_steps, mcore_router_fields,
                                   stage_layers)
from costmodels.scoring import Estimate
from costmodels.plan import Recompute
from costmodels.specs import LaunchPath

OUTCOMES = ("accepted", "refused_with_reason", "rejected", "silently_changed")


class NotInstalled(RuntimeError):
    """The framework package (the `conformance` extra) is not installed or cannot be imported here."""


@dataclass(frozen=True)
class Verdict:
    framework: str
    plan: str
    outcome: str
    detail: str = ""


def check(estimate: Estimate, framework: str, **options: object) -> Verdict:
    """Emit `estimate` for `framework` (with export `options`: verl_algorithm) and run the framework's own code on it
    (see the module docstring)."""
    return check_all([estimate], framework, **options)[0]


def check_all(estimates: list[Estimate], framework: str, **options: object) -> list[Verdict]:
    """`check` of many estimates; NeMo's run in one process of its environment (its import takes a while)."""
    verdicts: list[Verdict | None] = [None] * len(estimates)
    pending: list[tuple[int, Estimate, LaunchConfig]] = []
    for index, estimate in enumerate(estimates):
        try:
            config = launch_config(estimate, framework, **options)
        except Unsupported as refused:
            verdicts[index] = Verdict(framework, estimate.plan.short(), "refused_with_reason",
                                      "; ".join(refused.reasons))
            continue
        # a setting autopar chose for the framework is priced (export.launch_config): that estimate is compared
        pending.append((index, config.priced or estimate, config))
    if framework == "nemo":
        jobs, runnable = [], []
        for index, priced, config in pending:
            try:
                jobs.append(_nemo_job(config))
                runnable.append((index, priced))
            except ValueError as error:
                verdicts[index] = Verdict(framework, priced.plan.short(), "rejected", str(error))
        results = nemo_launch(jobs) if jobs else []
        for (index, priced), result in zip(runnable, results):
            verdicts[index] = _judge(framework, priced, lambda: _nemo_compare(priced, _nemo_values(result)))
    else:
        for index, priced, config in pending:
            verdicts[index] = _judge(framework, priced, lambda: CHECKERS[framework](priced, config))
    return verdicts


def _judge(framework: str, estimate: Estimate, run: Callable[[], list[str]]) -> Verdict:
    try:
        changed = run()
    except NotInstalled:
        raise
    except (Exception, SystemExit) as error:  # the framework refused the config (argparse exits, asserts, ...)
        return Verdict(framework, estimate.plan.short(), "rejected", f"{type(error).__name__}: {error}"[:400])
    if changed:
        return Verdict(framework, estimate.plan.short(), "silently_changed", "; ".join(changed))
    return Verdict(framework, estimate.plan.short(), "accepted")


def _differences(expected: dict[str, object], actual: dict[str, object]) -> list[str]:
    return [f"{name}: plan {expected[name]!r}, framework {actual[name]!r}" for name in expected
            if expected[name] != actual[name]]


def _require(module: str, package: str):
    import importlib

    _python_312_names()
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise NotInstalled(f"{package} is not importable here ({error}); pip install '.[conformance]'") from None


def _python_312_names() -> None:
    """megatron-core 0.19 declares Python >= 3.12; the one 3.12 name its training code imports is typing.override
    (PEP 698). On 3.11 the harness takes it from typing_extensions; nothing else is changed."""
    import typing

    if not hasattr(typing, "override"):
        try:
            import typing_extensions
        except ImportError:
            return
        typing.override = typing_extensions.override


def _plan_fields(estimate: Estimate) -> dict[str, object]:
    """The plan in Megatron-Core names (what every Megatron-based framework should end with)."""
    plan = estimate.plan
    return {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
            "virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
            "context_parallel_size": plan.cp, "sequence_parallel": plan.sp}


# ---- DeepSpeed -------------------------------------------------------------------------------------------------

def _deepspeed(estimate: Estimate, config: LaunchConfig) -> list[str]:
    comm = _require("deepspeed.comm", "deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    plan, num_gpus = estimate.plan, estimate.cluster.num_gpus

    class TopologyMpu:  # what PipelineModule.mpu() answers for the batch accounting (a PipelineParallelGrid)
        def __init__(self, topology):
            self.topology = topology

        def get_data_parallel_world_size(self):
            return self.topology.get_dim("data")

    mpu = (TopologyMpu(PipeModelDataParallelTopology(num_pp=plan.pp, num_mp=plan.tp,
                                                     num_dp=num_gpus // (plan.pp * plan.tp)))
           if plan.pp > 1 else None)
    with mock.patch.object(comm, "get_world_size", return_value=num_gpus), \
            mock.patch.object(comm, "get_rank", return_value=0):
        ds = DeepSpeedConfig(json.loads(config.text), mpu=mpu)
    expected = {"micro": plan.mbs, "accumulation": gradient_accumulation_steps(estimate), "zero": plan.zero,
                "autotp": plan.tp if plan.pp == 1 and plan.tp > 1 else 0,
                "sequences_per_step": estimate.training.global_batch_size,
                "gradient_reduce": "torch.float32" if estimate.training.grad_reduce_in_fp32 else "torch.bfloat16"}
    replicas = ds.world_size // (plan.tp if plan.pp == 1 else 1)   # AutoTP ranks of one replica read one batch
    actual = {"micro": ds.train_micro_batch_size_per_gpu, "accumulation": ds.gradient_accumulation_steps,
              "zero": ds.zero_optimization_stage, "autotp": ds.tensor_parallel_config.autotp_size,
              "sequences_per_step": ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps * replicas,
              # DeepSpeedEngine.communication_data_type: the config's, else bf16 under bf16.enabled
              "gradient_reduce": str(ds.communication_data_type or "torch.bfloat16")}
    return _differences(expected, actual)


# ---- Megatron-LM -----------------------------------------------------------------------------------------------

def command_words(text: str) -> list[str]:
    """The words of an emitted command line as the program receives them: comments dropped, the continuation lines
    joined, and the words split and unquoted by shell rules (the text is pasted into a shell), so quoting the shell
    would strip is tested, not assumed."""
    return shlex.split(" ".join(line.rstrip(" \\").strip() for line in text.splitlines()
                                if line.strip() and not line.startswith("#")))


def megatron_command(text: str) -> tuple[dict[str, str | None], list[str]]:
    """(environment changes, pretrain_gpt.py flags) of an emitted Megatron-LM launch line: `VAR=value` prefixes and
    `env -u VAR` (None: unset)."""
    words = command_words(text)
    env: dict[str, str | None] = {}
    while words and words[0] != "torchrun":
        word = words.pop(0)
        if word == "env":
            continue
        if word == "-u":
            env[words.pop(0)] = None
        elif "=" in word:
            name, _, value = word.partition("=")
            env[name] = value
    return env, words[words.index("pretrain_gpt.py") + 1:]


@contextlib.contextmanager
def _environment(changes: dict[str, str | None]):
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _megatron(estimate: Estimate, config: LaunchConfig) -> list[str]:
    arguments = _require("megatron.training.arguments", "megatron-core (Megatron-LM's megatron/training)")
    env, flags = megatron_command(config.text)
    env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", None)   # the launch line alone decides, not this shell
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    # what every run adds beside the plan: a tokenizer, a learning rate and a length (the comment says so)
    args = parser.parse_args(flags + ["--tokenizer-type", "NullTokenizer", "--vocab-size",
                                      str(estimate.model.vocab_size), "--lr", "1e-4", "--train-iters", "10"])
    args.world_size, args.rank = estimate.cluster.num_gpus, 0
    import torch

    # an H100: device arch 9 for the CUDA_DEVICE_MAX_CONNECTIONS rule, compute capability (9, 0) for GroupedGEMM
    with _environment(env), mock.patch.object(arguments, "get_device_arch_version", return_value=9), \
            mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)), \
            contextlib.redirect_stdout(io.StringIO()):
        arguments.validate_args(args)
        args.apply_rope_fusion = False   # needs Transformer Engine, absent on this CPU machine (not a plan knob)
        core = arguments.core_transformer_config_from_args(args)
    plan = estimate.plan
    expected = dict(_plan_fields(estimate), expert_model_parallel_size=plan.ep,
                    expert_tensor_parallel_size=plan.etp if estimate.model.is_moe else plan.tp,
                    data_parallel_size=estimate.dp, micro_batch_size=plan.mbs,
                    global_batch_size=estimate.training.global_batch_size,
                    use_distributed_optimizer=plan.zero >= 1, use_megatron_fsdp=plan.zero >= 2,
                    layers_per_rank=stage_layers(estimate.model.num_layers, plan),
                    recompute_granularity=None if plan.recompute is Recompute.NONE else plan.recompute.label)
    actual = {name: getattr(args, name) for name in expected if hasattr(args, name)}
    actual["expert_tensor_parallel_size"] = core.expert_tensor_parallel_size
    actual["layers_per_rank"] = _megatron_layers_per_rank(core, estimate)
    actual["recompute_granularity"] = core.recompute_granularity
    # the model the command builds: its positions, query/key norms and router (export.megatron.model_flags)
    model = estimate.model
    if model.rope is not None:
        expected["rotary_base"], actual["rotary_base"] = int(round(model.rope.theta)), args.rotary_base
        expected["rotary_percent"], actual["rotary_percent"] = model.rope.rotary_fraction, args.rotary_percent
        expected["rope_scaling"] = model.rope.factor if model.rope.scaling == "llama3" else None
        actual["rope_scaling"] = args.rope_scaling_factor if args.use_rope_scaling else None
        rope = model.rope
        if model.mla is not None:   # MLATransformerConfig's own yarn fields (rope_type yarn by default)
            yarn = {"rope_type": "yarn" if rope.scaling == "yarn" else "rope"}
            if rope.scaling == "yarn":
                yarn.update(rotary_scaling_factor=rope.factor, mscale=rope.mscale, mscale_all_dim=rope.mscale_all_dim)
        elif rope.scaling == "yarn":   # GPTModel's yarn position type reads config.yarn_*
            yarn = {"yarn_rotary_scaling_factor": rope.factor, "yarn_mscale": rope.mscale,
                    "yarn_mscale_all_dim": rope.mscale_all_dim,
                    "yarn_original_max_position_embeddings": rope.original_max_positions,
                    "yarn_beta_fast": rope.beta_fast, "yarn_beta_slow": rope.beta_slow,
                    "yarn_correction_range_round_to_int": rope.round_to_int}
            expected["position_embedding_type"], actual["position_embedding_type"] = "yarn", \
                args.position_embedding_type
        else:
            yarn = {}
        expected.update({f"rope {name}": value for name, value in yarn.items()})
        actual.update({f"rope {name}": getattr(core, name, None) for name in yarn})
    expected["qk_layernorm"], actual["qk_layernorm"] = model.qk_layernorm, bool(core.qk_layernorm)
    expected["qk_l2_norm"], actual["qk_l2_norm"] = model.qk_l2_norm, bool(getattr(core, "qk_l2_norm", False))
    interval = model.nope_layer_interval if model.num_layers % max(model.nope_layer_interval, 1) == 0 else 0
    expected["nope_layers"] = [int((i + 1) % interval == 0) for i in range(model.num_layers)] if interval else None
    actual["nope_layers"] = list(core.no_rope_freq) if getattr(core, "no_rope_freq", None) else None
    if model.moe is not None:
        defaults = {"moe_router_score_function": "softmax", "moe_router_pre_softmax": False,
                    "moe_router_enable_expert_bias": False, "moe_router_num_groups": None,
                    "moe_router_group_topk": None, "moe_router_topk_scaling_factor": None,
                    "moe_apply_probs_on_input": False}
        router = {**defaults, **mcore_router_fields(model)}
        expected.update({f"router {name}": value for name, value in router.items()})
        actual.update({f"router {name}": getattr(core, name) for name in router})
    # the precision the step time priced: fp8 on, with its recipe (TransformerConfig.fp8 / fp8_recipe)
    recipe = estimate.training.fp8_scaling
    expected["fp8"], actual["fp8"] = recipe is not None, core.fp8 is not None
    if recipe is not None:
        expected["fp8_recipe"], actual["fp8_recipe"] = recipe.value, str(getattr(core.fp8_recipe, "value",
                                                                                  core.fp8_recipe))
    # the gradient buffer's dtype and the reduce's bytes the estimate priced
    expected["grad_reduce_in_fp32"] = estimate.training.grad_reduce_in_fp32
    actual["grad_reduce_in_fp32"] = megatron_grads_in_fp32(args)
    # the fp8 parameters the estimate priced: TransformerConfig.fp8_param and the DistributedDataParallelConfig
    # Megatron-LM builds from the args (training.py get_megatron_ddp_config; its __post_init__ refuses the MXFP8
    # reuse flag without fp8 parameters)
    from megatron.training.training import get_megatron_ddp_config

    ddp = get_megatron_ddp_config(args)
    expected.update(fp8_params_priced(estimate))
    actual.update(fp8_param=bool(core.fp8_param), fp8_param_gather=bool(ddp.fp8_param_gather),
                  reuse_grad_buf_for_mxfp8_param_ag=bool(ddp.reuse_grad_buf_for_mxfp8_param_ag))
    # the EP all-to-all overlap the step time hid needs a stream of its own: accepted under one hardware queue, it
    # would run serialised (validate_args only warns)
    expected["ep_overlap_on_its_own_stream"] = bool(getattr(args, "overlap_moe_expert_parallel_comm", False)) and \
        estimate.training.moe_a2a_overlap
    actual["ep_overlap_on_its_own_stream"] = bool(getattr(args, "overlap_moe_expert_parallel_comm", False)) and \
        env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"
    expected.update(_cuda_graphs_priced(estimate))
    actual.update(_cuda_graphs_run(args.cuda_graph_impl, args.cuda_graph_modules))
    expected.update(_offload_priced(estimate))
    actual.update(_offload_run(core.fine_grained_activation_offloading, core.offload_modules,
                               core.activation_offload_fraction))
    return _differences(expected, actual)


def _cuda_graphs_priced(estimate: Estimate) -> dict[str, object]:
    """The CUDA graphs the estimate's launches were priced with: whether any, the modules captured ([] = the
    whole layer), and the per-layer capture path (its static inputs differ in memory: memory.captures_attention_mask;
    None for none or the whole iteration)."""
    training = estimate.training
    graphs = training.launch is LaunchPath.CUDA_GRAPH
    per_layer = graphs and not training.cuda_graph_full_iteration
    return {"cuda_graphs": graphs, "cuda_graph_modules": sorted(training.cuda_graph_modules) if graphs else None,
            "cuda_graph_full_iteration": graphs and training.cuda_graph_full_iteration,
            "cuda_graph_impl": training.cuda_graph_impl if per_layer else None}


def _offload_priced(estimate: Estimate) -> dict[str, object]:
    """The fine-grained activation offloading the memory was priced with (TrainingSpec.offload_modules)."""
    training = estimate.training
    return {"offload_modules": sorted(training.offload_modules),
            "activation_offload_fraction": training.offload_fraction if training.offload_modules else 1.0}


def _offload_run(on: object, modules: object, fraction: object = 1.0) -> dict[str, object]:
    """The offloading a TransformerConfig runs: its offload_modules and the share of their groups offloaded, where
    fine_grained_activation_offloading is on."""
    return {"offload_modules": sorted(str(m) for m in (modules or [])) if on else [],
            "activation_offload_fraction": float(fraction if fraction is not None else 1.0) if on else 1.0}


def _cuda_graphs_run(impl: object, modules: object) -> dict[str, object]:
    """What a Megatron-Core config captures: its cuda_graph_impl and modules (enum members, names or 'full': the
    whole layer; megatron-core 0.16's whole iteration is impl local with scope full_iteration), in
    _cuda_graphs_priced's terms."""
    if str(impl) == "none":
        return {"cuda_graphs": False, "cuda_graph_modules": None, "cuda_graph_full_iteration": False,
                "cuda_graph_impl": None}
    names = modules if isinstance(modules, (list, tuple)) else [modules] if modules else []
    names = {str(getattr(m, "name", m)) for m in names}
    full_iteration = str(impl) == "full_iteration" or "full_iteration" in names
    return {"cuda_graphs": True, "cuda_graph_modules": sorted(names - {"full", "full_iteration"}),
            "cuda_graph_full_iteration": full_iteration, "cuda_graph_impl": None if full_iteration else str(impl)}


def fp8_params_priced(estimate: Estimate) -> dict[str, bool]:
    """What a Megatron-Core job must end with to run the weights the estimate priced (TrainingSpec.fp8_param_gather):
    the switches `common.fp8_param_fields` says the estimate priced, each off where it names none (bf16, or MXFP8's
    reuse flag for another recipe), TransformerConfig.fp8_param beside DistributedDataParallelConfig's
    fp8_param_gather."""
    fields = fp8_param_fields(estimate)
    gather = fields.get("fp8_param_gather", False)
    return {"fp8_param": gather, "fp8_param_gather": gather,
            "reuse_grad_buf_for_mxfp8_param_ag": fields.get("reuse_grad_buf_for_mxfp8_param_ag", False)}


def megatron_grads_in_fp32(ddp) -> bool:
    """Whether a Megatron-Core job keeps and reduces its main gradients in fp32, from Megatron-LM's args or a
    DistributedDataParallelConfig (`ddp`): Megatron-FSDP by megatron_fsdp_main_grads_dtype, None being the
    parameters' dtype, bf16 (megatron_fsdp/param_and_grad_buffer.py _resolve_group_grad_dtype; it does not read
    grad_reduce_in_fp32); the distributed optimizer / DDP by grad_reduce_in_fp32 (Megatron-LM: training.py passes
    accumulate_allreduce_grads_in_fp32 as it)."""
    import torch

    if getattr(ddp, "use_megatron_fsdp", False):
        return getattr(ddp, "megatron_fsdp_main_grads_dtype", None) == torch.float32
    if hasattr(ddp, "accumulate_allreduce_grads_in_fp32"):
        return bool(ddp.accumulate_allreduce_grads_in_fp32)
    return bool(ddp.grad_reduce_in_fp32)


def _megatron_layers_per_rank(core, estimate: Estimate) -> list[int]:
    """Decoder layers on each pipeline rank as Megatron-Core will build them (the TransformerConfig's split)."""
    plan, num_layers = estimate.plan, estimate.model.num_layers
    if plan.pp == 1:
        return [num_layers]
    layout = getattr(core, "pipeline_model_parallel_layout", None)
    if layout is not None:   # PipelineParallelLayerLayout (parsed and validated by TransformerConfig): [pp][vpp]
        return [sum(sum(getattr(kind, "name", str(kind)) == "decoder" for kind in chunk) for chunk in rank)
                for rank in layout.layout]
    first, last = core.num_layers_in_first_pipeline_stage, core.num_layers_in_last_pipeline_stage
    if first is None and last is None:
        slots = int(bool(core.account_for_embedding_in_pipeline_split)) + int(
            bool(core.account_for_loss_in_pipeline_split))
        per_rank = (num_layers + slots) // plan.pp
        ranks = [per_rank] * plan.pp
        ranks[0] -= int(bool(core.account_for_embedding_in_pipeline_split))
        ranks[-1] -= int(bool(core.account_for_loss_in_pipeline_split))
        return ranks
    middle_ranks = plan.pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    middle = [rest // middle_ranks] * middle_ranks if middle_ranks else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


# ---- torchtitan ------------------------------------------------------------------------------------------------

def _torchtitan(estimate: Estimate, config: LaunchConfig) -> list[str]:
    manager = _require("torchtitan.config.manager", "torchtitan")
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = estimate.plan
    with tempfile.TemporaryDirectory() as folder:
        module = f"autopar_plan_{abs(hash(config.text)) % 10**9}"
        Path(folder, f"{module}.py").write_text(config.text.replace("def autopar_plan", f"def {module}"))
        sys.path.insert(0, folder)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                loaded = manager.ConfigManager().parse_args(["--module", module, "--config", module])
        finally:
            sys.path.remove(folder)
            sys.modules.pop(module, None)
    parallelism = loaded.parallelism
    dims = ParallelDims.from_config(parallelism, estimate.cluster.num_gpus)   # torchtitan's own mesh arithmetic
    from torchtitan.distributed.fsdp import get_fsdp_reshard_after_forward_policy

    with _fake_process_group(estimate.cluster.num_gpus):   # build_mesh() as rank 0 of the job builds it
        dims.build_mesh()
        fsdp_degree = _torchtitan_shard_degree(dims)
    # what apply_fsdp_to_decoder resolves the policy to (torchtitan/distributed/fsdp.py)
    reshard = get_fsdp_reshard_after_forward_policy(parallelism.fsdp_reshard_after_forward, dims.pp_enabled)
    layers_per_rank = [estimate.model.num_layers]
    if plan.pp > 1:   # what pipeline_llm / _build_pipeline_schedule check before building stages
        from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

        schedule = get_schedule_class(parallelism.pipeline_parallel_schedule)
        parts = parallelism.module_fqns_per_model_part
        per_rank = len(parts) // dims.pp
        if len(parts) % dims.pp or (issubclass(schedule, PipelineScheduleSingle) and per_rank != 1) or \
                (not issubclass(schedule, PipelineScheduleSingle) and per_rank < 2):
            raise ValueError(f"{len(parts)} model parts do not fit schedule {parallelism.pipeline_parallel_schedule} "
                             f"on pp={dims.pp}")
        if loaded.training.local_batch_size % parallelism.pipeline_parallel_microbatch_size:
            raise ValueError("local_batch_size must be divisible by pipeline_parallel_microbatch_size")
        # the rank-to-stage map torchtitan builds its stages with: decoder layers each pipeline rank holds
        layers_per_rank = [sum(sum(module.startswith("layers.") for module in parts[stage])
                               for stage in _get_pp_rank_to_stage_indices_mapping(
                                   rank, dims.pp, parallelism.pipeline_parallel_schedule, len(parts)))
                           for rank in range(dims.pp)]
    dp = estimate.dp
    expected = {"dp_replicate": 1 if plan.zero >= 2 else dp, "dp_shard": dp if plan.zero >= 2 else 1,
                "tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep,
                "sequence_parallel": plan.sp or plan.tp == 1,
                "parameters sharded over": dp * plan.cp if plan.zero >= 2 else 1,
                "reshard_after_forward": plan.zero == 3,
                "model_parts": plan.pp * plan.vpp if plan.pp > 1 else 1,
                "layers_per_rank": stage_layers(estimate.model.num_layers, plan),
                "activation_checkpoint": {Recompute.NONE: "NoneType", Recompute.FULL: "FullAC.Config",
                                          Recompute.SELECTIVE: "SelectiveAC.Config"}[plan.recompute],
                "compiled": estimate.training.launch is LaunchPath.COMPILE,
                "global_batch_size": estimate.training.global_batch_size,
                "seq_len": estimate.training.seq_len,
                "reduce_dtype": "float32"}
    actual = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp, "pp": dims.pp,
              "cp": dims.cp, "ep": dims.ep, "sequence_parallel": parallelism.enable_sequence_parallel,
              "parameters sharded over": fsdp_degree,
              "reshard_after_forward": reshard if fsdp_degree > 1 else False,
              "model_parts": len(parallelism.module_fqns_per_model_part) if plan.pp > 1 else 1,
              "layers_per_rank": layers_per_rank,
              "activation_checkpoint": type(loaded.activation_checkpoint).__qualname__,
              "compiled": bool(loaded.compile.enable),
              "global_batch_size": loaded.training.global_batch_size,
              "seq_len": loaded.training.seq_len,
              "reduce_dtype": loaded.training.mixed_precision_reduce}
    if not estimate.training.grad_reduce_in_fp32:
        expected["reduce_dtype"] = "bfloat16"
    return _differences(expected, actual)


def _torchtitan_shard_degree(dims) -> int:
    """Over how many ranks torchtitan's fully_shard shards the dense parameters: the shard axes of the mesh its
    parallelize passes to apply_fsdp_to_decoder (spmd_types / full_dtensor: full_dtensor.resolve_fsdp_mesh, dp_shard
    and cp; the legacy backend: the flattened `fsdp` mesh, dp_shard·cp)."""
    if dims.spmd_backend in ("full_dtensor", "spmd_types"):
        from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

        mesh, mesh_dims = resolve_fsdp_mesh(dims)
        if mesh_dims is None or mesh_dims.shard is None:
            return 1
        axes = mesh_dims.shard if isinstance(mesh_dims.shard, tuple) else (mesh_dims.shard,)
        degree = 1
        for axis in axes:
            degree *= mesh[axis].size()
        return degree
    return dims.get_mesh("fsdp").size() if dims.fsdp_enabled else 1


@contextlib.contextmanager
def _fake_process_group(world_size: int):
    """torch.distributed initialised with PyTorch's fake backend (torch/testing/_internal/distributed/fake_pg.py):
    rank 0 of `world_size`, no communication, so torchtitan's DeviceMesh is built as on the cluster."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---- verl ------------------------------------------------------------------------------------------------------

def _verl(estimate: Estimate, config: LaunchConfig) -> list[str]:
    """verl's main_ppo path up to the workers: Hydra composes ppo_megatron_trainer with the overrides,
    validate_config(config, need_reference_policy(config), need_critic(config)) as main() calls it, then
    OmegaConf.resolve (TaskRunner.run) and, for the actor and (GAE) the critic, the DistributedDataParallelConfig
    verl's megatron_utils builds through Megatron-Bridge's create_ddp_config and the optimizer config
    init_megatron_optim_config builds."""
    verl_config = _require("verl.trainer.config", "verl")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from autopar.export.verl import ALGORITHMS, sequence_lengths

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        composed = compose(config_name="ppo_megatron_trainer", overrides=command_words(config.text))
    critic = need_critic(composed)
    paths = tuple({str(composed.actor_rollout_ref.model.path), str(composed.critic.model.path)})
    from verl.workers.config import model as verl_model_config

    # the model's tokenizer files are not on this machine (its config.json is: hf_config_cache): HFModelConfig gets
    # a tokenizer with no special tokens and no processor, and reads everything else itself
    tokenizer = SimpleNamespace(bos_token_id=None, eos_token_id=None, pad_token_id=None, chat_template=None)
    with hf_config_cache(estimate.model, paths), contextlib.redirect_stdout(io.StringIO()), \
            mock.patch.object(verl_model_config, "hf_tokenizer", return_value=tokenizer), \
            mock.patch.object(verl_model_config, "hf_processor", return_value=None):
        validate_config(composed, use_reference_policy=need_reference_policy(composed), use_critic=critic)
    OmegaConf.resolve(composed)
    algorithm = str(composed.algorithm.adv_estimator)
    plan, training = estimate.plan, estimate.training
    prompt, response = sequence_lengths(training.seq_len)
    rollout = composed.actor_rollout_ref.rollout
    expected = {"sequence": training.seq_len, "rollout sequence": training.seq_len,
                "critic": ALGORITHMS.get(algorithm, False),
                "train_batch_size": training.global_batch_size, "micro": plan.mbs}
    actual = {"sequence": composed.data.max_prompt_length + composed.data.max_response_length,
              "rollout sequence": rollout.prompt_length + rollout.response_length, "critic": critic,
              "train_batch_size": composed.data.train_batch_size * rollout.n,
              "micro": composed.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}
    changed = _differences(expected, actual)
    workers = [("actor", composed.actor_rollout_ref.actor)] + ([("critic", composed.critic)] if critic else [])
    for role, worker in workers:
        changed += [f"{role} {line}" for line in _verl_engine(estimate, worker)]
    return changed


def _verl_engine(estimate: Estimate, worker) -> list[str]:
    """One verl Megatron worker's engine (`worker`: the actor's or the critic's resolved section) against the plan."""
    from omegaconf import OmegaConf

    from verl.utils.megatron.optimizer import init_megatron_optim_config

    megatron, plan = worker.megatron, estimate.plan
    expected = dict(_plan_fields(estimate), sequence_parallel=plan.sp, expert_model_parallel_size=plan.ep,
                    use_megatron_fsdp=plan.zero >= 2, use_distributed_optimizer=plan.zero >= 1)
    actual = {name: megatron.get(name) for name in expected if name in megatron}
    overrides = OmegaConf.to_container(megatron.override_ddp_config)
    with contextlib.redirect_stdout(io.StringIO()):
        optimizer = init_megatron_optim_config(worker.optim,
                                               use_distributed_optimizer=bool(megatron.use_distributed_optimizer))
    # engine/megatron/transformer_impl.py _resolve_override_ddp_config: fp32 reduction unless given (or a
    # low-precision precision-aware optimizer), then megatron_utils -> Bridge's create_ddp_config (its
    # Megatron-FSDP defaults, the overrides, finalize: DistributedDataParallelConfig.__post_init__)
    if "grad_reduce_in_fp32" not in overrides:
        overrides["grad_reduce_in_fp32"] = not (optimizer.use_precision_aware_optimizer
                                                and optimizer.main_grads_dtype != _torch_dtype("float32"))
    _import_bridge()
    from megatron.bridge.training.utils.config_utils import create_ddp_config

    ddp = create_ddp_config(wrap_with_ddp=True, use_distributed_optimizer=bool(megatron.use_distributed_optimizer),
                            use_megatron_fsdp=bool(megatron.use_megatron_fsdp), overrides=overrides)
    from autopar.export.common import data_parallel_overlap

    expected.update(grad_reduce_in_fp32=estimate.training.grad_reduce_in_fp32, **data_parallel_overlap(estimate))
    actual.update(grad_reduce_in_fp32=megatron_grads_in_fp32(ddp), overlap_grad_reduce=bool(ddp.overlap_grad_reduce),
                  overlap_param_gather=bool(ddp.overlap_param_gather))
    transformer = {k: v for k, v in OmegaConf.to_container(megatron.override_transformer_config).items()
                   if k in _transformer_fields()}
    fp8 = transformer.get("fp8")
    recipe = transformer.get("fp8_recipe", "delayed")
    # the distributed optimizer's fp8 handling reads the recipe and the reuse flag of its own config (Megatron-LM
    # fills both from the same args as the model's and the DDP config's)
    priced = estimate.training.fp8_scaling
    expected["optimizer fp8_recipe"] = priced.value if priced is not None else None
    actual["optimizer fp8_recipe"] = optimizer.fp8_recipe
    expected["optimizer reuse_grad_buf_for_mxfp8_param_ag"] = \
        fp8_params_priced(estimate)["reuse_grad_buf_for_mxfp8_param_ag"]
    actual["optimizer reuse_grad_buf_for_mxfp8_param_ag"] = optimizer.reuse_grad_buf_for_mxfp8_param_ag
    expected.update(_cuda_graphs_priced(estimate))
    actual.update(_cuda_graphs_run(transformer.get("cuda_graph_impl", "none"), transformer.get("cuda_graph_modules")))
    expected.update(_offload_priced(estimate))
    actual.update(_offload_run(transformer.get("fine_grained_activation_offloading", False),
                               transformer.get("offload_modules"), transformer.get("activation_offload_fraction", 1.0)))
    return (_differences(expected, actual)
            + _fp8_differences(estimate, fp8, recipe, transformer.get("fp8_param", False), ddp)
            + _transformer_config(estimate, {
                **{name: megatron[name] for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                     "virtual_pipeline_model_parallel_size", "context_parallel_size",
                                                     "sequence_parallel", "expert_model_parallel_size",
                                                     "expert_tensor_parallel_size")},
                **transformer}))


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


# ---- Megatron-Core TransformerConfig (NeMo 2, Megatron-Bridge, verl) -------------------------------------------

def _transformer_fields() -> set[str]:
    _require("megatron.core", "megatron-core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    return {f.name for f in dataclasses.fields(TransformerConfig)}


def _transformer_config(estimate: Estimate, fields: dict[str, object]) -> list[str]:
    """Build Megatron-Core's TransformerConfig (its __post_init__ checks) from the model's shape and `fields`, and
    compare the pipeline split it ends with to the plan's."""
    _require("megatron.core", "megatron-core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = estimate.model
    shape = dict(num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
                 num_attention_heads=model.num_attention_heads, num_query_groups=model.num_kv_heads,
                 kv_channels=model.head_dim, add_bias_linear=model.linear_bias,
                 multi_latent_attention=model.mla is not None,
                 # the model's own dropout, as the frameworks' model providers read it from its config (Megatron-
                 # Core's default 0.1 would meet checks the model never does: graphed attention recompute)
                 attention_dropout=float(model.dropout), hidden_dropout=float(model.dropout))
    if estimate.plan.pp > 1:   # every recipe sets the pipeline's dtype (NeMo 2: pipeline_dtype; Bridge recipes too)
        import torch

        shape.update(pipeline_dtype=torch.bfloat16)
    if model.moe is not None:   # the recipe's router is the model's (export.common.mcore_router_fields)
        shape.update(num_moe_experts=model.moe.num_experts, moe_router_topk=model.moe.top_k,
                     moe_ffn_hidden_size=model.moe.expert_ffn_hidden_size, **mcore_router_fields(model))
    if model.num_mtp_layers:    # the recipe's MTP depth (a layout's 'm' stages must match it)
        shape.update(mtp_num_layers=model.num_mtp_layers)
    if fields.get("expert_tensor_parallel_size") is None:
        fields = {k: v for k, v in fields.items() if k != "expert_tensor_parallel_size"}
    with contextlib.redirect_stdout(io.StringIO()):
        core = TransformerConfig(**{**shape, **fields})
    return _differences({"layers_per_rank": stage_layers(model.num_layers, estimate.plan)},
                        {"layers_per_rank": _megatron_layers_per_rank(core, estimate)})


def nemo_python() -> str:
    """The Python of NeMo's environment: $AUTOPAR_NEMO_PYTHON, else the repository's .venv-nemo (built as .ci/run
    builds it); NotInstalled without one. NeMo 2.7.3 imports megatron-core 0.16 (0.19 removed modules it imports),
    so it cannot share the other checks' environment."""
    path = os.environ.get("AUTOPAR_NEMO_PYTHON") or str(Path(__file__).resolve().parents[2] / ".venv-nemo" / "bin"
                                                        / "python")
    if not Path(path).is_file():
        raise NotInstalled(f"NeMo 2's environment is not here ({path}); build .venv-nemo as .ci/run does, or set "
                           "AUTOPAR_NEMO_PYTHON")
    return path


def nemo_launch(jobs: list[tuple[str, list[str]]]) -> list[dict]:
    """NeMo's launch path (export/nemo_entry.py, in NeMo's environment) for (recipe, overrides) jobs, in one process:
    per job {"values": ...} or {"error": ...}."""
    import subprocess

    python = nemo_python()
    with tempfile.TemporaryDirectory() as folder:
        jobs_path, results_path = Path(folder, "jobs.json"), Path(folder, "results.json")
        jobs_path.write_text(json.dumps([{"factory": factory, "overrides": overrides,
                                          "te_only_fusions": list(TE_ONLY_FUSIONS)} for factory, overrides in jobs]))
        done = subprocess.run([python, str(Path(__file__).with_name("nemo_entry.py")), str(jobs_path),
                               str(results_path)], capture_output=True, text=True, timeout=3600)
        if done.returncode != 0 or not results_path.is_file():
            raise NotInstalled(f"NeMo's environment did not run ({done.stderr.strip().splitlines()[-1:]})")
        return json.loads(results_path.read_text())


def _nemo(estimate: Estimate, config: LaunchConfig) -> list[str]:
    return _nemo_compare(estimate, _nemo_values(nemo_launch([_nemo_job(config)])[0]))


def _nemo_job(config: LaunchConfig) -> tuple[str, list[str]]:
    recipe = header_value(config.text, "recipe")
    if not recipe:
        raise ValueError("the config names no NeMo recipe (--factory)")
    return recipe, command_words(config.text)


def _nemo_values(result: dict) -> dict:
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["values"]


def _nemo_compare(estimate: Estimate, values: dict) -> list[str]:
    """What the NeMo job ends with (nemo_entry.py's values) against the estimate."""
    from autopar.export.common import data_parallel_overlap

    model, ddp, plan = values["model"], values["ddp"], estimate.plan
    expected = dict(_plan_fields(estimate), expert_model_parallel_size=plan.ep,
                    micro_batch_size=plan.mbs, global_batch_size=estimate.training.global_batch_size,
                    seq_length=estimate.training.seq_len, model_seq_length=estimate.training.seq_len,
                    gpus=estimate.cluster.num_gpus, use_distributed_optimizer=plan.zero >= 1,
                    precision_aware_optimizer=False, optimizer_dtypes=["torch.float32"] * 4,
                    use_megatron_fsdp=plan.zero >= 2,
                    recompute_granularity=None if plan.recompute is Recompute.NONE else plan.recompute.label,
                    grad_reduce_in_fp32=estimate.training.grad_reduce_in_fp32, **data_parallel_overlap(estimate))
    fsdp = bool(ddp.get("use_megatron_fsdp"))
    grads_fp32 = (ddp["grad_reduce_in_fp32"] if not fsdp or values["fsdp_reads_grad_reduce_in_fp32"]
                  else ddp.get("megatron_fsdp_main_grads_dtype") == "torch.float32")
    actual = {name: model[name] for name in _plan_fields(estimate)}
    actual.update(expert_model_parallel_size=model["expert_model_parallel_size"],
                  micro_batch_size=values["data"]["micro_batch_size"],
                  global_batch_size=values["data"]["global_batch_size"], seq_length=values["data"]["seq_length"],
                  model_seq_length=model["seq_length"],
                  gpus=int(values["trainer"]["num_nodes"]) * int(values["trainer"]["devices"]),
                  use_distributed_optimizer=bool(values["optimizer"]["use_distributed_optimizer"]),
                  precision_aware_optimizer=bool(values["optimizer"]["use_precision_aware_optimizer"]),
                  optimizer_dtypes=values["optimizer"]["dtypes"],
                  use_megatron_fsdp=fsdp, recompute_granularity=model["recompute_granularity"],
                  grad_reduce_in_fp32=bool(grads_fp32), overlap_grad_reduce=bool(ddp["overlap_grad_reduce"]),
                  overlap_param_gather=bool(ddp["overlap_param_gather"]))
    expected.update(_cuda_graphs_priced(estimate))
    actual.update(_cuda_graphs_run(model["cuda_graph_impl"], values["cuda_graph_scope_names"]))
    split = {name: model[name] for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                            "virtual_pipeline_model_parallel_size", "context_parallel_size",
                                            "sequence_parallel", "expert_model_parallel_size",
                                            "expert_tensor_parallel_size", "num_layers_in_first_pipeline_stage",
                                            "num_layers_in_last_pipeline_stage",
                                            "account_for_embedding_in_pipeline_split",
                                            "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout",
                                            "recompute_granularity", "recompute_method", "recompute_num_layers")}
    if split["pipeline_model_parallel_layout"] is None:
        del split["pipeline_model_parallel_layout"]
    ddp_view = SimpleNamespace(fp8_param_gather=ddp.get("fp8_param_gather", False),
                               reuse_grad_buf_for_mxfp8_param_ag=ddp.get("reuse_grad_buf_for_mxfp8_param_ag", False))
    return (_differences(expected, actual) + _model_shape(estimate, SimpleNamespace(**model))
            + _fp8_differences(estimate, model["fp8"], model["fp8_recipe"], model["fp8_param"], ddp_view)
            + _transformer_config(estimate, split))


def _fp8_differences(estimate: Estimate, fp8: object, recipe: object, fp8_param: object, ddp) -> list[str]:
    """The fp8 a Megatron-Core job ends with against the estimate's: fp8 on or off, its recipe, and the fp8
    parameters (`fp8_params_priced`) on the model (TransformerConfig.fp8_param) and in the ddp config `ddp`."""
    priced = estimate.training.fp8_scaling
    expected = {"fp8": priced is not None, **fp8_params_priced(estimate)}
    actual = {"fp8": fp8 is not None, "fp8_param": bool(fp8_param), "fp8_param_gather": bool(ddp.fp8_param_gather),
              "reuse_grad_buf_for_mxfp8_param_ag": bool(ddp.reuse_grad_buf_for_mxfp8_param_ag)}
    if priced is not None:
        expected["fp8_recipe"] = priced.value
        actual["fp8_recipe"] = str(getattr(recipe, "value", recipe)) if fp8 is not None else None
    return _differences(expected, actual)


# ---- Megatron-Bridge -------------------------------------------------------------------------------------------

def header_value(text: str, key: str) -> str | None:
    """The value of an emitted config's `# key: value` comment line (export.nemo writes `# recipe: NAME` and
    `# autobridge: SOURCE`), or None."""
    for line in text.splitlines():
        if line.startswith(f"# {key}: "):
            return line[len(f"# {key}: "):].strip()
    return None


@contextlib.contextmanager
def hf_config_cache(model, repo_ids: tuple[str, ...], revisions: tuple[str, ...] = ()):
    """The machine's Hugging Face cache as a user's would hold it: the model's config.json (its bundled preset, the
    one autopar priced) under each id in `repo_ids`, read offline (huggingface_hub's HF_HUB_CACHE / HF_HUB_OFFLINE,
    which hf_hub_download reads at each call), at its main ref and at each commit in `revisions` (recipes pin one).
    No weights: Bridge's recipes build the provider with load_weights=False."""
    from huggingface_hub import constants

    from autopar.export.common import preset_name
    from autopar.models import PRESETS_DIR

    name = preset_name(model)
    source = PRESETS_DIR / f"{name}.json" if name else Path(str(model.source))
    with tempfile.TemporaryDirectory() as cache:
        for repo in repo_ids:
            if "/" not in repo or Path(repo).exists():
                continue
            folder = Path(cache, "models--" + repo.replace("/", "--"))
            (folder / "refs").mkdir(parents=True)
            (folder / "refs" / "main").write_text("0" * 40)
            for commit in ("0" * 40, *revisions):
                (folder / "snapshots" / commit).mkdir(parents=True)
                (folder / "snapshots" / commit / "config.json").write_text(source.read_text())
        with mock.patch.object(constants, "HF_HUB_CACHE", cache), mock.patch.object(constants, "HF_HUB_OFFLINE", True), \
                _environment({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": cache, "TRANSFORMERS_OFFLINE": "1"}):
            yield cache


def _import_bridge():
    """Megatron-Bridge imported whole, as `import megatron.bridge` runs on a GPU machine, with one stand-in: its LoRA
    layers (megatron/bridge/peft/lora_layers.py, PEFT only, the one module of the package that imports Transformer
    Engine unguarded; TE is a CUDA build). Every other module is Bridge's own, and sees no Transformer Engine."""
    import importlib
    import types

    _require("megatron.core", "megatron-core")
    name = "megatron.bridge.peft.lora_layers"
    if name not in sys.modules:
        try:
            importlib.import_module("transformer_engine.pytorch")
        except Exception:   # noqa: BLE001 - no TE here: the stand-in
            stand_in = types.ModuleType(name)
            stand_in.__doc__ = "autopar conformance stand-in: LoRA layers need Transformer Engine (a CUDA build)"
            for cls in ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TEFusedLoRALinear"):
                setattr(stand_in, cls, type(cls, (), {}))
            sys.modules[name] = stand_in
    try:
        return importlib.import_module("megatron.bridge")
    except ImportError as error:
        raise NotInstalled(f"megatron-bridge is not importable here ({error}); pip install '.[conformance]'") from None


def bridge_recipe_repo_ids(function) -> tuple[str, ...]:
    """The Hugging Face ids a Bridge recipe may pass to AutoBridge.from_hf_pretrained: every 'org/name' string in
    its module's source (some recipes pass the id through a helper's argument)."""
    import inspect
    import re

    return tuple(sorted(set(re.findall(r'"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)"',
                                       inspect.getsource(inspect.getmodule(function))))))


def bridge_recipe_revisions(function) -> tuple[str, ...]:
    """The Hugging Face commits a Bridge recipe's module pins (40 hex digits)."""
    import inspect
    import re

    return tuple(sorted(set(re.findall(r'"([0-9a-f]{40})"', inspect.getsource(inspect.getmodule(function))))))


def bridge_launch(estimate: Estimate, text: str):
    """The ConfigContainer Megatron-Bridge's pretrain() runs for an emitted config: the named recipe function (or,
    for `# autobridge:`, recipes.common._pretrain_common with AutoBridge.from_hf_pretrained(SOURCE)
    .to_megatron_provider(load_weights=False)), the overrides through process_config_with_overrides (run_recipe.py's
    path: Hydra's parser in struct mode, then _apply_overrides, which instantiates _target_ nodes), then
    runtime_config_update (pretrain()'s first step: mixed precision setup, data-parallel size, CommOverlapConfig
    setup, ConfigContainer.validate). The machine: WORLD_SIZE = the cluster's GPUs, Transformer Engine present for
    comm_overlap.py's tp_comm_overlap check (HAVE_TE), the model's config.json in the Hugging Face cache."""
    import importlib

    _import_bridge()
    from megatron.bridge.training import comm_overlap
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    recipe, autobridge = header_value(text, "recipe"), header_value(text, "autobridge")
    if header_value(text, "provider"):
        from megatron.bridge.recipes.common import _pretrain_common

        build, repos, revisions = _pretrain_common, (), ()
    elif recipe:
        recipes = importlib.import_module("megatron.bridge.recipes")
        if not hasattr(recipes, recipe):
            raise ValueError(f"Megatron-Bridge has no recipe {recipe!r}")
        build = getattr(recipes, recipe)
        repos, revisions = bridge_recipe_repo_ids(build), bridge_recipe_revisions(build)
    elif autobridge:
        from megatron.bridge import AutoBridge
        from megatron.bridge.recipes.common import _pretrain_common

        def build():
            cfg = _pretrain_common()
            cfg.model = AutoBridge.from_hf_pretrained(autobridge).to_megatron_provider(load_weights=False)
            return cfg

        repos, revisions = (autobridge,), ()
    else:
        raise ValueError("the config names neither a Megatron-Bridge recipe nor an AutoBridge model")
    with hf_config_cache(estimate.model, repos, revisions), _environment({"WORLD_SIZE": str(estimate.cluster.num_gpus)}), \
            mock.patch.object(comm_overlap, "HAVE_TE", True), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        cfg = build()
        cfg = process_config_with_overrides(cfg, cli_overrides=command_words(text))
        # the kernel fusions Megatron-Core refuses without Transformer Engine (TransformerConfig: 'apply_rope_fusion
        # is not available. Please install TE >= 1.4.'): not plan knobs, off as on this CPU machine's Megatron-LM
        # check (_megatron)
        for fusion in TE_ONLY_FUSIONS:
            if hasattr(cfg.model, fusion):
                setattr(cfg.model, fusion, False)
        runtime_config_update(cfg)
    return cfg


TE_ONLY_FUSIONS = ("apply_rope_fusion", "moe_permute_fusion", "moe_router_fusion", "gradient_accumulation_fusion")
"""TransformerConfig kernel fusions that need Transformer Engine (absent here): no plan knob among them."""


def _model_shape(estimate: Estimate, config) -> list[str]:
    """The model a Megatron-Core config builds against the one priced (its shape)."""
    model = estimate.model
    expected = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                "num_attention_heads": model.num_attention_heads, "num_query_groups": model.num_kv_heads,
                "ffn_hidden_size": model.ffn_hidden_size if model.moe is None or model.moe.first_dense_layers
                else None}
    actual = {name: getattr(config, name, None) for name in expected}
    if expected["ffn_hidden_size"] is None:
        del expected["ffn_hidden_size"], actual["ffn_hidden_size"]
    if model.moe is not None:
        expected.update(num_moe_experts=model.moe.num_experts, moe_router_topk=model.moe.top_k)
        actual.update(num_moe_experts=config.num_moe_experts, moe_router_topk=config.moe_router_topk)
    return _differences(expected, actual)


def _bridge(estimate: Estimate, config: LaunchConfig) -> list[str]:
    from autopar.export.common import data_parallel_overlap, model_parallel_overlap, pipeline_p2p_overlap

    cfg = bridge_launch(estimate, config.text)
    model, ddp, plan = cfg.model, cfg.ddp, estimate.plan
    expected = dict(_plan_fields(estimate), expert_model_parallel_size=plan.ep,
                    micro_batch_size=plan.mbs, global_batch_size=estimate.training.global_batch_size,
                    seq_length=estimate.training.seq_len, data_parallel_size=estimate.dp,
                    use_distributed_optimizer=plan.zero >= 1, use_megatron_fsdp=plan.zero >= 2,
                    layers_per_rank=stage_layers(estimate.model.num_layers, plan),
                    grad_reduce_in_fp32=estimate.training.grad_reduce_in_fp32,
                    recompute_granularity=None if plan.recompute is Recompute.NONE else plan.recompute.label,
                    precision_aware_optimizer=False,
                    **data_parallel_overlap(estimate),
                    tp_comm_overlap=model_parallel_overlap(estimate)["tp_comm_overlap"],
                    overlap_moe_expert_parallel_comm=model_parallel_overlap(estimate)[
                        "overlap_moe_expert_parallel_comm"],
                    overlap_p2p_comm=pipeline_p2p_overlap(estimate).get("overlap_p2p_comm", False))
    actual = {name: getattr(model, name, None) for name in _plan_fields(estimate)}
    actual.update(expert_model_parallel_size=model.expert_model_parallel_size,
                  micro_batch_size=cfg.train.micro_batch_size, global_batch_size=cfg.train.global_batch_size,
                  seq_length=model.seq_length, data_parallel_size=cfg.data_parallel_size,
                  use_distributed_optimizer=bool(ddp.use_distributed_optimizer),
                  use_megatron_fsdp=bool(ddp.use_megatron_fsdp and cfg.dist.use_megatron_fsdp),
                  layers_per_rank=_megatron_layers_per_rank(model, estimate),
                  grad_reduce_in_fp32=megatron_grads_in_fp32(ddp),
                  recompute_granularity=model.recompute_granularity,
                  precision_aware_optimizer=bool(cfg.optimizer.use_precision_aware_optimizer),
                  overlap_grad_reduce=bool(ddp.overlap_grad_reduce),
                  overlap_param_gather=bool(ddp.overlap_param_gather),
                  tp_comm_overlap=bool(model.tp_comm_overlap),
                  overlap_moe_expert_parallel_comm=bool(model.overlap_moe_expert_parallel_comm),
                  overlap_p2p_comm=bool(model.overlap_p2p_comm))
    from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

    expected.update(_cuda_graphs_priced(estimate))
    actual.update(_cuda_graphs_run(model.cuda_graph_impl, cuda_graph_module_names(model)))
    expected.update(_offload_priced(estimate))
    actual.update(_offload_run(model.fine_grained_activation_offloading, model.offload_modules,
                               model.activation_offload_fraction))
    return (_differences(expected, actual) + _model_shape(estimate, model)
            + _fp8_differences(estimate, model.fp8, model.fp8_recipe, model.fp8_param, ddp)
            + _bridge_preset_differences(estimate, cfg.mixed_precision))


BRIDGE_PRICED_PRECISION_FIELDS = ("fp8_param", "fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag",
                                  "grad_reduce_in_fp32")
"""The MixedPrecisionConfig fields an export may change from the recipe's preset (export.nemo.bridge_mixed_precision):
the fp8 parameters and the gradient dtype the estimate priced (checked on the model and ddp configs above)."""


def _bridge_preset_differences(estimate: Estimate, precision) -> list[str]:
    """The launched MixedPrecisionConfig against the preset of the estimate's recipe (get_mixed_precision_config),
    field by field, the priced fields aside: a node written without a preset field runs other scaling."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    from autopar.export.common import BRIDGE_FP8_PRESETS

    recipe = estimate.training.fp8_scaling
    preset = get_mixed_precision_config(BRIDGE_FP8_PRESETS[recipe.value] if recipe else "bf16_mixed")
    preset.finalize()
    return [f"mixed_precision {f.name}: preset {getattr(preset, f.name)!r}, launched {getattr(precision, f.name)!r}"
            for f in dataclasses.fields(preset) if f.name not in BRIDGE_PRICED_PRECISION_FIELDS
            and getattr(preset, f.name) != getattr(precision, f.name)]


def _nemo_run_value(text: str) -> object:
    """One `key=value` value as NeMo-Run's CLI parser reads it for `nemo llm pretrain` (nemo_run/cli/cli_parser.py
    TypeParser: parse_optional 'none'/'null', parse_bool, parse_int, parse_float, parse_list by ast.literal_eval,
    parse_str stripping one pair of surrounding quotes). A list must be a Python literal: Hydra's bare-word list
    [a,b] is the ListParseError NeMo-Run raises."""
    import ast

    lowered = text.lower()
    if lowered in ("null", "none"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if text.startswith("["):
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError) as error:
            raise ValueError(f"NeMo-Run: invalid list {text!r} ({error})") from None
        if not isinstance(parsed, list):
            raise ValueError(f"NeMo-Run: {text!r} is not a list")
        return parsed
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        pass
    try:                    # a float field (Optional[float]: parse_union -> parse_float; infer_type the same)
        return float(text)
    except ValueError:
        return text


CHECKERS: dict[str, Callable[[Estimate, LaunchConfig], list[str]]] = {
    "megatron": _megatron, "nemo": _nemo, "bridge": _bridge, "verl": _verl, "torchtitan": _torchtitan,
    "deepspeed": _deepspeed,
}
