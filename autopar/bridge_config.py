"""Read a Megatron-Bridge training configuration (a ConfigContainer as YAML) back into an autopar plan.

    run = read_bridge_config("run_config.yaml")     # or a mapping: the YAML already loaded
    estimate(run.model_spec(model), cluster, run.training_spec(TrainingSpec()), run.plan)

The YAML is what Megatron-Bridge writes itself (`ConfigContainer.to_yaml`, saved beside a run and read back by
`ConfigContainer.from_yaml`; megatron/bridge/training/config.py): sections `model` (the model provider: Megatron-Core
TransformerConfig field names), `train`, `dataset`, `ddp` (DistributedDataParallelConfig), `optimizer`
(OptimizerConfig), `mixed_precision` (MixedPrecisionConfig, or a preset name), `comm_overlap` (CommOverlapConfig),
`dist` and `env_vars`. What Bridge does to them at setup is done here too, in the same order:
`MixedPrecisionConfig.setup` writes every mixed-precision field that the model, optimizer or DDP config also has over
theirs (mixed_precision.py `update_config_with_precision_overrides`), and CommOverlapConfig's fields, where set,
override the model's and DDP's overlap switches (comm_overlap.py `CommOverlapConfig.setup`).

The result is a `MegatronRun` (autopar.megatron_args), as --from-megatron-args gives: the plan, the TrainingSpec
fields, the model shape fields, notes. Every field that changes memory or step time and that no cost term reads is
named in `MegatronRun.not_priced`, with what it changes; a value autopar cannot represent is an InputError naming the
field. The GPU count is not in a ConfigContainer (the launcher gives it): `num_gpus` is None.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from costmodels.errors import InputError
from costmodels.plan import Plan, Recompute
from costmodels.specs import ModelSpec

INPUT_NAME = "from-bridge-config"

MIXED_PRECISION_PRESETS: dict[str, dict[str, Any]] = {
    "bf16_mixed": {"bf16": True, "fp8": None},
    "bf16_with_fp8_delayed_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_param_gather": True},
    "bf16_with_fp8_current_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "blockwise",
                                               "fp8_param_gather": False},
    "bf16_with_mxfp8_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": False},
}
"""Megatron-Bridge's mixed-precision presets by name (megatron/bridge/training/mixed_precision.py, the registered
recipe functions; hyphenated names are the same), the fields that decide what autopar prices. A config written by
`to_yaml` carries the resolved MixedPrecisionConfig instead."""

SHARDING_STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""DistributedDataParallelConfig.data_parallel_sharding_strategy under Megatron-FSDP -> ZeRO stage."""


def load_bridge_config(source: "str | Path | Mapping[str, Any]") -> dict[str, Any]:
    """The ConfigContainer mapping of a YAML file path (or YAML text), or `source` itself when it is a mapping."""
    if isinstance(source, Mapping):
        return dict(source)
    import yaml

    text = str(source)
    path = Path(text).expanduser()
    try:
        is_file = "\n" not in text and len(text) < 4096 and path.is_file()
    except OSError:
        is_file = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise InputError(INPUT_NAME, f"cannot read {source}: {error.strerror}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputError(INPUT_NAME, f"not YAML ({str(error).splitlines()[0]}); give the YAML a Megatron-Bridge "
                                     "ConfigContainer writes (to_yaml / run_config.yaml)") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("model"), dict):
        raise InputError(INPUT_NAME, "no `model:` section: give the YAML a Megatron-Bridge ConfigContainer writes "
                                     "(to_yaml / run_config.yaml)")
    return loaded


class _Config:
    """The sections after Bridge's setup overrides (module docstring)."""

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = cfg
        precision = cfg.get("mixed_precision")
        if isinstance(precision, str):
            name = precision.replace("-", "_")
            if name not in MIXED_PRECISION_PRESETS:
                raise InputError(INPUT_NAME, f"mixed_precision {precision!r}: autopar reads the presets "
                                             f"{', '.join(MIXED_PRECISION_PRESETS)}, or the resolved "
                                             "MixedPrecisionConfig that to_yaml writes")
            precision = MIXED_PRECISION_PRESETS[name]
        self.precision: Mapping[str, Any] = precision if isinstance(precision, Mapping) else {}
        self.comm_overlap: Mapping[str, Any] = cfg.get("comm_overlap") or {}

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.cfg.get(name)
        return value if isinstance(value, Mapping) else {}

    def get(self, section: str, name: str, default: Any = None) -> Any:
        """A field as Bridge runs it: the mixed-precision config's over the model's, optimizer's and DDP's."""
        if section in ("model", "optimizer", "ddp") and self.precision.get(name) is not None:
            return self.precision[name]
        value = self.section(section).get(name, default)
        return default if value is None else value

    def overlap(self, section: str, name: str, default: Any = None) -> Any:
        """An overlap switch: CommOverlapConfig's, where it sets one, over the section's own."""
        value = self.comm_overlap.get(name)
        return self.get(section, name, default) if value is None else value


