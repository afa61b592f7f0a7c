"""The search space: a finite domain for every knob of a plan, from the model, the cluster and the training run.

Domains are *candidates*; the rules (costmodels.rules) decide which combinations are valid. A domain leaves out
values that can never be valid whatever the other knobs are (tp that does not divide the heads, pp deeper than the
model), and values the search bounds on purpose; every bound below is documented and can be moved with
`--max knob=v` / `--min knob=v`, and `--fix knob=v` puts any value in (then the rules say what is wrong with it).

| knob | candidates |
|---|---|
| tp | divisors of num_gpus that divide the attention and KV heads; with the `tp_node` rule on, also divide the NVLink domain (a node; more on GB200 NVL72) |
| pp | divisors of num_gpus, at most num_layers |
| first/last_stage_layers | per pp, see `layer_splits` (0 = same as the middle stages) |
| vpp | 1..num_layers, unbounded by default like Megatron-Core (the `layers` rule keeps the counts a stage's layers split into: 92 layers on pp 4 interleave up to vpp 23) |
| cp | powers of two dividing num_gpus with seq_len % (2·cp) == 0 and at least 128 tokens per rank |
| ep | divisors of num_experts that divide num_gpus (1 for dense models) |
| etp | MoE: divisors of the NVLink domain that divide num_gpus; dense: always equal to tp (no expert layers) |
| mbs | divisors of the global batch, at most 16 (default bound `mbs <= 16`) |
| sp | off, on |
| recompute, recompute_layers, recompute_modules | none; selective with the module sets of `selective_module_sets` (Megatron-Core --recompute-modules); full of all layers (0); full of the first r layers of each chunk (Megatron's block method) for r in 1,2,3,4,6,8,12,16,24,32,48,64 below the largest chunk |
| zero | 0, 1, 2, 3 |

Uneven pipeline stages (`layer_splits`). For pp > 1 the middle stages get m layers each with m = ceil(L/pp) or
ceil(L/pp) + 1, and the first and last stages share the remainder r = L - (pp-2)·m as (f, l) with 1 <= f, l <= m
(ends no heavier than the middle: they carry the embedding and the loss). An end that gets exactly m layers is
written 0 ("as the middle"), so (0, 0) is the even split when pp divides L. With pp = 2 there is no middle stage:
the lighter end is given, (x, 0) or (0, x), with x = L - ceil(L/2) or one less. Examples: DeepSeek-V3, 61 layers on
pp 16: m = 4, r = 5: (1, 0), (2, 3), (3, 2), (0, 1); Llama-3.1-405B, 126 layers on pp 16: m = 8, r = 14:
(6, 0), (7, 7), (0, 6); with m = 9 the ends share 0 layers, so none. At most ~3·pp splits per pp.
With interleaving, an end of exactly m - 1 layers counts the embedding (first) or the loss (last) as its missing
layer, Megatron-Core's --account-for-embedding/loss-in-pipeline-split (the `layers` rule, costmodels.plan
.embedding_loss_slots): Llama-3.1-405B's (7, 7) on pp 16 interleaves with vpp 2, 4 or 8.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodels.errors import InputError
from costmodels.plan import PLAN_FIELDS, PlanArrays, Recompute, RecomputeModule
from costmodels.rules import FP8_DELAYED_UNRECOMPUTABLE
from costmodels.specs import ClusterSpec, Fp8Recipe, ModelSpec, TrainingSpec

KNOBS: tuple[str, ...] = PLAN_FIELDS
"""Every knob of a plan, in Plan's field order."""

TIE_BREAK_ORDER: tuple[str, ...] = ("pp", "tp", "cp", "ep", "etp", "vpp", "first_stage_layers",
                                    "last_stage_layers", "zero", "recompute", "recompute_layers", "recompute_modules",
                                    "sp", "mbs")
"""Among plans with equal objective vectors the front keeps the one that is smallest in this order, each knob
compared by value (sp: off before on; recompute: none < selective < full). Both solvers use it."""

DEFAULT_MAX: Mapping[str, int] = {"mbs": 16}
"""Bounds on knobs that would otherwise have no natural limit (override with --max)."""

MIN_TOKENS_PER_CP_RANK = 128
PARTIAL_RECOMPUTE_LAYERS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


