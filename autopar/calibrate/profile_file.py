"""A calibrated hardware profile: bundled base profile + fitted values + raw measurements, written atomically.

The file is an ordinary profile (`costmodels/profiles/*.yaml` format) that `costmodels.hardware.load_profile`
reads, so `solve` / `estimate --profile FILE` use it like a bundled one. What calibration changes:

    compute.gemm_efficiency          fitted parameters of the cost model's GEMM-efficiency curve
    links.<link>.alpha_us            fitted alpha of the alpha–beta model, per measured link
    links.<link>.bandwidth_efficiency  fitted bandwidth / the spec-sheet (nominal) bandwidth, capped at 1
    collectives.<link>.<collective>  fitted (alpha, bus bandwidth) per group size measured (costmodels.comm)
    memory.overheads_gib.<name>      measured fixed memory terms (GPU runs)

Everything else (HBM, peak FLOP/s, nominal bandwidths, the links and overheads not measured) is the base
profile's, and `provenance` says so field by field. A CPU run (`autopar calibrate --allow-cpu`) is named
`cpu-<host>-calibrated`, never after the base GPU, and marked `device: cpu` in `calibration` and
`provenance`. The extra top-level section `calibration` (kept by the parser in
`HardwareProfile.extra`) holds where and when it was measured, what was not measured and why, the fit with its
residuals, and the raw measurements — enough to refit later (`autopar profile fit`) without rerunning anything.

Writing: the text is validated by the same parser that will read it, then written to a temporary file in the
target's directory, fsync'ed and renamed over the target (`os.replace`), so an interrupted run never leaves a
half-written profile.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from autopar.calibrate.calibration_section import CPU_DEVICE
from autopar.calibrate.fit import (CollectivePointFit, FitResult, attention_curves_measured, fit_attention_efficiency,
                                   fit_collective_points, fit_gemm_efficiency, fit_grouped_gemm, fit_host_costs,
                                   fit_link, fit_link_by_collective, host_row_parameters)
from autopar.calibrate.measurements import LINK_DESCRIPTIONS, LINKS, Measurements, measurements_from_dict
from costmodels.compute import attention_dispatch_parameter
from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile, bundled_profile_names, load_profile, parse_profile
from costmodels.units import GIB

CALIBRATION_FORMAT = 1


@dataclass(frozen=True)
class RunInfo:
    """Where, when and how the measurements were taken."""

    measured_at_utc: str
    """ISO 8601, e.g. 2026-11-29T10:40:12Z."""
    hostnames: tuple[str, ...]
    device_name: str
    """'NVIDIA H100 80GB HBM3', or 'cpu'."""
    world_size: int
    nodes: int
    ranks_per_node: int
    torch_version: str
    backend: str
    """'nccl', 'gloo', or 'none' for a single process."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """warm-up runs, timed runs, message sizes, --quick."""

    @property
    def device(self) -> str:
        """'cpu' for a CPU run (`autopar calibrate --allow-cpu`, device_name 'cpu'), else 'cuda'."""
        return CPU_DEVICE if self.device_name == CPU_DEVICE else "cuda"

    def to_dict(self) -> dict[str, Any]:
        return {"measured_at_utc": self.measured_at_utc, "hostnames": list(self.hostnames),
                "device": self.device, "device_name": self.device_name, "world_size": self.world_size,
                "nodes": self.nodes,
                "ranks_per_node": self.ranks_per_node, "torch_version": self.torch_version,
                "backend": self.backend, "settings": dict(self.settings)}


@dataclass(frozen=True)
class CalibrationFit:
    """The fit of every measured part; None / absent where nothing was measured."""

    gemm: FitResult | None
    links: Mapping[str, FitResult]
    links_by_collective: Mapping[str, Mapping[str, FitResult]]
    collective_points: tuple[CollectivePointFit, ...] = ()
    """Per link, collective and group size: the points of the profile's `collectives:` section."""
    attention: FitResult | None = None
    """The kernel-less fused-attention curve, where attention rows without a kernel were measured."""
    attention_curves: Mapping[tuple[str, str], FitResult] = field(default_factory=dict)
    """(kernel, pass) -> that kernel's curve in that pass, where rows of it were measured."""
    grouped: FitResult | None = None
    """The grouped expert-GEMM roofline, where grouped GEMMs were measured."""
    host: FitResult | None = None
    """The `host:` costs per launch path (µs), where host launches were measured."""


