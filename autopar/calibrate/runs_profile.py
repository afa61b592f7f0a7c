"""The profile `autopar calibrate --from-runs` writes: the bundled profile with the fitted values, each changed value's
before/after and the runs it came from in `provenance`, and a `calibration_from_runs` section with the fit's
residuals per run, its leave-one-out error and its warnings.

The file is an ordinary profile (costmodels/profiles/*.yaml format): `solve` / `estimate --profile FILE` rank with
it, `autopar profile show FILE` compares it with the bundled profile it started from. Its name is
`<base>-fitted-to-runs`, never the bundled GPU's, and it has no aliases.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Mapping, Sequence

from autopar.calibrate.from_runs import TEXT_SECTION, FREE_PARAMETERS, RunsFit
from autopar.calibrate.profile_file import FlowRow, _bundled_yaml, _round, profile_dumper

SECTION_FORMAT = 1
NAME_SUFFIX = "-fitted-to-runs"


def bundled_profile_data(name: str) -> dict[str, Any]:
    """The YAML data of a bundled profile (by its resolved name)."""
    import yaml

    return yaml.safe_load(_bundled_yaml(name))


def fitted_profile_text(fit: RunsFit, base_data: Mapping[str, Any], files: Sequence[str],
                        when: "str | None" = None) -> str:
    """The fitted profile's YAML text, checked by the parser that will read it."""
    import copy

    import yaml

    from costmodels.hardware import parse_profile

    when = when or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = copy.deepcopy(dict(base_data))
    base = fit.base
    data["name"] = f"{base.name}{NAME_SUFFIX}"
    data["display_name"] = f"{base.display_name}, fitted to {len(fit.residuals)} measured runs {when[:10]}"
    data["aliases"] = []
    provenance: dict[str, str] = dict(data.get("provenance", {}))
    sources = _sources(fit)
    stamp = f"autopar calibrate --from-runs {when}"
    by_parameter = {q.parameter.name: q for q in fit.parameters}
    grouped: dict[str, list[tuple[str, float, float]]] = {}
    for path, (before, after) in fit.changes.items():
        _set_value(data, path, _round(after))
        grouped.setdefault(_provenance_key(path), []).append((path, before, after))
    for key, changes in grouped.items():
        q = by_parameter[_parameter_of(changes[0][0])]
        values = "; ".join(f"{_round(before)} -> {_round(after)}" if len(changes) == 1 else
                           f"{path.rpartition('.')[0].rpartition('.')[2]}: {_round(before)} -> {_round(after)}"
                           for path, before, after in changes)
        earlier = provenance.get(key, "")
        provenance[key] = (
            f"{stamp}: {q.parameter.name} scaled ×{q.scale:.4g} ({values}) by a regularised fit to "
            f"{q.runs_exercising} measured runs ({sources}); prior: {base.name}'s value, width "
            f"{q.parameter.prior_sigma:.0%}; the runs' information {q.information_ratio:.3g}× the prior's"
            + (f"; before: {earlier}" if earlier else ""))
    for link, kinds in (data.get("collectives") or {}).items():
        for kind, points in (kinds or {}).items():
            kinds[kind] = [FlowRow(point) for point in points or []]
    data["provenance"] = provenance
    data[TEXT_SECTION] = section_data(fit, files, when)
    header = (f"# Hardware profile fitted to measured runs by `autopar calibrate --from-runs` ({when}).\n"
              f"# Base: bundled profile {base.name}; every changed value says so in `provenance` (before -> after).\n"
              f"# Residuals per run, leave-one-out error and warnings: section `{TEXT_SECTION}`.\n")
    text = header + yaml.dump(data, Dumper=profile_dumper(), sort_keys=False, width=120, allow_unicode=True)
    parse_profile(text, "fitted profile")   # the reader must accept what we write: a failure here is a bug
    return text


