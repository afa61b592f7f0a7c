"""A plan — one assignment of every parallelism knob — and `PlanArrays`, many plans as numpy columns.

Every cost function takes `PlanArrays` and returns numpy arrays, so the solver evaluates millions of plans at once
and `estimate` evaluates one (a `PlanArrays` of length 1). Knob names follow DESIGN.md §1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Sequence

import numpy as np

from costmodels.errors import InputError, require, require_non_negative_int, require_positive_int
from costmodels.structure import StructureIndex, per_structure, take_rows


class Recompute(enum.IntEnum):
    """Activation recomputation (Korthikanti et al., arXiv 2205.05198 §4)."""

    NONE = 0
    """Keep every activation for the backward pass."""
    SELECTIVE = 1
    """Recompute only the attention core (softmax, dropout, scores·V): drops the 5·a·s/h term (§4.2)."""
    FULL = 2
    """Keep only each layer's input and re-run the whole forward in the backward pass (§4.1)."""

    @classmethod
    def parse(cls, value: "str | int | Recompute") -> "Recompute":
        if isinstance(value, Recompute):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise InputError("recompute", f"unknown recompute {value!r}; use none, selective or full") from None
        try:
            return cls(int(value))
        except (ValueError, TypeError):
            raise InputError("recompute", f"unknown recompute {value!r}; use none, selective or full") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class RecomputeModule(enum.IntFlag):
    """Megatron-Core's per-module selective recompute (`--recompute-granularity selective --recompute-modules ...`,
    megatron/core/transformer/transformer_config.py `recompute_modules`): each module's forward output is dropped
    after the forward pass and recomputed from its stored input in the backward pass."""

    CORE_ATTN = 1
    """The attention core (Korthikanti et al., arXiv 2205.05198 §4.2): Megatron's default module."""
    LAYERNORM = 2
    """The norms that are modules of their own (ModelSpec.num_separate_norms: a MoE layer's pre-MLP norm, MLA's input
    norm; Transformer Engine fuses the others into the linear layer after them): their outputs are not kept."""
    MLP = 4
    """A dense layer's whole MLP: only its input is kept."""
    MOE_ACT = 8
    """The routed experts' activation function: its output (the down projection's input) is not kept."""
    MOE = 16
    """A MoE layer's whole MLP (router, dispatch, routed experts, combine, and the shared experts, which
    MoELayer's checkpointed forward runs first): only its input is kept."""
    SHARED_EXPERTS = 32
    """The shared experts' MLP."""
    MLA_UP_PROJ = 64
    """MLA's up projections (Q, K, V out of the latents)."""

    @classmethod
    def parse(cls, value: "str | int | Iterable[str]") -> int:
        """A bit set from names ('core_attn,layernorm' or a list) or an int; '' or 'default' is 0."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            require(0 <= int(value) < 2 ** len(cls), "recompute_modules", f"unknown module bits {value!r}")
            return int(value)
        names = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        bits = 0
        for name in names:
            if name in ("", "default"):
                continue
            try:
                bits |= cls[name.strip().upper()]
            except KeyError:
                raise InputError("recompute_modules", f"unknown module {name!r}; use "
                                                      f"{', '.join(m.label for m in cls)}") from None
        return int(bits)

    @property
    def label(self) -> str:
        return (self.name or "").lower()

    @classmethod
    def names(cls, bits: int) -> list[str]:
        return [m.label for m in cls if bits & m]

    @classmethod
    def short_names(cls, bits: int) -> list[str]:
        """Compact names for plan labels: attn, ln, mlp, act, moe, shared, mla."""
        return [SHORT_MODULE_NAMES[m.label] for m in cls if bits & m]


SHORT_MODULE_NAMES = {"core_attn": "attn", "layernorm": "ln", "mlp": "mlp", "moe_act": "act", "moe": "moe",
                      "shared_experts": "shared", "mla_up_proj": "mla"}
"""RecomputeModule label -> the short form plan labels use (`Plan.short`)."""

DEFAULT_RECOMPUTE_MODULES = int(RecomputeModule.CORE_ATTN)
"""Megatron-Core's default `recompute_modules`: ['core_attn']."""


def knob(default: object, help: str, megatron_flag: str = "", *, metavar: str = "N", default_text: str = "",
         aliases: tuple[str, ...] = (), column: bool = True) -> object:
    """A Plan field with what users see of it: the help text of its CLI flag (`--NAME`, underscores as dashes),
    the Megatron-LM flag it maps to, and the flag's other spellings. `autopar.commands` builds the plan flags from
    these; JSON, CSV, HTML and explain take the field order. The one list of knobs is `PLAN_FIELDS` below."""
    return field(default=default, metadata={"help": help, "megatron_flag": megatron_flag, "metavar": metavar,
                                            "default_text": default_text or str(default), "aliases": aliases,
                                            "column": column})