def _int(config: _Config, section: str, name: str, default: int | None = None) -> int | None:
    value = config.get(section, name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(INPUT_NAME, f"{section}.{name}: expected a whole number, got {value!r}")
    return value


def _dtype_name(value: Any) -> str:
    """'float32', 'bfloat16', ... of a torch dtype as to_yaml writes it ({_target_: torch.float32}) or a string."""
    if isinstance(value, Mapping):
        value = value.get("_target_", "")
    return str(value).rsplit(".", 1)[-1].lower()


def _layout(config: _Config, pp: int) -> tuple[tuple[int, ...], int]:
    """(decoder layers per virtual stage, MTP layers) of model.pipeline_model_parallel_layout: Megatron-Core's
    string, or the list of stages of layer names it also takes (PipelineParallelLayerLayout)."""
    from autopar.megatron_args import parse_megatron_layout

    layout = config.get("model", "pipeline_model_parallel_layout")
    if isinstance(layout, Mapping):         # a PipelineParallelLayerLayout as to_yaml writes it
        layout = layout.get("input_data", layout.get("layout"))
    if isinstance(layout, list):
        letters = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
        try:
            layout = "|".join("".join(letters[str(name).strip().lower()] for name in stage) for stage in layout)
        except (KeyError, TypeError):
            raise InputError(INPUT_NAME, f"model.pipeline_model_parallel_layout {layout!r}: stages of embedding, "
                                         "decoder, mtp, loss expected") from None
    try:
        return parse_megatron_layout(str(layout), pp)
    except InputError as error:
        raise InputError(INPUT_NAME, "model.pipeline_model_parallel_layout: " +
                         error.message.replace("--pipeline-model-parallel-layout", "the layout")) from None


def _recompute(config: _Config, notes: list[str]) -> dict[str, Any]:
    granularity = config.get("model", "recompute_granularity")
    if granularity is None:
        return {"recompute": Recompute.NONE}
    if granularity == "selective":
        modules = config.get("model", "recompute_modules") or []
        return {"recompute": Recompute.SELECTIVE,
                "recompute_modules": ",".join(modules) if isinstance(modules, list) else str(modules)}
    if granularity != "full":
        raise InputError(INPUT_NAME, f"model.recompute_granularity {granularity!r}: full or selective expected")
    method = config.get("model", "recompute_method")
    layers = _int(config, "model", "recompute_num_layers")
    if method == "block":
        return {"recompute": Recompute.FULL, "recompute_layers": layers or 0}
    if method not in (None, "uniform"):
        raise InputError(INPUT_NAME, f"model.recompute_method {method!r}: uniform or block expected")
    if layers not in (None, 1):
        notes.append(f"model.recompute_method uniform with recompute_num_layers {layers}: autopar models one "
                     "checkpoint per layer (every layer's input kept)")
    return {"recompute": Recompute.FULL}


def _zero(config: _Config) -> int:
    if config.get("dist", "use_torch_fsdp2"):
        return 3
    if config.get("ddp", "use_megatron_fsdp") or config.get("dist", "use_megatron_fsdp"):
        strategy = str(config.get("ddp", "data_parallel_sharding_strategy", "no_shard"))
        if strategy not in SHARDING_STRATEGY_ZERO:
            raise InputError(INPUT_NAME, f"ddp.data_parallel_sharding_strategy {strategy!r}: one of "
                                         f"{', '.join(SHARDING_STRATEGY_ZERO)} expected")
        return max(SHARDING_STRATEGY_ZERO[strategy], 1 if config.get("ddp", "use_distributed_optimizer") else 0)
    distributed = config.get("ddp", "use_distributed_optimizer") or config.get("optimizer", "use_distributed_optimizer")
    return 1 if distributed else 0


def _precision(config: _Config) -> dict[str, Any]:
    from autopar.megatron_args import FP8_RECIPES

    fp8 = config.get("model", "fp8")
    if config.get("model", "fp4") or config.get("model", "fp4_param"):
        raise InputError(INPUT_NAME, "mixed_precision fp4 (NVFP4): autopar prices bf16 and fp8")
    if not fp8:
        return {"precision": "bf16", "fp8_param_gather": False}
    recipe = str(config.get("model", "fp8_recipe", "delayed"))
    if recipe not in FP8_RECIPES:
        raise InputError(INPUT_NAME, f"mixed_precision.fp8_recipe {recipe!r}: autopar prices "
                                     f"{', '.join(FP8_RECIPES)}")
    params = bool(config.get("ddp", "fp8_param_gather") or config.get("model", "fp8_param"))
    return {"precision": "fp8", "fp8_recipe": recipe, "fp8_param_gather": params}


def _dispatcher(config: _Config, notes: list[str]) -> dict[str, Any]:
    kind = config.get("model", "moe_token_dispatcher_type")
    if kind in (None, "alltoall"):
        return {"moe_dispatcher": "alltoall"}
    if kind == "allgather":
        notes.append("model.moe_token_dispatcher_type allgather priced as alltoall (the same expert GEMMs)")
        return {"moe_dispatcher": "alltoall"}
    if kind == "flex":
        backend = config.get("model", "moe_flex_dispatcher_backend", "deepep")
        if backend == "hybridep":
            notes.append("moe_flex_dispatcher_backend hybridep: its exchange priced as deepep's (both send a token "
                         "once per destination node), its buffers as HybridEP's")
            return {"moe_dispatcher": "deepep", "moe_hybridep": True}
        return {"moe_dispatcher": "deepep"}
    raise InputError(INPUT_NAME, f"model.moe_token_dispatcher_type {kind!r}: allgather, alltoall or flex expected")


def _rank_budget(config: _Config, training: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """The flex dispatcher's rank token budget and the paged stash of the routed experts' activations
    (TrainingSpec.moe_rank_capacity_factor, moe_paged_stash_factor): model.moe_expert_rank_capacity_factor, with
    model.moe_paged_stash and its moe_paged_stash_buffer_size_factor_cuda (a negative factor sizes the stash from
    the actual tokens instead of the expected ones: the same under balanced routing, its magnitude is taken)."""
    factor = config.get("model", "moe_expert_rank_capacity_factor")
    if factor is None:
        if config.get("model", "moe_paged_stash"):
            raise InputError(INPUT_NAME, "model.moe_paged_stash needs model.moe_expert_rank_capacity_factor "
                                         "(Megatron-Core refuses it without one)")
        return {}
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise InputError(INPUT_NAME, f"model.moe_expert_rank_capacity_factor: expected a number > 0, got {factor!r}")
    if training.get("moe_dispatcher") != "deepep":
        raise InputError(INPUT_NAME, "model.moe_expert_rank_capacity_factor is the flex dispatcher's (hybridep or "
                                     "ncclep backend); set model.moe_token_dispatcher_type flex")
    out: dict[str, Any] = {"moe_rank_capacity_factor": float(factor)}
    if config.get("model", "moe_paged_stash"):
        cuda = config.get("model", "moe_paged_stash_buffer_size_factor_cuda", 1.10)
        if isinstance(cuda, bool) or not isinstance(cuda, (int, float)):
            raise InputError(INPUT_NAME, f"model.moe_paged_stash_buffer_size_factor_cuda: expected a number, got "
                                         f"{cuda!r}")
        out["moe_paged_stash_factor"] = abs(float(cuda))
        host = config.get("model", "moe_paged_stash_buffer_size_factor_cpu", 0.0)
        if isinstance(host, (int, float)) and host:
            notes.append(f"model.moe_paged_stash_buffer_size_factor_cpu {host}: a pinned host buffer takes what "
                         "overflows the stash's CUDA buffer (host memory, not priced)")
    return out


def _cpu_offloading(config: _Config, notes: list[str]) -> dict[str, Any]:
    """TrainingSpec.cpu_offload_layers from model.cpu_offloading with cpu_offloading_num_layers (Transformer Engine's
    layer-wise activation offloading); the offloaded weights (cpu_offloading_weights) are named as not priced."""
    if not config.get("model", "cpu_offloading"):
        return {}
    layers = _int(config, "model", "cpu_offloading_num_layers", 0) or 0
    if layers < 0:
        raise InputError(INPUT_NAME, f"model.cpu_offloading_num_layers {layers}: expected a whole number >= 0")
    out: dict[str, Any] = {}
    if config.get("model", "cpu_offloading_activations", True) and layers:
        out["cpu_offload_layers"] = layers
        notes.append(f"model.cpu_offloading_num_layers {layers}: their activations priced on the host; the copies' "
                     "time is not priced")
    if config.get("model", "cpu_offloading_weights"):
        notes.append("model.cpu_offloading_weights: the offloaded weights are priced on the GPU (not modelled)")
    return out


BRIDGE_GRAPH_MODULES_NOT_PRICED = ("mamba",)
"""CUDA-graph modules a Bridge recipe may name that no layer autopar prices has (the Mamba layers of hybrid
models): dropped, with a note."""


def _cuda_graphs(config: _Config, notes: list[str]) -> dict[str, Any]:
    """TrainingSpec's launch fields from model.cuda_graph_impl and the modules it captures, as Megatron-Core 0.19's
    TransformerConfig.__post_init__ reads them: the deprecated cuda_graph_scope, when set, replaces
    cuda_graph_modules ("full": the whole layer); then as --cuda-graph-impl / --cuda-graph-modules
    (autopar.megatron_args._cuda_graphs: full_iteration in the modules makes the impl full_iteration)."""
    from autopar.megatron_args import _cuda_graphs as from_flags

    impl = config.get("model", "cuda_graph_impl") or "none"
    if impl == "none":     # Bridge clears the modules of an impl none (validate_cuda_graph_configuration): eager
        return {}
    scope = config.get("model", "cuda_graph_scope")
    modules = scope if scope is not None else config.get("model", "cuda_graph_modules")
    # a module may be written as the CudaGraphModule enum member Bridge serialised ({_target_: ...CudaGraphModule,
    # _name_: attn, _args_: [1], _call_: true})
    words = [str(m.get("_name_", "")) if isinstance(m, Mapping) else str(m) for m in modules] \
        if isinstance(modules, (list, tuple)) else str(modules or "").split(",")
    words = [w.strip() for w in words if w.strip()]
    dropped = [w for w in words if w in BRIDGE_GRAPH_MODULES_NOT_PRICED]
    kept = [w for w in words if w not in BRIDGE_GRAPH_MODULES_NOT_PRICED]
    if dropped:
        notes.append(f"model.cuda_graph_modules {', '.join(dropped)}: no layer of the priced model has it"
                     + ("; nothing else is captured: priced eager" if not kept else ""))
        if not kept:       # the modules named were all Mamba's: the priced layers run eager
            return {}
    flags: dict[str, "str | bool"] = {"--cuda-graph-impl": str(impl)}
    if kept:
        flags["--cuda-graph-modules"] = " ".join(kept)
    graphs = from_flags(flags, notes)
    if graphs.get("cuda_graph_impl") == "local":
        raise InputError(INPUT_NAME, "model.cuda_graph_impl local with per-layer modules: Megatron-Bridge runs local "
                                     "capture for the whole iteration only (utils/cuda_graph.py "
                                     "validate_cuda_graph_configuration); use transformer_engine, or full_iteration")
    return graphs


def _fine_grained_offloading(config: _Config, notes: list[str]) -> dict[str, Any]:
    """TrainingSpec.offload_modules from model.fine_grained_activation_offloading with model.offload_modules
    (TransformerConfig; Megatron-Core refuses the switch without modules)."""
    modules = config.get("model", "offload_modules") or []
    if isinstance(modules, str):
        modules = modules.replace(",", " ").split()
    if not config.get("model", "fine_grained_activation_offloading"):
        return {}
    from autopar.megatron_args import offload_fields

    # the fraction's range is TrainingSpec's check, as it is TransformerConfig's
    return offload_fields(tuple(modules), config.get("model", "activation_offload_fraction"),
                          ("model.fine_grained_activation_offloading", "model.offload_modules"), notes, INPUT_NAME)


def _attention(config: _Config) -> dict[str, Any]:
    from autopar.megatron_args import ATTENTION_OF_BACKEND

    backend = config.get("model", "attention_backend")
    if isinstance(backend, Mapping):           # an AttnBackend enum as to_yaml writes it
        backend = backend.get("_args_", [None])[0] if isinstance(backend.get("_args_"), list) else None
    if backend is None:
        return {}
    name = str(backend).rsplit(".", 1)[-1].lower()
    names = {"1": "flash", "2": "fused", "3": "unfused", "4": "local", "5": "auto"}     # AttnBackend values
    name = names.get(name, name)
    return dict(ATTENTION_OF_BACKEND.get(name, {}))


UNPRICED_SWITCHES: dict[tuple[str, str], tuple[Any, str]] = {
    ("model", "delta_offload_bytes_across_pp_ranks"): (0, "later pipeline ranks keep that many more offloaded bytes "
                                                          "on the GPU each: more memory there than estimated"),
    ("optimizer", "optimizer_cpu_offload"): (False, "optimizer states and step on the host: less GPU memory"),
    ("ddp", "num_distributed_optimizer_instances"): (1, "the distributed optimizer shards over dp / instances: more "
                                                        "optimizer memory per GPU than estimated"),
    ("model", "cuda_graph_impl"): ("none", "the graph pool's temporaries are not shared with eager ones (about one "
                                           "layer's working set), and a whole-iteration capture's evaluation graph "
                                           "keeps its own loader batches: not priced; the captured launches, the "
                                           "attention masks among Transformer Engine graphs' static inputs and a "
                                           "whole-iteration capture's training batches are"),
    ("model", "delay_wgrad_compute"): (False, "weight-gradient GEMMs deferred to overlap the expert all-to-all: one "
                                              "layer's wgrad inputs held a little longer (a transient, not priced)"),
    ("comm_overlap", "delay_wgrad_compute"): (False, "weight-gradient GEMMs deferred to overlap the expert "
                                                     "all-to-all: one layer's wgrad inputs held a little longer (a "
                                                     "transient, not priced)"),
    ("model", "first_last_layers_bf16"): (False, "the first and last layers in bf16 (priced in fp8)"),
    ("ddp", "fsdp_double_buffer"): (False, "Megatron-FSDP's temporary buckets from a fixed pool of two FSDP units' "
                                           "buffers (megatron_fsdp/param_and_grad_buffer.py FixedPoolAllocator, "
                                           "size 2): about the two layers' gather zero3_prefetch_buffers prices, "
                                           "held for the whole step"),
    ("ddp", "keep_fp8_transpose_cache"): (False, "Megatron-FSDP keeps fp8 transposes between steps: more memory "
                                                 "than estimated"),
}
"""(section, field) -> (the value that changes nothing, what another value changes that no cost term reads)."""


def _not_priced(config: _Config) -> list[str]:
    out = []
    for (section, name), (neutral, what) in UNPRICED_SWITCHES.items():
        value = config.get(section, name) if section != "comm_overlap" else config.comm_overlap.get(name)
        if value is None or value == neutral or value == []:
            continue
        shown = value if not isinstance(value, Mapping) else value.get("_target_", value)
        out.append(f"{section}.{name}={shown}: {what}")
    alloc = str((config.section("env_vars") or {}).get("PYTORCH_CUDA_ALLOC_CONF", ""))
    if "expandable_segments:True" in alloc.replace(" ", ""):
        out.append("env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator maps segments "
                   "that grow, so little is lost to fragmentation (the headroom is for that)")
    return out


MODEL_FIELDS = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
                "num_attention_heads": "num_attention_heads", "num_query_groups": "num_kv_heads",
                "kv_channels": "head_dim", "vocab_size": "vocab_size", "num_moe_experts": "num_experts",
                "moe_router_topk": "top_k", "moe_ffn_hidden_size": "expert_ffn_hidden_size",
                "mtp_num_layers": "num_mtp_layers"}
"""Model-provider fields (TransformerConfig names) -> the ModelSpec names `MegatronRun.model` uses."""


def read_bridge_config(source: "str | Path | Mapping[str, Any]") -> "MegatronRun":
    """Read a Megatron-Bridge ConfigContainer (YAML path, YAML text or the mapping) into a MegatronRun."""
    from autopar.megatron_args import MegatronRun, _slot_split

    cfg = load_bridge_config(source)
    peft = cfg.get("peft")
    if peft:
        target = peft.get("_target_", "a PEFT scheme") if isinstance(peft, Mapping) else str(peft)
        raise InputError(INPUT_NAME, f"peft: {target} (parameter-efficient fine-tuning): autopar prices "
                                     "full-parameter training, and a PEFT run keeps no gradients or optimizer states "
                                     "for its frozen weights; give the config without its peft section to price "
                                     "full training")
    config = _Config(cfg)
    notes: list[str] = []
    tp = _int(config, "model", "tensor_model_parallel_size", 1)
    pp = _int(config, "model", "pipeline_model_parallel_size", 1)
    num_layers = _int(config, "model", "num_layers")
    layout: tuple[int, ...] = ()
    first = last = 0
    if config.get("model", "pipeline_model_parallel_layout") is not None:
        layout, _ = _layout(config, pp)
        vpp = len(layout) // pp
    else:
        vpp = _int(config, "model", "virtual_pipeline_model_parallel_size") or 1
        first = _int(config, "model", "num_layers_in_first_pipeline_stage") or 0
        last = _int(config, "model", "num_layers_in_last_pipeline_stage") or 0
        embedding_slot = bool(config.get("model", "account_for_embedding_in_pipeline_split"))
        loss_slot = bool(config.get("model", "account_for_loss_in_pipeline_split"))
        if (embedding_slot or loss_slot) and pp > 1:
            first, last = _slot_split(pp, num_layers, embedding_slot, loss_slot)
    sp = bool(config.get("model", "sequence_parallel"))
    if sp and tp == 1:
        sp = False
    mbs = _int(config, "train", "micro_batch_size", 1)
    etp = _int(config, "model", "expert_tensor_parallel_size") or 0
    values = dict(tp=tp, pp=pp, vpp=vpp, cp=_int(config, "model", "context_parallel_size", 1),
                  ep=_int(config, "model", "expert_model_parallel_size", 1), etp=etp, mbs=mbs, sp=sp,
                  zero=_zero(config), first_stage_layers=first, last_stage_layers=last, layout=layout,
                  **_recompute(config, notes))
    try:
        plan = Plan(**values)
    except InputError as error:
        raise InputError(INPUT_NAME, f"{error.field}: {error.message}") from None
    training: dict[str, Any] = {**_precision(config)}
    seq_len = _int(config, "model", "seq_length") or _int(config, "dataset", "seq_length")
    if seq_len:
        training["seq_len"] = seq_len
    gbs = _int(config, "train", "global_batch_size")
    if gbs:
        training["global_batch_size"] = gbs
    training["grad_reduce_in_fp32"] = bool(config.get("ddp", "grad_reduce_in_fp32", True))
    # CommOverlapConfig.setup (comm_overlap.py), where the config has one: the P2P overlap on for interleaved
    # pipelines, the gradient reduce and parameter gather overlapped under the distributed optimizer (when dp > 1,
    # which the launcher decides: taken as so), TP overlap only with SP; a field it sets explicitly wins
    with_comm_overlap = bool(config.comm_overlap)
    distributed = plan.zero >= 1 and with_comm_overlap
    training["overlap_grad_reduce"] = bool(config.overlap("ddp", "overlap_grad_reduce", distributed))
    training["overlap_param_gather"] = bool(config.overlap("ddp", "overlap_param_gather", distributed))
    training["tp_comm_overlap"] = bool(config.overlap("model", "tp_comm_overlap", False)) and plan.sp
    training["moe_a2a_overlap"] = bool(config.overlap("model", "overlap_moe_expert_parallel_comm", False))
    if training["overlap_param_gather"] and not training["overlap_grad_reduce"]:
        # Megatron-Core's DDP runs it (Bridge does not run Megatron-LM's validate_args, which refuses it); autopar
        # prices the parameter-gather overlap beside the gradient-reduce overlap only (TrainingSpec)
        notes.append("ddp.overlap_param_gather without overlap_grad_reduce: priced without the gather overlap "
                     "(exposed)")
        training["overlap_param_gather"] = False
    # (autopar's overlap_p2p_comm is the interleaved schedule's: a plan without interleaving keeps the default)
    p2p = config.comm_overlap.get("overlap_p2p_comm") if with_comm_overlap else config.get("model", "overlap_p2p_comm")
    if plan.vpp > 1 and (p2p is not None or with_comm_overlap):
        training["overlap_p2p_comm"] = True if p2p is None else bool(p2p)
    training.update(_cpu_offloading(config, notes))
    training.update(_fine_grained_offloading(config, notes))
    training.update(_cuda_graphs(config, notes))
    # GPTDatasetConfig's default builds the mask; inter-document masking leaves it out (cu_seqlens instead)
    if config.get("dataset", "create_attention_mask") is False or config.get("dataset", "inter_document_masking"):
        training["dataloader_attention_mask"] = False
    training["dataloader_on_every_rank"] = True       # data/utils.py: the dataset built on every rank
    if config.get("model", "deallocate_pipeline_outputs") is False:
        training["deallocate_pipeline_outputs"] = False
    if config.overlap("model", "defer_embedding_wgrad_compute", False) and plan.pp > 1:
        training["defer_output_wgrad"] = True
        limit = config.overlap("model", "wgrad_deferral_limit", 0)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InputError(INPUT_NAME, f"wgrad_deferral_limit: expected a whole number >= 0, got {limit!r}")
        training["wgrad_deferral_limit"] = limit
    training["cross_entropy"] = "fused" if config.get("model", "cross_entropy_loss_fusion") else "unfused"
    training["pipeline_schedule"] = "1f1b"            # Megatron-Core's (interleaved with vpp > 1)
    if config.get("optimizer", "use_precision_aware_optimizer"):      # TrainingSpec.optimizer_state_bytes
        from autopar.megatron_args import optimizer_state_bytes

        training["optimizer_state_bytes"] = optimizer_state_bytes(
            *(_dtype_name(config.get("optimizer", name, "float32"))
              for name in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")),
            fp8_params=bool(training.get("fp8_param_gather")), fp8_recipe=training.get("fp8_recipe"),
            store_param_remainders=bool(config.get("optimizer", "store_param_remainders", True)))
    group = _int(config, "model", "microbatch_group_size_per_vp_stage")
    if group and plan.vpp > 1:
        if group < plan.pp:
            raise InputError(INPUT_NAME, f"model.microbatch_group_size_per_vp_stage {group} is below pp={plan.pp}: "
                                         "Megatron-Core refuses it (schedules.py: 'should range in [PP, M]')")
        training["microbatch_group_size_per_vp_stage"] = group
    training.update(_attention(config))
    model_fields = {spec_name: config.get("model", name) for name, spec_name in MODEL_FIELDS.items()
                    if isinstance(config.get("model", name), int) and not isinstance(config.get("model", name), bool)}
    if not model_fields.get("num_experts"):      # the router fields of a dense provider are defaults, not a shape
        for name in ("num_experts", "top_k", "expert_ffn_hidden_size"):
            model_fields.pop(name, None)
    if model_fields.get("num_experts"):
        training.update(_dispatcher(config, notes))
        training["expert_gemm"] = "cublas"
        capacity = config.get("model", "moe_expert_capacity_factor")
        if isinstance(capacity, (int, float)) and capacity > 0:
            training["moe_capacity_factor"] = float(capacity)
            if config.get("model", "moe_pad_expert_input_to_capacity"):
                training["moe_imbalance_factor"] = max(1.0, float(capacity))
        training.update(_rank_budget(config, training, notes))
    return MegatronRun(plan=plan, training=training, num_gpus=None, model=model_fields, flags={},
                       notes=tuple(notes), not_priced=tuple(_not_priced(config)),
                       hf_model_id=str(config.get("model", "hf_model_id") or ""))


def bridge_model_spec(run: "MegatronRun", base: ModelSpec) -> ModelSpec:
    """`base` (the bundled model the config names) with the shape the config runs: its layer count, width, heads,
    vocabulary, experts and MTP layers where they differ (a performance recipe may shorten a model)."""
    shape = dict(run.model)
    if base.mla is not None:        # an MLA provider's query groups and kv_channels are not MLA's head shapes
        shape.pop("num_kv_heads", None)
        shape.pop("head_dim", None)
    moe_fields = {k: shape.pop(k) for k in ("num_experts", "top_k", "expert_ffn_hidden_size") if k in shape}
    spec = replace(base, **{k: v for k, v in shape.items() if getattr(base, k) != v})
    if base.moe is not None and moe_fields:
        spec = replace(spec, moe=replace(base.moe, **{k: v for k, v in moe_fields.items()
                                                      if getattr(base.moe, k) != v}))
    return spec