def section_data(fit: RunsFit, files: Sequence[str], when: str) -> dict[str, Any]:
    """The `calibration_from_runs` section: what was fitted, to what, and how well."""
    return {
        "format": SECTION_FORMAT,
        "base_profile": fit.base.name,
        "fitted_at_utc": when,
        "files": list(files),
        "runs": len(fit.residuals),
        "model_evaluations": fit.model_evaluations,
        "fit_seconds": round(fit.elapsed_s, 3),
        "mape_bundled": _round(fit.mape("prior_s"), 4),
        "mape_fitted": _round(fit.mape("fitted_s"), 4),
        "mape_leave_one_out": _round(fit.mape("leave_one_out_s"), 4),
        "adopted": fit.adopted,
        "rms_leave_one_out_fit": _round(fit.leave_one_out_check[0], 4),
        "rms_bundled": _round(fit.leave_one_out_check[1], 4),
        "parameters": [FlowRow({"name": q.parameter.name, "scale": _round(q.scale, 5), "status": q.status,
                                "information_ratio": _round(q.information_ratio, 4),
                                "runs_exercising": q.runs_exercising, "prior_sigma": q.parameter.prior_sigma})
                       for q in fit.parameters],
        "not_fitted": list(fit.skipped),
        "warnings": list(fit.warnings),
        "residuals": [FlowRow({"run": f"{r.run.source} {r.run.run_id}", "label": r.run.label,
                               "plan": r.plan.short(), "measured_s": _round(r.measured_s, 6),
                               "bundled_s": _round(r.prior_s, 6), "fitted_s": _round(r.fitted_s, 6),
                               "leave_one_out_s": _round(r.leave_one_out_s, 6),
                               "fitted_error": _round(r.error(r.fitted_s), 4)})
                      for r in fit.residuals],
    }


def _sources(fit: RunsFit) -> str:
    counts = Counter(r.run.source for r in fit.residuals)
    return ", ".join(f"{source} ({n})" for source, n in counts.items())


def _parameter_of(path: str) -> str:
    import fnmatch

    for parameter in FREE_PARAMETERS:
        for pattern in parameter.paths:
            if fnmatch.fnmatchcase(_plain(path), pattern):
                return parameter.name
    raise AssertionError(f"{path} belongs to no parameter")


def _plain(path: str) -> str:
    """'collectives.ib.all_reduce[0].busbw_gb_per_s' -> 'collectives.ib.all_reduce.busbw_gb_per_s'."""
    import re

    return re.sub(r"\[\d+\]", "", path)


def _provenance_key(path: str) -> str:
    """The provenance entry of a value: the path itself; a collective point's is its collective's entry."""
    plain = _plain(path)
    return plain.rpartition(".")[0] if plain.startswith("collectives.") else plain


def _set_value(data: dict, path: str, value: float) -> None:
    from autopar.calibrate.from_runs import _set

    _set(data, path, value)


def read_runs_section(profile: Any) -> "dict[str, Any] | None":
    """A fitted profile's `calibration_from_runs` section, checked (None when the profile has none); InputError
    naming the file and the field when it is damaged."""
    data = profile.extra.get(TEXT_SECTION)
    if data is None:
        return None

    from costmodels.errors import InputError

    def fail(where: str, message: str) -> InputError:
        return InputError("profile", f"{profile.source_path}: {TEXT_SECTION}.{where} {message}; fix the file or fit "
                                     "again")

    if not isinstance(data, dict):
        raise fail("", "must be a mapping")
    if data.get("format") != SECTION_FORMAT:
        raise fail("format", f"must be {SECTION_FORMAT}, got {data.get('format')!r}")
    if not isinstance(data.get("base_profile"), str):
        raise fail("base_profile", "must be the name of a bundled profile")
    for key in ("mape_bundled", "mape_fitted", "mape_leave_one_out"):
        if isinstance(data.get(key), bool) or not isinstance(data.get(key), (int, float)):
            raise fail(key, "must be a number")
    for key, fields in (("parameters", ("name", "scale", "status")), ("residuals", ("run", "measured_s"))):
        rows = data.get(key)
        if not isinstance(rows, list) or not all(isinstance(row, dict) and all(f in row for f in fields)
                                                 for row in rows):
            raise fail(key, f"must be a list of mappings with {', '.join(fields)}")
    if not isinstance(data.get("adopted", True), bool):
        raise fail("adopted", "must be true or false")
    for key in ("warnings", "files", "not_fitted"):
        if not isinstance(data.get(key, []), list):
            raise fail(key, "must be a list")
    return data


def runs_section_lines(section: Mapping[str, Any]) -> list[str]:
    """What `autopar profile show` says about a profile fitted to runs."""
    lines = [f"fitted to {len(section['residuals'])} measured runs at {section.get('fitted_at_utc', '?')} from "
             f"{', '.join(section.get('files', [])) or '?'} (base profile {section['base_profile']}); step-time "
             f"MAPE over those runs: bundled {section['mape_bundled']:.1%}, fitted {section['mape_fitted']:.1%}, "
             f"leave-one-out {section['mape_leave_one_out']:.1%}"]
    if section.get("adopted") is False:
        lines.append("  the fit was not adopted (it did not predict left-out runs better than the bundled profile): "
                     "these are the bundled values")
    for row in section["parameters"]:
        lines.append(f"  {row['name']}: ×{row['scale']:.4g} ({row['status']})")
    lines += [f"  warning: {warning}" for warning in section.get("warnings", [])]
    return lines