@dataclass(frozen=True)
class Plan:
    """One layout. `dp` is derived: num_gpus / (tp·cp·pp); `edp` = num_gpus / (etp·ep·pp)."""

    tp: int = knob(1, "tensor-parallel size", "--tensor-model-parallel-size")
    pp: int = knob(1, "pipeline-parallel size", "--pipeline-model-parallel-size")
    vpp: int = knob(1, "virtual stages per pipeline rank (interleaved 1F1B)")
    """Virtual stages per pipeline rank (interleaved 1F1B); 1 = plain 1F1B."""
    cp: int = knob(1, "context-parallel size", "--context-parallel-size")
    ep: int = knob(1, "expert-parallel size, MoE only", "--expert-model-parallel-size")
    etp: int = knob(0, "tensor-parallel size inside experts", "--expert-tensor-parallel-size", default_text="tp")
    """Tensor parallelism inside expert layers; 0 means 'same as tp' (Megatron's default)."""
    mbs: int = knob(1, "micro-batch size in sequences", aliases=("--micro-batch-size",))
    sp: bool = knob(False, "sequence parallelism on the TP group", "--sequence-parallel",
                    default_text="on when tp > 1")
    recompute: Recompute = knob(Recompute.NONE, "activation recomputation", metavar="{none,selective,full}",
                                default_text="none")
    recompute_layers: int = knob(0, "with --recompute full: layers per stage recomputed", "--recompute-num-layers",
                                 default_text="0 = all")
    """With full recompute: layers per pipeline stage (per virtual chunk) recomputed, Megatron's block method
    (--recompute-num-layers); 0 = all of them."""
    recompute_modules: "int | str" = knob(0, "with --recompute selective: modules recomputed, of core_attn, layernorm, "
                                         "mlp, moe_act, moe, shared_experts, mla_up_proj", "--recompute-modules",
                                         metavar="M[,M...]", default_text="core_attn")
    """With selective recompute: the modules recomputed, a RecomputeModule bit set (--recompute-modules);
    0 = Megatron's default, core_attn only. Names ('layernorm,moe_act') are read into the bit set."""
    zero: int = knob(0, "sharding over DP: 1 = Megatron distributed optimizer, 2 + gradients, 3 + parameters",
                     metavar="{0,1,2,3}")
    """0 none, 1 optimizer states (= Megatron distributed optimizer), 2 + gradients, 3 + parameters (ZeRO/FSDP)."""
    first_stage_layers: int = knob(0, "decoder layers on the first pipeline stage",
                                   "--decoder-first-pipeline-num-layers", default_text="even split")
    """Decoder layers on the first pipeline rank; 0 = even split (Megatron --decoder-first-pipeline-num-layers)."""
    last_stage_layers: int = knob(0, "decoder layers on the last pipeline stage",
                                  "--decoder-last-pipeline-num-layers", default_text="even split")
    """Decoder layers on the last pipeline rank; 0 = even split (--decoder-last-pipeline-num-layers)."""
    layout: tuple[int, ...] = knob((), "decoder layers of each virtual pipeline stage in model order, e.g. 9,8,8,7",
                                   "--pipeline-model-parallel-layout", metavar="N,N,...",
                                   default_text="the first/last split", column=False)
    """Decoder layers of every virtual pipeline stage in model order (stage i on rank i % pp, chunk i // pp;
    embedding on the first, loss and MTP on the last: costmodels.layout); () = the split above. Not a search column:
    `autopar solve --layouts` chooses it per structure (autopar.search.layouts)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "cp", "ep", "mbs"):
            require_positive_int(getattr(self, name), name)
        for name in ("etp", "recompute_layers", "first_stage_layers", "last_stage_layers"):
            require_non_negative_int(getattr(self, name), name)
        object.__setattr__(self, "recompute_modules", RecomputeModule.parse(self.recompute_modules))
        if self.etp == 0:
            object.__setattr__(self, "etp", self.tp)
        object.__setattr__(self, "recompute", Recompute.parse(self.recompute))
        require(isinstance(self.sp, (bool, np.bool_)), "sp", f"must be true or false, got {self.sp!r}")
        object.__setattr__(self, "sp", bool(self.sp))
        require(self.zero in (0, 1, 2, 3) and not isinstance(self.zero, bool), "zero",
                f"must be 0, 1, 2 or 3, got {self.zero!r}")
        # modules belong to selective recompute (Megatron ignores --recompute-modules otherwise); one spelling of
        # the default: core_attn alone is 0
        if self.recompute is not Recompute.SELECTIVE or self.recompute_modules == DEFAULT_RECOMPUTE_MODULES:
            object.__setattr__(self, "recompute_modules", 0)
        layout = self.layout
        if isinstance(layout, str):          # "9,8,8,7" or "9|8|8|7" (the CLI flag)
            parts = [part.strip() for part in layout.replace("|", ",").split(",") if part.strip()]
            require(all(part.isascii() and part.isdigit() and len(part) <= 9 for part in parts), "layout",
                    "give whole numbers of decoder layers per virtual stage in the digits 0-9, e.g. 9,8,8,7; got "
                    f"{layout[:40]!r}" + (f"… ({len(layout):,} characters)" if len(layout) > 40 else ""))
            layout = tuple(int(part) for part in parts)
        layout = tuple(layout)
        require(all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in layout),
                "layout", f"must list whole numbers of decoder layers per virtual stage, got {self.layout!r}")
        object.__setattr__(self, "layout", tuple(int(x) for x in layout))
        require(not layout or len(layout) == self.pp * self.vpp, "layout",
                f"has {len(layout)} virtual stages; pp·vpp = {self.pp}·{self.vpp} = {self.pp * self.vpp} needed")
        # the layout places every layer: no split beside it, so one plan has one price (costmodels.layout.parent_plan)
        require(not layout or not (self.first_stage_layers or self.last_stage_layers), "layout",
                "a layout places every decoder layer, so it takes no first/last stage split; drop the split")

    def dp(self, num_gpus: int) -> int:
        """Data-parallel size on `num_gpus` (0 when the model-parallel product does not divide it)."""
        model_parallel = self.tp * self.cp * self.pp
        return num_gpus // model_parallel if num_gpus % model_parallel == 0 else 0

    def edp(self, num_gpus: int) -> int:
        expert_parallel = self.etp * self.ep * self.pp
        return num_gpus // expert_parallel if num_gpus % expert_parallel == 0 else 0

    def short(self) -> str:
        """A compact one-line label, e.g. 'tp8 pp4 vpp2 mbs1 sp sel z1'."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if (self.first_stage_layers or self.last_stage_layers) and not self.layout:
            parts.append(f"split{self.first_stage_layers or '-'}/{self.last_stage_layers or '-'}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        parts.append(f"mbs{self.mbs}")
        if self.sp:
            parts.append("sp")
        if self.recompute is not Recompute.NONE:
            layers = f"{self.recompute_layers}" if self.recompute_layers else ""
            parts.append({Recompute.SELECTIVE: "sel", Recompute.FULL: "full"}[self.recompute] + layers)
            if self.recompute_modules:
                parts[-1] += "(" + "+".join(RecomputeModule.short_names(self.recompute_modules)) + ")"
        if self.zero:
            parts.append(f"z{self.zero}")
        if self.layout:
            parts.append("layout " + "|".join(map(str, self.layout)))
        return " ".join(parts)


PLAN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Plan) if f.metadata.get("column", True))
"""The knobs of a plan, in DESIGN.md §1 order: the one list every flag set, table, document and solver reads.
`layout` is not among them: it is no single integer and no search column (autopar solve --layouts sets it)."""


