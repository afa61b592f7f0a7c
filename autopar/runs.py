"""Measured training runs as autopar inputs: autopar's run format (CSV) and the readers both it and the fidelity
benchmark use.

A measured run is one training job a team (or a paper) ran: the model, the cluster, the training setup, the layout
it used, and the step time it measured. `MeasuredRun` holds it in autopar's own specs, so the cost model prices it
exactly like a plan it proposes. Knobs a run does not state are not guessed: they are `free`, and the run is priced
at the fastest layout that agrees with everything stated and fits in memory (`choose_plan`), as a tuned run would be.

The run format (docs/run_format.md) is the CSV format of shared/reference/runs/: `#` comment lines, then one header
row and one row per run with the 48 columns listed there. `read_run_file` reads a team's own file of that format
(`autopar calibrate --from-runs FILE.csv`); `benchmarks/fidelity_runs.py` turns the published reference files into
runs with each source's own conventions, through the same row helpers (`read_run_rows`, `number`, `integer`,
`gpu_profile`, `precision_fields`) and the same plan choice (`candidate_plans`, `choose_plan`).

Every reader is strict: a cell that cannot be read is an `InputError` naming the file, the row and the column,
never a default chosen in its place. Empty cells mean what the frameworks do without the flag: tp, pp, vpp, cp,
ep and etp 1 (Megatron-LM's defaults for --tensor-model-parallel-size and its siblings), no recompute, no
optimizer sharding; the cells without a framework default (model, gpu, num_gpus, precision, seq_len, the global
batch, micro_batch and the measurement) must be given.
"""

from __future__ import annotations

import csv
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from costmodels.errors import InputError

if TYPE_CHECKING:
    from costmodels.hardware import HardwareProfile
    from costmodels.plan import Plan
    from costmodels.specs import ClusterSpec, Fp8Recipe, ModelSpec, Precision, TrainingSpec

MEMORY_HEADROOM = 0.05
"""Measured runs were tuned to fill the GPU: a layout counts as fitting below 95% of HBM (not the 20% planning
headroom autopar uses for new runs)."""

RUN_FORMAT_COLUMNS = (
    "row_id", "source_table", "model", "model_type", "params_total", "params_active", "hidden", "layers", "heads",
    "kv_heads", "ffn", "vocab", "experts", "top_k", "moe_ffn", "gpu", "num_gpus", "num_nodes", "gpus_per_node",
    "interconnect", "precision", "seq_len", "global_batch_seqs", "global_batch_tokens", "micro_batch", "grad_accum",
    "num_microbatches", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "edp", "sharding", "recompute", "method",
    "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s_per_gpu", "samples_per_s_total",
    "tflops_per_gpu", "mfu_pct", "hfu_pct", "peak_mem_gb", "notes")
"""The columns of shared/reference/runs/*.csv, in order: autopar's run format (docs/run_format.md)."""

REQUIRED_COLUMNS = ("model", "gpu", "num_gpus", "precision", "seq_len", "micro_batch")

MAX_RUN_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class MeasuredRun:
    """One measured training run in autopar's specs: what to price and what was measured."""

    source: str
    """Where it comes from: a file name (and, for the reference data, the source's name)."""
    run_id: str
    """Its row id or line number in that file."""
    label: str
    model: "ModelSpec"
    cluster: "ClusterSpec"
    training: "TrainingSpec"
    fixed: Mapping[str, Any]
    """Plan fields the run states."""
    free: Mapping[str, tuple] = field(default_factory=dict)
    """Plan fields the run leaves open -> the values autopar chooses from (the fastest that fits)."""
    measured_step_s: float = 0.0
    metric: str = "step s"
    """What was measured, before it was turned into seconds per step."""
    notes: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.source}: {self.run_id}"


@dataclass(frozen=True)
class PlanChoice:
    """The layout a run is priced at, its predicted step time, and whether it fits in memory."""

    plan: "Plan"
    step_s: float
    fits: bool
    peak_memory_bytes: float