def fit_measurements(measurements: Measurements, base: HardwareProfile,
                     fixed_gemm: tuple[str, ...] = ()) -> CalibrationFit:
    """Fit the cost model's parameters to whatever was measured (`fixed_gemm`: curve parameters kept at the base's
    value, for measurements that do not determine them). The link-level fit (the fallback for collectives not
    measured) takes the rows that time one link alone; every row feeds the per-collective points."""
    gemm_rows = [row for row in measurements.gemm if row.precision in base.peak_flops_per_s and row.kind == "gemm"]
    gemm = fit_gemm_efficiency(gemm_rows, base, fixed=fixed_gemm) if gemm_rows else None
    attention_rows = [row for row in measurements.gemm if row.kind == "attention"]
    curves = {key: fit_attention_efficiency(attention_rows, base, *key)
              for key in attention_curves_measured(attention_rows)}
    attention = curves.pop(("", ""), None)
    grouped_rows = [row for row in measurements.gemm if row.kind == "grouped_gemm"]
    grouped = None
    if grouped_rows:  # on the GEMM curve just fitted: bf16 grouped GEMMs take its peak_fraction unless measured
        curve = dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, **gemm.params}) if gemm else base
        grouped = fit_grouped_gemm(grouped_rows, curve)
    single_link = {link: tuple(c for c in measurements.collectives_on(link) if c.ranks_per_node == 1)
                   for link in measurements.links_measured}
    links = {link: fit_link(rows, base.links[link]) for link, rows in single_link.items() if rows}
    by_collective = {link: fit_link_by_collective(rows, base.links[link]) for link, rows in single_link.items()
                     if rows}
    points = tuple(fit_collective_points(measurements.collectives, base)) if measurements.collectives else ()
    host = fit_host_costs(measurements.host, base) if measurements.host else None
    return CalibrationFit(gemm=gemm, links=links, links_by_collective=by_collective, collective_points=points,
                          attention=attention, attention_curves=curves, grouped=grouped, host=host)


# ---- the base profile -----------------------------------------------------------------------------------------------

def base_profile_for_device(device_name: str, memory_gib: float) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb': the GPU family in the name, the bundled size nearest the memory."""
    words = device_name.lower().replace("-", " ").split()
    candidates = []
    for name in bundled_profile_names():
        family, size = name.split("-")[0], name.split("-")[-1]
        if family in words and size.endswith("gb") and size[:-2].isdigit():
            candidates.append((abs(int(size[:-2]) - memory_gib), name))
    return min(candidates)[1] if candidates else None


# ---- building the profile ------------------------------------------------------------------------------------------