def recompute_module_names(plan: Plan) -> list[str]:
    """The modules selective recompute re-runs (Megatron-Core --recompute-modules); [] without selective."""
    if plan.recompute is not Recompute.SELECTIVE:
        return []
    return RecomputeModule.names(plan.recompute_modules or DEFAULT_RECOMPUTE_MODULES)


def plan_to_dict(plan: Plan, num_gpus: int) -> dict[str, Any]:
    """A plan with its derived sizes (dp, edp after etp), in DESIGN.md §1 names; recompute by its label; the
    layout (decoder layers per virtual stage) when it has one."""
    out: dict[str, Any] = {}
    for name in PLAN_FIELDS:
        value = getattr(plan, name)
        out[name] = value.label if isinstance(value, Recompute) else value
        if name == "recompute_modules":
            out[name] = recompute_module_names(plan)
        if name == "etp":
            out["dp"], out["edp"] = plan.dp(num_gpus), plan.edp(num_gpus)
    if plan.layout:
        out["layout"] = list(plan.layout)
    return out


@dataclass(frozen=True)
class PlanArrays:
    """Many plans as equal-length numpy columns, one per Plan field (int64; `sp` bool)."""

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    sp: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    recompute_modules: np.ndarray
    zero: np.ndarray
    first_stage_layers: np.ndarray
    last_stage_layers: np.ndarray
    structure: "StructureIndex | None" = field(default=None, compare=False, repr=False)
    """Optional: which row of a table of distinct structures each plan has (costmodels.structure); functions of
    the structure knobs alone are then evaluated once per structure and gathered. Never changes a value."""

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in PLAN_FIELDS}
        assert len(lengths) == 1, f"PlanArrays columns differ in length: {lengths}"

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_plans(cls, plans: Iterable[Plan]) -> "PlanArrays":
        plans = list(plans)
        columns = {name: np.array([getattr(p, name) for p in plans], dtype=np.int64) for name in PLAN_FIELDS}
        columns["sp"] = columns["sp"].astype(bool)
        return cls(**columns)

    @classmethod
    def from_columns(cls, **columns: "np.ndarray | int | bool") -> "PlanArrays":
        """Columns by name; missing ones take Plan's defaults; scalars broadcast; etp 0 → tp."""
        defaults = Plan()
        length = max((np.size(v) for v in columns.values()), default=1)
        built = {}
        for name in PLAN_FIELDS:
            value = columns.get(name, getattr(defaults, name) if name != "etp" else 0)
            built[name] = np.broadcast_to(np.asarray(value, dtype=bool if name == "sp" else np.int64),
                                          (length,)).copy()
        built["etp"] = np.where(built["etp"] == 0, built["tp"], built["etp"])
        return cls(**built)

    def take(self, index: "np.ndarray | Sequence[int] | slice") -> "PlanArrays":
        structure = self.structure.take(index) if self.structure is not None else None
        return PlanArrays(**{name: take_rows(getattr(self, name), index) for name in PLAN_FIELDS}, structure=structure)

    def plan(self, i: int) -> Plan:
        values = {name: getattr(self, name)[i].item() for name in PLAN_FIELDS}
        values["recompute"] = Recompute(values["recompute"])
        return Plan(**values)

    def __iter__(self):
        return (self.plan(i) for i in range(len(self)))