# ---- rows of the run format --------------------------------------------------------------------------------------

def read_run_rows(path: "str | Path") -> list[dict[str, str]]:
    """The rows of a run-format CSV (lines starting with '#' are comments), each a column -> text mapping."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def number(row: Mapping[str, str], key: str) -> "float | None":
    """The cell as a number; None when it is empty or not a number (the reference files keep printed forms
    such as '175B' in a few cells; `strict_number` refuses them)."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def integer(row: Mapping[str, str], key: str, default: "int | None" = None) -> "int | None":
    value = number(row, key)
    return default if value is None else int(round(value))


# ---- GPUs ----------------------------------------------------------------------------------------------------------

def _profile(name: str) -> "HardwareProfile | None":
    from costmodels.hardware import load_profile

    try:
        return load_profile(name)
    except (InputError, FileNotFoundError, OSError):
        return None


def gpu_profile(gpu: str) -> "tuple[HardwareProfile | None, str, str]":
    """(profile or None, reason when None, assumption note) for a run's GPU description ('H100 80GB', 'A100-40G')."""
    text = gpu.lower()
    if "gb300" in text:
        return _profile("gb300"), ("no gb300 profile: shared/reference has no GB300 spec row or measurement (MAMF "
                                   "measured B300 HGX only; GB300's memory and clocks are not stated)"), ""
    if "gb200" in text:
        return _profile("gb200"), "no gb200 profile", ""
    if "h800" in text:
        return _profile("h800-80gb"), "no h800-80gb profile", ""
    if "a800" in text and ("pcie" in text or re.search(r"\b40\s*g", text)):
        return None, (f"GPU {gpu!r}: the bundled a800-80gb profile is the 80GB SXM part; no profile for the A800 "
                      "40GB or PCIe cards (other HBM, power and NVLink bridge)"), ""
    if "a800" in text:
        return _profile("a800-80gb"), "no a800-80gb profile", ""
    if "96gb" in text or "500w" in text:
        return _profile("h100-96gb"), ("no profile for H100 96GB HBM2e at 500 W (Grand Teton): the source states "
                                       "HBM (96 GB, 2.4 TB/s) but says the peak TFLOP/s at the 500 W cap is unknown, "
                                       "and no microbenchmark measured the part: no stated fact scales H100 SXM "
                                       "compute to it"), ""
    if "b200" in text and "power" in text:   # the same reason as the 500 W H100 rows: not the part a profile describes
        return None, ("B200 power-limited, the cap not stated: no stated fact scales B200 compute to it (as for the "
                      "500 W H100 rows)"), ""
    if "b200" in text:
        return _profile("b200-180gb"), "no b200 profile", ""
    if "h200" in text:
        return _profile("h200-141gb"), "no h200 profile", ""
    if "h100" in text:
        return _profile("h100-80gb"), "no h100 profile", ""
    if "a100" in text and "40" in text:
        return _profile("a100-40gb"), "no a100-40gb profile", ""
    if "a100" in text:
        return _profile("a100-80gb"), "no a100-80gb profile", ""
    if "ampere" in text:
        return _profile("a100-80gb"), "", "GPU 'NVIDIA Ampere' (model not named): A100 80GB assumed, as its MFU implies"
    return None, f"GPU {gpu!r} has no profile", ""


def cluster_for(profile: "HardwareProfile", num_gpus: int, gpus_per_node: int = 0) -> "ClusterSpec":
    """The cluster a measured run ran on, with the measured-run memory headroom (MEMORY_HEADROOM)."""
    from costmodels.specs import ClusterSpec

    return ClusterSpec(profile=profile, num_gpus=num_gpus, gpus_per_node=gpus_per_node or 0, headroom=MEMORY_HEADROOM)


# ---- precision -----------------------------------------------------------------------------------------------------

def precision_of(text: str) -> "Precision":
    from costmodels.specs import Precision

    text = (text or "").lower()
    return Precision.FP8 if ("fp8" in text or "float8" in text) else Precision.BF16