# ---- user controls ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Controls:
    """What the user pins, bounds and relaxes. Contradictory controls are an InputError: a pin outside a bound of the
    same knob, or a minimum above a maximum (one of them would be ignored, or nothing searched)."""

    fix: Mapping[str, int] = field(default_factory=dict)
    minimum: Mapping[str, int] = field(default_factory=dict)
    maximum: Mapping[str, int] = field(default_factory=dict)
    relax: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for knob, value in self.fix.items():
            low, high = self.minimum.get(knob), self.maximum.get(knob)
            if (low is not None and value < low) or (high is not None and value > high):
                bound = f"min {knob}={low}" if low is not None and value < low else f"max {knob}={high}"
                raise InputError(knob, f"fix {knob}={value} is outside {bound}; drop one of them")
        for knob, low in self.minimum.items():
            high = self.maximum.get(knob)
            if high is not None and low > high:
                raise InputError(knob, f"min {knob}={low} is above max {knob}={high}; nothing can be searched")


POSITIVE_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "mbs")
"""Knobs whose values start at 1 (etp, the stage splits and recompute_layers take 0: 'as tp', 'even', 'all')."""


def parse_knob_value(knob: str, value: str | int | bool | Recompute) -> int:
    """A knob value from the command line or the API, as the integer the search uses."""
    if knob not in KNOBS:
        derived = " (dp is derived: num_gpus / (tp·cp·pp); pin tp, cp, pp instead)" if knob == "dp" else ""
        raise InputError(knob, f"unknown knob{derived}; knobs are {', '.join(KNOBS)}")
    if knob == "recompute":
        return int(Recompute.parse(value))
    if knob == "recompute_modules":
        return RecomputeModule.parse(value)
    if knob == "sp":
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("1", "true", "on", "yes"):
                return 1
            if text in ("0", "false", "off", "no"):
                return 0
            raise InputError("sp", f"expected true or false, got {value!r}")
        return int(bool(value))
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?[0-9]{1,18}", text):            # not `1_6`, `８`, or 5,000 digits
            shown = repr(text[:24]) + (f"… ({len(text):,} characters)" if len(text) > 24 else "")
            raise InputError(knob, f"expected a whole number in the digits 0-9 (at most 18 of them), got {shown}")
        number = int(text, 10)
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(knob, f"expected a whole number, got {value!r}")
    else:
        number = int(value)
    if knob in POSITIVE_KNOBS and number < 1:
        raise InputError(knob, f"must be a positive integer, got {number}")
    if number < 0:
        raise InputError(knob, f"must be a non-negative integer, got {number}")
    if knob == "zero" and number > 3:
        raise InputError(knob, f"must be 0, 1, 2 or 3, got {number}")
    return number


