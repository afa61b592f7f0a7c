"""Read an existing Megatron-LM launch (a command line or a whole launch script) back into an autopar plan.

    run = parse_megatron_args(text)          # or read_megatron_source(path_or_text) first
    plan, training, num_gpus = run           # a MegatronRun unpacks like the (plan, training, num_gpus) triple
    estimate(model, cluster, run.training_spec(TrainingSpec()), run.plan)

What it understands (flag names from NVIDIA/Megatron-LM megatron/training/arguments.py, the same ones
`autopar.export.megatron` writes, so `emit` → `parse` gives the plan back):

- shell syntax: backslash line continuations, single/double quotes, `#` comments, `--flag value` and
  `--flag=value`, variables set in the script (`TP=4`, `export TP=4`, `${TP}`, `${TP:-4}`, `$((NNODES*8))`),
  `ARGS=( ... )` arrays and `ARGS="..."` strings spanning lines (their flags are read where they are written);
- parallelism: --tensor-model-parallel-size, --pipeline-model-parallel-size, --context-parallel-size,
  --expert-model-parallel-size, --expert-tensor-parallel-size, --sequence-parallel, the three virtual-pipeline
  spellings (--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, and the older
  --virtual-pipeline-model-parallel-size), --decoder-first/last-pipeline-num-layers, and
  --account-for-embedding/loss-in-pipeline-split (read as an end stage one layer lighter than the middle ones);
- batch and memory: --micro-batch-size, --global-batch-size, --seq-length, --recompute-activations,
  --recompute-granularity/-method/-num-layers, --use-distributed-optimizer, Megatron-FSDP
  (--use-megatron-fsdp/--use-custom-fsdp with --data-parallel-sharding-strategy), --use-torch-fsdp2, --bf16, --fp16,
  --fp8-format with --fp8-recipe;
- MoE dispatch: --moe-token-dispatcher-type with --moe-flex-dispatcher-backend (or the older --moe-enable-deepep);
  token dropping: --moe-expert-capacity-factor, with --moe-pad-expert-input-to-capacity (`_capacity`);
- the pipeline schedule of sail-sg's zero-bubble fork: --enable-zero-bubble with --zero-bubble-max-pending-backward
  pp or 2·pp (zb-1p, zb-2p); without them 1f1b;
- CUDA graphs: --cuda-graph-impl and --cuda-graph-modules (and the deprecated --enable-cuda-graph,
  --external-cuda-graph, --cuda-graph-scope), the launch path the step is priced with (`_cuda_graphs`);
- the GPU count, when the script says it: torchrun/launch `--nproc-per-node` × `--nnodes`, a `WORLD_SIZE=`
  assignment, or `#SBATCH --nodes` × `--gpus-per-node`/`--ntasks-per-node`;
- model shape flags (--num-layers, --hidden-size, ...), returned in `model` to check against the MODEL given.

Flags known to change memory or step time that autopar does not price (CPU offloading, optimizer states
offloaded, unfused kernels, ...: COST_FLAGS_NOT_PRICED) are named in the notes, each
with what it changes. Every other flag (data, logging, checkpoints, the learning-rate schedule) is ignored. Anything
that cannot be read (an unset shell variable in a flag that matters, a bad --pipeline-model-parallel-layout) is an
`InputError` naming the flag and the fix.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from costmodels.errors import InputError
from costmodels.plan import Plan, Recompute
from costmodels.specs import OFFLOAD_MODULES, ModelSpec, TrainingSpec

INPUT_NAME = "from-megatron-args"

VALUE_FLAGS = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--encoder-seq-length",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--data-parallel-sharding-strategy",
    "--fp8-format", "--fp8-recipe", "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--num-query-groups", "--kv-channels", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--vocab-size", "--attention-backend", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
    "--attention-dropout", "--hidden-dropout", "--zero-bubble-max-pending-backward", "--moe-expert-capacity-factor",
    "--main-grads-dtype", "--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-grad-comm-dtype",
    "--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-params-dtype",
    "--microbatch-group-size-per-virtual-pipeline-stage", "--cuda-graph-impl", "--moe-expert-rank-capacity-factor",
    "--cpu-offloading-num-layers", "--activation-offload-fraction",
    "--moe-paged-stash-buffer-size-factor-cuda", "--wgrad-deferral-limit",
})
LIST_FLAGS = frozenset({"--recompute-modules", "--moe-router-load-balancing-type", "--cuda-graph-modules",
                        "--cuda-graph-scope", "--offload-modules"})
"""Flags taking several words (argparse nargs='*'): the words up to the next flag."""
LAUNCHER_FLAGS = frozenset({  # torchrun / torch.distributed.launch / the deepspeed launcher
    "--nproc-per-node", "--nproc_per_node", "--nnodes", "--num_gpus", "--num_nodes", "--num-gpus", "--num-nodes",
})
VALUE_FLAGS = VALUE_FLAGS | LAUNCHER_FLAGS
SWITCH_FLAGS = frozenset({
    "--fp8-param-gather", "--first-last-layers-bf16",
    "--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-custom-fsdp",
    "--use-torch-fsdp2", "--bf16", "--fp16", "--recompute-activations", "--group-query-attention",
    "--multi-latent-attention", "--no-create-attention-mask-in-dataloader", "--dataloader-inter-document-masking",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--overlap-moe-expert-parallel-comm",
    "--moe-enable-deepep", "--no-overlap-p2p-communication", "--overlap-p2p-communication",
    "--cross-entropy-loss-fusion", "--enable-zero-bubble", "--zero-bubble-v-schedule",
    "--moe-pad-expert-input-to-capacity", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32",
    "--use-precision-aware-optimizer", "--enable-cuda-graph", "--external-cuda-graph", "--moe-paged-stash",
    "--defer-embedding-wgrad-compute", "--fine-grained-activation-offloading",
})
OVERLAP_FIELD_OF_FLAG = {"--overlap-grad-reduce": "overlap_grad_reduce",
                         "--overlap-param-gather": "overlap_param_gather",
                         "--tp-comm-overlap": "tp_comm_overlap",
                         "--overlap-moe-expert-parallel-comm": "moe_a2a_overlap"}
"""Megatron-Core overlap switches -> TrainingSpec options (the step time hides what the command overlaps)."""
P2P_OVERLAP_OF_FLAG = {"--overlap-p2p-communication": True, "--no-overlap-p2p-communication": False}
"""The interleaved schedule's P2P overlap -> TrainingSpec.overlap_p2p_comm: on by default since Megatron-LM 4eeff55d1f
(2023-10-12), which added --no-overlap-p2p-communication; before it, --overlap-p2p-communication turned it on. No
Megatron-LM has both flags; given both, the current one (applied last here) wins."""

PLAN_FLAG_OF_FIELD = {"recompute_modules": "--recompute-modules", "tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                      "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
                      "etp": "--expert-tensor-parallel-size", "mbs": "--micro-batch-size",
                      "vpp": "--num-virtual-stages-per-pipeline-rank",
                      "recompute_layers": "--recompute-num-layers",
                      "first_stage_layers": "--decoder-first-pipeline-num-layers",
                      "last_stage_layers": "--decoder-last-pipeline-num-layers"}

DROPOUT_FLAGS = ("--attention-dropout", "--hidden-dropout")
"""Dropout probabilities, checked against ModelSpec.dropout."""
MEGATRON_DEFAULT_DROPOUT = 0.1
"""What Megatron-LM trains with when a dropout flag is absent (TransformerConfig.hidden_dropout / attention_dropout,
megatron/core/transformer/transformer_config.py, from which its argument parser is generated)."""

SHARDING_STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}

MODEL_FLAGS = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
               "--num-attention-heads": "num_attention_heads", "--kv-channels": "head_dim",
               "--num-experts": "num_experts", "--moe-router-topk": "top_k",
               "--moe-ffn-hidden-size": "expert_ffn_hidden_size", "--vocab-size": "vocab_size"}


@dataclass(frozen=True)
class MegatronRun:
    """A Megatron-LM launch as autopar sees it."""

    plan: Plan
    training: dict[str, Any]
    """TrainingSpec fields the command sets: seq_len, global_batch_size, precision ('bf16' | 'fp8'), fp8_recipe, the overlap
    switches (overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, moe_a2a_overlap, overlap_p2p_comm), the
    gradient reduce dtype (grad_reduce_in_fp32), the attention backend, the MoE dispatcher and capacity
    (moe_capacity_factor, moe_imbalance_factor when padded) and the loss kernels (cross_entropy)."""
    num_gpus: int | None
    """GPU count when the script says it (launcher, WORLD_SIZE or #SBATCH), else None."""
    model: dict[str, int] = field(default_factory=dict)
    """ModelSpec-named shape fields the command sets (num_layers, hidden_size, num_kv_heads, ...)."""
    flags: dict[str, "str | bool"] = field(default_factory=dict)
    """The recognised flags with their final values (last occurrence wins, as in argparse)."""
    notes: tuple[str, ...] = ()
    """Approximations made while reading (e.g. fp16 read as bf16)."""
    not_priced: tuple[str, ...] = ()
    """Settings the run has that change memory or step time and that no cost term reads, each with what it changes
    (autopar.bridge_config; a Megatron-LM command's are among its notes)."""
    hf_model_id: str = ""
    """The Hugging Face model the run's config names (a Megatron-Bridge model provider's hf_model_id), if any."""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.training, self.num_gpus))

    def training_spec(self, base: TrainingSpec) -> TrainingSpec:
        """`base` with the training fields the command sets (`training`): sequence length, global batch, precision,
        overlap switches, attention backend, MoE dispatcher, loss kernels, pipeline schedule."""
        return replace(base, **self.training)

    def model_mismatches(self, model: ModelSpec) -> list[str]:
        """Shape flags of the command that disagree with `model`, one line each (empty when consistent)."""
        expected = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                    "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
                    "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "vocab_size": model.vocab_size}
        if model.moe is not None:
            expected.update(num_experts=model.moe.num_experts, top_k=model.moe.top_k,
                            expert_ffn_hidden_size=model.moe.expert_ffn_hidden_size)
        lines = [f"{name}: the command has {value}, {model.name} has {expected[name]}"
                 for name, value in self.model.items() if name in expected and expected[name] != value]
        for flag in DROPOUT_FLAGS:
            stated = _probability(self.flags, flag)
            if stated is not None:
                how = f"has {stated:.10g}"
            elif self.model and self.flags:     # a whole launch command (it gives the shape) leaves the default
                stated, how = MEGATRON_DEFAULT_DROPOUT, f"leaves Megatron-LM's default {MEGATRON_DEFAULT_DROPOUT:g}"
            else:
                continue
            if abs(stated - model.dropout) > 1e-9:
                lines.append(f"{flag.lstrip('-')}: the command {how}, {model.name} has {model.dropout:.10g} "
                             "(memory is estimated with the model's)")
        return lines