def fp8_recipe_of(text: str) -> "Fp8Recipe":
    """The FP8 recipe a precision cell names: MXFP8 as such; torchao's float8 (torchtitan's Float8Linear, dynamic
    per-tensor scaling) as per-tensor current scaling; Transformer Engine's fp8 where no recipe is named
    (llm-foundry's amp_fp8: te.fp8_autocast with DelayedScaling; 'fp8 (delayed scaling)') as delayed scaling."""
    from costmodels.specs import Fp8Recipe

    text = (text or "").lower()
    if "mxfp8" in text:
        return Fp8Recipe.MXFP8
    if "float8" in text:
        return Fp8Recipe.TENSORWISE
    return Fp8Recipe.DELAYED


def precision_fields(text: str) -> dict[str, object]:
    """TrainingSpec's precision and fp8_recipe from a precision cell."""
    return {"precision": precision_of(text), "fp8_recipe": fp8_recipe_of(text)}


# ---- choosing the layout a run is priced at -----------------------------------------------------------------------

def candidate_plans(run: Any) -> "list[Plan]":
    """Every buildable plan of a run's free choices (`run.fixed`, `run.free`), once: Plan normalises knobs that do
    not apply (recompute_modules without selective recompute), so different choices can build the same plan."""
    from costmodels.plan import Plan

    names = list(run.free)
    plans: dict[Plan, None] = {}
    for values in itertools.product(*(run.free[n] for n in names)):
        knobs = dict(run.fixed)
        knobs.update(zip(names, values))
        try:
            plan = Plan(**knobs)
        except InputError:
            continue
        if buildable(run, plan):
            plans[plan] = None
    return list(plans)


def buildable(run: Any, plan: "Plan") -> bool:
    """Whether `plan` can run the job at all: whole dp and edp, whole micro-batches, layers that split over the
    pipeline, interleaving only with a pipeline, experts that split over ep."""
    gpus, model = run.cluster.num_gpus, run.model
    dp = plan.dp(gpus)
    if dp == 0 or plan.edp(gpus) == 0:
        return False
    if run.training.global_batch_size % (dp * plan.mbs):
        return False
    if plan.pp > 1 and not plan.first_stage_layers and not plan.layout and model.num_layers % (plan.pp * plan.vpp):
        return False
    if plan.vpp > 1 and plan.pp == 1:
        return False
    if model.is_moe and model.moe.num_experts % plan.ep:
        return False
    return True


def choose_plan(run: Any, cluster: "ClusterSpec | None" = None) -> "PlanChoice | None":
    """The layout a run is priced at: of its candidate plans, the fastest that fits (fitting plans first), priced
    on `cluster` (default the run's own). None when no candidate is buildable."""
    import numpy as np

    from costmodels.memory import peak_memory
    from costmodels.plan import PlanArrays
    from costmodels.steptime import step_time_s

    plans = candidate_plans(run)
    if not plans:
        return None
    cluster = cluster or run.cluster
    arrays = PlanArrays.from_plans(plans)
    times = step_time_s(run.model, cluster, run.training, arrays)
    peak, _, _ = peak_memory(run.model, cluster, run.training, arrays)
    fits = peak <= cluster.memory_limit_bytes
    best = int(np.lexsort((times, ~fits))[0])                           # fitting plans first, then fastest
    return PlanChoice(plans[best], float(times[best]), bool(fits[best]), float(peak[best]))


def step_time_of_plan(run: Any, plan: "Plan", cluster: "ClusterSpec") -> float:
    """The step time of one fixed plan of a run, priced on `cluster`."""
    from costmodels.plan import PlanArrays
    from costmodels.steptime import step_time_s

    return float(step_time_s(run.model, cluster, run.training, PlanArrays.from_plans([plan]))[0])


# ---- autopar's run format: a team's own file ----------------------------------------------------------------------

