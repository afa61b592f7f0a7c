"""`autopar profile show`: what a (calibrated) profile says, against the bundled profile of the same GPU.

The comparison is in the terms a reader plans with: achieved link bandwidth against the spec sheet and against
what the bundled profile assumes ("inter-node bandwidth 38% below spec"), alpha, the GEMM-efficiency parameters
and the efficiency they give on two typical shapes ("GEMM peak fraction 0.71 vs bundled 0.75"), memory overheads,
plus where/when it was measured, the fit residuals and what was not measured.
"""

from __future__ import annotations

from typing import Any

from autopar.calibrate.calibration_section import CalibrationSection, read_calibration_section
from autopar.calibrate.measurements import LINK_DESCRIPTIONS, LINKS
from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile, load_profile, resolve_gpu_name
from costmodels.units import GIB

REFERENCE_GEMMS = ((8192, 8192, 8192, "square 8192"), (4096, 8192, 1024, "4096 tokens, h=8192, tp=8 (attention out)"))
"""(m, n, k, label): a large square GEMM and a thin tensor-parallel one."""


def bundled_counterpart(profile: HardwareProfile, section: CalibrationSection | None,
                        runs_section: "dict[str, Any] | None" = None) -> HardwareProfile | None:
    """The bundled profile to compare with: the calibration's (or the fit to runs') base, else one the profile's
    name resolves to."""
    candidates = [section.base_profile] if section is not None else []
    candidates += [runs_section["base_profile"]] if runs_section is not None else []
    candidates += [profile.name, profile.name.removesuffix("-calibrated"), *profile.aliases]
    for candidate in candidates:
        try:
            return load_profile(resolve_gpu_name(candidate))
        except InputError:
            continue
    return None


def summarise(profile: HardwareProfile, against: str | None = None) -> dict[str, Any]:
    """JSON-ready summary (base units) with the human-readable `lines` the text view prints."""
    from autopar.calibrate.runs_profile import read_runs_section, runs_section_lines

    section = read_calibration_section(profile)
    runs_section = read_runs_section(profile)
    bundled = load_profile(resolve_gpu_name(against)) if against else \
        bundled_counterpart(profile, section, runs_section)
    measured_links = set(section.measurements.links_measured) if section else set()
    summary: dict[str, Any] = {
        "file": profile.source_path, "name": profile.name, "display_name": profile.display_name,
        "calibrated": section is not None, "compared_with": bundled.name if bundled else None,
        "measured_on_cpu": section is not None and section.measured_on_cpu,
    }
    lines: list[str] = []
    if summary["measured_on_cpu"]:
        lines.append(f"WARNING: measured on CPU (host {section.run['hostnames'][0]}), not a GPU: GEMM efficiency and "
                     "link speeds describe that CPU; for testing the calibration pipeline only "
                     "(solve/estimate/explain --profile refuse it without --allow-cpu-profile)")
    if section is not None:
        run = section.run
        summary["calibration"] = {"base_profile": section.base_profile,
                                  "base_profile_reason": section.base_profile_reason,
                                  "measured_at_utc": section.measured_at_utc, **run,
                                  "gemm_measurements": len(section.measurements.gemm),
                                  "collective_measurements": len(section.measurements.collectives)}
        hosts = sorted(set(run["hostnames"]))
        lines.append(f"measured {section.measured_at_utc} on {', '.join(hosts[:3])}"
                     f"{' …' if len(hosts) > 3 else ''}: {run['world_size']} rank(s), {run['nodes']} node(s) × "
                     f"{run['ranks_per_node']}, device {run['device_name']}, torch {run['torch_version']}, "
                     f"backend {run['backend']}")
        lines.append(f"base profile {section.base_profile} ({section.base_profile_reason})")
    elif runs_section is not None:
        summary["fitted_to_runs"] = {key: runs_section[key] for key in (
            "base_profile", "fitted_at_utc", "files", "mape_bundled", "mape_fitted", "mape_leave_one_out",
            "parameters", "warnings") if key in runs_section}
        lines += runs_section_lines(runs_section)
    else:
        lines.append("not a calibrated profile (no calibration section): spec-sheet and initial values")
    if bundled is not None:
        lines.append(f"compared with bundled profile {bundled.name} ({bundled.display_name})")
    else:
        lines.append("no bundled profile of this GPU to compare with")

    summary["compute"] = _compute(profile, bundled, section, lines)
    summary["links"] = {link: _link(profile, bundled, link, link in measured_links, section, lines) for link in LINKS}
    summary["collectives"] = _collectives(profile, bundled, lines)
    summary["elementwise"] = _elementwise(profile, bundled, lines)
    summary["memory_overheads"] = _memory(profile, bundled, section, lines)
    summary["notes"] = list(section.notes) if section else []
    summary["lines"] = lines
    return summary