def read_megatron_source(value: str) -> str:
    """The text of a launch script when `value` names an existing file, else `value` itself (a command line)."""
    candidate = value.strip()
    if candidate and "\n" not in candidate and len(candidate) < 4096:
        try:
            path = Path(candidate).expanduser()
            is_file = path.is_file()
        except (OSError, RuntimeError):  # not a usable path (a command line longer than a file name, ~nosuchuser)
            is_file = False
        if is_file:
            try:
                return path.read_text(encoding="utf-8", errors="replace")
            except OSError as error:
                raise InputError(INPUT_NAME, f"cannot read {candidate}: {error.strerror}") from None
    return value


def _names_a_missing_file(text: str) -> bool:
    """Whether `text` is one word written as a file path (a directory part or a file suffix) that does not exist: a
    launch script given by a mistyped path, which read_megatron_source passed on as a command line."""
    words = text.split()
    if len(words) != 1 or words[0].startswith("-"):
        return False
    try:
        path = Path(words[0]).expanduser()
        return ("/" in words[0] or bool(path.suffix)) and not path.exists()
    except (OSError, RuntimeError):     # RuntimeError: ~user of no such user
        return False


# ---- shell words -----------------------------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)", re.DOTALL)
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?(?:(:?[-=+])([^}]*))?\}")
_PLAIN = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_SBATCH = re.compile(r"^\s*#SBATCH\s+(-N|--[a-z-]+)(?:[= ]\s*(\S+))?", re.MULTILINE)


def _expand(word: str, variables: dict[str, str]) -> str:
    """Shell parameter expansion with the variables the script set; unknown ones stay as written ('$X')."""

    def braced(match: re.Match[str]) -> str:
        name, array, operator_, default = match.groups()
        if array:  # ${ARGS[@]}: the array's flags were read where the array was written
            return ""
        value = variables.get(name)
        if operator_ in (":-", ":=") and not value:
            return _expand(default or "", variables)
        if operator_ in ("-", "=") and value is None:
            return _expand(default or "", variables)
        if operator_ in (":+", "+"):
            return _expand(default or "", variables) if value else ""
        return value if value is not None else match.group(0)

    def arithmetic(match: re.Match[str]) -> str:
        inner = _expand(match.group(1), variables)
        inner = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", lambda m: variables.get(m.group(1), m.group(1)), inner)
        result = _integer_arithmetic(inner)
        return str(result) if result is not None else match.group(0)

    word = _ARITHMETIC.sub(arithmetic, word)
    word = _BRACED.sub(braced, word)
    return _PLAIN.sub(lambda m: variables.get(m.group(1), m.group(0)), word)


_ARITHMETIC_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                         ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _integer_arithmetic(expression: str) -> int | None:
    """Bash `$(( ))` on integers: + - * / % and parentheses; None for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC_OPERATORS:
            right = value(node.right)
            if right == 0 and not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
                raise ZeroDivisionError
            return _ARITHMETIC_OPERATORS[type(node.op)](value(node.left), right)
        raise ValueError("not integer arithmetic")

    try:
        return value(tree)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def shell_words(text: str) -> tuple[list[str], dict[str, str]]:
    """The words of a command or script after quote removal and variable expansion, and the variables it sets.

    Not a shell: no command substitution, no control flow (both branches of an `if` are read, in order), arrays
    are read in place. A variable holding several flags (`OPTS="--tp 4 --pp 2"; ... $OPTS`) is split again.
    """
    joined = re.sub(r"\\\r?\n", " ", text)
    joined = _ARITHMETIC.sub(lambda m: "$((" + re.sub(r"\s+", "", m.group(1)) + "))", joined)  # one word each
    lexer = shlex.shlex(joined, posix=True, punctuation_chars=";&|")  # `TP=2; PP=2`, `a && b` split apart
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        raw_words = list(lexer)
    except ValueError as error:
        raise InputError(INPUT_NAME, f"cannot split the command into words ({error}); check its quotes") from None
    variables: dict[str, str] = {}
    words: list[str] = []
    for raw in raw_words:
        assignment = _ASSIGNMENT.match(raw)
        if assignment and not assignment.group(2).startswith("("):
            variables[assignment.group(1)] = _expand(assignment.group(2), variables)
            continue
        expanded = _expand(raw, variables)
        if expanded != raw and re.search(r"\s", expanded):
            words.extend(shlex.split(expanded, comments=False))
        elif expanded:
            words.append(expanded)
    return words, variables


# ---- flags -----------------------------------------------------------------------------------------------------

def recognised_flags(words: list[str]) -> dict[str, "str | bool"]:
    """Known flags → value (str) or True for switches; the last occurrence wins, as with argparse."""
    flags: dict[str, str | bool] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--"):
            continue
        name, has_inline, inline = word.partition("=")
        if name in SWITCH_FLAGS:
            flags[name] = True
        elif name in LIST_FLAGS:
            values = [inline] if has_inline else []
            while index < len(words) and not words[index].startswith("-"):
                values.append(words[index])
                index += 1
            flags[name] = " ".join(values)
        elif name in VALUE_FLAGS:
            if has_inline:
                flags[name] = inline
            elif index < len(words):
                flags[name] = words[index]
                index += 1
            else:
                raise InputError(INPUT_NAME, f"{name} is the last word of the command; give its value")
    return flags


def _integer(flags: dict[str, "str | bool"], name: str, default: int | None = None) -> int | None:
    value = flags.get(name)
    if value is None:
        return default
    try:
        return int(str(value), 10)
    except ValueError:
        hint = " (a shell variable the script does not set? substitute its value)" if "$" in str(value) else ""
        raise InputError(INPUT_NAME, f"{name}: expected a whole number, got {value!r}{hint}") from None


def _probability(flags: dict[str, "str | bool"], name: str) -> float | None:
    """A flag's value as a probability in [0, 1]; None when absent."""
    if name not in flags:
        return None
    text = str(flags[name])
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        hint = " (a shell variable the script does not set? substitute its value)" if "$" in text else ""
        raise InputError(INPUT_NAME, f"{name} {text!r} is not a probability; give a number in [0, 1]{hint}")
    return value


