"""The engine flags through the real CLI (issue 42): --framework prices what the framework runs, the launch-path
flags are refused where the engine has no such thing (exit 2, one line naming the flag), and every document says
which engine and launch path were priced."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import autopar

SMALL = ("estimate", "llama-3.2-1b", "--gpus", "8", "--seq-len", "1024", "--global-batch", "64", "--mbs", "1")


def estimate(*flags: str) -> dict:
    result = autopar(*SMALL, *flags, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_framework_picks_the_engine_and_the_inputs_name_it():
    megatron = estimate()
    assert megatron["inputs"]["training"]["engine"] == "megatron"
    assert megatron["inputs"]["training"]["launch"] == "eager"
    titan = estimate("--framework", "torchtitan", "--compile")
    assert (titan["inputs"]["training"]["engine"], titan["inputs"]["training"]["launch"]) == ("torchtitan", "compile")
    plain = estimate("--framework", "pytorch")
    assert plain["inputs"]["training"]["engine"] == "pytorch"
    llmc = estimate("--framework", "llm.c")
    assert llmc["inputs"]["training"]["engine"] == "native"
    # the same plan, different engines: the host's share and the GPU's elementwise work differ
    assert len({round(doc["step_time_s"], 6) for doc in (megatron, titan, plain, llmc)}) == 4
    text = autopar(*SMALL, "--framework", "torchtitan", "--compile")
    assert "engine torchtitan (FSDP2), torch.compile'd blocks" in " ".join(text.stdout.split())


def test_cuda_graphs_cut_the_host_share():
    eager = estimate("--tp", "8")
    graphs = estimate("--tp", "8", "--cuda-graph-impl", "transformer_engine")
    assert graphs["inputs"]["training"]["launch"] == "cuda_graph"
    assert graphs["time_terms_s"]["host"] < eager["time_terms_s"]["host"]


@pytest.mark.parametrize("flags,names", [
    (["--compile"], ["compile", "megatron"]),
    (["--framework", "torchtitan", "--cuda-graph-impl", "local"], ["cuda_graph_impl", "torchtitan"]),
    (["--cuda-graph-impl", "full_iter"], ["cuda_graph_impl", "full_iter"]),
    (["--cuda-graph-modules", "attn"], ["cuda_graph_modules", "--cuda-graph-impl"]),
    (["--cuda-graph-impl", "local", "--cuda-graph-modules", "router"], ["cuda_graph_modules", "router"]),
    (["--fused-kernels"], ["fused_kernels", "megatron"]),
    (["--deepspeed-version", "0.5.10"], ["deepspeed_version", "--framework deepspeed"]),
    (["--framework", "deepspeed", "--deepspeed-version", "latest"], ["deepspeed_version", "0.5.10"]),
    (["--framework", "jax"], ["framework", "jax", "pytorch"]),
], ids=["compile-megatron", "graphs-torchtitan", "bad-impl", "modules-no-impl", "bad-module", "fused-megatron",
        "ds-version-no-ds", "bad-ds-version", "unknown-framework"])
def test_engine_flags_are_refused_where_they_do_not_apply(flags, names):
    result = autopar(*SMALL, *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: ") and "Traceback" not in result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_solve_under_a_priced_only_framework_searches_data_parallel_plans():
    result = autopar("solve", "llama-3.2-1b", "--gpus", "8", "--seq-len", "1024", "--global-batch", "64",
                     "--framework", "pytorch", "--json")
    assert result.returncode == 0, result.stderr
    front = json.loads(result.stdout)
    assert front["points"] and all(p["plan"]["tp"] == 1 and p["plan"]["pp"] == 1 for p in front["points"])
    refused = autopar("solve", "llama-3.2-1b", "--gpus", "8", "--emit", "pytorch")
    assert refused.returncode == 2 and "writes no launch config" in refused.stderr


def test_megatron_commands_bring_their_cuda_graphs(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                      "--sequence-parallel --num-layers 16 --hidden-size 2048 --num-attention-heads 32 "
                      "--micro-batch-size 1 --global-batch-size 64 --seq-length 1024 --bf16 "
                      "--cuda-graph-impl transformer_engine --cuda-graph-modules attn mlp\n", encoding="utf-8")
    result = autopar("estimate", "llama-3.2-1b", "--from-megatron-args", str(script), "--json")
    assert result.returncode == 0, result.stderr
    training = json.loads(result.stdout)["inputs"]["training"]
    assert training["launch"] == "cuda_graph" and training["cuda_graph_modules"] == ["attn", "mlp"]


@pytest.mark.parametrize("flags,loss", [
    ((), "fused"),                                            # Megatron-Core's fused cross entropy
    (("--framework", "torchtitan"), "unfused"),               # F.cross_entropy on upcast logits
    (("--framework", "torchtitan", "--compile"), "xentropy"),  # the loss compiled with the model
    (("--framework", "deepspeed"), "unfused"),
    (("--framework", "llm.c"), "xentropy"),                   # llm.c's fused classifier
    (("--framework", "torchtitan", "--cross-entropy", "fused"), "fused"),   # as asked
])
def test_the_loss_priced_is_the_engines_unless_asked(flags, loss):
    assert estimate(*flags)["inputs"]["training"]["cross_entropy"] == loss


def test_a_compiled_torchtitan_plan_is_launched_compiled():
    compiled = autopar(*SMALL, "--emit", "torchtitan", "--compile", "--zero", "3")
    assert compiled.returncode == 0, compiled.stderr
    assert "config.compile = CompileConfig(enable=True)" in compiled.stdout
    assert "# note: cross_entropy" not in compiled.stdout          # the loss it runs is the loss priced
    eager = autopar(*SMALL, "--emit", "torchtitan", "--zero", "3")
    # written either way: a registry config that compiles must not leave an eager estimate compiled
    assert "config.compile = CompileConfig(enable=False)" in eager.stdout and "# note: cross_entropy" not in eager.stdout


def test_the_estimate_says_why_freed_gradients_count_less():
    """torchtitan frees its gradients between steps: with FSDP and one micro-batch a step the report says why the
    gradient rows are below the gradients' size; with two micro-batches, or under Megatron-Core, it says nothing."""
    def run(batch: int, *flags: str):
        return autopar("estimate", "llama-3.2-1b", "--gpus", "8", "--seq-len", "1024", "--mbs", "1", "--zero", "3",
                       "--tp", "1", "--pp", "1", "--global-batch", str(batch), *flags)

    phrase = "frees them between steps (zero_grad(set_to_none=True))"
    assert phrase in " ".join(run(8, "--framework", "torchtitan").stdout.split())
    assert phrase not in " ".join(run(16, "--framework", "torchtitan").stdout.split())
    assert phrase not in " ".join(run(8).stdout.split())

    def gradients(batch: int) -> float:
        return json.loads(run(batch, "--framework", "torchtitan", "--json").stdout)["stages"][0]["terms_bytes"][
            "gradients"]

    assert gradients(8) < gradients(16)


