"""Training logs read as measured runs (autopar/run_logs.py), on real log excerpts.

Sources of the excerpts (each quoted verbatim; the fixture files are the logs' lines, unedited):
- tests/data/run_logs/megatron_lm_mi300x_thera.log: lines 566-978 (start-up notes, the arguments block) and the
  `elapsed time per iteration` lines of rccltest/log-megatron-thera.sh in github.com/sfantao/lumi-ai-workflow-tests
  @ ab6be8e6 — a Megatron-LM (ROCm build, rocm/megatron-lm:v25.9) pretrain_gpt.py run on 8 MI300X.
- tests/data/run_logs/megatron_lm_rl_refit_args.log: lines 51-727 of examples/rl/test_results/
  test_260128_154146_gloo.log in github.com/NVIDIA/Megatron-LM @ b12e09ee (Megatron-LM's own repository): the
  arguments block of a run that failed before its first iteration.
- MEGATRON_ISSUE_756: iteration lines of github.com/NVIDIA/Megatron-LM/issues/756 (Mixtral 8x7B on 16 H100).
- NEMO_ISSUE_7957: the progress-bar line of github.com/NVIDIA/NeMo/issues/7957 (NeMo 1.x GPT 7B).
- NEMO_ISSUE_5819: the configuration NeMo printed, github.com/NVIDIA/NeMo/issues/5819 (Slurm task prefix `0: `).
- NEMO2_BIONEMO_PR_740: NeMo 2.x `Training epoch` lines of github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740.
- TORCHTITAN_PR_1349 and TORCHTITAN_PR_2389: log lines of github.com/pytorch/torchtitan/pull/1349 and /pull/2389.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.run_logs import (LogLine, log_kind, megatron_arguments, megatron_command, megatron_steps, nemo_config,
                              nemo_run, nemo_steps, read_log, read_log_lines, torchtitan_run)
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Recompute

DATA = Path(__file__).parent / "data" / "run_logs"


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100")


def lines_of(text: str) -> list[LogLine]:
    path_lines = text.strip("\n").split("\n")
    from autopar.run_logs import ANSI, LINE_PREFIX

    return [LogLine(i, LINE_PREFIX.sub("", ANSI.sub("", line))) for i, line in enumerate(path_lines, start=1)]


# ---- Megatron-LM -------------------------------------------------------------------------------------------------

def test_megatron_log_gives_layout_model_training_and_step(h100):
    run = read_log(DATA / "megatron_lm_mi300x_thera.log", h100)
    # the arguments block: --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel
    # --micro-batch-size 1 --recompute-activations --use-distributed-optimizer, world_size 8
    assert run.cluster.num_gpus == 8
    assert (run.fixed["tp"], run.fixed["pp"], run.fixed["cp"], run.fixed["mbs"]) == (4, 2, 1, 1)
    assert run.fixed["sp"] and run.fixed["zero"] == 1 and run.fixed["recompute"] is Recompute.SELECTIVE
    assert (run.training.seq_len, run.training.global_batch_size) == (8192, 512)
    model = run.model          # --num-layers 56 --hidden-size 6144 --num-attention-heads 96 --num-query-groups 24
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads) == (56, 6144, 96, 24)
    assert (model.ffn_hidden_size, model.vocab_size) == (21504, 50257)     # ' > padded vocab (size: 50257) ...'
    assert model.mlp.value == "gated" and model.norm.value == "rmsnorm" and not model.tied_embeddings
    # iterations 1..17 logged, 450846.5 ms for the first (start-up, dropped); the median of 2..17 is the mean of
    # the two middle values of the 16 sorted times 419152.3 and 419212.6... here 419214.95 / 1000 rounded below
    times = sorted([423291.1, 421545.3, 420965.6, 421365.2, 419080.4, 418343.3, 419181.8, 419295.2, 419414.1,
                    419469.4, 419234.8, 419363.6, 418969.1, 419212.6, 419055.3, 419152.3])
    assert run.measured_step_s == pytest.approx((times[7] + times[8]) / 2 / 1000)
    assert "median of 16 logged steps (2..17)" in run.notes[0]


def test_megatron_lm_own_log_without_iterations_is_refused_not_guessed(h100):
    lines = read_log_lines(DATA / "megatron_lm_rl_refit_args.log")
    arguments, _ = megatron_arguments("rl.log", lines)
    # names of 48+ characters print with no dots at all ('inference_dynamic_batching_cuda_graph_max_tokens  16384')
    assert arguments["inference_dynamic_batching_cuda_graph_max_tokens"] == "16384"
    assert (arguments["world_size"], arguments["tensor_model_parallel_size"]) == ("8", "2")
    command = megatron_command(arguments)
    assert "--tensor-model-parallel-size 2" in command and "--expert-model-parallel-size 2" in command
    assert "--main-grads-dtype fp32" in command           # printed as torch.float32
    with pytest.raises(InputError, match=r"no 'elapsed time per iteration \(ms\)' line"):
        read_log(DATA / "megatron_lm_rl_refit_args.log", h100)


MEGATRON_ISSUE_756 = """\
 [2024-04-06 03:02:12] iteration       71/     100 | consumed samples:         9088 | elapsed time per iteration (ms): 5361.6 | throughput per GPU (TFLOP/s/GPU): 243.6 | learning rate: 1.420000E-05 | global batch size:   128 | lm loss: 1.818812E+00 | load_balancing_loss: 1.013377E+00 | loss scale: 1.0 | grad norm: 1.300 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-04-06 03:02:18] iteration       72/     100 | consumed samples:         9216 | elapsed time per iteration (ms): 5470.7 | throughput per GPU (TFLOP/s/GPU): 238.7 | learning rate: 1.440000E-05 | global batch size:   128 | lm loss: 1.820313E+00 | load_balancing_loss: 1.019612E+00 | loss scale: 1.0 | grad norm: 1.305 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-04-06 03:02:24] iteration       73/     100 | consumed samples:         9344 | elapsed time per iteration (ms): 5829.9 | throughput per GPU (TFLOP/s/GPU): 224.0 | learning rate: 1.460000E-05 | global batch size:   128 | lm loss: 1.798953E+00 | load_balancing_loss: 1.010977E+00 | loss scale: 1.0 | grad norm: 1.539 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def test_megatron_iteration_lines_of_issue_756():
    steps = megatron_steps("issue-756", lines_of(MEGATRON_ISSUE_756), 128)
    assert [(step, seconds) for _, step, seconds in steps] == [(71, pytest.approx(5.3616)), (72, pytest.approx(5.4707)),
                                                               (73, pytest.approx(5.8299))]
    assert megatron_steps("issue-756", lines_of(MEGATRON_ISSUE_756), 256) == []     # another batch: not the step