def _first_integer(flags: dict[str, "str | bool"], *names: str) -> int | None:
    for name in names:
        value = _integer(flags, name)
        if value is not None:
            return value
    return None


def _num_gpus(flags: dict[str, "str | bool"], variables: dict[str, str], text: str) -> int | None:
    per_node = _first_integer(flags, "--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
    nodes_value = flags.get("--nnodes", flags.get("--num_nodes", flags.get("--num-nodes")))
    if isinstance(nodes_value, str) and ":" in nodes_value:  # torchrun elastic range MIN:MAX: the run uses MAX
        nodes_value = nodes_value.rsplit(":", 1)[1]
    nodes = _integer({"--nnodes": nodes_value}, "--nnodes") if nodes_value is not None else None
    if per_node is not None:
        return per_node * (nodes or 1)
    world = variables.get("WORLD_SIZE")
    if world is not None and world.isdigit():
        return int(world)
    sbatch = {name: value for name, value in _SBATCH.findall(text)}
    sbatch_nodes = sbatch.get("--nodes") or sbatch.get("-N")
    sbatch_per_node = sbatch.get("--gpus-per-node") or sbatch.get("--ntasks-per-node")
    if sbatch_nodes and sbatch_per_node and sbatch_nodes.isdigit():
        digits = re.sub(r"^.*:", "", sbatch_per_node)  # --gpus-per-node=h100:8
        if digits.isdigit():
            return int(sbatch_nodes) * int(digits)
    return None


def _slot_split(pp: int, num_layers: int | None, embedding_slot: bool, loss_slot: bool) -> tuple[int, int]:
    """(first, last) stage layers of Megatron-Core's --account-for-embedding/loss-in-pipeline-split: every rank gets
    (layers + slots) / pp slots and an end stage with a slot holds one layer fewer (0: as the middle stages)."""
    if num_layers is None:
        raise InputError(INPUT_NAME, "--account-for-embedding/loss-in-pipeline-split needs the layer count: add "
                                     "--num-layers to the command")
    slots = int(embedding_slot) + int(loss_slot)
    if (num_layers + slots) % pp:
        raise InputError(INPUT_NAME, f"{num_layers} layers + {slots} embedding/loss slot(s) do not split over "
                                     f"pp={pp} stages evenly (Megatron-LM asserts so)")
    per_rank = (num_layers + slots) // pp
    if per_rank < 2:
        raise InputError(INPUT_NAME, f"{num_layers} layers + {slots} embedding/loss slot(s) over pp={pp} stages leave "
                                     "an end stage without a decoder layer, which autopar cannot represent; use a "
                                     "smaller --pipeline-model-parallel-size")
    return (per_rank - 1 if embedding_slot else 0), (per_rank - 1 if loss_slot else 0)


def _virtual_stages(flags: dict[str, "str | bool"], pp: int, layer_count: "Callable[[], int | None]",
                    uneven: bool, slots: int = 0) -> int:
    per_rank = _first_integer(flags, "--num-virtual-stages-per-pipeline-rank",
                              "--virtual-pipeline-model-parallel-size")
    layers_per_virtual_stage = _integer(flags, "--num-layers-per-virtual-pipeline-stage")
    if per_rank is not None and layers_per_virtual_stage is not None:   # arguments.py validate_args: at most one
        raise InputError(INPUT_NAME, "--num-layers-per-virtual-pipeline-stage and "
                                     "--num-virtual-stages-per-pipeline-rank are exclusive (Megatron-LM asserts so); "
                                     "keep one")
    if per_rank is not None:
        return per_rank
    if layers_per_virtual_stage is None:
        return 1
    if uneven:
        raise InputError(INPUT_NAME, "--num-layers-per-virtual-pipeline-stage cannot be combined with "
                                     "--decoder-first/last-pipeline-num-layers (Megatron-LM asserts so); use "
                                     "--num-virtual-stages-per-pipeline-rank")
    num_layers = layer_count()
    if num_layers is None:
        raise InputError(INPUT_NAME, "--num-layers-per-virtual-pipeline-stage needs the layer count: add "
                                     "--num-layers to the command")
    slotted = num_layers + slots   # embedding/loss slots count as layers (Megatron-LM arguments.py)
    if layers_per_virtual_stage <= 0 or slotted % (pp * layers_per_virtual_stage):
        raise InputError(INPUT_NAME, f"--num-layers-per-virtual-pipeline-stage {layers_per_virtual_stage} does "
                                     f"not divide the {slotted} layers over pp={pp} stages evenly")
    return slotted // (pp * layers_per_virtual_stage)


def _recompute(flags: dict[str, "str | bool"], notes: list[str]) -> tuple[Recompute, int]:
    granularity = flags.get("--recompute-granularity")
    if flags.get("--recompute-activations"):   # arguments.py validate_args sets selective whatever else is given
        if granularity not in (None, "selective"):
            notes.append(f"--recompute-activations overrides --recompute-granularity {granularity}: Megatron-LM "
                         "runs selective recompute")
        granularity = "selective"
    if granularity is None:
        return Recompute.NONE, 0
    if granularity == "selective":
        if flags.get("--recompute-method") is not None:   # validate_args asserts recompute_method is None here
            raise InputError(INPUT_NAME, "--recompute-method with selective recompute (--recompute-granularity "
                                         "selective or --recompute-activations): Megatron-LM refuses it; drop "
                                         "--recompute-method")
        return Recompute.SELECTIVE, 0
    if granularity != "full":
        raise InputError(INPUT_NAME, f"--recompute-granularity {granularity!r}: use full or selective")
    method = flags.get("--recompute-method")
    layers = _integer(flags, "--recompute-num-layers")
    if method == "block":
        if layers is None:
            raise InputError(INPUT_NAME, "--recompute-method block needs --recompute-num-layers")
        return Recompute.FULL, layers
    if method not in (None, "uniform"):
        raise InputError(INPUT_NAME, f"--recompute-method {method!r}: use uniform or block")
    if method is None:
        notes.append("--recompute-granularity full without --recompute-method: read as every layer recomputed")
    if layers not in (None, 1):
        notes.append(f"--recompute-method uniform with --recompute-num-layers {layers}: autopar models one "
                     "checkpoint per layer (the layer inputs of every layer kept)")
    return Recompute.FULL, 0


def _zero(flags: dict[str, "str | bool"]) -> int:
    if flags.get("--use-torch-fsdp2"):
        return 3
    if flags.get("--use-megatron-fsdp") or flags.get("--use-custom-fsdp"):
        strategy = str(flags.get("--data-parallel-sharding-strategy", "no_shard"))
        if strategy not in SHARDING_STRATEGY_ZERO:
            raise InputError(INPUT_NAME, f"--data-parallel-sharding-strategy {strategy!r}: use one of "
                                         f"{', '.join(SHARDING_STRATEGY_ZERO)}")
        zero = SHARDING_STRATEGY_ZERO[strategy]
        return max(zero, 1) if flags.get("--use-distributed-optimizer") else zero
    return 1 if flags.get("--use-distributed-optimizer") else 0


ATTENTION_OF_BACKEND = {"auto": {}, "fused": {"attention_kernel": "cudnn"}, "flash": {"attention_kernel": "fa2"},
                        "unfused": {"flash_attention": False}, "local": {"flash_attention": False}}
"""Megatron-Core's --attention-backend (AttnBackend: flash, fused, unfused, local, auto) -> TrainingSpec fields."""


def _attention(flags: dict[str, "str | bool"], notes: list[str]) -> dict[str, Any]:
    backend = flags.get("--attention-backend")
    if backend is None:
        return {}
    if backend not in ATTENTION_OF_BACKEND:
        raise InputError(INPUT_NAME, f"--attention-backend {backend!r}: expected one of "
                                     f"{', '.join(ATTENTION_OF_BACKEND)}")
    if backend == "flash":
        notes.append("--attention-backend flash read as FlashAttention-2 (Transformer Engine runs FlashAttention-3 "
                     "on Hopper when flash_attn_3 is installed: give --attention-kernel fa3 for that)")
    return dict(ATTENTION_OF_BACKEND[str(backend)])


def _dispatcher(flags: dict[str, "str | bool"], notes: list[str]) -> dict[str, Any]:
    """TrainingSpec.moe_dispatcher from --moe-token-dispatcher-type (allgather, alltoall, flex) and the flex backend
    (--moe-flex-dispatcher-backend deepep | hybridep, or the older --moe-enable-deepep)."""
    kind = flags.get("--moe-token-dispatcher-type")
    if kind is None:
        if "--num-experts" in flags:
            notes.append("no --moe-token-dispatcher-type: Megatron-Core's default allgather, priced as alltoall (the "
                         "same expert GEMMs; the all-gather dispatcher's exchange is not modelled apart)")
        return {}
    if kind not in ("allgather", "alltoall", "flex"):
        raise InputError(INPUT_NAME, f"--moe-token-dispatcher-type {kind!r}: expected allgather, alltoall or flex")
    if kind == "allgather":
        notes.append("--moe-token-dispatcher-type allgather priced as alltoall (the same expert GEMMs; the "
                     "all-gather dispatcher's exchange is not modelled apart)")
        return {"moe_dispatcher": "alltoall"}
    if kind == "alltoall":
        return {"moe_dispatcher": "alltoall"}
    backend = _flex_backend(flags)
    if backend == "hybridep":
        notes.append("--moe-flex-dispatcher-backend hybridep: its exchange priced as deepep's (both send a token once "
                     "per destination node), its buffers as HybridEP's")
        return {"moe_dispatcher": "deepep", "moe_hybridep": True}
    elif backend == "ncclep":
        notes.append("--moe-flex-dispatcher-backend ncclep priced as deepep (the flex dispatcher's backend autopar "
                     "models; NCCL-EP's own exchange is not modelled apart)")
    elif backend != "deepep":
        raise InputError(INPUT_NAME, f"--moe-flex-dispatcher-backend {backend!r}: expected deepep, hybridep or "
                                     "ncclep")
    return {"moe_dispatcher": "deepep"}


def _rank_budget(flags: dict[str, "str | bool"]) -> dict[str, float]:
    """TrainingSpec.moe_rank_capacity_factor and moe_paged_stash_factor from --moe-expert-rank-capacity-factor (the
    flex dispatcher's HybridEP / NCCL-EP backends only, as TransformerConfig checks) and --moe-paged-stash with
    --moe-paged-stash-buffer-size-factor-cuda (default 1.10; a negative factor sizes the stash from the actual
    tokens, the expected ones under balanced routing: its magnitude is taken)."""
    text = flags.get("--moe-expert-rank-capacity-factor")
    stash = bool(flags.get("--moe-paged-stash"))
    if text is None:
        if stash:
            raise InputError(INPUT_NAME, "--moe-paged-stash without --moe-expert-rank-capacity-factor: Megatron-Core "
                                         "refuses it ('moe_paged_stash requires moe_expert_rank_capacity_factor to "
                                         "be set'); add the factor")
        return {}
    try:
        factor = float(str(text))
    except ValueError:
        raise InputError(INPUT_NAME, f"--moe-expert-rank-capacity-factor: expected a number, got {text!r}") from None
    if not math.isfinite(factor) or factor <= 0:
        raise InputError(INPUT_NAME, f"--moe-expert-rank-capacity-factor {text}: expected a number > 0")
    if _flex_backend(flags) not in ("hybridep", "ncclep"):
        raise InputError(INPUT_NAME, "--moe-expert-rank-capacity-factor needs --moe-token-dispatcher-type flex with "
                                     "--moe-flex-dispatcher-backend hybridep or ncclep (Megatron-Core "
                                     "TransformerConfig refuses it otherwise)")
    out = {"moe_rank_capacity_factor": factor}
    if stash:
        cuda = flags.get("--moe-paged-stash-buffer-size-factor-cuda", "1.10")
        try:
            out["moe_paged_stash_factor"] = abs(float(str(cuda)))
        except ValueError:
            raise InputError(INPUT_NAME, f"--moe-paged-stash-buffer-size-factor-cuda: expected a number, got "
                                         f"{cuda!r}") from None
    return out


CAPACITY_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
"""The router load-balancing types TransformerConfig.__post_init__ accepts a capacity factor with ('moe_expert_
capacity_factor only works with aux_loss, seq_aux_loss, global_aux_loss or none load balancing'); Megatron's
default is aux_loss."""


def _capacity(flags: dict[str, "str | bool"], notes: list[str]) -> dict[str, float]:
    """TrainingSpec.moe_capacity_factor from --moe-expert-capacity-factor (TransformerConfig: None = dropless, a
    negative value is reset to None); with --moe-pad-expert-input-to-capacity every expert runs exactly its capacity
    (MoEAlltoAllTokenDispatcher's drop_and_pad: num_out_tokens = capacity × experts), read as a load of the capacity
    factor on every expert (moe_imbalance_factor = max(1, capacity), so min(imbalance, capacity) is the capacity).
    What TransformerConfig refuses is refused: padding without a factor, padding under the flex dispatcher's DeepEP
    backend (HybridEP pads), a factor with a load-balancing type outside CAPACITY_BALANCING_TYPES."""
    text = flags.get("--moe-expert-capacity-factor")
    pad = bool(flags.get("--moe-pad-expert-input-to-capacity"))
    capacity = None
    if text is not None:
        try:
            capacity = float(str(text))
        except ValueError:
            raise InputError(INPUT_NAME, f"--moe-expert-capacity-factor: expected a number, got {text!r}") from None
        if not math.isfinite(capacity) or capacity == 0:
            raise InputError(INPUT_NAME, f"--moe-expert-capacity-factor {text}: expected a positive capacity "
                                         "(or a negative one for dropless routing)")
        if capacity < 0:            # TransformerConfig.__post_init__ resets a negative factor to None (dropless)
            notes.append(f"--moe-expert-capacity-factor {text}: negative, dropless routing (Megatron-Core resets it "
                         "to None)")
            capacity = None
    if pad and capacity is None:    # TransformerConfig.__post_init__
        raise InputError(INPUT_NAME, "--moe-pad-expert-input-to-capacity without a positive "
                                     "--moe-expert-capacity-factor: Megatron-Core refuses it ('moe_expert_capacity_"
                                     "factor must be set to use moe_pad_expert_input_to_capacity'); add the factor")
    if pad and _flex_backend(flags) == "deepep":   # TransformerConfig checks this under the flex dispatcher only
        raise InputError(INPUT_NAME, "--moe-pad-expert-input-to-capacity with the flex dispatcher's DeepEP backend: "
                                     "Megatron-Core refuses it ('Flex token dispatcher with deepep backend does not "
                                     "support moe_pad_expert_input_to_capacity'); use --moe-token-dispatcher-type "
                                     "alltoall or drop the padding")
    if capacity is None:
        return {}
    balancing = str(flags.get("--moe-router-load-balancing-type") or "aux_loss").split()
    refused = [kind for kind in balancing if kind not in CAPACITY_BALANCING_TYPES]
    if refused:
        raise InputError(INPUT_NAME, f"--moe-expert-capacity-factor with --moe-router-load-balancing-type "
                                     f"{refused[0]}: Megatron-Core refuses it ('moe_expert_capacity_factor only works "
                                     f"with {', '.join(CAPACITY_BALANCING_TYPES)} load balancing'); use one of those "
                                     "or drop the factor")
    if pad:
        notes.append(f"--moe-pad-expert-input-to-capacity: every expert runs its capacity ({capacity:g}× the balanced "
                     "load), read as --moe-imbalance-factor " + f"{max(1.0, capacity):g}")
        return {"moe_capacity_factor": capacity, "moe_imbalance_factor": max(1.0, capacity), "moe_pad_to_capacity": True}
    return {"moe_capacity_factor": capacity}


CUDA_GRAPH_MODULE_NAMES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
"""--cuda-graph-modules values a transformer layer has (transformer_config.py cuda_graph_modules; 'mamba' has none
here); 'full' in the deprecated --cuda-graph-scope meant the whole layer."""


def _cuda_graphs(flags: dict[str, "str | bool"], notes: list[str]) -> dict[str, Any]:
    """TrainingSpec's launch fields from Megatron-LM 0.19's CUDA-graph flags (arguments.py, transformer_config.py):
    --cuda-graph-impl local / transformer_engine captures the layers' --cuda-graph-modules (none named: the whole
    layer); the deprecated --enable-cuda-graph (local), --external-cuda-graph (transformer_engine) and
    --cuda-graph-scope (the modules; 'full_iteration' the impl) are migrated as validate_args migrates them.
    full_iteration (the whole forward-backward captured) is priced as every module of every layer captured."""
    impl = str(flags.get("--cuda-graph-impl") or "none")
    if flags.get("--enable-cuda-graph"):
        impl = "local"
    if flags.get("--external-cuda-graph"):
        impl = "transformer_engine"
    words = []
    for flag in ("--cuda-graph-scope", "--cuda-graph-modules"):
        value = flags.get(flag)
        if isinstance(value, str):
            words += value.replace(",", " ").split()
    if "full_iteration" in words:
        impl, words = "full_iteration", [w for w in words if w != "full_iteration"]
    if impl == "none":
        if words:
            notes.append("--cuda-graph-modules without --cuda-graph-impl: nothing is captured (Megatron-LM's default "
                         "impl is none)")
        return {}
    if impl not in ("local", "transformer_engine", "full_iteration"):
        raise InputError(INPUT_NAME, f"--cuda-graph-impl {impl}: expected none, local, transformer_engine or "
                                     "full_iteration")
    modules = tuple(w for w in words if w != "full")
    unknown = [w for w in modules if w not in CUDA_GRAPH_MODULE_NAMES]
    if unknown:
        raise InputError(INPUT_NAME, f"--cuda-graph-modules {unknown[0]}: expected some of "
                                     f"{', '.join(CUDA_GRAPH_MODULE_NAMES)}")
    if impl == "full_iteration":
        notes.append("--cuda-graph-impl full_iteration: priced as every module of every layer captured (the "
                     "embedding, loss and optimizer launches stay eager in the estimate)")
        return {"launch": "cuda_graph", "cuda_graph_modules": (), "cuda_graph_full_iteration": True}
    return {"launch": "cuda_graph", "cuda_graph_modules": modules, "cuda_graph_impl": impl}


def _fine_grained_offloading(flags: dict[str, "str | bool"], notes: list[str]) -> dict[str, Any]:
    """TrainingSpec.offload_modules from --fine-grained-activation-offloading --offload-modules M ... (TransformerConfig
    fields; docs/user-guide/features/fine_grained_activation_offloading.md); the modules without the switch are
    ignored, as Megatron-Core ignores them."""
    value = flags.get("--offload-modules")
    modules = tuple(value.replace(",", " ").split()) if isinstance(value, str) else ()
    if not flags.get("--fine-grained-activation-offloading"):
        if modules:
            notes.append("--offload-modules without --fine-grained-activation-offloading: nothing is offloaded "
                         "(Megatron-Core reads the modules only with the switch)")
        return {}
    return offload_fields(modules, _probability(flags, "--activation-offload-fraction"),
                          ("--fine-grained-activation-offloading", "--offload-modules"), notes, INPUT_NAME)


def offload_fields(modules: "tuple[str, ...]", fraction: "float | None", names: tuple[str, str], notes: list[str],
                   input_name: str) -> dict[str, Any]:
    """TrainingSpec's offload fields from an importer's modules and fraction, with the switch on; `names` (the
    switch, the modules) as the source spells them. Megatron-Core refuses the switch without modules
    (TransformerConfig.__post_init__: `assert self.offload_modules is not None and len(...) > 0`)."""
    switch, modules_name = names
    if not modules:
        raise InputError(input_name, f"{switch} without {modules_name}: Megatron-Core refuses it; name some of "
                                     f"{', '.join(OFFLOAD_MODULES)}")
    unknown = [m for m in modules if m not in OFFLOAD_MODULES]
    if unknown:
        raise InputError(input_name, f"{modules_name} {unknown[0]}: expected some of {', '.join(OFFLOAD_MODULES)}")
    notes.append(f"{modules_name} {' '.join(modules)}: their saved activations priced on the host (but about two "
                 "layers' worth); the copies' time beyond the layers they overlap priced at the GPU's host link")
    return {"offload_modules": tuple(modules), **({"offload_fraction": fraction} if fraction is not None else {})}


COST_FLAGS_NOT_PRICED: dict[str, "tuple[str | None, str]"] = {
    # flag: (the value that changes nothing, or None for a switch; what it changes that the estimate does not price)
    "--num-distributed-optimizer-instances": ("1", "the distributed optimizer shards over dp / instances, not "
                                                   "all of dp: more optimizer memory per GPU than estimated"),
    "--optimizer-cpu-offload": (None, "optimizer states and step on the host: less GPU memory, another step time"),
    "--overlap-param-gather-with-optimizer-step": (None, "the first parameter all-gather overlapped with the "
                                                         "optimizer step: the estimate exposes it"),
    "--delta-offload-bytes-across-pp-ranks": ("0", "later pipeline ranks keep that many more offloaded bytes on the "
                                                   "GPU each: more memory there than estimated"),
    "--delay-wgrad-compute": (None, "weight-gradient GEMMs deferred to overlap the expert all-to-all: the estimate "
                                    "runs them in place"),
    "--moe-shared-expert-overlap": (None, "the shared experts computed beside the token dispatch: the estimate runs "
                                          "them in turn"),
    "--no-gradient-accumulation-fusion": (None, "weight gradients accumulated by a separate kernel, not inside the "
                                                "GEMM: more HBM traffic than estimated"),
    "--no-masked-softmax-fusion": (None, "unfused softmax kernels: more HBM traffic than estimated"),
    "--no-bias-gelu-fusion": (None, "unfused bias + GeLU: more HBM traffic than estimated"),
    "--no-bias-swiglu-fusion": (None, "unfused bias + SwiGLU: more HBM traffic than estimated"),
    "--no-bias-dropout-fusion": (None, "unfused bias + dropout + residual: more HBM traffic than estimated"),
    "--no-rope-fusion": (None, "unfused rotary embedding: more HBM traffic than estimated"),
}
"""Megatron-LM flags (megatron/training/arguments.py, and those generated from TransformerConfig's fields by
ArgumentGroupFactory: --cpu-offloading-num-layers, --delta-offload-bytes-across-pp-ranks, --delay-wgrad-compute,
--moe-shared-expert-overlap, ...) that change memory or step time in a way no cost term
reads (the precision-aware optimizer's state dtypes are priced: TrainingSpec.optimizer_state_bytes). A command that sets one (to anything but the value that changes nothing) gets a note saying what the
estimate leaves out, so that an imported estimate is not mistaken for the command's own."""


def _same_number(value: str, neutral: str) -> bool:
    """'1' and '1.0' name the same fraction."""
    try:
        return float(value) == float(neutral)
    except ValueError:
        return False


def unpriced_flag_notes(words: list[str], zero: int) -> list[str]:
    """One note per COST_FLAGS_NOT_PRICED flag the command sets (the last occurrence wins, as with argparse). Under
    Megatron-FSDP's gradient sharding (`zero` >= 2), which needs --no-gradient-accumulation-fusion (its README),
    that flag is not named: the step time reduce-scatters each microbatch's gradients there and accumulates none."""
    stated: dict[str, str | None] = {}
    for index, word in enumerate(words):
        name, has_inline, inline = word.partition("=")
        if name not in COST_FLAGS_NOT_PRICED or (name == "--no-gradient-accumulation-fusion" and zero >= 2):
            continue
        neutral, _ = COST_FLAGS_NOT_PRICED[name]
        if neutral is None:
            stated[name] = None
        elif has_inline:
            stated[name] = inline
        elif index + 1 < len(words) and not words[index + 1].startswith("--"):
            stated[name] = words[index + 1]
    notes = []
    for name, value in stated.items():
        neutral, what = COST_FLAGS_NOT_PRICED[name]
        if neutral is not None and (value is None or value.lower() == neutral or _same_number(value, neutral)):
            continue
        shown = name if value is None else f"{name} {value}"
        notes.append(f"{shown}: {what}")
    return notes


def _flex_backend(flags: dict[str, "str | bool"]) -> "str | None":
    """The flex dispatcher's backend: --moe-flex-dispatcher-backend (default deepep), or deepep by the older
    --moe-enable-deepep; None when the dispatcher is not flex."""
    if flags.get("--moe-token-dispatcher-type") != "flex":
        return None
    return "deepep" if flags.get("--moe-enable-deepep") else str(flags.get("--moe-flex-dispatcher-backend", "deepep"))


def _cross_entropy(flags: dict[str, "str | bool"]) -> str:
    """TrainingSpec.cross_entropy: fused with --cross-entropy-loss-fusion, else Megatron-LM's default unfused loss
    (TransformerConfig.cross_entropy_loss_fusion = False), which keeps an fp32 copy of the logits."""
    return "fused" if flags.get("--cross-entropy-loss-fusion") else "unfused"


def _pipeline_schedule(flags: dict[str, "str | bool"], pp: int) -> str:
    """TrainingSpec.pipeline_schedule: 1f1b (upstream Megatron-LM's only schedules), or the zero-bubble schedule of
    sail-sg's Megatron-LM fork (zero-bubble-pipeline-parallelism, megatron/training/arguments.py): --enable-zero-bubble
    with --zero-bubble-max-pending-backward pp (ZB-1p) or 2·pp (ZB-2p), as its README says."""
    if flags.get("--zero-bubble-v-schedule"):
        raise InputError(INPUT_NAME, "--zero-bubble-v-schedule: the ZB-V schedule (two chunks per rank in a V) is "
                                     "not modelled; autopar prices zb-1p and zb-2p (--enable-zero-bubble "
                                     "--zero-bubble-max-pending-backward pp or 2·pp)")
    if not flags.get("--enable-zero-bubble") or pp == 1:      # without a pipeline no schedule changes anything
        return "1f1b"
    limit = flags.get("--zero-bubble-max-pending-backward", "auto")
    if str(limit) == str(pp):
        return "zb-1p"
    if str(limit) == str(2 * pp):
        return "zb-2p"
    raise InputError(INPUT_NAME, f"--zero-bubble-max-pending-backward {limit}: only pp ({pp}, ZB-1p) and 2·pp "
                                 f"({2 * pp}, ZB-2p) are modelled ('auto', the fork's adaptive limit, and others are "
                                 "not); set one of them")


def _precision(flags: dict[str, "str | bool"], notes: list[str]) -> str:
    if flags.get("--fp16") and flags.get("--bf16"):   # arguments.py validate_args: assert not args.fp16 with bf16
        raise InputError(INPUT_NAME, "--fp16 and --bf16 together: Megatron-LM refuses both; keep one")
    if flags.get("--fp8-format"):
        return "fp8"
    if flags.get("--fp16"):
        notes.append("--fp16 read as bf16 (same bytes per value; autopar models bf16 and fp8)")
    elif not flags.get("--bf16"):
        notes.append("neither --bf16 nor --fp16: Megatron-LM would train in fp32, which autopar does not model; "
                     "read as bf16")
    return "bf16"


MEGATRON_FSDP_GRAD_DTYPES = ("auto", "fp32", "bf16", "fp16")
"""--megatron-fsdp-main-grads-dtype / --megatron-fsdp-grad-comm-dtype choices (arguments.py)."""


def _grad_reduce_in_fp32(flags: dict[str, "str | bool"], notes: list[str]) -> bool:
    """Whether the command keeps and reduces its main gradients in fp32 (TrainingSpec.grad_reduce_in_fp32).

    The distributed optimizer / DDP: DistributedDataParallelConfig.grad_reduce_in_fp32 as Megatron-LM derives it for
    bf16 (arguments.py validate_args; training.py passes accumulate_allreduce_grads_in_fp32 as grad_reduce_in_fp32):
    --grad-reduce-in-bf16 turns it off; else --accumulate-allreduce-grads-in-fp32 or --main-grads-dtype fp32 (the
    default) turn it on, and --main-grads-dtype bf16 alone leaves it off. Megatron-FSDP does not read it: its main
    gradients have --megatron-fsdp-main-grads-dtype, whose default 'auto' is the parameters' dtype, bf16
    (megatron_fsdp/param_and_grad_buffer.py _resolve_group_grad_dtype), and --use-torch-fsdp2 shards the bf16
    parameters with no MixedPrecisionPolicy (torch_fully_sharded_data_parallel.py), so it reduces in bf16."""
    if flags.get("--use-torch-fsdp2"):
        return False
    if flags.get("--use-megatron-fsdp") or flags.get("--use-custom-fsdp"):
        main, comm = (str(flags.get(flag) or "auto").lower() for flag in ("--megatron-fsdp-main-grads-dtype",
                                                                          "--megatron-fsdp-grad-comm-dtype"))
        for flag, value in (("--megatron-fsdp-main-grads-dtype", main), ("--megatron-fsdp-grad-comm-dtype", comm)):
            if value not in MEGATRON_FSDP_GRAD_DTYPES:
                raise InputError(INPUT_NAME, f"{flag} {value}: Megatron-LM takes one of "
                                             f"{', '.join(MEGATRON_FSDP_GRAD_DTYPES)}")
        in_fp32 = main == "fp32"
        if comm != "auto" and (comm == "fp32") != in_fp32:
            notes.append(f"--megatron-fsdp-grad-comm-dtype {comm} with main gradients in "
                         f"{'fp32' if in_fp32 else 'bf16'}: priced with the main gradients' dtype on the wire too")
        return in_fp32
    main_grads = str(flags.get("--main-grads-dtype") or "fp32").lower()
    if main_grads not in ("fp32", "bf16"):
        raise InputError(INPUT_NAME, f"--main-grads-dtype {main_grads}: Megatron-LM takes fp32 or bf16")
    if flags.get("--accumulate-allreduce-grads-in-fp32") and main_grads != "fp32":
        raise InputError(INPUT_NAME, "--accumulate-allreduce-grads-in-fp32 with --main-grads-dtype bf16: Megatron-LM "
                                     "asserts '--main-grads-dtype can only be fp32 when "
                                     "--accumulate-allreduce-grads-in-fp32 is set'; drop one")
    if flags.get("--grad-reduce-in-bf16"):
        return False
    return bool(flags.get("--accumulate-allreduce-grads-in-fp32")) or main_grads == "fp32"


DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp8": 1,
               "uint8": 1, "float8_e4m3fn": 1}