def build_profile_text(base_name: str, base_reason: str, measurements: Measurements, run: RunInfo,
                       notes: tuple[str, ...] = ()) -> tuple[str, CalibrationFit, tuple[str, ...]]:
    """The calibrated profile's YAML text, the fit, and every note (given + those the fit adds).

    The text is checked with `parse_profile` (and its measurements re-read strictly) before it is returned.
    """
    import yaml

    base = load_profile(base_name)
    data = yaml.safe_load(_bundled_yaml(base_name))
    fit = fit_measurements(measurements, base)
    notes = list(notes)
    stamp = f"autopar calibrate {run.measured_at_utc} on {_hosts(run)} ({run.device_name}, {run.backend})"
    provenance: dict[str, str] = dict(data.get("provenance", {}))
    on_cpu = run.device == CPU_DEVICE

    if on_cpu:  # named after the host, so nobody takes it for the GPU whose spec sheet filled the gaps
        data["name"] = cpu_profile_name(run.hostnames[0])
        data["display_name"] = (f"CPU run on {_hosts(run)} {run.measured_at_utc[:10]}, NOT a GPU "
                                f"(unmeasured values from {base.name})")
        provenance["device"] = (f"{CPU_DEVICE}: {stamp}; measured on a CPU, not a GPU — for testing the "
                                "calibration pipeline only")
    else:
        data["name"] = f"{base.name}-calibrated"
        data["display_name"] = f"{base.display_name}, calibrated {run.measured_at_utc[:10]} on {_hosts(run)}"
    data["aliases"] = []

    apply_fit(data, base, fit, measurements, stamp, provenance, notes)

    overheads = data["memory"]["overheads_gib"]
    for name, value_bytes in measurements.memory_overheads_bytes.items():
        if name in overheads:
            overheads[name] = _round(value_bytes / GIB)
    measured_overheads = sorted(set(measurements.memory_overheads_bytes) & set(overheads))
    if measured_overheads:
        kept = sorted(set(overheads) - set(measured_overheads))
        provenance["memory.overheads_gib"] = (f"{stamp}: measured {', '.join(measured_overheads)}"
                                              + (f"; {', '.join(kept)} from base profile {base.name}" if kept else ""))
    else:
        provenance["memory.overheads_gib"] = f"base profile {base.name} (not measured)"
    data["provenance"] = provenance

    data["calibration"] = {
        "format": CALIBRATION_FORMAT,
        "base_profile": base.name,
        "base_profile_reason": base_reason,
        **run.to_dict(),
        "notes": list(dict.fromkeys(notes)),
        "fit": _fit_dict(fit),
        "measurements": _flow_rows(measurements.to_dict()),
    }
    header = (f"# Calibrated hardware profile written by `autopar calibrate` ({run.measured_at_utc}).\n"
              f"# Base: bundled profile {base.name}; fitted and measured fields say so in `provenance`.\n"
              "# Raw measurements and fit residuals are under `calibration` (refit: autopar profile fit FILE).\n")
    text = header + yaml.dump(data, Dumper=profile_dumper(), sort_keys=False, width=120, allow_unicode=True)
    parse_profile(text, "calibrated profile")  # the reader must accept what we write: a failure here is a bug
    measurements_from_dict(yaml.safe_load(text)["calibration"]["measurements"], "calibrated profile")
    return text, fit, tuple(dict.fromkeys(notes))


