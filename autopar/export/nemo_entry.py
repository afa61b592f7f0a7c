"""NeMo 2's launch path for emitted `nemo llm pretrain --factory RECIPE key=value ...` configs, run in the NeMo
environment (NeMo 2.7.3 imports megatron-core 0.16, not the 0.19 of the other checks, so it has its own venv:
.ci/run's `.venv-nemo`; export.conformance._nemo runs this file there and compares what it prints).

    python nemo_entry.py jobs.json results.json
    jobs: [{"factory": "llama31_70b", "overrides": ["trainer.num_nodes=8", ...]}, ...]

For each job, what `nemo llm pretrain` runs up to where a GPU is needed: NeMo-Run's LazyEntrypoint(llm.pretrain,
factory=..., overwrites=...).resolve() (nemo_run/cli/lazy.py: the recipe, then every override through NeMo-Run's
CLI parser: a value it cannot parse for its field's type raises ParseError), fdl.build of the model, the strategy
(MegatronStrategy) and the precision plugin (MegatronMixedPrecision), the plugin handed to the strategy as
Lightning's accelerator connector does, then MegatronStrategy.connect(model): the strategy's parallelism copied
onto model.config and the plugin's dtype config applied over model.config, the optimizer config and the ddp config
(update_config_with_dtype_overrides). It prints the values the job ends with, or the error. Only the standard
library and NeMo are imported here (no autopar).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys

# run as a file, its folder leads sys.path, and autopar/export/nemo.py (and megatron.py, ...) would shadow NeMo's
# packages: the folder is taken off
sys.path = [entry for entry in sys.path if os.path.abspath(entry or ".") != os.path.dirname(os.path.abspath(__file__))]

MODEL_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                "context_parallel_size", "sequence_parallel", "expert_model_parallel_size",
                "expert_tensor_parallel_size", "num_layers_in_first_pipeline_stage",
                "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout", "recompute_granularity",
                "recompute_method", "recompute_num_layers", "recompute_modules", "seq_length", "num_layers",
                "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "fp8", "fp8_recipe", "fp8_param",
                "overlap_p2p_comm", "batch_p2p_comm", "cross_entropy_loss_fusion", "tp_comm_overlap",
                "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type", "add_bias_linear",
                "multi_latent_attention", "mtp_num_layers", "cuda_graph_impl", "cuda_graph_scope")
DDP_FIELDS = ("grad_reduce_in_fp32", "overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer",
              "use_megatron_fsdp", "data_parallel_sharding_strategy", "fp8_param_gather",
              "reuse_grad_buf_for_mxfp8_param_ag", "megatron_fsdp_main_grads_dtype")


def plain(value: object) -> object:
    """A value as JSON carries it (enums by value, dtypes and the rest by str)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "value") and isinstance(value.value, (int, str)):
        return value.value
    return str(value)


def scope_names(scope: object) -> list[str]:
    """CUDA-graph scope members (one or a list; enum members or names) as names."""
    members = scope if isinstance(scope, (list, tuple)) else [scope] if scope else []
    return [str(getattr(member, "name", member)) for member in members]


def run(job: dict) -> dict:
    import fiddle as fdl
    from nemo.collections import llm
    from nemo_run.cli.lazy import LazyEntrypoint

    with contextlib.redirect_stdout(io.StringIO()):
        partial = LazyEntrypoint(llm.pretrain, factory=job["factory"], overwrites=job["overrides"]).resolve()
        # the kernel fusions Megatron-Core refuses without Transformer Engine (a CUDA build, absent here): no plan
        # knob among them (job["te_only_fusions"], export.conformance.TE_ONLY_FUSIONS)
        for fusion in job.get("te_only_fusions", ()):
            setattr(partial.model.config, fusion, False)
        model = fdl.build(partial.model)
        strategy = fdl.build(partial.trainer.strategy)
        plugin = fdl.build(partial.trainer.plugins)
        optim = fdl.build(partial.optim)
        model.optim = optim
        strategy.precision_plugin = plugin   # lightning's _AcceleratorConnector hands the plugin over
        strategy.connect(model)
    ddp = strategy.ddp_config
    ddp_fields = {f.name for f in dataclasses.fields(ddp)}
    values = {"model": {name: plain(getattr(model.config, name, None)) for name in MODEL_FIELDS},
              # the captured modules by name (CudaGraphScope's values are numbers)
              "cuda_graph_scope_names": scope_names(getattr(model.config, "cuda_graph_scope", None)),
              "ddp": {name: plain(getattr(ddp, name)) for name in DDP_FIELDS if name in ddp_fields},
              "optimizer": {"use_distributed_optimizer": optim.config.use_distributed_optimizer,
                            "use_precision_aware_optimizer": optim.config.use_precision_aware_optimizer,
                            "dtypes": [plain(getattr(optim.config, name)) for name in (
                                "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")]},
              "data": {name: plain(getattr(partial.data, name, None))
                       for name in ("micro_batch_size", "global_batch_size", "seq_length")},
              "trainer": {"num_nodes": partial.trainer.num_nodes, "devices": partial.trainer.devices},
              "strategy": {"fsdp": plain(getattr(strategy, "_fsdp", None) or getattr(strategy, "fsdp", None))},
              # megatron-core 0.16's Megatron-FSDP keeps main gradients in fp32 when grad_reduce_in_fp32 is set
              # (megatron_fsdp.py passes it to its buffers); later ones read megatron_fsdp_main_grads_dtype
              "fsdp_reads_grad_reduce_in_fp32": "megatron_fsdp_main_grads_dtype" not in ddp_fields}
    return {"values": values}


def main() -> int:
    with open(sys.argv[1]) as jobs_file:
        jobs = json.load(jobs_file)
    results = []
    for job in jobs:
        try:
            results.append(run(job))
        except BaseException as error:  # noqa: BLE001 - NeMo's refusal of the config, reported per job
            results.append({"error": f"{type(error).__name__}: {error}"[:600]})
    with open(sys.argv[2], "w") as results_file:   # a file: NeMo logs to stdout
        json.dump(results, results_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