def test_megatron_iteration_line_cut_off_is_reported_with_its_line_number():
    line = MEGATRON_ISSUE_756.splitlines()[1]
    cut = line[:line.index("(ms): ") + 8]                    # '... elapsed time per iteration (ms): 54', cut off
    with pytest.raises(InputError, match=r"line 2: an iteration line whose iteration number or elapsed time"):
        megatron_steps("issue-756", lines_of(MEGATRON_ISSUE_756.splitlines()[0] + "\n" + cut), 128)


def test_megatron_log_model_checked_against_model_flag(h100):
    from autopar.models import load_model

    with pytest.raises(InputError, match="the log's model is not --model llama-3.1-8b: num_layers"):
        read_log(DATA / "megatron_lm_mi300x_thera.log", h100, load_model("llama-3.1-8b"))


# ---- NeMo --------------------------------------------------------------------------------------------------------

NEMO_ISSUE_7957 = """\
Epoch 0: :   3%|▎         | 9000/301500 [1:42:42<55:37:46, v_num=0-56, reduced_train_loss=nan.0, global_step=9e+3, consumed_samples=6.3e+5, train_step_timing in s=0.615, val_loss=7.040]
"""

NEMO2_BIONEMO_PR_740 = """\
Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 | global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106
Training epoch 0, iteration 121/149 | lr: 3e-05 | consumed_samples: 122 | global_batch_size: 1 | global_step: 121 | reduced_train_loss: 1.288 | train_step_timing in s: 0.03163 | val_loss: 4.106
Training epoch 0, iteration 122/149 | lr: 3e-05 | consumed_samples: 123 | global_batch_size: 1 | global_step: 122 | reduced_train_loss: 1.333 | train_step_timing in s: 0.03215 | val_loss: 4.106
"""