def apply_fit(data: dict[str, Any], base: HardwareProfile, fit: CalibrationFit, measurements: Measurements,
              stamp: str, provenance: dict[str, str], notes: list[str], fixed_gemm: tuple[str, ...] = ()) -> None:
    """Write a fit into profile YAML data (compute.gemm_efficiency, links.*, collectives.*) with one provenance entry
    per key naming what fed it (`stamp`, and the rows' source files when they carry one); notes for what the
    measurements could not determine. Shared by `autopar calibrate` / `autopar profile fit` and the bundled
    profiles' fit to the public microbenchmarks (benchmarks/fit_microbench.py)."""
    gemm_rows = [row for row in measurements.gemm if row.precision in base.peak_flops_per_s and row.kind == "gemm"]
    if fit.gemm is not None:
        data["compute"]["gemm_efficiency"] = {**data["compute"]["gemm_efficiency"],
                                              **{name: _round(value) for name, value in fit.gemm.params.items()}}
        if fit.gemm.at_bound:
            notes.append(f"GEMM fit: {', '.join(fit.gemm.at_bound)} ran to the edge of its range "
                         "(the measured shapes do not pin it down)")
        precisions = sorted({row.precision for row in measurements.gemm if row.precision in base.peak_flops_per_s})
        provenance["compute.gemm_efficiency"] = (
            f"{stamp}: least squares over {fit.gemm.points} GEMMs ({', '.join(precisions)}){_from(gemm_rows)}, "
            f"rms residual {fit.gemm.rms_relative_residual:.1%}" + (f"; kept from {base.name}: "
                                                                   f"{', '.join(fixed_gemm)}" if fixed_gemm else "")
            + (f"; at the edge of its range (not pinned down by these shapes): {', '.join(fit.gemm.at_bound)}"
               if fit.gemm.at_bound else ""))
    else:
        notes.append(f"GEMMs not measured: compute.gemm_efficiency kept from base profile {base.name}")
        provenance["compute.gemm_efficiency"] = f"base profile {base.name} (not measured)"

    if fit.attention is not None:
        attention_rows = [row for row in measurements.gemm if row.kind == "attention" and not row.attention_kernel]
        data["compute"]["gemm_efficiency"].update({name: _round(value) for name, value in fit.attention.params.items()})
        provenance["compute.gemm_efficiency.attention"] = (
            f"{stamp}: least squares over {fit.attention.points} fused-attention kernels{_from(attention_rows)}, "
            f"rms residual {fit.attention.rms_relative_residual:.1%}")
    for (kernel, attention_pass), result in fit.attention_curves.items():
        curve_rows = [row for row in measurements.gemm if row.kind == "attention"
                      and (row.attention_kernel, row.attention_pass) == (kernel, attention_pass)]
        data["compute"]["gemm_efficiency"].update({name: _round(value) for name, value in result.params.items()})
        dispatch_name = attention_dispatch_parameter(kernel, attention_pass)
        dispatch_us = result.params.get(dispatch_name)
        dispatch = ("" if dispatch_us is None else
                    "; no host dispatch in the benchmark's times (the fit ran to its lower bound)"
                    if dispatch_name in result.at_bound else
                    f"; the host dispatch in the benchmark's times, {dispatch_us:.1f} µs per call as these rows carry it "
                    "(scaled with them where carried from another GPU), fitted with it and priced in "
                    "no step (costmodels.compute.attention_dispatch_parameter)")
        provenance[f"compute.gemm_efficiency.attention_{kernel}_{attention_pass}"] = (
            f"{stamp}: least squares over {result.points} {kernel} {attention_pass} attention kernels"
            f"{_from(curve_rows)}, rms residual {result.rms_relative_residual:.1%}{dispatch}")

    if fit.grouped is not None:
        grouped_rows = [row for row in measurements.gemm if row.kind == "grouped_gemm"]
        data["compute"]["gemm_efficiency"].update({name: _round(value) for name, value in fit.grouped.params.items()})
        provenance["compute.gemm_efficiency.grouped"] = (
            f"{stamp}: {', '.join(fit.grouped.params)} by least squares over {fit.grouped.points} grouped expert "
            f"GEMMs{_from(grouped_rows)}, roofline of costmodels.moe_kernels, rms residual "
            f"{fit.grouped.rms_relative_residual:.1%}")

    if fit.host is not None:
        host_rows = measurements.host
        data["host"] = {**(data.get("host") or {}), **{name: _round(value, 4) for name, value in fit.host.params.items()}}
        residuals = dict(zip(host_rows, fit.host.relative_residuals))
        for name in fit.host.params:
            feeding = [row for row in host_rows if name in host_row_parameters(row)]
            paths = ", ".join(sorted({row.path for row in feeding}))
            rms = math.sqrt(sum(residuals[row] ** 2 for row in feeding) / len(feeding))
            provenance[f"host.{name}"] = (
                f"{stamp}: least squares over {len(feeding)} host launches ({paths}){_from(feeding)}, rms residual "
                f"{rms:.1%}; a property of the host (CPU, Python, PyTorch, driver), not of the GPU")

    for link in LINKS:
        where = f"links.{link}"
        if link in fit.links:
            result = fit.links[link]
            described = f"{LINK_DESCRIPTIONS[link]} link ({link})"
            link_rows = [c for c in measurements.collectives_on(link) if c.ranks_per_node == 1]
            group_sizes = sorted({c.group_size for c in link_rows})
            kinds = sorted({c.kind for c in link_rows})
            text = (f"{stamp}: alpha-beta least squares over {result.points} collectives "
                    f"({', '.join(kinds)}; group sizes {', '.join(map(str, group_sizes))}){_from(link_rows)}, "
                    f"rms residual {result.rms_relative_residual:.1%}")
            if "bandwidth_bytes_per_s" in result.at_bound:
                largest = max(c.bytes for c in link_rows)
                notes.append(f"{described}: bandwidth not determined — every message up to {largest} bytes took "
                             "about alpha (raise --max-bytes); bandwidth_efficiency kept from the base profile")
                provenance[f"{where}.bandwidth_efficiency"] = f"base profile {base.name} (measurement inconclusive)"
            else:
                nominal = base.links[link].nominal_bandwidth_bytes_per_s
                efficiency = result.params["bandwidth_bytes_per_s"] / nominal
                if efficiency > 1.0:
                    notes.append(f"{described}: fitted bandwidth {result.params['bandwidth_bytes_per_s'] / 1e9:.1f} "
                                 f"GB/s exceeds the spec {nominal / 1e9:.1f} GB/s of {base.name}; "
                                 "bandwidth_efficiency capped at 1.0 (is --base-gpu right?)")
                    efficiency = 1.0
                data["links"][link]["bandwidth_efficiency"] = _round(efficiency)
                provenance[f"{where}.bandwidth_efficiency"] = text
            if "alpha_s" in result.at_bound and result.params["alpha_s"] > 1.0:
                notes.append(f"{described}: alpha not determined (fit ran to its 10 s bound); kept from the base "
                             "profile")
                provenance[f"{where}.alpha_us"] = f"base profile {base.name} (measurement inconclusive)"
            else:
                data["links"][link]["alpha_us"] = _round(result.params["alpha_s"] * 1e6)
                provenance[f"{where}.alpha_us"] = text
        else:
            for key in (f"{where}.bandwidth_efficiency", f"{where}.alpha_us"):
                earlier = provenance.get(key, "")
                if not earlier.startswith("base profile"):  # say where the base's value came from, once
                    provenance[key] = f"base profile {base.name} (not measured)" + (f": {earlier}" if earlier else "")

    points_by_key: dict[tuple[str, str], list[CollectivePointFit]] = {}
    for point_fit in fit.collective_points:
        points_by_key.setdefault((point_fit.link, point_fit.kind), []).append(point_fit)
    for (link, kind), point_fits in points_by_key.items():
        section = data.setdefault("collectives", {}).setdefault(link, {})
        regimes = {group: [p for p in section.get(kind, []) or [] if int(p["group_size"]) == group]
                   for group in {int(p["group_size"]) for p in section.get(kind, []) or []}}
        for point_fit in point_fits:
            regimes[point_fit.group_size] = [{"group_size": p.group_size, "alpha_us": _round(p.alpha_s * 1e6, 4),
                                              "busbw_gb_per_s": _round(p.bus_bandwidth_bytes_per_s / 1e9, 4)}
                                             for p in point_fit.regimes]
        section[kind] = [FlowRow(p) for group in sorted(regimes) for p in regimes[group]]
        described = []
        for point_fit in point_fits:
            unit = "nodes" if link == "ib" else "GPUs"
            kept = [name for name in ("alpha", "bandwidth") if name not in point_fit.fitted]
            sizes = [r.bytes for r in point_fit.rows]
            described.append(f"{point_fit.group_size} {unit}: {len(point_fit.regimes)} regime(s) over "
                             f"{point_fit.result.points} sizes {_size(min(sizes))}..{_size(max(sizes))}"
                             f"{_from(point_fit.rows)}, rms {point_fit.result.rms_relative_residual:.1%}, "
                             f"max {point_fit.result.max_relative_residual:.1%}"
                             + (f" ({' and '.join(kept)} not determined by these sizes: base value)" if kept else ""))
        provenance[f"collectives.{link}.{kind}"] = (f"{stamp}: (alpha, bus bandwidth) least squares, fastest regime "
                                                    "per size; " + "; ".join(described))