"""Bytes of the dtypes Megatron-Core's precision-aware optimizer keeps its states in."""


def optimizer_state_bytes(main_params: str, exp_avg: str, exp_avg_sq: str, fp8_params: bool, fp8_recipe: "str | None",
                          store_param_remainders: bool = True) -> tuple[int, int, int]:
    """TrainingSpec.optimizer_state_bytes of Megatron-Core's precision-aware optimizer (OptimizerConfig): the moments
    in their dtypes; the master weights in main_params' dtype, or, when Transformer Engine's FusedAdam keeps them
    (use_precision_aware_optimizer_no_fp8_or_ds_fp8: not fp32 masters beside fp8 weights of a recipe other than
    delayed) with bf16 weights and store_param_remainders, as the 16 remainder bits of an fp32 master (2 bytes:
    distrib_optimizer.py `init_shard(torch.int16)`)."""
    names = {"main_params_dtype": main_params, "exp_avg_dtype": exp_avg, "exp_avg_sq_dtype": exp_avg_sq}
    for name, dtype in names.items():
        if dtype not in DTYPE_BYTES:
            raise InputError(INPUT_NAME, f"{name} {dtype!r}: one of fp32, fp16, bf16, fp8 expected")
    master = DTYPE_BYTES[main_params]
    te_keeps_masters = main_params not in ("fp32", "float32") or not fp8_params or fp8_recipe in (None, "delayed")
    if te_keeps_masters and master == 4 and store_param_remainders:
        master = 2
    return master, DTYPE_BYTES[exp_avg], DTYPE_BYTES[exp_avg_sq]


FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""--fp8-recipe's choices that autopar prices (TransformerConfig.fp8_recipe; 'custom' takes a quantizer factory)."""


def _fp8_recipe(flags: dict[str, "str | bool"], notes: list[str]) -> "dict[str, str | bool]":
    """The FP8 recipe: --fp8-recipe, Megatron-Core's default 'delayed' without it; read only with --fp8-format. And
    fp8 parameters, --fp8-param-gather (TransformerConfig.fp8_param, argument_utils.py), which TransformerConfig
    refuses without fp8 and validate_args turns off under --use-torch-fsdp2 (Transformer Engine 2.x: 'FSDP2 FP8
    param gather is not supported yet in TE 2.0, will fallback to bf16 all_gather')."""
    recipe = flags.get("--fp8-recipe")
    if not flags.get("--fp8-format"):
        if flags.get("--fp8-param-gather"):
            raise InputError(INPUT_NAME, "--fp8-param-gather without --fp8-format: Megatron-Core refuses it "
                                         "('fp8_param must be used together with fp8 mode'); add --fp8-format or "
                                         "drop the flag")
        if recipe:
            notes.append(f"--fp8-recipe {recipe} without --fp8-format: Megatron-LM trains without fp8, so it is "
                         "ignored")
        return {"fp8_param_gather": False}
    recipe = str(recipe or "delayed")
    if recipe not in FP8_RECIPES:
        raise InputError(INPUT_NAME, f"--fp8-recipe {recipe}: autopar prices {', '.join(FP8_RECIPES)} (a 'custom' "
                                     "quantizer factory's kernels are unknown); use one of them")
    if recipe == "delayed" and flags.get("--first-last-layers-bf16"):   # TransformerConfig.__post_init__
        raise InputError(INPUT_NAME, "--first-last-layers-bf16 with delayed scaling: Megatron-Core refuses it "
                                     "('Delayed scaling does not support first / last layer in BF16'); add "
                                     "--fp8-recipe tensorwise or drop the flag")
    for flag, what in FP8_UNMODELLED_FLAGS.items():
        if flags.get(flag):
            notes.append(f"{flag}: {what}")
    fp8_params = bool(flags.get("--fp8-param-gather"))
    if fp8_params and flags.get("--use-torch-fsdp2"):
        notes.append("--fp8-param-gather with --use-torch-fsdp2: validate_args turns it off (Transformer Engine 2.x "
                     "gathers bf16 under torch FSDP2), so bf16 weights are priced")
        fp8_params = False
    return {"fp8_recipe": recipe, "fp8_param_gather": fp8_params}