def as_plan_arrays(plans: "Plan | PlanArrays | Iterable[Plan]") -> PlanArrays:
    if isinstance(plans, PlanArrays):
        return plans
    if isinstance(plans, Plan):
        return PlanArrays.from_plans([plans])
    return PlanArrays.from_plans(plans)


# ---- layers per pipeline stage ---------------------------------------------------------------------------------

def layers_per_middle_stage(num_layers: int, plans: PlanArrays) -> np.ndarray:
    """Decoder layers on each pipeline rank that is neither an explicit first nor an explicit last stage.

    Float: the `layers` rule (costmodels.rules) rejects plans where it is not a whole number.
    """
    return per_structure(plans, ("layers_per_middle_stage", num_layers),
                         lambda p: _layers_per_middle_stage(num_layers, p))


def _layers_per_middle_stage(num_layers: int, plans: PlanArrays) -> np.ndarray:
    has_first = (plans.first_stage_layers > 0) & (plans.pp > 1)
    has_last = (plans.last_stage_layers > 0) & (plans.pp > 1)
    middle_stages = plans.pp - has_first - has_last
    rest_layers = num_layers - plans.first_stage_layers * has_first - plans.last_stage_layers * has_last
    return rest_layers / np.maximum(middle_stages, 1)


class StageContent(np.ndarray):
    """Pipeline ranks (an int64 array, one rank per plan) that say themselves which decoder layers they hold:
    `layers` and `moe_layers` per plan, overriding the plan's even/first/last split. costmodels.layout prices a
    layout (any number of layers per virtual stage) through the ordinary per-stage cost functions this way: they
    read a rank's layers only through layers_on_stage / params.moe_layers_on_stage, and its role (first rank:
    embedding; last rank: output layer, loss, MTP; in-flight micro-batches) from the rank index itself."""

    layers: np.ndarray
    moe_layers: np.ndarray
    chunk_layers: "np.ndarray | None"
    """Decoder layers of each of the rank's virtual stages (one row per plan, vpp columns, chunk 0 first) where they
    are known (a layout's ranks); None: equal chunks. The interleaved schedule holds the chunks for different
    numbers of micro-batches (memory.interleaved_held_layers)."""

    @classmethod
    def of(cls, ranks: np.ndarray, layers: np.ndarray, moe_layers: np.ndarray,
           chunk_layers: "np.ndarray | None" = None) -> "StageContent":
        content = np.asarray(ranks, dtype=np.int64).view(cls)
        content.layers = np.asarray(layers, dtype=float)
        content.moe_layers = np.asarray(moe_layers, dtype=float)
        content.chunk_layers = None if chunk_layers is None else np.asarray(chunk_layers, dtype=float)
        return content

    def __array_finalize__(self, obj) -> None:
        self.layers = getattr(obj, "layers", None)
        self.moe_layers = getattr(obj, "moe_layers", None)
        self.chunk_layers = getattr(obj, "chunk_layers", None)


