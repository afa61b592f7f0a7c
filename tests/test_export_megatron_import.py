"""Reading existing Megatron-LM launches: scripts, shell syntax, every vpp spelling, errors, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from autopar.megatron_args import parse_megatron_args, read_megatron_source, shell_words
from autopar.report.document import load_schema
from costmodels.errors import InputError
from costmodels.plan import Plan, Recompute
from costmodels.specs import TrainingSpec

LAUNCH_SCRIPT = r"""#!/bin/bash
#SBATCH --nodes=4
#SBATCH --gpus-per-node=8
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${NNODES:-4}
TP=4; PP=4
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK"
GPT_MODEL_ARGS=(
    --num-layers 80
    --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64
    --group-query-attention --num-query-groups 8
    --seq-length 8192
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size $((32 * 16))
    --tensor-model-parallel-size ${TP}
    --pipeline-model-parallel-size=$PP
    --num-layers-per-virtual-pipeline-stage 5   # 80 / 4 = 20 per rank, 4 chunks of 5
    --sequence-parallel
    --use-distributed-optimizer
    --recompute-granularity full --recompute-method block --recompute-num-layers 2
    --bf16 --fp8-format hybrid
    --lr 1.5e-4 --train-iters 500000 --data-path "/data/my corpus"
)
torchrun ${DISTRIBUTED_ARGS} pretrain_gpt.py \
    "${GPT_MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    --save /ckpt --load /ckpt