def parse_assignments(items: Sequence[str] | Mapping[str, object] | None, flag: str) -> dict[str, int]:
    """`["tp=4", "pp=2"]` or `{"tp": 4}` -> {"tp": 4}; a malformed item is an InputError naming `flag`."""
    if not items:
        return {}
    pairs: list[tuple[str, object]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items:
            if "=" not in item:
                raise InputError(flag, f"expected KNOB=VALUE (e.g. tp=4), got {item!r}")
            name, _, value = item.partition("=")
            if not name.strip():
                raise InputError(flag, f"expected KNOB=VALUE (e.g. tp=4), got {item!r}: the knob's name is missing")
            pairs.append((name.strip(), value))
    values: dict[str, int] = {}
    for name, value in pairs:
        parsed = parse_knob_value(name, value)
        if name in values and values[name] != parsed:
            raise InputError(flag, f"{name} given twice ({name}={values[name]} and {name}={parsed}); keep one")
        values[name] = parsed
    return values


# ---- the space -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per knob. Pipeline splits (pp, first, last) and recompute settings (recompute, layers)
    are joint domains because their valid combinations are few."""

    splits: tuple[tuple[int, int, int], ...]
    """(pp, first_stage_layers, last_stage_layers)."""
    recomputes: tuple[tuple[int, int, int], ...]
    """(recompute, recompute_layers, recompute_modules)."""
    domains: Mapping[str, tuple[int, ...]]
    """tp, cp, vpp, ep, etp, mbs, sp, zero (etp absent when it follows tp: dense models)."""
    etp_follows_tp: bool

    # ---- sizes ----------------------------------------------------------------------------------------------
    def domain(self, knob: str) -> tuple[int, ...]:
        """Candidate values of any knob (projections of the joint domains for pp, first/last, recompute...)."""
        if knob == "pp":
            return tuple(sorted({s[0] for s in self.splits}))
        if knob == "first_stage_layers":
            return tuple(sorted({s[1] for s in self.splits}))
        if knob == "last_stage_layers":
            return tuple(sorted({s[2] for s in self.splits}))
        if knob == "recompute":
            return tuple(sorted({r[0] for r in self.recomputes}))
        if knob == "recompute_layers":
            return tuple(sorted({r[1] for r in self.recomputes}))
        if knob == "recompute_modules":
            return tuple(sorted({r[2] for r in self.recomputes}))
        if knob == "etp" and self.etp_follows_tp:
            return self.domains["tp"]
        return self.domains[knob]

    @property
    def free_knobs(self) -> tuple[str, ...]:
        """The independent factors of the product, in enumeration order."""
        knobs = ["tp", "cp", "vpp", "ep"] + ([] if self.etp_follows_tp else ["etp"]) + ["mbs", "sp", "zero"]
        return tuple(knobs)

    @property
    def size(self) -> int:
        """Number of candidate plans (the product of the domains, before the rules)."""
        return len(self.splits) * len(self.recomputes) * math.prod(len(self.domains[k]) for k in self.free_knobs)

    # ---- enumeration ----------------------------------------------------------------------------------------
    def factors(self, knobs: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """Factor columns for a product: 'split' and 'recompute' stand for their joint domains."""
        out = []
        for knob in knobs:
            if knob == "split":
                out.append(("split", np.array(self.splits, dtype=np.int64).reshape(-1, 3)))
            elif knob == "recompute":
                out.append(("recompute", np.array(self.recomputes, dtype=np.int64).reshape(-1, 3)))
            else:
                out.append((knob, np.array(self.domains[knob], dtype=np.int64).reshape(-1, 1)))
        return out

    def columns_from_factors(self, factors: list[tuple[str, np.ndarray]], indices: list[np.ndarray]
                             ) -> dict[str, np.ndarray]:
        columns: dict[str, np.ndarray] = {}
        for (name, table), index in zip(factors, indices):
            rows = table[index]
            if name == "split":
                columns["pp"], columns["first_stage_layers"], columns["last_stage_layers"] = rows.T
            elif name == "recompute":
                columns["recompute"], columns["recompute_layers"], columns["recompute_modules"] = rows.T
            elif name == "recompute_kind":
                columns["recompute"] = rows[:, 0]
            else:
                columns[name] = rows[:, 0]
        if self.etp_follows_tp and "tp" in columns:
            columns["etp"] = columns["tp"]
        return columns


def selective_module_sets(model: ModelSpec, training: "TrainingSpec | None" = None) -> list[int]:
    """The --recompute-modules sets searched with selective recompute (a RecomputeModule bit set each; 0 is
    Megatron-Core's default, core_attn). Not all 2^7 subsets: the ones that trade memory for time in order (each
    drops more than the one before it), as Megatron-Core's MoE recipes use them (ModelZoo: 'norm, act'; DeepSeek-V3
    on GB200: 'mlp, moe_act'; Qwen3 long context: 'layernorm, moe'):
    dense: core_attn; + layernorm; + mlp. MoE: also layernorm + moe_act, with core_attn, and core_attn + layernorm
    + moe; a model's dense layers add mlp, its shared experts shared_experts, MLA mla_up_proj to the MoE sets.
    layernorm only where a norm is a module of its own (ModelSpec.num_separate_norms: a dense model without MLA fuses
    both norms into the linear layers after them, and recomputes nothing). Under fp8 delayed scaling (`training`)
    without layernorm and moe_act, which Megatron-Core refuses there (rule fp8_delayed_recompute): the same sets
    with those taken out, so moe, mlp, shared_experts and mla_up_proj are still searched."""
    core = RecomputeModule.CORE_ATTN
    norm = RecomputeModule.LAYERNORM if model.num_separate_norms(moe_layer=model.is_moe) else RecomputeModule(0)
    sets = [0, int(core | norm)] if norm else [0]          # 0 is core_attn alone
    if model.moe is None:
        sets.append(int(core | norm | RecomputeModule.MLP))
    else:
        has_dense = model.moe.first_dense_layers > 0 or model.moe.layer_freq > 1
        extra = RecomputeModule(0)
        if has_dense:
            extra |= RecomputeModule.MLP
        if model.moe.num_shared_experts:
            extra |= RecomputeModule.SHARED_EXPERTS
        if model.mla is not None:
            extra |= RecomputeModule.MLA_UP_PROJ
        for moe in (norm | RecomputeModule.MOE_ACT, core | norm | RecomputeModule.MOE_ACT,
                    core | norm | RecomputeModule.MOE):
            sets.append(int(moe | extra))
    if training is not None and training.fp8_scaling is Fp8Recipe.DELAYED:
        refused = int(FP8_DELAYED_UNRECOMPUTABLE)
        sets = [0] + [s & ~refused for s in sets if s & ~refused not in (0, int(core))]
    return sorted(set(sets))


def plan_arrays(columns: Mapping[str, np.ndarray], length: int | None = None) -> PlanArrays:
    """PlanArrays from some columns; absent knobs take Plan's defaults (etp: tp)."""
    if length is not None and not columns:
        return PlanArrays.from_columns(tp=np.ones(length, dtype=np.int64))
    cols = dict(columns)
    if "sp" in cols:
        cols["sp"] = np.asarray(cols["sp"]).astype(bool)
    return PlanArrays.from_columns(**cols)