NEMO_ISSUE_5819 = """\
0:           constant_steps: 80000
0:           min_lr: 6.0e-05
0:     
0: [NeMo I 2023-01-18 07:39:41 megatron_gpt_pretraining:36] 
0:     
0:     ************** Experiment configuration ***********
0: [NeMo I 2023-01-18 07:39:41 megatron_gpt_pretraining:37] 
0:     name: megatron_gpt
0:     restore_from_path: null
0:     trainer:
0:       devices: 4
0:       num_nodes: 2
0:       accelerator: gpu
0:       precision: 16
0:       logger: false
0:       enable_checkpointing: false
0:       replace_sampler_ddp: false
0:       max_epochs: null
0:       max_steps: 300000
0:       log_every_n_steps: 50
0:       val_check_interval: 300
0:       limit_val_batches: 50
0:       limit_test_batches: 50
0:       accumulate_grad_batches: 1
0:       gradient_clip_val: 1.0
0:       benchmark: false
0:       enable_model_summary: false
0:     exp_manager:
0:       explicit_log_dir: null
0:       exp_dir: null
0:       name: megatron_gpt
"""
"""The excerpt of issue 5819 stops before the model: section (the issue's log is longer than the excerpt)."""


def test_nemo1_progress_bar_step():
    steps = nemo_steps("issue-7957", lines_of(NEMO_ISSUE_7957), None)
    assert [(step, seconds) for _, step, seconds in steps] == [(9000, 0.615)]


def test_nemo2_step_lines_read_and_the_missing_configuration_reported(h100, tmp_path):
    steps = nemo_steps("pr-740", lines_of(NEMO2_BIONEMO_PR_740), 1)
    assert [seconds for _, _, seconds in steps] == pytest.approx([0.03146, 0.03163, 0.03215])
    assert [step for _, step, _ in steps] == [120, 121, 122]
    log = tmp_path / "nemo2.log"
    log.write_text(NEMO2_BIONEMO_PR_740)
    assert log_kind(read_log_lines(log)) == "nemo"
    with pytest.raises(InputError, match="no 'Experiment configuration' block: NeMo 2.x"):
        read_log(log, h100)


def test_nemo1_configuration_through_slurm_prefixes_and_its_missing_model_section(h100):
    with pytest.raises(InputError, match="the configuration has no model: and trainer: sections"):
        nemo_config("issue-5819", lines_of(NEMO_ISSUE_5819))


NEMO_CONFIG_000763D0 = """\
[NeMo I 2022-05-01 12:00:00 megatron_gpt_pretraining:40] 
    
    ************** Experiment configuration ***********
[NeMo I 2022-05-01 12:00:00 megatron_gpt_pretraining:41] 
    name: megatron_gpt
    trainer:
      devices: 1
      num_nodes: 1
      accelerator: gpu
      precision: 16
    model:
      micro_batch_size: 4
      global_batch_size: 8
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 1
      encoder_seq_length: 512
      max_position_embeddings: ${.encoder_seq_length}
      num_layers: 12
      hidden_size: 768
      ffn_hidden_size: 3072
      num_attention_heads: 12
      hidden_dropout: 0.1
      activations_checkpoint_granularity: null
      sequence_parallel: false
      optim:
        name: fused_adam
"""
"""A constructed log, not a real one: the keys and values are those of NeMo's own
examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (github.com/NVIDIA/NeMo @ 000763d0) as
megatron_gpt_pretraining.py prints them (`logging.info(f'\\n{OmegaConf.to_yaml(cfg)}')` under the
'Experiment configuration' record, unresolved `${...}` kept), shortened to the keys autopar reads; the step lines
below follow issue 7957's progress bar."""