SHARDING_ZERO = {"": 0, "none": 0, "ddp": 0, "no_shard": 0, "zero0": 0, "zero-0": 0,
                 "zero1": 1, "zero-1": 1, "distributed optimizer": 1, "distributed_optimizer": 1, "optim": 1,
                 "zero2": 2, "zero-2": 2, "shard_grad_op": 2, "optim_grads": 2,
                 "zero3": 3, "zero-3": 3, "full_shard": 3, "fsdp": 3, "fsdp2": 3, "optim_grads_params": 3}
"""The `sharding` cell -> ZeRO stage (DESIGN.md §1 `zero`): ZeRO stages by number, Megatron's distributed optimizer
(ZeRO-1), Megatron-FSDP's sharding strategies and PyTorch FSDP's (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2)."""

RECOMPUTE_OF_CELL = {"": "none", "none": "none", "false": "none", "off": "none", "selective": "selective",
                     "full": "full", "true": "full", "on": "full"}
"""The `recompute` cell: none | selective | full (activation checkpointing 'on'/'true' of FSDP codes = full)."""

PRECISIONS = ("bf16", "fp16", "fp8", "fp8 delayed", "fp8 tensorwise", "fp8 blockwise", "mxfp8", "float8",
              "amp_bf16", "amp_fp8")

TOKENS_PER_STEP_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s_per_gpu",
                           "samples_per_s_total")


def read_run_file(path: "str | Path", gpu: str) -> list[MeasuredRun]:
    """The runs of a run-format CSV measured on `gpu` (a bundled GPU name or alias); InputError on the first row
    that cannot be read, on a row measured on another GPU, and on a file with no row."""
    from costmodels.hardware import load_profile, read_text_file, resolve_gpu_name

    path = Path(path)
    name = path.name
    text = read_text_file(path, "from-runs", max_bytes=MAX_RUN_FILE_BYTES)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    if not lines:
        raise InputError("from-runs", f"{name}: no header row (a run-format CSV starts with '#' comments, then the "
                                      "header; see docs/run_format.md)")
    reader = csv.DictReader(lines)
    header = [column.strip() for column in reader.fieldnames or []]
    missing = [column for column in REQUIRED_COLUMNS if column not in header]
    if missing:
        raise InputError("from-runs", f"{name}: no column {', '.join(missing)} in the header; the run format's "
                                      "columns are listed in docs/run_format.md")
    if not any(column in header for column in TOKENS_PER_STEP_METRICS):
        flops = " (only TFLOP/s or MFU columns: each framework counts FLOPs its own way, so they give no step time)" \
            if {"tflops_per_gpu", "mfu_pct", "hfu_pct"} & set(header) else ""
        raise InputError("from-runs", f"{name}: no measurement column{flops}: give step_time_s, "
                                      "tokens_per_s_per_gpu, tokens_per_s_total, samples_per_s_per_gpu or "
                                      "samples_per_s_total")
    wanted = resolve_gpu_name(gpu)
    profile = load_profile(wanted)
    runs = []
    resolved: dict[str, tuple] = {}
    for index, raw in enumerate(reader, start=1):
        row = {(key or "").strip(): (value or "").strip() for key, value in raw.items() if key is not None}
        if None in raw:
            raise InputError("from-runs", f"{name}: row {index}: more cells than the header has columns")
        row_id = row.get("row_id") or str(index)
        runs.append(run_from_row(row, name, f"row {row_id}", profile, wanted, resolved))
    if not runs:
        raise InputError("from-runs", f"{name}: no run rows after the header")
    return runs