"""


def test_a_launch_script_is_read_like_the_shell_would():
    run = parse_megatron_args(LAUNCH_SCRIPT)
    assert run.plan == Plan(tp=4, pp=4, vpp=4, sp=True, zero=1, recompute=Recompute.FULL, recompute_layers=2)
    # no --cross-entropy-loss-fusion in the script: Megatron-LM's default unfused loss
    assert run.training == {"seq_len": 8192, "global_batch_size": 512, "precision": "fp8", "fp8_recipe": "delayed",
                            "cross_entropy": "unfused", "pipeline_schedule": "1f1b",
                            "grad_reduce_in_fp32": True,     # validate_args' bf16 default
                            "fp8_param_gather": False}
    fused = parse_megatron_args(LAUNCH_SCRIPT.replace("--bf16", "--bf16 --cross-entropy-loss-fusion"))
    assert fused.training["cross_entropy"] == "fused"
    assert run.num_gpus == 32  # --nproc_per_node 8 x --nnodes 4
    assert run.model == {"num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672,
                         "num_attention_heads": 64, "num_kv_heads": 8}
    plan, training, num_gpus = run  # unpacks as the (plan, training fields, num_gpus) triple
    assert (plan, num_gpus) == (run.plan, 32)
    assert run.training_spec(TrainingSpec()) == TrainingSpec(seq_len=8192, global_batch_size=512, precision="fp8",
                                                             cross_entropy="unfused")


def test_read_from_a_file_path(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(LAUNCH_SCRIPT)
    assert read_megatron_source(str(script)) == LAUNCH_SCRIPT
    assert read_megatron_source("--tensor-model-parallel-size 2") == "--tensor-model-parallel-size 2"
    assert read_megatron_source("~nosuchuser_zz/train.sh") == "~nosuchuser_zz/train.sh"   # no such user: a command


@pytest.mark.parametrize("flags, vpp", [
    ("--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2", 4),  # 32/4/2
    ("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2", 2),
    ("--pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 3", 3),  # older spelling
    ("--pipeline-model-parallel-size 4", 1),
])
def test_every_virtual_pipeline_spelling(flags, vpp):
    assert parse_megatron_args(flags).plan.vpp == vpp


def test_uneven_stages_and_the_layer_count_from_the_model():
    run = parse_megatron_args("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
                              "--decoder-last-pipeline-num-layers=6 --num-virtual-stages-per-pipeline-rank 2")
    assert (run.plan.first_stage_layers, run.plan.last_stage_layers, run.plan.vpp) == (6, 6, 2)
    # --num-layers-per-virtual-pipeline-stage needs the layer count: from the command, or the caller's model
    assert parse_megatron_args("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4",
                               num_layers=32).plan.vpp == 4
    with pytest.raises(InputError, match="needs the layer count"):
        parse_megatron_args("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4")


def test_embedding_and_loss_slots_are_read_as_lighter_end_stages():
    # 126 + 2 slots over pp 16 = 8 per rank: the ends hold 7 decoder layers; 2 layers per virtual stage -> vpp 4
    run = parse_megatron_args("--num-layers 126 --pipeline-model-parallel-size 16 "
                              "--num-layers-per-virtual-pipeline-stage 2 --account-for-embedding-in-pipeline-split "
                              "--account-for-loss-in-pipeline-split")
    assert (run.plan.pp, run.plan.vpp, run.plan.first_stage_layers, run.plan.last_stage_layers) == (16, 4, 7, 7)
    loss_only = parse_megatron_args("--num-layers 127 --pipeline-model-parallel-size 16 "
                                    "--num-virtual-stages-per-pipeline-rank 2 --account-for-loss-in-pipeline-split")
    assert (loss_only.plan.first_stage_layers, loss_only.plan.last_stage_layers) == (0, 7)
    with pytest.raises(InputError, match="cannot be combined"):
        parse_megatron_args("--num-layers 126 --pipeline-model-parallel-size 16 --decoder-first-pipeline-num-layers 7 "
                            "--account-for-embedding-in-pipeline-split")
    with pytest.raises(InputError, match="do not split over pp=16"):
        parse_megatron_args("--num-layers 125 --pipeline-model-parallel-size 16 "
                            "--account-for-embedding-in-pipeline-split")
    with pytest.raises(InputError, match="without a decoder layer"):     # (15 + 1) / 16 = 1 slot per rank
        parse_megatron_args("--num-layers 15 --pipeline-model-parallel-size 16 "
                            "--account-for-embedding-in-pipeline-split")
    with pytest.raises(InputError, match="pp=2 with interleaving"):
        parse_megatron_args("--num-layers 6 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                            "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")


@pytest.mark.parametrize("flags, zero", [
    ("--bf16", 0), ("--use-distributed-optimizer", 1),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", 2),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer", 3),
    ("--use-custom-fsdp --data-parallel-sharding-strategy=optim", 1),
    ("--use-torch-fsdp2", 3),
])
def test_optimizer_sharding(flags, zero):
    assert parse_megatron_args(flags).plan.zero == zero


@pytest.mark.parametrize("flags, recompute, layers", [
    ("--recompute-activations", Recompute.SELECTIVE, 0),
    # validate_args sets selective for --recompute-activations, whatever --recompute-granularity says
    ("--recompute-granularity full --recompute-activations", Recompute.SELECTIVE, 0),
    ("--recompute-granularity selective", Recompute.SELECTIVE, 0),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", Recompute.FULL, 0),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 3", Recompute.FULL, 3),
])
def test_recompute(flags, recompute, layers):
    plan = parse_megatron_args(flags).plan
    assert (plan.recompute, plan.recompute_layers) == (recompute, layers)


def test_approximations_are_noted():
    run = parse_megatron_args("--fp16 --recompute-granularity full --recompute-method uniform "
                              "--recompute-num-layers 4 --sequence-parallel")
    assert run.training["precision"] == "bf16"
    assert run.plan.sp is False  # Megatron-LM turns SP off at tp=1
    assert len(run.notes) == 5  # fp16, uniform x4, sp at tp=1, no --micro-batch-size, no batch and no GPU count
    # no --global-batch-size: Megatron-LM's default micro-batch x dp when the GPU count is known
    run = parse_megatron_args("torchrun --nproc-per-node=8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                              "--micro-batch-size 2 --bf16")
    assert run.training["global_batch_size"] == 2 * 4


@pytest.mark.parametrize("flags, in_fp32", [
    ("--bf16", True),                                                   # validate_args: main grads fp32 -> True
    ("--bf16 --grad-reduce-in-bf16", False),
    ("--bf16 --main-grads-dtype bf16", False),                          # no fp32 accumulation asked for
    ("--bf16 --main-grads-dtype fp32 --accumulate-allreduce-grads-in-fp32", True),
    ("--bf16 --accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16", False),   # grad-reduce-in-bf16 wins
    # Megatron-FSDP reads its own dtype, default 'auto': the parameters' bf16, whatever grad_reduce_in_fp32 says
    ("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params", False),
    ("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --accumulate-allreduce-grads-in-fp32",
     False),
    ("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --megatron-fsdp-main-grads-dtype fp32",
     True),
    ("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --megatron-fsdp-main-grads-dtype auto",
     False),
    ("--bf16 --use-torch-fsdp2", False),                                # bf16 parameters, no MixedPrecisionPolicy
])
def test_the_gradient_reduce_dtype_is_read_as_validate_args_derives_it(flags, in_fp32):
    run = parse_megatron_args(flags)
    assert run.training["grad_reduce_in_fp32"] is in_fp32
    assert run.training_spec(TrainingSpec()).gradient_bytes_per_param == (4 if in_fp32 else 2)
    assert not any(note.startswith(("--grad-reduce-in-bf16", "--main-grads-dtype")) for note in run.notes)


def test_a_megatron_fsdp_comm_dtype_unlike_its_main_gradients_is_noted():
    run = parse_megatron_args("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads "
                              "--megatron-fsdp-main-grads-dtype fp32 --megatron-fsdp-grad-comm-dtype bf16")
    assert run.training["grad_reduce_in_fp32"] is True
    assert any(note.startswith("--megatron-fsdp-grad-comm-dtype bf16 with main gradients in fp32")
               for note in run.notes), run.notes
    same = parse_megatron_args("--bf16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads "
                               "--megatron-fsdp-main-grads-dtype fp32 --megatron-fsdp-grad-comm-dtype fp32")
    assert not any(note.startswith("--megatron-fsdp-grad-comm-dtype") for note in same.notes)


def test_an_unreadable_launcher_only_loses_the_gpu_count():
    run = parse_megatron_args("torchrun --nproc-per-node gpu --nnodes $NNODES pretrain_gpt.py --micro-batch-size 2")
    assert run.num_gpus is None and run.plan.mbs == 2
    assert any("GPU count not read" in note for note in run.notes)


def test_shell_words_expand_variables_and_strings_of_flags():
    words, variables = shell_words('OPTS="--tp-like 1 --pp-like 2"\nX=${UNSET:-7}\necho $OPTS ${X} $(( X * 2 ))')
    # $OPTS splits into its flags; ${UNSET:-7} takes the default; $(( X * 2 )) = 14
    assert words == ["echo", "--tp-like", "1", "--pp-like", "2", "7", "14"]
    assert variables == {"OPTS": "--tp-like 1 --pp-like 2", "X": "7"}


@pytest.mark.parametrize("text, message", [
    ("--tensor-model-parallel-size $TP", "shell variable the script does not set"),
    ("--tensor-model-parallel-size 0", "--tensor-model-parallel-size: must be a positive integer"),
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'", "not supported"),
    ("--micro-batch-size", "last word of the command"),
    ("--recompute-granularity full --recompute-method block", "needs --recompute-num-layers"),
    ("--data-path 'unbalanced", "check its quotes"),
    ("train.sh", r"no Megatron-LM flags in 'train.sh' \(no file has that path either\)"),
    ("/no/such/dir/launch", r"'/no/such/dir/launch' \(no file has that path either\)"),
    ("pretrain_gpt", r"no Megatron-LM flags in 'pretrain_gpt': give"),
    ("~nosuchuser_zz/train.sh", r"no Megatron-LM flags in '~nosuchuser_zz/train.sh'"),
    ("torchrun --nproc-per-node 8 pretrain_gpt.py", "no Megatron-LM flags"),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy everything", "data-parallel-sharding-strategy"),
    ("--hidden-dropout high", "--hidden-dropout 'high' is not a probability"),
    ("--attention-dropout 1.5", "--attention-dropout '1.5' is not a probability"),
    ("--fp16 --bf16", "--fp16 and --bf16 together"),
    ("--bf16 --accumulate-allreduce-grads-in-fp32 --main-grads-dtype bf16", "can only be fp32 when"),
    ("--bf16 --main-grads-dtype fp16", "--main-grads-dtype fp16: Megatron-LM takes fp32 or bf16"),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --megatron-fsdp-main-grads-dtype fp8",
     "--megatron-fsdp-main-grads-dtype fp8: Megatron-LM takes one of auto, fp32, bf16, fp16"),
    ("--recompute-granularity full --recompute-method uniform --recompute-activations", "drop --recompute-method"),
    ("--recompute-granularity selective --recompute-method block", "drop --recompute-method"),
    ("--pipeline-model-parallel-size 2 --num-layers 32 --num-layers-per-virtual-pipeline-stage 4 "
     "--num-virtual-stages-per-pipeline-rank 2", "are exclusive"),
])
def test_bad_commands_name_the_flag_and_the_fix(text, message):
    with pytest.raises(InputError, match=message) as error:
        parse_megatron_args(text)
    assert error.value.field == "from-megatron-args"


def _autopar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_estimates_an_existing_megatron_command(tmp_path):
    """`autopar estimate MODEL --from-megatron-args FILE --out ... --emit ...` through a real subprocess."""
    script = tmp_path / "train.sh"
    script.write_text(LAUNCH_SCRIPT.replace("--num-layers 80", "--num-layers 32")
                      .replace("--hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64",
                               "--hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32")
                      .replace("--num-layers-per-virtual-pipeline-stage 5", "--num-layers-per-virtual-pipeline-stage 4")
                      .replace("--bf16 --fp8-format hybrid", "--bf16"))
    report = tmp_path / "estimate.json"
    result = _autopar("estimate", "llama-3.1-8b", "--from-megatron-args", str(script), "--out", str(report),
                      "--emit", "megatron", "--json")
    assert result.returncode in (0, 1), result.stderr
    document = json.loads(result.stdout)  # --json keeps stdout a single JSON document
    assert document["plan"]["tp"] == 4 and document["plan"]["pp"] == 4 and document["plan"]["vpp"] == 2
    assert document["inputs"]["cluster"]["num_gpus"] == 32
    assert document["inputs"]["training"]["seq_len"] == 8192
    saved = json.loads(report.read_text())
    jsonschema.validate(saved, load_schema(), cls=jsonschema.Draft202012Validator)
    emitted = result.stderr[result.stderr.index("# Megatron-LM"):]
    assert parse_megatron_args(emitted).plan == parse_megatron_args(script.read_text()).plan


def test_cli_rejects_an_unreadable_command():
    result = _autopar("estimate", "llama-3.1-8b", "--from-megatron-args", "--tensor-model-parallel-size $TP")
    assert result.returncode == 2
    assert result.stderr.startswith("autopar: error: from-megatron-args:")
    assert "Traceback" not in result.stderr


def test_cli_says_when_the_command_overrides_the_typed_dispatcher():
    command = ("--tensor-model-parallel-size 2 --expert-model-parallel-size 8 --sequence-parallel --micro-batch-size 1 "
               "--global-batch-size 256 --seq-length 4096 --bf16 --num-experts 8 --moe-token-dispatcher-type alltoall")
    result = _autopar("estimate", "mixtral-8x7b", "--gpus", "64", "--moe-dispatcher", "deepep",
                      "--from-megatron-args", command)
    assert result.returncode in (0, 1), result.stderr
    assert "note: --moe-dispatcher deepep ignored: the Megatron-LM command runs alltoall" in result.stderr
    assert "dispatcher alltoall" in " ".join(result.stdout.split())


def test_cli_prices_the_commands_expert_capacity_over_a_typed_one():
    command = ("--tensor-model-parallel-size 2 --expert-model-parallel-size 8 --sequence-parallel --micro-batch-size 1 "
               "--global-batch-size 256 --seq-length 4096 --bf16 --num-experts 8 --moe-token-dispatcher-type alltoall "
               "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity")
    result = _autopar("estimate", "mixtral-8x7b", "--gpus", "64", "--moe-capacity-factor", "2",
                      "--from-megatron-args", command)
    assert result.returncode in (0, 1), result.stderr
    assert "note: --moe-capacity-factor 2 ignored: the Megatron-LM command runs 1.25" in result.stderr
    assert "MoE capacity factor 1.25, imbalance 1.25" in " ".join(result.stdout.split())


@pytest.mark.parametrize("typed, command", [(("--seq-len", "8192"), "--seq-length 2048"),
                                            (("--global-batch", "512"), "--global-batch-size 128"),
                                            # typed values equal to autopar's own defaults are typed all the same
                                            (("--seq-len", "4096"), "--seq-length 2048"),
                                            (("--global-batch", "1024"), "--global-batch-size 128")])
def test_cli_refuses_a_typed_training_flag_the_command_contradicts(typed, command):
    done = _autopar("estimate", "llama-3.1-8b", "--from-megatron-args",
                    f"pretrain_gpt.py --tensor-model-parallel-size 2 {command}", *typed)
    assert done.returncode == 2 and "contradicts the Megatron-LM command's" in done.stderr, done.stderr
    same = _autopar("estimate", "llama-3.1-8b", "--from-megatron-args",
                    f"pretrain_gpt.py --tensor-model-parallel-size 2 {command}", typed[0], command.split()[1])
    assert same.returncode in (0, 1), same.stderr


def test_cli_says_when_the_command_reduces_gradients_in_fp32_over_a_typed_bf16():
    command = "pretrain_gpt.py --tensor-model-parallel-size 2 --micro-batch-size 1 --bf16 --use-distributed-optimizer"
    typed = _autopar("estimate", "llama-3.1-8b", "--grad-reduce-in-bf16", "--from-megatron-args", command)
    assert typed.returncode in (0, 1), typed.stderr
    assert "note: --grad-reduce-in-bf16 ignored: the Megatron-LM command reduces gradients in fp32" in typed.stderr
    assert "gradients reduced in fp32" in " ".join(typed.stdout.split())
    bf16 = _autopar("estimate", "llama-3.1-8b", "--from-megatron-args", command + " --grad-reduce-in-bf16")
    assert bf16.returncode in (0, 1), bf16.stderr
    assert "ignored" not in bf16.stderr and "gradients reduced in bf16" in " ".join(bf16.stdout.split())


MOE_COMMAND = ("pretrain_gpt.py --num-experts 8 --moe-router-topk 2 --micro-batch-size 1 --bf16 "
               "--moe-token-dispatcher-type alltoall")


def test_expert_capacity_is_read_and_padding_runs_every_expert_at_its_capacity():
    """--moe-expert-capacity-factor caps the busiest expert; with --moe-pad-expert-input-to-capacity every expert
    runs its capacity (Megatron-Core's drop-and-pad), read as that load; a negative factor is dropless, as
    TransformerConfig resets it."""
    capped = parse_megatron_args(MOE_COMMAND + " --moe-expert-capacity-factor 1.5")
    assert capped.training["moe_capacity_factor"] == 1.5 and "moe_imbalance_factor" not in capped.training
    padded = parse_megatron_args(MOE_COMMAND + " --moe-expert-capacity-factor=1.5 --moe-pad-expert-input-to-capacity")
    spec = padded.training_spec(TrainingSpec())
    assert (spec.moe_capacity_factor, spec.moe_imbalance_factor) == (1.5, 1.5)
    assert any(note.startswith("--moe-pad-expert-input-to-capacity") for note in padded.notes)
    under_one = parse_megatron_args(MOE_COMMAND + " --moe-expert-capacity-factor 0.5 "
                                                  "--moe-pad-expert-input-to-capacity").training_spec(TrainingSpec())
    assert (under_one.moe_capacity_factor, under_one.moe_imbalance_factor) == (0.5, 1.0)   # min(1, 0.5): 0.5
    hybridep = parse_megatron_args(MOE_COMMAND.replace("alltoall", "flex") + " --moe-flex-dispatcher-backend "
                                   "hybridep --moe-expert-capacity-factor 1.2 --moe-pad-expert-input-to-capacity "
                                   "--moe-router-load-balancing-type seq_aux_loss")
    assert hybridep.training["moe_imbalance_factor"] == 1.2          # HybridEP pads (DeepEP alone refuses it)
    dropless = parse_megatron_args(MOE_COMMAND + " --moe-expert-capacity-factor -1")
    assert "moe_capacity_factor" not in dropless.training
    assert any("dropless" in note for note in dropless.notes)


@pytest.mark.parametrize("extra, words", [
    # TransformerConfig.__post_init__ refuses these three
    ("--moe-pad-expert-input-to-capacity", ["--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor"]),
    ("--moe-expert-capacity-factor 1.2 --moe-pad-expert-input-to-capacity --moe-token-dispatcher-type flex "
     "--moe-flex-dispatcher-backend deepep", ["deepep", "alltoall"]),
    ("--moe-expert-capacity-factor 1.2 --moe-router-load-balancing-type sinkhorn", ["sinkhorn", "aux_loss"]),
    # not a number (argparse refuses it), and a zero capacity (every token dropped): refused here
    ("--moe-expert-capacity-factor lots", ["--moe-expert-capacity-factor", "lots"]),
    ("--moe-expert-capacity-factor 0", ["--moe-expert-capacity-factor", "positive"]),
])
def test_an_expert_capacity_that_cannot_run_is_bad_input(extra, words):
    with pytest.raises(InputError) as error:
        parse_megatron_args(MOE_COMMAND + " " + extra)
    assert error.value.field == "from-megatron-args"
    assert all(word in error.value.message for word in words), error.value.message


def test_flags_that_change_cost_without_a_cost_term_are_named_in_the_notes():
    """Offloading, unfused kernels: each named with what the estimate leaves out; at the value that changes nothing
    (one optimizer instance) no note. The precision-aware optimizer's state dtypes are
    priced (TrainingSpec.optimizer_state_bytes, issue 43), so they get no note: bf16 first moment, fp32 second,
    fp32 masters kept as the bf16 weights' 16 remainder bits: (2, 2, 4)."""
    run = parse_megatron_args(MOE_COMMAND + " --use-precision-aware-optimizer --exp-avg-dtype bf16 "
                              "--exp-avg-sq-dtype fp32 --num-distributed-optimizer-instances 1 "
                              "--cuda-graph-impl=transformer_engine --cpu-offloading-num-layers 4 --no-rope-fusion "
                              "--lr 3e-4 --save /ckpt")
    flagged = {note.split(":")[0] for note in run.notes}
    assert {"--cpu-offloading-num-layers 4", "--no-rope-fusion"} <= flagged
    # CUDA graphs are priced (issue 42: the layers' launches replay as graphs), so they get no note
    assert not any(note.startswith("--cuda-graph-impl") for note in run.notes)
    assert run.training["launch"] == "cuda_graph" and run.training["cuda_graph_modules"] == ()
    assert run.training["optimizer_state_bytes"] == (2, 2, 4)
    assert not any(note.startswith(("--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "--exp-avg-dtype",
                                    "--num-distributed-optimizer-instances", "--lr", "--save")) for note in run.notes)
    quiet = parse_megatron_args(MOE_COMMAND + " --cuda-graph-impl none --num-distributed-optimizer-instances 1 "
                                              "--cpu-offloading-num-layers 0 --use-precision-aware-optimizer")
    assert not any(note.startswith(("--cuda-graph-impl", "--num-distributed-optimizer-instances",
                                    "--cpu-offloading-num-layers", "--use-precision-aware-optimizer"))
                   for note in quiet.notes)


def test_a_whole_iteration_graph_takes_full_recompute_and_per_layer_graphs_do_not():
    """--cuda-graph-impl full_iteration is read as the whole iteration captured, which Megatron-Core runs with full
    recompute; per-layer graphs (transformer_engine) with full recompute are refused as Megatron-Core refuses them
    (rule cuda_graph_recompute), exit 2 naming the rule."""
    command = ("pretrain_gpt.py --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 --bf16 "
               "--seq-length 4096 --global-batch-size 64 --recompute-granularity full --recompute-method uniform "
               "--recompute-num-layers 1 --use-distributed-optimizer ")
    whole = parse_megatron_args(command + "--cuda-graph-impl full_iteration")
    assert whole.training["cuda_graph_full_iteration"] is True and whole.training["launch"] == "cuda_graph"
    accepted = _autopar("estimate", "llama-3.1-8b", "--gpus", "16", "--from-megatron-args",
                        command + "--cuda-graph-impl full_iteration")
    assert accepted.returncode in (0, 1), accepted.stderr
    assert "CUDA graphs (the whole iteration)" in " ".join(accepted.stdout.split())
    refused = _autopar("estimate", "llama-3.1-8b", "--gpus", "16", "--from-megatron-args",
                       command + "--cuda-graph-impl transformer_engine")
    assert refused.returncode == 2 and "cuda_graph_recompute" in refused.stderr
