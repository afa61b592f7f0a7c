"""Training logs as measured runs: Megatron-LM, NeMo / Megatron-Bridge and torchtitan.

Each reader turns one log into a `autopar.runs.MeasuredRun`: the model, the layout, the training setup and the
measured step time, from what the framework prints, never from a default put in place of a line that is not there.
A line that should carry a value and cannot be read is an `InputError` naming the file and the line number.

- Megatron-LM (and Megatron-Bridge, which logs the same way): the arguments block `_print_args` prints at start
  (megatron/training/arguments.py: `  <name> ....... <value>` between `---- arguments ----` and
  `---- end of arguments ----`), read back into the command line it came from and through
  `autopar.megatron_args.parse_megatron_args` (the same reader as `--from-megatron-args`); the GPU count is its
  `world_size`. The step time is the iteration lines' `elapsed time per iteration (ms)` (training.py
  training_log: the average over the log interval; Bridge writes `current/mean`). The model comes from the same
  block (num_layers, hidden_size, ... and the ` > padded vocab (size: V ...)` line), or from --model.
- NeMo (1.x, PyTorch Lightning): the experiment configuration YAML it prints at start
  (`************** Experiment configuration ***********` then OmegaConf.to_yaml(cfg), as in
  examples/nlp/language_modeling/megatron_gpt_pretraining.py) gives the layout, the model and the GPU count
  (trainer.devices × trainer.num_nodes); the step time is `train_step_timing in s` of the progress lines
  (`... train_step_timing in s=0.615 ...` in the progress bar, `| train_step_timing in s: 0.189 |` in NeMo 2.x's
  `Training epoch E, iteration I/N | ...` lines). NeMo 2.x prints no configuration: such a log gives the step
  time only, and is refused with what is missing.
- torchtitan: `Building <n>-D device mesh with [dims], [sizes]` (or `Building device mesh with parallelism: pp=..,
  dp_replicate=.., ...`), `Building <model> <flavor> with <...>ModelArgs(...)`, the batch line (`... local batch
  size B, global batch size G, [gradient accumulation steps A,] sequence length S ...`), `Applied <kind> activation
  checkpointing`, `Float8 training active`, and the metric lines `step: N  loss: ..  tps: T ..`, tps being tokens
  per second per device (torchtitan/components/metrics.py: this rank's tokens / (time × tp·cp·pp)).

The step time of a log is the median over the logged steps after the first (the first includes start-up:
compilation, allocator warm-up; Megatron-LM says so in training_log), of the steps at the configured global batch.
"""

from __future__ import annotations

import ast
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from costmodels.errors import InputError

if TYPE_CHECKING:
    from autopar.runs import MeasuredRun
    from costmodels.hardware import HardwareProfile
    from costmodels.specs import ModelSpec

INPUT = "from-runs"
MAX_LOG_BYTES = 256 * 2**20
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE_PREFIX = re.compile(r"^(?:\d+:\s|\[rank\d+\]:\s?|\[default\d+\]:\s?|\S+/\d+ \[default\d+\]:\s?|"
                         r"\[\d{4}-\d\d-\d\d[T ][\d:.+\-]+\]\s)+")
"""Launcher prefixes in front of a log line: Slurm's `0: `, torchrun's `[rank0]:`, NeMo-Run's `pretrain/0
[default0]:`, a `[2025-01-01T00:00:00+00:00] ` timestamp."""
WARMUP_STEPS = 1
"""Logged steps dropped at the start of a log (they include start-up)."""


@dataclass(frozen=True)
class LogLine:
    number: int
    text: str


def read_log_lines(path: Path) -> list[LogLine]:
    try:
        size = path.stat().st_size
        if size > MAX_LOG_BYTES:
            raise InputError(INPUT, f"{path.name} is {size:,} bytes, over the {MAX_LOG_BYTES:,}-byte limit; give an "
                                    "excerpt with the configuration and the step lines")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(INPUT, f"no file at {str(path)!r}; check the path") from None
    except IsADirectoryError:
        raise InputError(INPUT, f"{str(path)!r} is a directory; give a log or run-format CSV file") from None
    except OSError as exc:
        raise InputError(INPUT, f"cannot read {str(path)!r} ({exc.strerror or exc.__class__.__name__})") from None
    text = raw.decode("utf-8", errors="replace")
    return [LogLine(i, LINE_PREFIX.sub("", ANSI.sub("", line.rstrip("\r"))))
            for i, line in enumerate(text.split("\n"), start=1)]