def run_from_row(row: Mapping[str, str], source: str, run_id: str, profile: "HardwareProfile",
                 gpu_name: str, profiles: "dict[str, tuple] | None" = None) -> MeasuredRun:
    """One row of autopar's run format as a MeasuredRun priced on `profile`; InputError naming the row and the
    column when a cell cannot be read. `profiles` keeps the GPU cells already resolved (one file names a few)."""
    from costmodels.specs import TrainingSpec

    def fail(column: str, message: str) -> InputError:
        return InputError("from-runs", f"{source}: {run_id}: {column}: {message}")

    profiles = {} if profiles is None else profiles
    if row.get("gpu", "") not in profiles:
        profiles[row.get("gpu", "")] = gpu_profile(row.get("gpu", ""))
    row_profile, why, _ = profiles[row.get("gpu", "")]
    if not row.get("gpu"):
        raise fail("gpu", "empty; give the GPU the run used (e.g. H100 80GB)")
    if row_profile is None:
        raise fail("gpu", f"{row['gpu']!r} is not a GPU with a bundled profile ({why})")
    if row_profile.name != gpu_name:
        raise fail("gpu", f"{row['gpu']!r} is {row_profile.name}, not the --gpu {gpu_name}; give the runs of one "
                          "GPU type per calibration")
    model = _row_model(row, fail)
    gpus = _positive_integer(row, "num_gpus", fail, required=True)
    gpus_per_node = _positive_integer(row, "gpus_per_node", fail) or 0
    seq = _positive_integer(row, "seq_len", fail, required=True)
    gbs = _global_batch(row, seq, fail)
    precision_text = row.get("precision", "").lower()
    if precision_text not in PRECISIONS:
        raise fail("precision", f"{row.get('precision')!r}: expected one of {', '.join(PRECISIONS)}")
    notes = []
    if precision_text == "fp16":
        notes.append("fp16 priced as bf16 (the same tensor-core rate and bytes)")
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs, **precision_fields(precision_text))
    fixed = dict(tp=_degree(row, "tp", fail), pp=_degree(row, "pp", fail), vpp=_degree(row, "vpp", fail),
                 cp=_degree(row, "cp", fail), ep=_degree(row, "ep", fail), etp=_degree(row, "etp", fail) or 0,
                 mbs=_positive_integer(row, "micro_batch", fail, required=True),
                 zero=_sharding(row, fail), recompute=_recompute(row, fail))
    fixed["sp"] = fixed["tp"] > 1        # the run format has no column for it: on with tp > 1, as every recipe runs
    cluster = cluster_for(row_profile, gpus, gpus_per_node)
    step, metric = _measured_step(row, training.tokens_per_step, gbs, gpus, fail)
    label = f"{model.name} x{gpus} {_layout_label(fixed)}"
    run = MeasuredRun(source, run_id, label, model, cluster, training, fixed, {}, step, metric, tuple(notes))
    if not candidate_plans(run):
        raise fail("tp/pp/micro_batch", f"the layout {_layout_label(fixed)} cannot run {model.name} on {gpus} GPUs "
                                        f"with global batch {gbs} (dp, micro-batches or layers do not divide)")
    return run


def _layout_label(fixed: Mapping[str, Any]) -> str:
    return " ".join(f"{k}{fixed[k]}" for k in ("tp", "pp", "vpp", "cp", "ep") if fixed.get(k, 1) not in (1, 0)) \
        + f" mbs{fixed['mbs']} zero{fixed['zero']} {getattr(fixed['recompute'], 'value', fixed['recompute'])}"


def _row_model(row: Mapping[str, str], fail) -> "ModelSpec":
    """The `model` cell through autopar's model loader (preset, config.json path, cached Hugging Face id), checked
    against the architecture cells the row gives."""
    from autopar.models import load_model

    if not row.get("model"):
        raise fail("model", "empty; give a preset name (autopar models), a config.json path or a cached HF id")
    try:
        model = load_model(row["model"])
    except InputError as error:
        raise fail("model", error.message) from None
    stated = {"hidden": model.hidden_size, "layers": model.num_layers, "heads": model.num_attention_heads,
              "kv_heads": model.num_kv_heads, "ffn": model.ffn_hidden_size, "vocab": model.vocab_size}
    if model.moe is not None:
        stated.update(experts=model.moe.num_experts, top_k=model.moe.top_k, moe_ffn=model.moe.expert_ffn_hidden_size)
    for column, value in stated.items():
        cell = strict_number(row, column, fail)
        if cell is not None and int(cell) != value:
            raise fail(column, f"the row has {int(cell)}, model {model.name} has {value}: name the model the run "
                               "trained")
    return model