def test_the_optimizer_step_holds_every_gradient_and_ddps_buckets():
    """At the optimizer step the activations are gone but every gradient is there, whatever share of them the
    backward's peak held, and DDP's buckets stay: the step's total counts both."""
    import autopar
    from autopar.commands import optimizer_step_warnings
    from costmodels import memory
    from costmodels.plan import PlanArrays

    model, cluster = autopar.load_model("llama-3.2-1b"), autopar.make_cluster(gpu="h100", num_gpus=8)
    training = autopar.Training(seq_len=512, global_batch_size=8, engine="pytorch", grad_reduce_in_fp32=False)
    result = autopar.estimate(model, cluster, training, autopar.Plan(tp=1, mbs=1, zero=0,
                                                                     recompute=autopar.Recompute.FULL))
    terms = result.stages[0].terms_bytes
    plans = PlanArrays.from_plans([result.plan])
    kept = sum(value for name, value in terms.items() if name not in memory.ACTIVATION_TERMS
               and name not in memory.GRADIENT_TERMS and (name not in memory.BUFFER_TERMS
                                                          or name == "ddp_gradient_buckets"))
    step = kept + float(memory.full_gradient_bytes(model, cluster, training, plans, 0)[0]) \
        + float(memory.optimizer_step_grad_copy_bytes(model, cluster, training, plans, 0)[0])
    assert terms["ddp_gradient_buckets"] > 0
    warning, = optimizer_step_warnings(result)
    assert f"holds {step / 2**30:.2f} GiB" in warning
    # a plain PyTorch loop has no Megatron optimizer: the line names the mechanism, not the framework
    assert "an fp32-master optimizer copies them" in warning and "Megatron" not in warning