def layers_on_stage(num_layers: int, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    """Decoder layers held by pipeline rank `stage` (all its virtual chunks together)."""
    if isinstance(stage, StageContent) and stage.layers is not None:
        return np.asarray(stage.layers)
    return per_structure(plans, ("layers_on_stage", num_layers),
                         lambda p, s: _layers_on_stage(num_layers, p, s), stage)


def _layers_on_stage(num_layers: int, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
    middle = layers_per_middle_stage(num_layers, plans)
    is_first = (stage == 0) & (plans.first_stage_layers > 0) & (plans.pp > 1)
    is_last = (stage == plans.pp - 1) & (plans.last_stage_layers > 0) & (plans.pp > 1)
    return np.where(is_first, plans.first_stage_layers, np.where(is_last, plans.last_stage_layers, middle))


def embedding_loss_slots(num_layers: int, plans: "PlanArrays | Plan") -> tuple[np.ndarray, np.ndarray]:
    """Whether the first (last) pipeline rank counts the embedding (loss) as one of its layers.

    Megatron-Core's --account-for-embedding-in-pipeline-split (--account-for-loss-in-pipeline-split) adds one layer
    slot for the embedding (loss) to the pipeline split (`TransformerConfig`, `get_num_layers_to_build`): every rank
    gets (num_layers + slots) / pp slots in vpp equal chunks, and the first (last) rank's first (last) chunk holds
    one decoder layer less. A plan says so by giving an interleaved (vpp > 1) pipeline a first (last) stage of
    exactly one layer fewer than the middle stages: such a stage cannot split into vpp equal chunks otherwise.
    """
    middle = layers_per_middle_stage(num_layers, plans)
    interleaved = (plans.pp > 1) & (plans.vpp > 1)
    embedding = interleaved & (plans.first_stage_layers > 0) & (plans.first_stage_layers + 1 == middle)
    loss = interleaved & (plans.last_stage_layers > 0) & (plans.last_stage_layers + 1 == middle)
    return np.asarray(embedding), np.asarray(loss)


def first_layer_index(num_layers: int, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    """Index of the first decoder layer on pipeline rank `stage` (contiguous assignment, vpp ignored)."""
    return per_structure(plans, ("first_layer_index", num_layers),
                         lambda p, s: _first_layer_index(num_layers, p, s), stage)


def _first_layer_index(num_layers: int, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
    first_stage = layers_on_stage(num_layers, plans, 0)
    middle = layers_per_middle_stage(num_layers, plans)
    return np.where(stage == 0, 0.0, first_stage + (stage - 1) * middle)


# ---- derived sizes ---------------------------------------------------------------------------------------------

def data_parallel_size(plans: PlanArrays, num_gpus: int) -> np.ndarray:
    """dp = num_gpus / (tp·cp·pp); float, non-integral where the `world` rule fails."""
    return num_gpus / (plans.tp * plans.cp * plans.pp)


def expert_data_parallel_size(plans: PlanArrays, num_gpus: int) -> np.ndarray:
    """edp = num_gpus / (etp·ep·pp) (Megatron-Core expert-data-parallel group); float as above."""
    return num_gpus / (plans.etp * plans.ep * plans.pp)


def num_microbatches(plans: PlanArrays, num_gpus: int, global_batch_size: int) -> np.ndarray:
    """gbs / (dp·mbs) per pipeline per step; float, non-integral where the `batch` rule fails."""
    return global_batch_size / (data_parallel_size(plans, num_gpus) * plans.mbs)


def selective_modules(plans: PlanArrays) -> np.ndarray:
    """The RecomputeModule bits each plan recomputes: its modules with selective recompute (0 = core_attn only,
    Megatron's default), nothing otherwise."""
    modules = np.where(plans.recompute_modules == 0, DEFAULT_RECOMPUTE_MODULES, plans.recompute_modules)
    return np.where(plans.recompute == Recompute.SELECTIVE, modules, 0)


def recomputes_module(plans: PlanArrays, module: RecomputeModule) -> np.ndarray:
    return (selective_modules(plans) & int(module)) != 0