def log_kind(lines: list[LogLine]) -> str:
    """'megatron', 'nemo' or 'torchtitan' by the lines only that framework prints; '' when none."""
    text = "\n".join(line.text for line in lines[:200000])
    if "------------------------ arguments ------------------------" in text or \
            "elapsed time per iteration (ms)" in text:
        return "megatron"
    if "train_step_timing in s" in text or "Experiment configuration" in text:
        return "nemo"
    if re.search(r"step:\s*\d+\s+loss:", text) and "tps:" in text:
        return "torchtitan"
    return ""


def read_log(path: "str | Path", profile: "HardwareProfile", model: "ModelSpec | None" = None) -> "MeasuredRun":
    """The measured run of one training log, priced on `profile`; `model` replaces the model the log describes
    (checked against the shape the log states)."""
    path = Path(path)
    lines = read_log_lines(path)
    kind = log_kind(lines)
    readers: dict[str, Callable] = {"megatron": megatron_run, "nemo": nemo_run, "torchtitan": torchtitan_run}
    if not kind:
        raise InputError(INPUT, f"{path.name}: neither a run-format CSV (.csv) nor a Megatron-LM, NeMo or "
                                "torchtitan training log (none of their configuration or step lines found)")
    return readers[kind](path.name, lines, profile, model)


def _fail(name: str, line: "LogLine | None", message: str) -> InputError:
    where = f"line {line.number}: " if line is not None else ""
    return InputError(INPUT, f"{name}: {where}{message}")


def _median_step(name: str, steps: list[tuple[LogLine, int, float]], what: str) -> tuple[float, str]:
    """The median step time of the logged steps after the first WARMUP_STEPS, and a note saying which."""
    if not steps:
        raise _fail(name, None, f"no {what} line: the log has no measured step (did the run reach its first "
                                "logged step?)")
    kept = steps[WARMUP_STEPS:] if len(steps) > WARMUP_STEPS else []
    if not kept:
        raise _fail(name, steps[0][0], f"only the first logged step ({what}); its time includes start-up: give a "
                                       "log with more steps")
    seconds = statistics.median(value for _, _, value in kept)
    return seconds, (f"step time: median of {len(kept)} logged steps ({kept[0][1]}..{kept[-1][1]}), the first "
                     f"{WARMUP_STEPS} dropped (start-up)")


# ---- Megatron-LM -----------------------------------------------------------------------------------------------

ARGUMENTS_START = re.compile(r"^-+ arguments -+$")
ARGUMENTS_END = re.compile(r"^-+ end of arguments -+$")
ARGUMENT_LINE = re.compile(r"^\s+(\w+) \.* ?(.*)$")
"""`'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)`: no dots at all for a name of 48 characters or more."""
ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9]+(?:\.[0-9]*)?)(?:\s*/\s*[0-9.]+)?\s*\|")
GLOBAL_BATCH = re.compile(r"global batch size:\s*(\d+)\s*\|")
PADDED_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens")

TORCH_DTYPE_FLAG_VALUE = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
"""Printed torch dtypes (e.g. main_grads_dtype) -> the flag's spelling (arguments.py `--main-grads-dtype fp32|bf16`);
enums (`AttnBackend.flash`) print with their class name."""

ARGUMENT_FLAG = {"fp8": "--fp8-format"}
"""Megatron-LM argument names whose flag is not `--` + the name with dashes (arguments.py: `--fp8-format`
stores into `fp8`)."""


def megatron_arguments(name: str, lines: list[LogLine]) -> tuple[dict[str, str], LogLine]:
    """The arguments block: name -> printed value; InputError for a line inside it that is not `name ... value`."""
    start = next((line for line in lines if ARGUMENTS_START.match(line.text.strip())), None)
    if start is None:
        raise _fail(name, None, "no Megatron-LM arguments block ('---- arguments ----', printed at start by "
                                "_print_args): the layout and the model cannot be read; give the log from its start")
    values: dict[str, str] = {}
    for line in lines[start.number:]:
        if ARGUMENTS_END.match(line.text.strip()):
            return values, start
        match = ARGUMENT_LINE.match(line.text)
        if match is None:
            raise _fail(name, line, f"not an argument line ('  name ..... value') inside the arguments block: "
                                    f"{line.text.strip()[:60]!r}")
        values[match.group(1)] = match.group(2).strip()
    raise _fail(name, start, "the arguments block has no end ('---- end of arguments ----'): the log is cut")