FP8_UNMODELLED_FLAGS = {
    "--first-last-layers-bf16": "bf16 first and last layers not modelled (every layer priced in fp8)",
}
"""fp8 switches of Megatron-Core's TransformerConfig / DistributedDataParallelConfig that no cost term reads."""


def _model_fields(flags: dict[str, "str | bool"]) -> dict[str, int]:
    model = {field_name: _integer(flags, flag) for flag, field_name in MODEL_FLAGS.items() if flag in flags}
    heads = model.get("num_attention_heads")
    groups = _integer(flags, "--num-query-groups")
    if flags.get("--group-query-attention") and groups is not None:
        model["num_kv_heads"] = groups
    elif heads is not None and not flags.get("--multi-latent-attention"):  # MLA has no KV-head count
        model["num_kv_heads"] = heads
    return {name: value for name, value in model.items() if value is not None}


# ---- --pipeline-model-parallel-layout ----------------------------------------------------------------------------
# Grammar (Megatron-Core megatron/core/transformer/pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout):
# virtual stages in model order separated by '|'; in each, E = embedding, t = a decoder layer, m = an MTP layer,
# L = loss; 'x*n' repeats a character, '(...)*n' a group; commas are cosmetic. Stage i runs on pipeline rank i % pp.
# It validates: E first, L last, each exactly once, decoder layers before MTP layers, MTP in a rank's last chunk.

