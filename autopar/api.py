"""Small constructors for the public API: `autopar.make_cluster(...)` and `autopar.Training(...)`."""

from __future__ import annotations

from pathlib import Path

from costmodels.hardware import load_profile
from costmodels.specs import ClusterSpec, TrainingSpec

Training = TrainingSpec


def make_cluster(gpu: str = "h100-80gb", num_gpus: int = 8, gpus_per_node: int = 0, headroom: float = 0.2,
                 profile: "str | Path | None" = None, allow_cpu_profile: bool = False,
                 nvlink_domain_gpus: int = 0) -> ClusterSpec:
    """A cluster of `num_gpus` GPUs of one bundled type, or described by a (calibrated) profile YAML file.

    A profile measured on a CPU (`autopar calibrate --allow-cpu`) is refused unless `allow_cpu_profile`, as on the CLI.
    """
    if profile is None:
        hardware = load_profile(gpu)
    else:
        from autopar.calibrate.calibration_section import check_profile_calibration  # no torch on this path

        hardware = check_profile_calibration(load_profile(profile), allow_cpu=allow_cpu_profile)
    return ClusterSpec(profile=hardware, num_gpus=num_gpus, gpus_per_node=gpus_per_node, headroom=headroom,
                       nvlink_domain=nvlink_domain_gpus)