def _from(rows) -> str:
    """' from a.csv, b.csv' when rows carry their source, else ''."""
    sources = list(dict.fromkeys(row.source for row in rows if row.source))
    return f" from {', '.join(sources)}" if sources else ""


def _size(bytes_: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if bytes_ >= scale:
            return f"{bytes_ / scale:.3g} {unit}"
    return f"{bytes_} B"


def _fit_dict(fit: CalibrationFit) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if fit.gemm is not None:
        out["gemm_efficiency"] = {"params": {k: _round(v) for k, v in fit.gemm.params.items()}, **fit.gemm.summary()}
    links: dict[str, Any] = {}
    for link, result in fit.links.items():
        links[link] = {
            "alpha_us": _round(result.params["alpha_s"] * 1e6),
            "bandwidth_gb_per_s": _round(result.params["bandwidth_bytes_per_s"] / 1e9),
            **result.summary(),
            "by_collective": {kind: {"alpha_us": _round(r.params["alpha_s"] * 1e6),
                                     "bandwidth_gb_per_s": _round(r.params["bandwidth_bytes_per_s"] / 1e9),
                                     **r.summary()}
                              for kind, r in fit.links_by_collective.get(link, {}).items()},
        }
    if links:
        out["links"] = links
    if fit.host is not None:
        out["host"] = {"params": {k: _round(v, 4) for k, v in fit.host.params.items()}, **fit.host.summary()}
    return out


def cpu_profile_name(hostname: str) -> str:
    """'cpu-<host>-calibrated', the host in lower-case letters, digits and dashes ('Build.Box_1' -> 'build-box-1')."""
    host = re.sub(r"[^a-z0-9]+", "-", hostname.lower()).strip("-") or "host"
    return f"{CPU_DEVICE}-{host}-calibrated"


def _hosts(run: RunInfo) -> str:
    hosts = list(dict.fromkeys(run.hostnames))
    return hosts[0] if len(hosts) == 1 else f"{hosts[0]} and {len(hosts) - 1} more host(s)"


def _round(value: float, digits: int = 6) -> float:
    """`digits` significant digits: enough for a fit, short in YAML."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) and value != 0 else float(value)


def _bundled_yaml(name: str) -> str:
    from importlib import resources

    return (resources.files("costmodels") / "profiles" / f"{name}.yaml").read_text(encoding="utf-8")


class FlowRow(dict):
    """A measurement row or a collective regime: written on one line in YAML."""


def _flow_rows(measurements: dict[str, Any]) -> dict[str, Any]:
    rounded = copy.deepcopy(measurements)
    for section in ("gemm", "collectives"):
        rounded[section] = [FlowRow({k: _round(v) if isinstance(v, float) else v for k, v in row.items()})
                            for row in rounded[section]]
    rounded["memory_overheads_gib"] = {k: _round(v) for k, v in rounded["memory_overheads_gib"].items()}
    return rounded


def profile_dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # the reader refuses aliases (costmodels.hardware)
            return True

    Dumper.add_representer(FlowRow, lambda dumper, row: dumper.represent_mapping(
        "tag:yaml.org,2002:map", row.items(), flow_style=True))
    return Dumper


# ---- writing -----------------------------------------------------------------------------------------------------

def check_output_path(path: str | Path) -> Path:
    """The profile's target: its directory must exist and be writable (checked before minutes of benchmarks)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.suffix not in (".yaml", ".yml"):
        raise InputError("out", f"{str(target)!r} must end in .yaml or .yml (profiles are YAML)")
    if not directory.is_dir():
        raise InputError("out", f"directory {str(directory)!r} does not exist; create it or choose another --out")
    if not os.access(directory, os.W_OK):
        raise InputError("out", f"directory {str(directory)!r} is not writable; choose another --out")
    if target.is_dir():
        raise InputError("out", f"{str(target)!r} is a directory; give a file name")
    from autopar.atomic_write import check_writable

    return check_writable(target)


def write_atomically(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never a part
    (autopar.atomic_write, the one writer of every autopar file)."""
    from autopar.atomic_write import write_text_atomically

    write_text_atomically(path, text)