def test_nemo1_configuration_gives_layout_and_model_and_asks_for_the_vocabulary(h100):
    from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding

    steps = "\n".join(NEMO_ISSUE_7957.strip().replace("9000/301500", f"{n}/301500").replace("9e+3", str(n))
                      .replace("0.615", f"0.6{n % 10}") for n in (1, 2, 3))
    lines = lines_of(NEMO_CONFIG_000763D0 + steps)
    with pytest.raises(InputError, match="no 'Padded vocab_size: .., original vocab_size: ..' line"):
        nemo_run("nemo1.log", lines, h100)
    gpt = ModelSpec(name="gpt-125m", hidden_size=768, num_layers=12, num_attention_heads=12, ffn_hidden_size=3072,
                    vocab_size=50257, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                    position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=512, tied_embeddings=True)
    run = nemo_run("nemo1.log", lines, h100, gpt)
    assert (run.fixed["tp"], run.fixed["pp"], run.fixed["mbs"], run.fixed["zero"]) == (1, 1, 4, 0)
    assert (run.training.seq_len, run.training.global_batch_size, run.cluster.num_gpus) == (512, 8, 1)
    assert run.measured_step_s == pytest.approx(0.625)        # median of 0.62, 0.63 after dropping 0.61
    assert "fp16 priced as bf16" in " ".join(run.notes)


# ---- torchtitan --------------------------------------------------------------------------------------------------

TORCHTITAN_PR_1349 = """\
[rank0]:[titan] 2025-06-26 18:12:46,592 - root - INFO - Building 1-D device mesh with ['dp_shard'], [8]
[rank0]:[titan] 2025-06-26 18:12:46,593 - root - INFO - [GC] Initial GC collection. 0.00 seconds.
[rank0]:[titan] 2025-06-26 18:23:14,389 - root - INFO - step:  1  loss:  8.1996  memory:  2.65GiB(2.79%)  tps: 1,772  tflops: 0.13  mfu: 0.01%
[rank0]:[titan] 2025-06-26 18:23:14,486 - root - INFO - step:  2  loss:  8.1709  memory:  2.66GiB(2.80%)  tps: 168,877  tflops: 12.14  mfu: 1.23%
[rank0]:[titan] 2025-06-26 18:23:14,580 - root - INFO - step:  3  loss:  8.1121  memory:  2.66GiB(2.80%)  tps: 175,100  tflops: 12.59  mfu: 1.27%
"""

TORCHTITAN_PR_2389 = """\
[titan] 2026-02-24 19:46:17,508 - root - INFO - step:  4  loss:  7.62585  grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.71  mfu: 13.99%
[titan] 2026-02-24 19:46:19,145 - root - INFO - step:  5  loss:  7.07623  grad_norm: 46.5000  memory: 66.91GiB(37.51%)  tps: 10,007  tflops: 313.36  mfu: 13.93%
"""


def test_torchtitan_log_without_batch_line_is_refused(h100, tmp_path):
    log = tmp_path / "titan.log"
    log.write_text(TORCHTITAN_PR_1349)
    lines = read_log_lines(log)
    assert log_kind(lines) == "torchtitan"
    with pytest.raises(InputError, match="no batch .* line"):
        read_log(log, h100)


def test_torchtitan_step_time_from_tps(h100):
    from autopar.models import load_model

    # the PR 1349 mesh (FSDP over 8) and PR 2389's metric lines, with a batch line of torchtitan's format
    # (torchtitan/train.py at b63e20988: 'Training starts at step 1, with local batch size .., global batch size ..,
    # sequence length .., ...'): tps per device = this rank's tokens / time, so step = 1 × 8192 / tps
    text = (TORCHTITAN_PR_1349.splitlines()[0] + "\n"
            + "[rank0]:[titan] - root - INFO - Training starts at step 1, with local batch size 1, global batch size "
              "8, sequence length 8192, total steps 10 (warmup 2)\n" + TORCHTITAN_PR_2389
            + TORCHTITAN_PR_2389.splitlines()[1].replace("step:  5", "step:  6").replace("10,007", "9,990") + "\n")
    run = torchtitan_run("titan.log", lines_of(text), h100, load_model("llama-3.1-8b"))
    assert run.cluster.num_gpus == 8 and run.fixed["zero"] == 3 and run.fixed["tp"] == 1
    assert run.measured_step_s == pytest.approx(8192 / ((10_007 + 9_990) / 2))   # step 4 dropped (first logged)
