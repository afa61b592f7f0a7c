"""The `calibration` section of a calibrated profile, read strictly.

`costmodels.hardware.parse_profile` validates the fields the cost model uses and keeps unknown top-level sections
in `HardwareProfile.extra` uninterpreted. A calibrated profile's `calibration` section (written by
`autopar.calibrate.profile_file`) is read here, by `autopar profile show/fit` and by every command that takes
`--profile`, so a profile whose measurements or fit are damaged is refused whole (exit 2) rather than half-used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from autopar.calibrate.measurements import Measurements, measurements_from_dict
from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile

SECTION = "calibration"
SUPPORTED_FORMATS = (1,)
CPU_DEVICE = "cpu"
"""`calibration.device` (and `device_name`) of a run measured on a CPU: a pipeline test, never a GPU profile."""


@dataclass(frozen=True)
class CalibrationSection:
    base_profile: str
    base_profile_reason: str
    measured_at_utc: str
    run: Mapping[str, Any]
    """hostnames, device, device_name, world_size, nodes, ranks_per_node, torch_version, backend."""
    notes: tuple[str, ...]
    fit: Mapping[str, Any]
    measurements: Measurements
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def measured_on_cpu(self) -> bool:
        """Measured by `autopar calibrate --allow-cpu` on a CPU: describes that CPU, not a GPU."""
        return self.run["device"] == CPU_DEVICE


def read_calibration_section(profile: HardwareProfile) -> CalibrationSection | None:
    """The profile's calibration section, or None when it has none; InputError on any defect."""
    if SECTION not in profile.extra:
        return None
    return calibration_section_from_dict(profile.extra[SECTION], profile.source_path)


def calibration_section_from_dict(data: Any, origin: str) -> CalibrationSection:
    def fail(where: str, message: str) -> None:
        raise InputError("profile", f"{origin}: {SECTION}.{where} {message}; fix the file or calibrate again")

    if not isinstance(data, dict):
        fail("", "must be a mapping")
    fmt = data.get("format")
    if fmt not in SUPPORTED_FORMATS:
        fail("format", f"must be one of {SUPPORTED_FORMATS}, got {fmt!r}")
    strings = {}
    for key in ("base_profile", "measured_at_utc", "device_name", "backend", "torch_version"):
        value = data.get(key)
        if not isinstance(value, str) or not value:
            fail(key, f"must be a non-empty string, got {value!r}")
        strings[key] = value
    for key in ("world_size", "nodes", "ranks_per_node"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(key, f"must be a positive whole number, got {value!r}")
    # `device` is written since CPU runs need an opt-in; earlier files said it only through device_name 'cpu'
    device = data.get("device", CPU_DEVICE if strings["device_name"] == CPU_DEVICE else "cuda")
    if device not in (CPU_DEVICE, "cuda"):
        fail("device", f"must be 'cpu' or 'cuda', got {device!r}")
    if (device == CPU_DEVICE) != (strings["device_name"] == CPU_DEVICE):
        fail("device", f"{device!r} contradicts device_name {strings['device_name']!r}")
    hostnames = data.get("hostnames")
    if not isinstance(hostnames, list) or not hostnames or not all(isinstance(h, str) for h in hostnames):
        fail("hostnames", "must be a non-empty list of host names")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        fail("notes", "must be a list of strings")
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        fail("fit", "must be a mapping")
    bad = _first_non_finite(fit, "fit")
    if bad is not None:
        fail(bad[0], f"must be a finite number, got {bad[1]!r}")
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        fail("settings", "must be a mapping")
    if "measurements" not in data:
        fail("measurements", "is missing")
    measurements = measurements_from_dict(data["measurements"], origin)
    run = {"device": device, **{key: data[key] for key in ("hostnames", "device_name", "world_size", "nodes",
                                                           "ranks_per_node", "torch_version", "backend")}}
    return CalibrationSection(base_profile=strings["base_profile"],
                              base_profile_reason=str(data.get("base_profile_reason", "")),
                              measured_at_utc=strings["measured_at_utc"], run=run, notes=tuple(notes), fit=fit,
                              measurements=measurements, settings=settings)


def _first_non_finite(node: Any, path: str) -> tuple[str, Any] | None:
    if isinstance(node, dict):
        for key, value in node.items():
            found = _first_non_finite(value, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = _first_non_finite(value, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(node, float) and not math.isfinite(node):
        return path, node
    return None


def check_profile_calibration(profile: HardwareProfile, allow_cpu: bool = False) -> HardwareProfile:
    """The profile, once its calibration section (if any) reads cleanly: for commands that take --profile.

    A profile measured on a CPU (`autopar calibrate --allow-cpu`) is refused unless `allow_cpu`
    (`--allow-cpu-profile`): its GEMM efficiency and link speeds are a CPU's, and a plan priced with them is wrong
    by orders of magnitude while looking like a GPU plan.
    """
    section = read_calibration_section(profile)
    if section is not None and section.measured_on_cpu and not allow_cpu:
        host = section.run["hostnames"][0]
        raise InputError("profile", f"{profile.source_path} was measured on a CPU (host {host}), not a GPU, so it "
                                    "would price a GPU job at CPU speed; calibrate on the GPUs, or pass "
                                    "--allow-cpu-profile to use it anyway (for testing the calibration pipeline)")
    return profile