def megatron_command(arguments: Mapping[str, str]) -> str:
    """The Megatron-LM command line an arguments block came from, for the flags autopar reads
    (autopar.megatron_args.VALUE_FLAGS / SWITCH_FLAGS / LIST_FLAGS): True switches as the flag, False/None
    dropped, lists as words."""
    from autopar.megatron_args import LIST_FLAGS, SWITCH_FLAGS, VALUE_FLAGS

    words: list[str] = []
    values = dict(arguments)
    if values.get("num_experts", "None") == "None":   # a dense model: the MoE arguments keep their defaults
        values = {key: value for key, value in values.items() if not key.startswith(("moe_", "expert_"))}
    if values.get("fp8", "None") == "None":           # no --fp8-format: the fp8 arguments keep their defaults
        values = {key: value for key, value in values.items() if not key.startswith("fp8_")}
    if values.get("virtual_pipeline_model_parallel_size", "None") != "None":   # validate_args derives it from these
        values.pop("num_layers_per_virtual_pipeline_stage", None)
        values.pop("num_virtual_stages_per_pipeline_rank", None)
    for key, value in values.items():
        if key == "overlap_p2p_comm":    # --no-overlap-p2p-communication stores False here
            words.append("--overlap-p2p-communication" if value == "True" else "--no-overlap-p2p-communication")
            continue
        flag = ARGUMENT_FLAG.get(key, "--" + key.replace("_", "-"))
        if value in ("None", "False", "") or flag not in (VALUE_FLAGS | SWITCH_FLAGS | LIST_FLAGS):
            continue
        if flag in SWITCH_FLAGS:
            if value == "True":
                words.append(flag)
            continue
        if flag in LIST_FLAGS:
            items = _python_list(value)
            if items:
                words += [flag, *items]
            continue
        words += [flag, TORCH_DTYPE_FLAG_VALUE.get(value, value.rpartition(".")[2] if value.startswith("AttnBackend.")
                                                  else value)]
    return " ".join(_quote(word) for word in words)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def _python_list(text: str) -> list[str]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.split()
    return [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)]


def megatron_run(name: str, lines: list[LogLine], profile: "HardwareProfile",
                 model: "ModelSpec | None" = None) -> "MeasuredRun":
    from autopar.megatron_args import parse_megatron_args
    from autopar.runs import MeasuredRun, cluster_for
    from costmodels.specs import TrainingSpec

    arguments, start = megatron_arguments(name, lines)
    try:
        launch = parse_megatron_args(megatron_command(arguments))
    except InputError as error:
        raise _fail(name, start, f"arguments block: {error.message}") from None
    world = _int_argument(name, start, arguments, "world_size")
    if model is None:
        model = megatron_model(name, start, arguments, lines)
    else:
        mismatches = launch.model_mismatches(model)
        if mismatches:
            raise _fail(name, start, f"the log's model is not --model {model.name}: {mismatches[0]}")
    steps = megatron_steps(name, lines, launch.training.get("global_batch_size"))
    step_s, how = _median_step(name, steps, "'elapsed time per iteration (ms)'")
    training = launch.training_spec(TrainingSpec())
    fixed = {field_name: getattr(launch.plan, field_name) for field_name in PLAN_FIELDS}
    run = MeasuredRun(name, f"lines {steps[0][0].number}-{steps[-1][0].number}",
                      f"{model.name} x{world} {launch.plan.short()}", model, cluster_for(profile, world), training,
                      fixed, {}, step_s, "elapsed time per iteration", (how, *launch.notes))
    return _checked(name, start, run)


def megatron_steps(name: str, lines: list[LogLine], gbs: "int | None") -> list[tuple[LogLine, int, float]]:
    """(line, iteration, seconds) of every iteration line at the configured global batch (a batch-size ramp-up's
    smaller steps are not the configured step); InputError for an iteration line that cannot be read."""
    steps = []
    for line in lines:
        if "elapsed time per iteration" not in line.text:
            continue
        iteration, elapsed, batch = ITERATION.search(line.text), ELAPSED.search(line.text), \
            GLOBAL_BATCH.search(line.text)
        if iteration is None or elapsed is None:
            raise _fail(name, line, "an iteration line whose iteration number or elapsed time cannot be read: "
                                    f"{line.text.strip()[:80]!r}")
        if batch is not None and gbs is not None and int(batch.group(1)) != gbs:
            continue
        steps.append((line, int(iteration.group(1)), float(elapsed.group(1)) / 1000.0))
    return steps