def _change(value: float, reference: float) -> str:
    """' (+21%)', or ' (×0.00055)' when the two are an order of magnitude apart."""
    if reference == 0:
        return ""
    ratio = value / reference
    return f" (×{ratio:.2g})" if not 0.1 <= ratio <= 10 else f" ({ratio - 1.0:+.0%})"


def _compute(profile: HardwareProfile, bundled: HardwareProfile | None, section: CalibrationSection | None,
             lines: list[str]) -> dict[str, Any]:
    from costmodels.compute import gemm_efficiency

    measured = section is not None and bool(section.measurements.gemm)
    out: dict[str, Any] = {"peak_flops_per_s": dict(profile.peak_flops_per_s), "measured": measured,
                           "gemm_efficiency": {}, "efficiency_at": []}
    peaks = ", ".join(f"{p} {v / 1e12:g}" for p, v in profile.peak_flops_per_s.items())
    if measured:
        counts = {p: len(section.measurements.gemm_in(p)) for p in profile.peak_flops_per_s}
        source = "fitted to measured GEMMs: " + ", ".join(
            f"{p} {n}" if n else f"{p} not measured (its parameters are the base profile's)" for p, n in counts.items())
    else:
        source = "not measured"
    lines.append(f"compute: dense peak TFLOP/s {peaks} (spec sheet); GEMM efficiency {source}")
    for name, value in profile.gemm_efficiency.items():
        reference = bundled.gemm_efficiency.get(name) if bundled else None
        out["gemm_efficiency"][name] = {"value": value, "bundled": reference}
        text = f"  GEMM {name.replace('_', ' ')} {value:.3g}"
        if reference is not None:
            text += f" vs bundled {reference:.3g}{_change(value, reference)}"
        lines.append(text)
    for m, n, k, label in REFERENCE_GEMMS:
        value = float(gemm_efficiency(profile, m, n, k, "bf16"))
        reference = float(gemm_efficiency(bundled, m, n, k, "bf16")) if bundled else None
        out["efficiency_at"].append({"m": m, "n": n, "k": k, "label": label, "value": value, "bundled": reference})
        text = f"  GEMM efficiency at {m}×{n}×{k} ({label}), bf16: {value:.3g}"
        if reference is not None:
            text += f" vs bundled {reference:.3g}"
        lines.append(text + f" = {value * profile.peak_flops_per_s['bf16'] / 1e12:.4g} TFLOP/s")
    fit = section.fit.get("gemm_efficiency") if section else None
    if fit:
        out["fit"] = fit
        lines.append(f"  fit: {fit.get('points')} GEMMs, relative residual rms "
                     f"{fit.get('rms_relative_residual', 0):.1%}, max {fit.get('max_relative_residual', 0):.1%}")
    return out


def _link(profile: HardwareProfile, bundled: HardwareProfile | None, link: str, measured: bool,
          section: CalibrationSection | None, lines: list[str]) -> dict[str, Any]:
    spec = profile.links[link]
    reference = bundled.links[link] if bundled else None
    description = f"{LINK_DESCRIPTIONS[link]} ({link})"
    fraction = spec.bandwidth_bytes_per_s / spec.nominal_bandwidth_bytes_per_s
    out: dict[str, Any] = {"measured": measured, "bandwidth_bytes_per_s": spec.bandwidth_bytes_per_s,
                           "nominal_bandwidth_bytes_per_s": spec.nominal_bandwidth_bytes_per_s,
                           "fraction_of_spec": fraction, "alpha_s": spec.alpha_s,
                           "bundled_bandwidth_bytes_per_s": reference.bandwidth_bytes_per_s if reference else None,
                           "bundled_alpha_s": reference.alpha_s if reference else None}
    if not measured:
        lines.append(f"{description}: not measured; {spec.bandwidth_bytes_per_s / 1e9:.1f} GB/s per GPU "
                     f"({fraction:.0%} of spec {spec.nominal_bandwidth_bytes_per_s / 1e9:.1f} GB/s), alpha "
                     f"{spec.alpha_s * 1e6:.1f} µs"
                     + (" (base profile values)" if section else ""))
        return out
    relation = (f"{1 - fraction:.0%} below spec" if 0.01 <= fraction < 1 else
                f"only {fraction:.2%} of spec" if fraction < 0.01 else "at spec")
    text = (f"{description} bandwidth {spec.bandwidth_bytes_per_s / 1e9:.3g} GB/s per GPU per direction: {relation} "
            f"{spec.nominal_bandwidth_bytes_per_s / 1e9:.3g} GB/s")
    if reference is not None:
        text += (f" (bundled assumes {reference.bandwidth_bytes_per_s / 1e9:.3g} GB/s, "
                 f"{reference.bandwidth_bytes_per_s / reference.nominal_bandwidth_bytes_per_s:.0%} of spec)")
    lines.append(text)
    alpha_text = f"  alpha {spec.alpha_s * 1e6:.3g} µs"
    if reference is not None:
        alpha_text += f" vs bundled {reference.alpha_s * 1e6:.3g} µs{_change(spec.alpha_s, reference.alpha_s)}"
    lines.append(alpha_text)
    fit = (section.fit.get("links") or {}).get(link) if section else None
    if fit:
        out["fit"] = fit
        lines.append(f"  fit: {fit.get('points')} collectives, relative residual rms "
                     f"{fit.get('rms_relative_residual', 0):.1%}, max {fit.get('max_relative_residual', 0):.1%}")
        for kind, per_kind in (fit.get("by_collective") or {}).items():
            lines.append(f"    {kind}: alpha {per_kind.get('alpha_us', 0):.3g} µs, "
                         f"{per_kind.get('bandwidth_gb_per_s', 0):.3g} GB/s, rms residual "
                         f"{per_kind.get('rms_relative_residual', 0):.1%}")
    return out