def format_megatron_layout(layout: "tuple[int, ...]", num_mtp_layers: int = 0) -> str:
    """The layout string of `layout` (decoder layers per virtual stage): the embedding on the first stage, the MTP
    layers and the loss on the last, runs of equal middle stages grouped, e.g. 'Et*4|(t*4|)*6,t*3mL'."""
    def stage(count: int) -> str:
        return "" if count == 0 else "t" if count == 1 else f"t*{count}"

    words = [stage(n) for n in layout]
    words[0] = "E" + words[0]
    words[-1] = words[-1] + "m" * num_mtp_layers + "L"
    out, i, last = [], 0, len(words) - 1
    while i < last:
        j = i
        while j + 1 < last and words[j + 1] == words[i] and i > 0:
            j += 1
        run = j - i + 1
        out.append(f"({words[i]}|)*{run}," if run >= 3 else "|".join(words[i:j + 1]) + "|")
        i = j + 1
    return "".join(out) + words[-1]


def parse_megatron_layout(text: str, pp: int) -> "tuple[tuple[int, ...], int]":
    """(decoder layers per virtual stage, MTP layers) of a layout string; an InputError for a string Megatron-LM
    would refuse, or one autopar cannot represent (MTP layers anywhere but with the loss on the last stage)."""
    flat = text.replace(",", "").replace(" ", "")
    for _ in range(8):                                   # groups may nest once or twice
        expanded = re.sub(r"\(([^()]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
        if expanded == flat:
            break
        flat = expanded
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    bad = sorted(set(flat) - set("ELtm|"))
    if bad:
        raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout {text!r}: unknown layer character "
                                     f"{bad[0]!r}; Megatron-LM knows E, L, t, m")
    if len(stages) % pp:
        raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout has {len(stages)} virtual stages, not a "
                                     f"multiple of --pipeline-model-parallel-size {pp}")
    joined = "".join(stages)
    if not joined.startswith("E") or joined.count("E") != 1 or not joined.endswith("L") or joined.count("L") != 1:
        raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout {text!r}: the embedding E must come first "
                                     "and the loss L last, once each (Megatron-LM asserts so)")
    mtp = joined.count("m")
    if mtp and "t" in joined[joined.index("m"):]:
        raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout {text!r}: decoder layers must come before "
                                     "the MTP layers (Megatron-LM asserts so)")
    if mtp and stages[-1].count("m") != mtp:
        raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout {text!r}: MTP layers outside the last "
                                     "virtual stage (a standalone MTP stage) are not supported: the cost model "
                                     "places them with the loss; move the m's next to L")
    return tuple(s.count("t") for s in stages), mtp