PLAN_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "sp", "recompute", "recompute_layers",
               "recompute_modules", "zero", "first_stage_layers", "last_stage_layers", "layout")


def _int_argument(name: str, line: LogLine, arguments: Mapping[str, str], key: str) -> int:
    value = arguments.get(key)
    if value is None or value == "None":
        raise _fail(name, line, f"the arguments block has no {key}")
    try:
        return int(value)
    except ValueError:
        raise _fail(name, line, f"{key} {value!r} is not a whole number") from None


def megatron_model(name: str, start: LogLine, arguments: Mapping[str, str], lines: list[LogLine]) -> "ModelSpec":
    """The model an arguments block describes (Megatron-LM's GPT model: megatron/core/transformer/
    transformer_config.py fields of the same names)."""
    from costmodels.specs import MlpKind, ModelSpec, MoESpec, NormKind, PositionEmbedding

    def get(key: str) -> str:
        return arguments.get(key, "None")

    def whole(key: str, default: "int | None" = None) -> int:
        if get(key) == "None":
            if default is None:
                raise _fail(name, start, f"the arguments block has no {key}; the model cannot be read (give --model)")
            return default
        return _int_argument(name, start, arguments, key)

    if get("multi_latent_attention") == "True" or get("hybrid_override_pattern") not in ("None", ""):
        raise _fail(name, start, "multi-latent or hybrid attention models are not read from the arguments block; "
                                 "give --model")
    if get("squared_relu") == "True":
        mlp = MlpKind.SQUARED_RELU
    else:
        mlp = MlpKind.GATED if get("swiglu") == "True" else MlpKind.PLAIN
    norms = {"LayerNorm": NormKind.LAYERNORM, "RMSNorm": NormKind.RMSNORM}
    if get("normalization") not in norms:
        raise _fail(name, start, f"normalization {get('normalization')!r} is not LayerNorm or RMSNorm")
    positions = {"rope": PositionEmbedding.ROPE, "learned_absolute": PositionEmbedding.LEARNED}
    position = "rope" if get("use_rotary_position_embeddings") == "True" else get("position_embedding_type")
    if position not in positions:
        raise _fail(name, start, f"position_embedding_type {position!r} is not rope or learned_absolute")
    vocab = next((int(m.group(1)) for line in lines for m in [PADDED_VOCAB.search(line.text)] if m), None)
    if vocab is None:
        vocab = whole("vocab_size")
    heads = whole("num_attention_heads")
    kv_heads = whole("num_query_groups", heads) if get("group_query_attention") == "True" else heads
    hidden = whole("hidden_size")
    moe = None
    if get("num_experts") != "None":
        experts = whole("num_experts")
        shared = get("moe_shared_expert_intermediate_size")
        moe = MoESpec(num_experts=experts, top_k=whole("moe_router_topk"),
                      expert_ffn_hidden_size=whole("moe_ffn_hidden_size", whole("ffn_hidden_size")),
                      num_shared_experts=1 if shared != "None" else 0,
                      shared_expert_ffn_hidden_size=int(shared) if shared != "None" else 0,
                      layer_freq=whole("moe_layer_freq", 1) if get("moe_layer_freq").isdigit() else 1)
    dropout = get("hidden_dropout")
    return ModelSpec(name=f"megatron-{hidden}h-{whole('num_layers')}l", hidden_size=hidden,
                     num_layers=whole("num_layers"), num_attention_heads=heads,
                     ffn_hidden_size=whole("ffn_hidden_size", 4 * hidden), vocab_size=vocab, num_kv_heads=kv_heads,
                     head_dim=whole("kv_channels", hidden // heads), mlp=mlp, norm=norms[get("normalization")],
                     position_embedding=positions[position],
                     max_position_embeddings=whole("max_position_embeddings", 0),
                     tied_embeddings=get("untie_embeddings_and_output_weights") != "True",
                     linear_bias=get("add_bias_linear") != "False", qkv_bias=get("add_qkv_bias") == "True",
                     moe=moe, dropout=float(dropout) if dropout != "None" else None,
                     source=f"{name}: Megatron-LM arguments block")


def _checked(name: str, line: "LogLine | None", run: "MeasuredRun") -> "MeasuredRun":
    from autopar.runs import candidate_plans

    if not candidate_plans(run):
        raise _fail(name, line, f"the layout {run.label} cannot run the model on {run.cluster.num_gpus} GPUs with "
                                f"global batch {run.training.global_batch_size}")
    return run


# ---- NeMo --------------------------------------------------------------------------------------------------------

NEMO_CONFIG_MARKER = "Experiment configuration"
NEMO_STEP = re.compile(r"train_step_timing in s\s*[:=]\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?\d+)?)")
NEMO_ITERATION = re.compile(r"(?:iteration (\d+)/\d+|global_step[:=]\s*([0-9.eE+]+))")
NEMO_GLOBAL_BATCH = re.compile(r"global_batch_size:\s*(\d+)")
NEMO_PADDED_VOCAB = re.compile(r"Padded vocab_size: (\d+), original vocab_size: (\d+)")


def nemo_config(name: str, lines: list[LogLine]) -> tuple[dict[str, Any], LogLine]:
    """The configuration YAML NeMo prints after 'Experiment configuration' (its lines indented under a log
    record header); InputError when absent or unreadable."""
    from costmodels.hardware import safe_yaml_load

    marker = next((line for line in lines if NEMO_CONFIG_MARKER in line.text), None)
    if marker is None:
        raise _fail(name, None, "no 'Experiment configuration' block: NeMo 2.x and Megatron-Bridge logs do not print "
                                "the layout, so it cannot be read from this log; give the run as a row of the run "
                                "format (docs/run_format.md) with its step time")
    body: list[str] = []
    for line in lines[marker.number:]:
        if not body and (not line.text.strip() or line.text.startswith("[NeMo")):
            continue                        # the header of the record that carries the YAML
        if line.text.startswith("    ") or (body and not line.text.strip()):
            body.append(line.text[4:])
            continue
        break
    try:
        data = safe_yaml_load("\n".join(body), name, INPUT)
    except Exception as error:     # a YAML error names its own line
        raise _fail(name, marker, f"the configuration after it is not readable YAML ({error.__class__.__name__})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict) or \
            not isinstance(data.get("trainer"), dict):
        raise _fail(name, marker, "the configuration has no model: and trainer: sections")
    return data, marker


def nemo_run(name: str, lines: list[LogLine], profile: "HardwareProfile",
             model: "ModelSpec | None" = None) -> "MeasuredRun":
    from autopar.runs import MeasuredRun, cluster_for
    from costmodels.plan import Recompute
    from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding, TrainingSpec

    config, marker = nemo_config(name, lines)
    cfg, trainer = _resolved(config["model"], config), _resolved(config["trainer"], config)

    def value(section: Mapping[str, Any], key: str, kinds=(int,), default: Any = ...) -> Any:
        got = section.get(key, default)
        if got is ...:
            raise _fail(name, marker, f"the configuration has no {key}")
        if got is not None and not isinstance(got, kinds) or isinstance(got, bool) and bool not in kinds:
            raise _fail(name, marker, f"{key} {got!r} is not a {' or '.join(k.__name__ for k in kinds)} "
                                      "(an unresolved ${...} interpolation?)")
        return got

    gpus = value(trainer, "devices") * value(trainer, "num_nodes")
    tp, pp = value(cfg, "tensor_model_parallel_size", default=1), value(cfg, "pipeline_model_parallel_size", default=1)
    vpp = value(cfg, "virtual_pipeline_model_parallel_size", default=None) or 1
    granularity = value(cfg, "activations_checkpoint_granularity", (str,), None)
    recompute = {None: Recompute.NONE, "selective": Recompute.SELECTIVE, "full": Recompute.FULL}.get(granularity)
    if recompute is None:
        raise _fail(name, marker, f"activations_checkpoint_granularity {granularity!r}: expected null, selective or "
                                  "full")
    optimizer = (cfg.get("optim") or {}).get("name", "")
    fixed = dict(tp=tp, pp=pp, vpp=vpp, cp=value(cfg, "context_parallel_size", default=1),
                 ep=value(cfg, "expert_model_parallel_size", default=1), mbs=value(cfg, "micro_batch_size"),
                 sp=bool(value(cfg, "sequence_parallel", (bool,), False)) and tp > 1, recompute=recompute,
                 zero=1 if optimizer == "distributed_fused_adam" else 0)
    seq = value(cfg, "encoder_seq_length")
    precision = str(trainer.get("precision", ""))
    notes = []
    if precision in ("16", "16-mixed"):
        notes.append("fp16 priced as bf16 (the same tensor-core rate and bytes)")
    elif precision not in ("bf16", "bf16-mixed", "32", "32-true"):
        raise _fail(name, marker, f"trainer.precision {precision!r}: expected bf16, bf16-mixed, 16 or 16-mixed")
    if precision in ("32", "32-true"):
        raise _fail(name, marker, "trainer.precision 32: fp32 training is not priced by autopar")
    fp8 = bool(cfg.get("fp8", False))
    training = TrainingSpec(seq_len=seq, global_batch_size=value(cfg, "global_batch_size"),
                            precision="fp8" if fp8 else "bf16")
    if model is None:
        vocab = next((int(m.group(2)) for line in lines for m in [NEMO_PADDED_VOCAB.search(line.text)] if m), None)
        if vocab is None:
            raise _fail(name, marker, "no 'Padded vocab_size: .., original vocab_size: ..' line: the vocabulary "
                                      "is not in the log; give --model")
        activation = value(cfg, "activation", (str,), "gelu")
        mlp = MlpKind.GATED if "glu" in activation else MlpKind.PLAIN
        norm = NormKind.RMSNORM if value(cfg, "normalization", (str,), "layernorm") == "rmsnorm" else \
            NormKind.LAYERNORM
        position = value(cfg, "position_embedding_type", (str,), "learned_absolute")
        heads = value(cfg, "num_attention_heads")
        model = ModelSpec(name=f"nemo-{value(cfg, 'hidden_size')}h-{value(cfg, 'num_layers')}l",
                          hidden_size=value(cfg, "hidden_size"), num_layers=value(cfg, "num_layers"),
                          num_attention_heads=heads, ffn_hidden_size=value(cfg, "ffn_hidden_size"),
                          vocab_size=vocab, num_kv_heads=value(cfg, "num_query_groups", default=None) or heads,
                          mlp=mlp, norm=norm,
                          position_embedding=PositionEmbedding.ROPE if position == "rope" else PositionEmbedding.LEARNED,
                          max_position_embeddings=value(cfg, "max_position_embeddings", default=seq),
                          tied_embeddings=bool(value(cfg, "share_embeddings_and_output_weights", (bool,), True)),
                          linear_bias=bool(value(cfg, "bias", (bool,), True)),
                          dropout=value(cfg, "hidden_dropout", (int, float), None),
                          source=f"{name}: NeMo configuration")
    steps = nemo_steps(name, lines, training.global_batch_size)
    step_s, how = _median_step(name, steps, "'train_step_timing in s'")
    run = MeasuredRun(name, f"lines {steps[0][0].number}-{steps[-1][0].number}", f"{model.name} x{gpus}", model,
                      cluster_for(profile, gpus), training, fixed, {}, step_s, "train_step_timing", (how, *notes))
    return _checked(name, marker, run)


INTERPOLATION = re.compile(r"^\$\{(\.?)([\w.]+)\}$")


def _resolved(section: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """`section` with its plain `${.key}` (sibling) and `${a.b}` (from the root) references replaced by the values
    they name, as OmegaConf resolves them when the run starts; anything else (resolvers such as
    `${multiply:...}`, missing keys) is left as text, and refused where it is read."""
    out = dict(section)
    for key, value in section.items():
        match = INTERPOLATION.match(value) if isinstance(value, str) else None
        if match is None:
            continue
        node: Any = section if match.group(1) else root
        for part in match.group(2).split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None and not isinstance(node, (dict, list)):
            out[key] = node
    return out


def nemo_steps(name: str, lines: list[LogLine], gbs: "int | None") -> list[tuple[LogLine, int, float]]:
    """(line, step, seconds) of every line with `train_step_timing in s` (at the configured global batch where the
    line states one)."""
    steps = []
    for line in lines:
        if "train_step_timing in s" not in line.text:
            continue
        timing = NEMO_STEP.search(line.text)
        step = NEMO_ITERATION.search(line.text)
        if timing is None or step is None:
            raise _fail(name, line, f"a train_step_timing line whose step or time cannot be read: "
                                    f"{line.text.strip()[:80]!r}")
        batch = NEMO_GLOBAL_BATCH.search(line.text)
        if batch is not None and gbs is not None and int(batch.group(1)) != gbs:
            continue
        number = int(step.group(1)) if step.group(1) else int(float(step.group(2)))
        steps.append((line, number, float(timing.group(1))))
    return steps


# ---- torchtitan --------------------------------------------------------------------------------------------------

TITAN_MESH_OLD = re.compile(r"Building (\d+)-D device mesh with \[(.*?)\], \[(.*?)\]")
TITAN_MESH = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+(?:, )?)+)")
TITAN_MODEL = re.compile(r"Building (\S+) (\S+) with (\w*ModelArgs)\((.*)\)\s*$")
TITAN_BATCH = re.compile(r"local batch size (\d+), global batch size (\d+), (?:gradient accumulation steps (\d+), )?"
                         r"sequence length (\d+)")
TITAN_AC = re.compile(r"Applied (\w+) activation checkpointing")
TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:.*?tps:\s*([\d,]+)")
TITAN_AC_KIND = {"selective": "selective", "full": "full", "SelectiveAC": "selective", "FullAC": "full"}


def torchtitan_run(name: str, lines: list[LogLine], profile: "HardwareProfile",
                   model: "ModelSpec | None" = None) -> "MeasuredRun":
    from autopar.runs import MeasuredRun, cluster_for
    from costmodels.plan import Recompute
    from costmodels.specs import AttentionKernel, CrossEntropyKernel, TrainingSpec

    def first(pattern: re.Pattern, what: str, required: bool = True):
        for line in lines:
            match = pattern.search(line.text)
            if match:
                return line, match
        if required:
            raise _fail(name, None, f"no {what} line: the log does not say {what.split(' (')[0]}; give the log from "
                                    "its start")
        return None, None

    degrees = _torchtitan_mesh(name, lines)
    batch_line, batch = first(TITAN_BATCH, "batch (local batch size, global batch size, sequence length)")
    local, global_batch = int(batch.group(1)), int(batch.group(2))
    accumulation, seq = int(batch.group(3) or 1), int(batch.group(4))
    if model is None:
        model_line, match = first(TITAN_MODEL, "model (Building <model> <flavor> with ...ModelArgs(...))")
        model = torchtitan_model(name, model_line, match)
    ac_line, ac = first(TITAN_AC, "activation checkpointing", required=False)
    recompute = Recompute.parse(TITAN_AC_KIND.get(ac.group(1), "none")) if ac else Recompute.NONE
    if ac is not None and ac.group(1) not in TITAN_AC_KIND:
        raise _fail(name, ac_line, f"activation checkpointing {ac.group(1)!r}: expected selective or full")
    fp8 = any("Float8 training active" in line.text for line in lines)
    tp, pp, cp = degrees.get("tp", 1), degrees.get("pp", 1), degrees.get("cp", 1)
    dp_shard, dp_replicate = degrees.get("dp_shard", 1), degrees.get("dp_replicate", 1)
    gpus = tp * pp * cp * dp_shard * dp_replicate
    if local * dp_shard * dp_replicate * accumulation != global_batch:
        raise _fail(name, batch_line, f"global batch {global_batch} is not local batch {local} × dp "
                                      f"{dp_shard * dp_replicate} × accumulation {accumulation}")
    # torchtitan's attention: SDPA, FlashAttention first in its backend priority, cuDNN first on compute capability
    # 10 (torchtitan/models/attention.py, ScaledDotProductAttention._init_backend); its loss: PyTorch's eager cross
    # entropy; FSDP2 over dp_shard (ZeRO-3), DDP over dp_replicate.
    kernel = AttentionKernel.CUDNN if profile.compute_capability >= 10.0 else AttentionKernel.FA2
    training = TrainingSpec(seq_len=seq, global_batch_size=global_batch,
                            precision="fp8" if fp8 else "bf16", fp8_recipe="tensorwise",
                            attention_kernel=kernel, cross_entropy=CrossEntropyKernel.UNFUSED)
    fixed = dict(tp=tp, pp=pp, cp=cp, ep=degrees.get("ep", 1), mbs=local, sp=tp > 1, recompute=recompute,
                 zero=3 if dp_shard > 1 else 0)
    free = {"vpp": tuple(v for v in range(1, model.num_layers // pp + 1) if model.num_layers % (pp * v) == 0)} \
        if pp > 1 else {}
    steps = []
    for line in lines:
        if not re.search(r"step:\s*\d+\s+loss:", line.text):
            continue
        match = TITAN_STEP.search(line.text)
        if match is None:
            raise _fail(name, line, f"a step line whose tps cannot be read: {line.text.strip()[:80]!r}")
        tps = float(match.group(2).replace(",", ""))
        if tps <= 0:
            raise _fail(name, line, f"tps {match.group(2)} is not a positive rate")
        # tps = this rank's tokens / (seconds × tp·cp·pp): step = local batch × accumulation × seq / (tps × tp·cp·pp)
        steps.append((line, int(match.group(1)), local * accumulation * seq / (tps * tp * cp * pp)))
    step_s, how = _median_step(name, steps, "'step: N  loss: ..  tps: ..'")
    notes = (how, "torchtitan per-op SAC priced as selective recompute") if recompute is Recompute.SELECTIVE \
        else (how,)
    run = MeasuredRun(name, f"lines {steps[0][0].number}-{steps[-1][0].number}", f"{model.name} x{gpus}", model,
                      cluster_for(profile, gpus), training, fixed, free, step_s, "tps", notes)
    return _checked(name, batch_line, run)


def _torchtitan_mesh(name: str, lines: list[LogLine]) -> dict[str, int]:
    for line in lines:
        old = TITAN_MESH_OLD.search(line.text)
        if old:
            names = [item.strip().strip("'\"") for item in old.group(2).split(",") if item.strip()]
            sizes = [int(item) for item in old.group(3).split(",") if item.strip()]
            if len(names) != len(sizes) or len(names) != int(old.group(1)):
                raise _fail(name, line, "the device mesh line lists different numbers of names and sizes")
            return dict(zip(names, sizes))
        new = TITAN_MESH.search(line.text)
        if new:
            return {key: int(value) for key, value in (item.split("=") for item in new.group(1).split(", "))}
    raise _fail(name, None, "no device mesh line ('Building ... device mesh with ...'): the layout is not in the log")


def torchtitan_model(name: str, line: LogLine, match: re.Match) -> "ModelSpec":
    """A Llama-architecture model from torchtitan's `<...>ModelArgs(...)` (torchtitan/models/llama3: SwiGLU MLP of
    compute_ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier), RMSNorm, RoPE, untied output, no biases)."""
    from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding

    family, flavor, arguments = match.group(1), match.group(2), match.group(4)
    if not family.startswith(("llama3", "llama2", "llama")) or family.startswith("llama4"):
        raise _fail(name, line, f"model {family} is read from torchtitan logs only for the Llama family; give --model")
    values = {}
    for key, raw in re.findall(r"(\w+)=('[^']*'|[^,()]+|\w+\([^)]*\))", arguments):
        try:
            values[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            values[key] = raw
    try:
        dim, layers, heads = int(values["dim"]), int(values["n_layers"]), int(values["n_heads"])
        vocab, multiple_of = int(values["vocab_size"]), int(values.get("multiple_of", 1))
    except (KeyError, TypeError, ValueError) as error:
        raise _fail(name, line, f"ModelArgs without a readable {error}") from None
    multiplier = values.get("ffn_dim_multiplier")
    hidden = int(2 * 4 * dim / 3)     # torchtitan/models/common/feed_forward.py compute_ffn_hidden_dim
    if multiplier is not None:
        hidden = int(float(multiplier) * hidden)
    ffn = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    kv = values.get("n_kv_heads")
    return ModelSpec(name=f"{family}-{flavor}".lower(), hidden_size=dim, num_layers=layers, num_attention_heads=heads,
                     ffn_hidden_size=ffn, vocab_size=vocab, num_kv_heads=int(kv) if kv else heads,
                     mlp=MlpKind.GATED, norm=NormKind.RMSNORM, position_embedding=PositionEmbedding.ROPE,
                     max_position_embeddings=int(values.get("max_seq_len", 0) or 0), tied_embeddings=False,
                     source=f"{name}: torchtitan ModelArgs")


# ---- every input -------------------------------------------------------------------------------------------------

def read_runs(paths: "list[str]", gpu: str, model: "ModelSpec | None" = None) -> "list[MeasuredRun]":
    """The measured runs of run-format CSVs and training logs, all on `gpu`."""
    from autopar.runs import read_run_file
    from costmodels.hardware import load_profile, resolve_gpu_name

    profile = load_profile(resolve_gpu_name(gpu))
    runs: list[MeasuredRun] = []
    for path in paths:
        if Path(path).suffix.lower() == ".csv":
            runs += read_run_file(path, gpu)
        else:
            runs.append(read_log(path, profile, model))
    return runs