def mixed_radix(sizes: Sequence[int], start: int, stop: int) -> list[np.ndarray]:
    """Digits of the flat indices start..stop-1 in the mixed radix `sizes` (last digit fastest)."""
    flat = np.arange(start, stop, dtype=np.int64)
    digits = []
    for size in reversed(sizes):
        digits.append(flat % size)
        flat = flat // size
    return digits[::-1]


# ---- domain construction ---------------------------------------------------------------------------------------

def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def layer_splits(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Candidate (first_stage_layers, last_stage_layers) for `pp` stages (module docstring)."""
    if pp == 1:
        return [(0, 0)]
    if pp > num_layers:
        return []
    splits: set[tuple[int, int]] = set()
    base = -(-num_layers // pp)
    if pp == 2:   # no middle stage: a split is the lighter end's layer count, on the first or the last stage
        if num_layers % 2 == 0:
            splits.add((0, 0))
        for heavier in (base, base + 1):
            lighter = num_layers - heavier
            if 1 <= lighter < heavier:
                splits.update({(lighter, 0), (0, lighter)})
        return sorted(splits)
    for middle in (base, base + 1):
        rest = num_layers - (pp - 2) * middle
        for first in range(max(1, rest - middle), min(middle, rest - 1) + 1):
            last = rest - first
            if 1 <= last <= middle:
                splits.add((0 if first == middle else first, 0 if last == middle else last))
    return sorted(splits)


def _within(values: Sequence[int], knob: str, controls: Controls) -> tuple[int, ...]:
    if knob in controls.fix:
        return (controls.fix[knob],)
    low = controls.minimum.get(knob, None)
    high = controls.maximum.get(knob, DEFAULT_MAX.get(knob))
    if knob in controls.maximum:
        high = controls.maximum[knob]
    kept = tuple(v for v in values if (low is None or v >= low) and (high is None or v <= high))
    return kept


def build_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                controls: Controls = Controls()) -> SearchSpace:
    n = cluster.num_gpus
    node = cluster.nvlink_domain_gpus  # tp_node: a node, or the job's share of a multi-node NVLink domain
    relaxed = set(controls.relax)
    gpu_divisors = divisors(n)

    tp_values = [d for d in gpu_divisors
                 if model.num_attention_heads % d == 0 and model.num_kv_heads % d == 0
                 and ("tp_node" in relaxed or (d <= node and node % d == 0))]
    cp_values = [c for c in gpu_divisors if c & (c - 1) == 0
                 and (c == 1 or (training.seq_len % (2 * c) == 0
                                 and training.seq_len // c >= MIN_TOKENS_PER_CP_RANK))]
    vpp_values = list(range(1, model.num_layers + 1))
    if model.moe is not None:
        ep_values = [e for e in divisors(model.moe.num_experts) if n % e == 0]
        etp_values = [d for d in gpu_divisors if "tp_node" in relaxed or (d <= node and node % d == 0)]
    else:
        ep_values, etp_values = [1], []
    mbs_values = divisors(training.global_batch_size)

    domains = {
        "tp": _within(tp_values, "tp", controls),
        "cp": _within(cp_values, "cp", controls),
        "vpp": _within(vpp_values, "vpp", controls),
        "ep": _within(ep_values, "ep", controls),
        "mbs": _within(mbs_values, "mbs", controls),
        "sp": _within([0, 1], "sp", controls),
        "zero": _within([0, 1, 2, 3], "zero", controls),
    }
    etp_follows_tp = model.moe is None and "etp" not in controls.fix
    if not etp_follows_tp:
        domains["etp"] = _within(etp_values if model.moe is not None else [], "etp", controls)

    pp_values = _within([p for p in gpu_divisors if p <= model.num_layers], "pp", controls)
    splits = []
    for pp in pp_values:
        candidates = layer_splits(model.num_layers, pp)
        firsts = _within(sorted({f for f, _ in candidates}), "first_stage_layers", controls)
        lasts = _within(sorted({l for _, l in candidates}), "last_stage_layers", controls)
        if "first_stage_layers" in controls.fix or "last_stage_layers" in controls.fix:
            pairs = [(f, l) for f in firsts for l in lasts]       # the rules judge a pinned split
        else:
            pairs = [(f, l) for f, l in candidates if f in firsts and l in lasts]
        splits.extend((pp, f, l) for f, l in pairs)

    largest_stage = max([model.num_layers] if not splits else
                        [_largest_stage_layers(model.num_layers, *s) for s in splits])
    recompute_values = _within([int(r) for r in Recompute], "recompute", controls)
    partial = [r for r in PARTIAL_RECOMPUTE_LAYERS if r < largest_stage]
    recomputes = []
    for rc in recompute_values:
        layer_options = [0] + (partial if rc == Recompute.FULL else [])
        module_options = selective_module_sets(model, training) if rc == Recompute.SELECTIVE else [0]
        for r in _within(layer_options, "recompute_layers", controls):
            for modules in _within(module_options, "recompute_modules", controls):
                recomputes.append((rc, r, modules))

    space = SearchSpace(splits=tuple(splits), recomputes=tuple(recomputes), domains=domains,
                        etp_follows_tp=etp_follows_tp)
    _check_not_empty(space, controls)
    return space


def _largest_stage_layers(num_layers: int, pp: int, first: int, last: int) -> int:
    if pp == 1:
        return num_layers
    explicit = [x for x in (first, last) if x > 0]
    middle_stages = pp - len(explicit)
    rest = num_layers - sum(explicit)
    middle = -(-rest // middle_stages) if middle_stages > 0 else 0
    return max(explicit + [middle])


def _check_not_empty(space: SearchSpace, controls: Controls) -> None:
    """A bound that leaves a knob without candidates is the user's to fix (one line naming the knob)."""
    for knob in space.free_knobs:
        if not space.domains[knob]:
            raise InputError(f"--min/--max {knob}", f"no candidate value of {knob} within the bounds "
                             f"(min {controls.minimum.get(knob, '-')}, max {controls.maximum.get(knob, DEFAULT_MAX.get(knob, '-'))}); "
                             "widen them")
    if not space.splits:
        raise InputError("--min/--max pp", "no candidate pipeline layout (pp, first/last stage layers) within the "
                         "bounds; widen them")
    if not space.recomputes:
        raise InputError("--min/--max recompute", "no candidate recompute setting within the bounds; widen them")


def tie_break_key(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Row order for equal objective vectors: np.lexsort keys, most significant last (see TIE_BREAK_ORDER)."""
    return np.array([np.asarray(columns[k], dtype=np.int64) for k in reversed(TIE_BREAK_ORDER)])