def strict_number(row: Mapping[str, str], column: str, fail) -> "float | None":
    text = row.get(column, "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise fail(column, f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise fail(column, f"{text!r} must be a positive number")
    return value


def _positive_integer(row: Mapping[str, str], column: str, fail, required: bool = False) -> "int | None":
    value = strict_number(row, column, fail)
    if value is None:
        if required:
            raise fail(column, "empty; the run format needs it (docs/run_format.md)")
        return None
    if value != int(value):
        raise fail(column, f"{row[column]!r} must be a whole number")
    return int(value)


def _degree(row: Mapping[str, str], column: str, fail) -> int:
    """A parallel degree; empty = 1, the frameworks' default without the flag."""
    return _positive_integer(row, column, fail) or 1


def _global_batch(row: Mapping[str, str], seq: int, fail) -> int:
    seqs = _positive_integer(row, "global_batch_seqs", fail)
    tokens = _positive_integer(row, "global_batch_tokens", fail)
    if seqs is None and tokens is None:
        raise fail("global_batch_seqs", "empty (and no global_batch_tokens); give the sequences per step")
    if seqs is None:
        if tokens % seq:
            raise fail("global_batch_tokens", f"{tokens} is not a whole number of {seq}-token sequences")
        seqs = tokens // seq
    elif tokens is not None and tokens != seqs * seq:
        raise fail("global_batch_tokens", f"{tokens} disagrees with global_batch_seqs {seqs} × seq_len {seq}")
    return seqs


def _sharding(row: Mapping[str, str], fail) -> int:
    text = row.get("sharding", "").strip().lower()
    for word in (text, text.replace("fsdp ", ""), text.split(" ")[-1] if text else ""):
        if word in SHARDING_ZERO:
            return SHARDING_ZERO[word]
    raise fail("sharding", f"{row.get('sharding')!r}: expected one of zero0..zero3, 'distributed optimizer', "
                           "FULL_SHARD, SHARD_GRAD_OP or NO_SHARD")


def _recompute(row: Mapping[str, str], fail) -> "Any":
    from costmodels.plan import Recompute

    text = row.get("recompute", "").strip().lower()
    if text not in RECOMPUTE_OF_CELL:
        raise fail("recompute", f"{row.get('recompute')!r}: expected none, selective or full")
    return Recompute.parse(RECOMPUTE_OF_CELL[text])


def _measured_step(row: Mapping[str, str], tokens_per_step: int, gbs: int, gpus: int,
                   fail) -> tuple[float, str]:
    """Seconds per step from the first measurement the row gives, in the order of TOKENS_PER_STEP_METRICS.
    TFLOP/s and MFU are refused: each framework counts FLOPs its own way, so they do not give a step time."""
    for column in TOKENS_PER_STEP_METRICS:
        value = strict_number(row, column, fail)
        if value is None:
            continue
        if column == "step_time_s":
            return value, "step s"
        if column == "tokens_per_s_per_gpu":
            return tokens_per_step / (value * gpus), "tokens/s/GPU"
        if column == "tokens_per_s_total":
            return tokens_per_step / value, "tokens/s"
        if column == "samples_per_s_per_gpu":
            return gbs / (value * gpus), "samples/s/GPU"
        return gbs / value, "samples/s"
    if row.get("tflops_per_gpu") or row.get("mfu_pct"):
        raise fail("step_time_s", "only TFLOP/s or MFU given: each framework counts FLOPs its own way, so they do "
                                  "not give a step time; give step_time_s or a tokens/samples per second")
    raise fail("step_time_s", "no measurement; give step_time_s, tokens_per_s_per_gpu, tokens_per_s_total, "
                              "samples_per_s_per_gpu or samples_per_s_total")


def runs_by_source(runs: Iterable[MeasuredRun]) -> dict[str, list[MeasuredRun]]:
    out: dict[str, list[MeasuredRun]] = {}
    for run in runs:
        out.setdefault(run.source, []).append(run)
    return out
