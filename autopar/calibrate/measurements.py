"""Raw calibration measurements: what was timed, its median and spread, and the one strict reader of them.

A measurement keeps the median of repeated timed runs and the inter-quartile range (q1, q3), never a single run.
The YAML form (the `calibration.measurements` section of a calibrated profile, or a bare measurements file with a
top-level `measurements` key) is read back by `measurements_from_dict`, which refuses the whole file at the first
defect — a missing field, a non-number, a NaN or infinity, a negative time, an unknown collective — with one line
naming the file, the row and the field. A file is used entirely or not at all.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from costmodels.errors import InputError

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""Collectives timed, by the names `costmodels.comm.collective_time_s` takes.
Message size convention (as nccl-tests): all_reduce the buffer; all_gather the gathered output; reduce_scatter the
full input; all_to_all one rank's whole send buffer; send_recv the message."""

LINKS = ("nvlink", "ib")
"""Profile link names: `nvlink` is whatever connects ranks of one node, `ib` whatever connects nodes."""

LINK_DESCRIPTIONS = {"nvlink": "intra-node", "ib": "inter-node"}

GEMM_PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timed runs of one operation: median and inter-quartile range, in seconds."""

    median_s: float
    q1_s: float
    q3_s: float
    runs: int

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s


def summarise_times(samples_s: Sequence[float]) -> Timing:
    """Median and quartiles (inclusive method, so one sample gives q1 = median = q3) of timed runs."""
    assert samples_s, "summarise_times needs at least one timed run"
    values = sorted(float(x) for x in samples_s)
    if len(values) == 1:
        return Timing(values[0], values[0], values[0], 1)
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Timing(median_s=median, q1_s=q1, q3_s=q3, runs=len(values))


@dataclass(frozen=True)
class GemmMeasurement:
    """C[m, n] = A[m, k] @ B[k, n] in `precision`: 2·m·n·k FLOPs in `timing.median_s`."""

    precision: str
    m: int
    n: int
    k: int
    timing: Timing
    label: str = ""
    """Which GEMM of a transformer layer the shape stands for ('qkv h=4096 tp=2', ...)."""
    source: str = ""
    """Where the row comes from when it was not measured by `autopar calibrate` (a reference table's file name)."""
    kind: str = "gemm"
    """'gemm'; 'attention': a fused attention kernel (m queries × n keys × head dim k), timed as the equivalent GEMM
    of 2·m·n·k FLOPs at the kernel's rate (fits the attention curve of its kernel and pass); or 'grouped_gemm': one
    group (expert) of a grouped GEMM, the kernel's time over its groups (fits the grouped-GEMM roofline,
    costmodels.moe_kernels)."""
    attention_kernel: str = ""
    """For an attention row: the kernel (costmodels.compute.ATTENTION_KERNELS); '' = not named (the row then times
    forward + backward together and fits the kernel-less curve)."""
    attention_pass: str = ""
    """For an attention row with a kernel: 'fwd' or 'bwd' (the rate in that pass, FLOPs as the kernels' benchmarks
    count them: causal = the unmasked half, backward = 2.5× the forward)."""
    exposed_dispatches: float = 0.0
    """For an attention row: how many CPU dispatches of the timed call its time includes, per equivalent GEMM --
    1 / (equivalent GEMMs in one call) when the harness times a single call on an idle GPU, so the GPU waits while
    the host dispatches it (cudnn-frontend's SDPA training benchmark); 0 (the default) when the
    dispatch is hidden behind queued work, as in a training step. The attention fit then tells the harness's fixed
    per-call time apart from the kernel's rate (autopar.calibrate.fit.fit_attention_efficiency)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.timing.median_s


@dataclass(frozen=True)
class CollectiveMeasurement:
    """One collective of `bytes` over a group of `group_size` ranks on `link`."""

    link: str
    kind: str
    group_size: int
    bytes: int
    timing: Timing
    ranks_per_node: int = 1
    """For `ib` rows: ranks of the group on each node. 1 (what `autopar calibrate` measures: one rank per node, every
    local rank's group running at once) times the inter-node link alone; more times the whole hierarchical
    collective (NVLink inside each node + the link between nodes), as nccl-tests across nodes does."""
    source: str = ""
    """Where the row comes from when it was not measured by `autopar calibrate` (a reference table's file name)."""

    @property
    def group_size_on_link(self) -> int:
        """Ranks the link itself joins: the group for nvlink, the nodes for ib."""
        return self.group_size // self.ranks_per_node if self.link == "ib" else self.group_size


HOST_PATHS = ("aten_op", "aten_gemm", "triton_launch", "compiled_call", "cuda_graph_replay", "launch", "sync")
"""How a host measurement launched its kernels (costmodels.host.HOST_FIELDS, without the `_us`): what its time is
the host cost of. A `compiled_call` row times a whole call of a torch.compile'd function that launches `kernels`
Triton kernels; a `cuda_graph_replay` row one replay of a graph of `kernels` nodes; a `sync` row what one
device-to-host synchronisation adds to an op (synchronised time per op less the back-to-back time per op)."""


@dataclass(frozen=True)
class HostMeasurement:
    """Wall-clock host time per call of one launch path, on a call too small for its kernels to matter (tiny tensors,
    back-to-back calls with one synchronisation at the end: the host's enqueue rate)."""

    path: str
    timing: Timing
    kernels: int = 1
    """Kernels one call launches (graph nodes for a replay)."""
    label: str = ""
    source: str = ""


@dataclass(frozen=True)
class Measurements:
    """Everything one calibration run measured. Empty parts were not measured (the notes say why)."""

    gemm: tuple[GemmMeasurement, ...] = ()
    collectives: tuple[CollectiveMeasurement, ...] = ()
    memory_overheads_bytes: Mapping[str, float] = field(default_factory=dict)
    """Measured fixed per-GPU memory terms by the profile's names (cuda_context, nccl_buffers, ...)."""
    host: tuple[HostMeasurement, ...] = ()
    """Host costs per launch path (costmodels.host)."""

    def collectives_on(self, link: str) -> tuple[CollectiveMeasurement, ...]:
        return tuple(c for c in self.collectives if c.link == link)

    def gemm_in(self, precision: str) -> tuple[GemmMeasurement, ...]:
        return tuple(g for g in self.gemm if g.precision == precision)

    @property
    def links_measured(self) -> tuple[str, ...]:
        return tuple(link for link in LINKS if self.collectives_on(link))

    # ---- YAML form ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        gib = 1024.0**3
        return {
            "gemm": [{"precision": g.precision, "m": g.m, "n": g.n, "k": g.k, **_timing_dict(g.timing),
                      "tflops": round(g.achieved_flops_per_s / 1e12, 6), "label": g.label,
                      **({"source": g.source} if g.source else {}),
                      **({"kind": g.kind} if g.kind != "gemm" else {}),
                      **({"attention_kernel": g.attention_kernel, "attention_pass": g.attention_pass}
                         if g.attention_kernel else {}),
                      **({"exposed_dispatches": g.exposed_dispatches} if g.exposed_dispatches else {})}
                     for g in self.gemm],
            "collectives": [{"link": c.link, "kind": c.kind, "group_size": c.group_size, "bytes": c.bytes,
                             **_timing_dict(c.timing),
                             **({"ranks_per_node": c.ranks_per_node} if c.ranks_per_node != 1 else {}),
                             **({"source": c.source} if c.source else {})} for c in self.collectives],
            "memory_overheads_gib": {name: value / gib for name, value in self.memory_overheads_bytes.items()},
            **({"host": [{"path": h.path, "kernels": h.kernels, **_timing_dict(h.timing), "label": h.label,
                          **({"source": h.source} if h.source else {})} for h in self.host]} if self.host else {}),
        }


def _timing_dict(timing: Timing) -> dict[str, Any]:
    return {"median_s": timing.median_s, "q1_s": timing.q1_s, "q3_s": timing.q3_s, "runs": timing.runs}


# ---- strict reading ------------------------------------------------------------------------------------------------

def measurements_from_dict(data: Any, origin: str) -> Measurements:
    """Measurements from their YAML form; InputError('measurements', ...) naming file, row and field on any defect."""
    if not isinstance(data, dict):
        _fail(origin, "measurements", "must be a mapping with gemm, collectives and memory_overheads_gib")
    unknown = set(data) - {"gemm", "collectives", "memory_overheads_gib", "host"}
    if unknown:
        _fail(origin, "measurements", f"unknown section(s) {', '.join(sorted(map(str, unknown)))}; "
                                      "expected gemm, collectives, memory_overheads_gib, host")
    gemm_rows = _rows(data, "gemm", origin)
    collective_rows = _rows(data, "collectives", origin)
    gemm = tuple(_gemm_row(row, f"measurements.gemm[{i}]", origin) for i, row in enumerate(gemm_rows))
    collectives = tuple(_collective_row(row, f"measurements.collectives[{i}]", origin)
                        for i, row in enumerate(collective_rows))
    memory = data.get("memory_overheads_gib", {}) or {}
    if not isinstance(memory, dict):
        _fail(origin, "measurements.memory_overheads_gib", "must be a mapping of name -> GiB")
    memory_bytes = {str(name): _number(memory, name, "measurements.memory_overheads_gib", origin, allow_zero=True)
                    * 1024.0**3 for name in memory}
    host = tuple(_host_row(row, f"measurements.host[{i}]", origin) for i, row in enumerate(_rows(data, "host", origin)))
    if not gemm and not collectives and not memory_bytes and not host:
        _fail(origin, "measurements", "holds no measurement at all; run `autopar calibrate` again")
    return Measurements(gemm=gemm, collectives=collectives, memory_overheads_bytes=memory_bytes, host=host)


def _rows(data: dict, key: str, origin: str) -> list:
    rows = data.get(key, [])
    if rows is None:
        return []
    if not isinstance(rows, list):
        _fail(origin, f"measurements.{key}", "must be a list of rows")
    return rows


def _timing(row: dict, where: str, origin: str) -> Timing:
    median = _number(row, "median_s", where, origin)
    q1 = _number(row, "q1_s", where, origin)
    q3 = _number(row, "q3_s", where, origin)
    runs = _integer(row, "runs", where, origin)
    if not q1 <= median <= q3:
        _fail(origin, where, f"needs q1_s <= median_s <= q3_s, got {q1!r}, {median!r}, {q3!r}")
    return Timing(median_s=median, q1_s=q1, q3_s=q3, runs=runs)


def _gemm_row(row: Any, where: str, origin: str) -> GemmMeasurement:
    if not isinstance(row, dict):
        _fail(origin, where, "must be a mapping with precision, m, n, k, median_s, q1_s, q3_s, runs")
    precision = row.get("precision")
    if precision not in GEMM_PRECISIONS:
        _fail(origin, f"{where}.precision", f"must be one of {', '.join(GEMM_PRECISIONS)}, got {precision!r}")
    label = row.get("label", "")
    return GemmMeasurement(precision=precision, m=_integer(row, "m", where, origin),
                           n=_integer(row, "n", where, origin), k=_integer(row, "k", where, origin),
                           timing=_timing(row, where, origin),
                           label=label if isinstance(label, str) else str(label),
                           source=str(row.get("source", "") or ""), kind=_gemm_kind(row, where, origin, precision),
                           **_attention_kernel_and_pass(row, where, origin),
                           **_exposed_dispatches(row, where, origin))


GEMM_KINDS = ("gemm", "attention", "grouped_gemm")


def _gemm_kind(row: dict, where: str, origin: str, precision: str) -> str:
    kind = row.get("kind", "gemm")
    if kind not in GEMM_KINDS:
        _fail(origin, f"{where}.kind", f"must be one of {', '.join(GEMM_KINDS)}, got {kind!r}")
    if kind == "attention" and precision != "bf16":
        _fail(origin, f"{where}.precision", "must be bf16 for an attention row (the core runs in bf16)")
    return kind


def _attention_kernel_and_pass(row: dict, where: str, origin: str) -> dict[str, str]:
    from costmodels.compute import ATTENTION_KERNELS, ATTENTION_PASSES

    kernel, attention_pass = row.get("attention_kernel", ""), row.get("attention_pass", "")
    if not kernel and not attention_pass:
        return {}
    if row.get("kind") != "attention":
        _fail(origin, f"{where}.attention_kernel", "belongs to an attention row (kind: attention)")
    if kernel not in ATTENTION_KERNELS:
        _fail(origin, f"{where}.attention_kernel", f"must be one of {', '.join(ATTENTION_KERNELS)}, got {kernel!r}")
    if attention_pass not in ATTENTION_PASSES:
        _fail(origin, f"{where}.attention_pass", f"must be one of {', '.join(ATTENTION_PASSES)}, got "
                                                 f"{attention_pass!r}")
    return {"attention_kernel": kernel, "attention_pass": attention_pass}


def _exposed_dispatches(row: dict, where: str, origin: str) -> dict[str, float]:
    if "exposed_dispatches" not in row:
        return {}
    if row.get("kind") != "attention" or not row.get("attention_kernel"):
        _fail(origin, f"{where}.exposed_dispatches", "belongs to an attention row of a named kernel (kind: "
                                                      "attention, attention_kernel)")
    return {"exposed_dispatches": _number(row, "exposed_dispatches", where, origin, allow_zero=True)}


def _collective_row(row: Any, where: str, origin: str) -> CollectiveMeasurement:
    if not isinstance(row, dict):
        _fail(origin, where, "must be a mapping with link, kind, group_size, bytes, median_s, q1_s, q3_s, runs")
    link, kind = row.get("link"), row.get("kind")
    if link not in LINKS:
        _fail(origin, f"{where}.link", f"must be one of {', '.join(LINKS)}, got {link!r}")
    if kind not in COLLECTIVE_KINDS:
        _fail(origin, f"{where}.kind", f"must be one of {', '.join(COLLECTIVE_KINDS)}, got {kind!r}")
    group_size = _integer(row, "group_size", where, origin)
    if group_size < 2:
        _fail(origin, f"{where}.group_size", f"a collective needs at least 2 ranks, got {group_size}")
    ranks_per_node = _integer(row, "ranks_per_node", where, origin) if "ranks_per_node" in row else 1
    if ranks_per_node != 1 and (link != "ib" or group_size % ranks_per_node or group_size // ranks_per_node < 2):
        _fail(origin, f"{where}.ranks_per_node", f"must divide group_size {group_size} into two or more nodes on "
                                                 f"link ib, got {ranks_per_node} on {link}")
    return CollectiveMeasurement(link=link, kind=kind, group_size=group_size,
                                 bytes=_integer(row, "bytes", where, origin), timing=_timing(row, where, origin),
                                 ranks_per_node=ranks_per_node, source=str(row.get("source", "") or ""))


def _host_row(row: Any, where: str, origin: str) -> HostMeasurement:
    if not isinstance(row, dict):
        _fail(origin, where, "must be a mapping with path, kernels, median_s, q1_s, q3_s, runs")
    path = row.get("path")
    if path not in HOST_PATHS:
        _fail(origin, f"{where}.path", f"must be one of {', '.join(HOST_PATHS)}, got {path!r}")
    label = row.get("label", "")
    return HostMeasurement(path=path, timing=_timing(row, where, origin), kernels=_integer(row, "kernels", where, origin),
                           label=label if isinstance(label, str) else str(label),
                           source=str(row.get("source", "") or ""))


def _number(row: dict, key: str, where: str, origin: str, allow_zero: bool = False) -> float:
    if key not in row:
        _fail(origin, f"{where}.{key}", "is missing")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(origin, f"{where}.{key}", f"must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        _fail(origin, f"{where}.{key}", f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _integer(row: dict, key: str, where: str, origin: str) -> int:
    value = _number(row, key, where, origin)
    if not isinstance(row[key], int):
        _fail(origin, f"{where}.{key}", f"must be a whole number, got {row[key]!r}")
    return int(value)


def _fail(origin: str, where: str, message: str) -> None:
    raise InputError("measurements", f"{origin}: {where} {message}; fix or remove the file and calibrate again")