def parse_megatron_args(text: str, num_layers: "int | Callable[[], int] | None" = None) -> MegatronRun:
    """Read a Megatron-LM command line or launch script.

    `num_layers` (the model's, or a function giving it, called only when needed) is used only when the command uses
    --num-layers-per-virtual-pipeline-stage without --num-layers; the command's own --num-layers wins.
    """
    words, variables = shell_words(text)
    flags = recognised_flags(words)
    if not any(name.startswith("--") and name not in LAUNCHER_FLAGS for name in flags):
        shown = " ".join(text.split())[:60]
        missing = " (no file has that path either)" if _names_a_missing_file(text) else ""
        raise InputError(INPUT_NAME, f"no Megatron-LM flags in {shown!r}{missing}: give a Megatron-LM command line "
                                     "or the path of an existing launch script")
    layout_text = flags.get("--pipeline-model-parallel-layout")
    if layout_text is not None:
        for other in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                      "--virtual-pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
                      "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
                      "--account-for-loss-in-pipeline-split"):
            if other in flags:
                raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout cannot be combined with {other} "
                                             "(Megatron-LM asserts so); keep the layout")
    notes: list[str] = []
    embedding_slot = bool(flags.get("--account-for-embedding-in-pipeline-split"))
    loss_slot = bool(flags.get("--account-for-loss-in-pipeline-split"))
    model = _model_fields(flags)
    for flag in DROPOUT_FLAGS:                   # a bad value is refused here, not when the model is compared
        _probability(flags, flag)

    def layer_count() -> int | None:
        if "num_layers" in model:
            return model["num_layers"]
        return num_layers() if callable(num_layers) else num_layers

    tp = _integer(flags, "--tensor-model-parallel-size", 1)
    pp = _integer(flags, "--pipeline-model-parallel-size", 1)
    first = _integer(flags, "--decoder-first-pipeline-num-layers", 0)
    last = _integer(flags, "--decoder-last-pipeline-num-layers", 0)
    if (embedding_slot or loss_slot) and (first or last):
        raise InputError(INPUT_NAME, "--account-for-embedding/loss-in-pipeline-split cannot be combined with "
                                     "--decoder-first/last-pipeline-num-layers (Megatron-LM asserts so); keep one")
    slots = int(embedding_slot) + int(loss_slot)
    layout: tuple[int, ...] = ()
    if layout_text is not None:
        layout, mtp = parse_megatron_layout(str(layout_text), pp)
        vpp = len(layout) // pp
        if "num_layers" in model and sum(layout) != model["num_layers"]:
            raise InputError(INPUT_NAME, f"--pipeline-model-parallel-layout places {sum(layout)} decoder layers; "
                                         f"--num-layers is {model['num_layers']}")
        if mtp:
            notes.append(f"--pipeline-model-parallel-layout: {mtp} MTP layer(s) on the last virtual stage")
    else:
        vpp = _virtual_stages(flags, pp, layer_count, uneven=bool(first or last), slots=slots)
    if slots and pp > 1:
        if pp == 2 and slots == 2 and vpp > 1:   # no middle stage to measure the lighter ends against
            raise InputError(INPUT_NAME, "--account-for-embedding-in-pipeline-split with "
                                         "--account-for-loss-in-pipeline-split on pp=2 with interleaving is not "
                                         "supported; describe the split with --decoder-first/last-pipeline-num-layers")
        first, last = _slot_split(pp, layer_count(), embedding_slot, loss_slot)
    sp = bool(flags.get("--sequence-parallel"))
    if sp and tp == 1:
        notes.append("--sequence-parallel with tp=1: Megatron-LM turns sequence parallelism off; read as off")
        sp = False
    mbs = _integer(flags, "--micro-batch-size")
    if mbs is None:
        notes.append("no --micro-batch-size: read as 1")
        mbs = 1
    recompute, recompute_layers = _recompute(flags, notes)
    values = dict(tp=tp, pp=pp, vpp=vpp, cp=_integer(flags, "--context-parallel-size", 1),
                  ep=_integer(flags, "--expert-model-parallel-size", 1),
                  etp=_integer(flags, "--expert-tensor-parallel-size", 0), mbs=mbs, sp=sp, recompute=recompute,
                  recompute_layers=recompute_layers, zero=_zero(flags), first_stage_layers=first,
                  last_stage_layers=last, layout=layout)
    modules = flags.get("--recompute-modules")
    if isinstance(modules, str) and modules.strip():
        if recompute is Recompute.SELECTIVE:
            values["recompute_modules"] = modules
        else:
            notes.append("--recompute-modules without --recompute-granularity selective: ignored, as Megatron does")
    try:
        plan = Plan(**values)
    except InputError as error:
        flag = PLAN_FLAG_OF_FIELD.get(error.field, error.field)
        raise InputError(INPUT_NAME, f"{flag}: {error.message}") from None
    try:
        num_gpus = _num_gpus(flags, variables, text)
    except InputError as error:  # an unreadable launcher line only loses the GPU count: --gpus gives it
        notes.append(f"GPU count not read from the launcher ({error.message}); give --gpus")
        num_gpus = None
    training: dict[str, Any] = {"precision": _precision(flags, notes), **_fp8_recipe(flags, notes)}
    training.update({field_name: True for flag, field_name in OVERLAP_FIELD_OF_FLAG.items() if flags.get(flag)})
    training.update({"overlap_p2p_comm": on for flag, on in P2P_OVERLAP_OF_FLAG.items() if flags.get(flag)})
    training["grad_reduce_in_fp32"] = _grad_reduce_in_fp32(flags, notes)
    training.update(_attention(flags, notes))
    training.update(_dispatcher(flags, notes))
    training.update(_capacity(flags, notes))
    training.update(_rank_budget(flags))
    if flags.get("--defer-embedding-wgrad-compute"):
        if plan.pp == 1:          # ModelParallelConfig.__post_init__
            raise InputError(INPUT_NAME, "--defer-embedding-wgrad-compute with pp=1: Megatron-Core refuses it ('Cannot "
                                         "defer embedding wgrad compute when pipeline model parallel is not used')")
        training["defer_output_wgrad"] = True
        limit = _integer(flags, "--wgrad-deferral-limit", 0)
        training["wgrad_deferral_limit"] = limit
    offloaded = _integer(flags, "--cpu-offloading-num-layers", 0)
    if offloaded:      # validate_args: `if args.cpu_offloading_num_layers > 0: args.cpu_offloading = True`
        if offloaded < 0:
            raise InputError(INPUT_NAME, f"--cpu-offloading-num-layers {offloaded}: expected a whole number >= 0")
        training["cpu_offload_layers"] = offloaded
        notes.append(f"--cpu-offloading-num-layers {offloaded}: their activations priced on the host (Transformer "
                     "Engine keeps at most num_layers - offloaded layers' activations on the GPU); the copies' time "
                     "is not priced")
    training.update(_fine_grained_offloading(flags, notes))
    if "--num-experts" in flags:   # TEGroupedMLP / SequentialMLP: a cuBLAS GEMM per expert (TrainingSpec.expert_gemm)
        training["expert_gemm"] = "cublas"
    if flags.get("--use-precision-aware-optimizer"):   # TrainingSpec.optimizer_state_bytes
        training["optimizer_state_bytes"] = optimizer_state_bytes(
            str(flags.get("--main-params-dtype", "fp32")), str(flags.get("--exp-avg-dtype", "fp32")),
            str(flags.get("--exp-avg-sq-dtype", "fp32")), bool(training.get("fp8_param_gather")),
            training.get("fp8_recipe"))
    group = _integer(flags, "--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None and plan.vpp > 1:
        if group < plan.pp:      # schedules.py: 'should range in [PP, M]'
            raise InputError(INPUT_NAME, f"--microbatch-group-size-per-virtual-pipeline-stage {group} is below "
                                         f"--pipeline-model-parallel-size {plan.pp}: Megatron-Core refuses it")
        training["microbatch_group_size_per_vp_stage"] = group
    training.update(_cuda_graphs(flags, notes))
    # TrainingSpec.dataloader_attention_mask: validate_args turns the mask off under inter-document masking too
    if flags.get("--no-create-attention-mask-in-dataloader") or flags.get("--dataloader-inter-document-masking"):
        training["dataloader_attention_mask"] = False
    training["cross_entropy"] = _cross_entropy(flags)
    training["pipeline_schedule"] = _pipeline_schedule(flags, plan.pp)
    seq_len = _first_integer(flags, "--seq-length", "--encoder-seq-length")
    if seq_len is not None:
        training["seq_len"] = seq_len
    global_batch = _integer(flags, "--global-batch-size")
    if global_batch is None and num_gpus is not None and plan.dp(num_gpus):
        global_batch = plan.mbs * plan.dp(num_gpus)  # Megatron-LM's default: one microbatch per DP rank
        notes.append(f"no --global-batch-size: Megatron-LM's default micro-batch × dp = {global_batch}")
    if global_batch is not None:
        training["global_batch_size"] = global_batch
    else:
        notes.append("no --global-batch-size and no GPU count in the command: Megatron-LM's default (micro-batch × "
                     "dp) is unknown here, so the global batch is --global-batch's")
    notes += unpriced_flag_notes(words, plan.zero)
    return MegatronRun(plan=plan, training=training, num_gpus=num_gpus, model=model, flags=flags,
                       notes=tuple(notes))