REFERENCE_MESSAGES = ((1024**2, "1 MiB"), (64 * 1024**2, "64 MiB"), (1024**3, "1 GiB"))
"""Message sizes at which `profile show` prices each measured collective."""


def _collectives(profile: HardwareProfile, bundled: HardwareProfile | None, lines: list[str]) -> dict[str, Any]:
    """Each per-collective entry (section `collectives:`) priced at REFERENCE_MESSAGES, against the bundled profile."""
    from costmodels.comm import link_collective_time_s

    out: dict[str, Any] = {}
    for link, kinds in profile.collectives.items():
        for kind, points in kinds.items():
            for group in sorted({p.group_size for p in points}):
                unit = "nodes" if link == "ib" else "GPUs"
                entry = []
                texts = []
                for bytes_, label in REFERENCE_MESSAGES:
                    time_s = float(link_collective_time_s(profile, link, kind, bytes_, group))
                    reference = (float(link_collective_time_s(bundled, link, kind, bytes_, group))
                                 if bundled is not None else None)
                    entry.append({"bytes": bytes_, "time_s": time_s, "bundled_time_s": reference})
                    texts.append(f"{label} {time_s * 1e6:.4g} µs"
                                 + (f" (bundled {reference * 1e6:.4g})" if reference is not None else ""))
                out.setdefault(link, {}).setdefault(kind, {})[group] = entry
                regimes = sum(p.group_size == group for p in points)
                lines.append(f"{LINK_DESCRIPTIONS[link]} ({link}) {kind} over {group} {unit} "
                             f"({regimes} regime{'s' if regimes > 1 else ''}): " + ", ".join(texts))
    return out


def _memory(profile: HardwareProfile, bundled: HardwareProfile | None, section: CalibrationSection | None,
            lines: list[str]) -> dict[str, Any]:
    measured = dict(section.measurements.memory_overheads_bytes) if section else {}
    out: dict[str, Any] = {}
    parts = []
    for name, value in profile.memory_overheads_bytes.items():
        reference = bundled.memory_overheads_bytes.get(name) if bundled else None
        out[name] = {"value_bytes": value, "bundled_bytes": reference, "measured": name in measured}
        text = f"{name} {value / GIB:.3g} GiB ({'measured' if name in measured else 'not measured'}"
        if reference is not None:
            text += f", bundled {reference / GIB:.3g} GiB"
        parts.append(text + ")")
    for name, value in measured.items():
        if name not in profile.memory_overheads_bytes:
            out[name] = {"value_bytes": value, "bundled_bytes": None, "measured": True, "in_profile": False}
            parts.append(f"{name} {value / GIB:.3g} GiB (measured, not a profile term)")
    lines.append("memory overheads: " + "; ".join(parts))
    return out


def _elementwise(profile: HardwareProfile, bundled: HardwareProfile | None, lines: list[str]) -> dict[str, Any]:
    from costmodels.compute import elementwise_traffic_factor

    value = elementwise_traffic_factor(profile)
    reference = elementwise_traffic_factor(bundled) if bundled else None
    text = f"elementwise traffic {value:.4g} HBM bytes per stored activation byte"
    if reference is not None:
        text += f" vs bundled {reference:.4g}{_change(value, reference)}"
    lines.append(text)
    return {"traffic_per_activation_byte": value, "bundled": reference}


def render_text(summary: dict[str, Any]) -> str:
    head = f"profile {summary['name']} — {summary['display_name']}\nfile {summary['file']}"
    body = "\n".join(summary["lines"])
    notes = "".join(f"\nnote: {note}" for note in summary["notes"])
    return f"{head}\n{body}{notes}\n"
