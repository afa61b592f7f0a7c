"""Calibration fit, measurement reading and profile writing (no torch needed).

Fit tests generate measurements from known parameters through the cost model's own functions
(`costmodels.comm.collective_time_s`, `costmodels.compute.gemm_efficiency`), multiply each by 5% Gaussian noise,
and check the fit recovers the parameters within 5%.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from autopar.calibrate.fit import fit_gemm_efficiency, fit_link, least_squares
from autopar.calibrate.measurements import (
    COLLECTIVE_KINDS, CollectiveMeasurement, GemmMeasurement, Measurements, Timing, measurements_from_dict,
    summarise_times,
)
from autopar.calibrate.profile_file import RunInfo, base_profile_for_device, build_profile_text, write_atomically
from costmodels.comm import collective_time_s
from costmodels.compute import gemm_efficiency
from costmodels.errors import InputError
from costmodels.hardware import LinkSpec, load_profile, parse_profile

NOISE = 0.05
SIZES = [2**e for e in range(10, 29)]  # 1 KiB … 256 MiB, as `autopar calibrate` measures on GPUs


def noisy(value: float, rng: np.random.Generator) -> float:
    return float(value * max(0.5, 1.0 + NOISE * rng.standard_normal()))


def timing(median_s: float) -> Timing:
    return Timing(median_s=median_s, q1_s=median_s * 0.98, q3_s=median_s * 1.02, runs=20)


def synthetic_collectives(link: str, alpha_s: float, bandwidth: float, group_size: int,
                          rng: np.random.Generator) -> list[CollectiveMeasurement]:
    truth = LinkSpec(bandwidth_bytes_per_s=bandwidth, alpha_s=alpha_s, nominal_bandwidth_bytes_per_s=bandwidth)
    rows = []
    for kind in COLLECTIVE_KINDS:
        n = 2 if kind == "send_recv" else group_size
        for size in SIZES:
            rows.append(CollectiveMeasurement(link=link, kind=kind, group_size=n, bytes=size,
                                              timing=timing(noisy(float(collective_time_s(truth, kind, size, n)),
                                                                  rng))))
    return rows


def gemm_rows(profile, params: dict[str, float], precisions: tuple[str, ...],
              rng: np.random.Generator) -> list[GemmMeasurement]:
    """GEMMs of the shapes `autopar calibrate` times on a GPU, with times from the efficiency curve."""
    truth = dataclasses.replace(profile, gemm_efficiency=params)
    rows = []
    for precision in precisions:
        for m, n, k in gemm_shapes():
            efficiency = float(gemm_efficiency(truth, m, n, k, precision))
            seconds = 2.0 * m * n * k / (efficiency * profile.peak_flops_per_s[precision])
            rows.append(GemmMeasurement(precision=precision, m=m, n=n, k=k, timing=timing(noisy(seconds, rng))))
    return rows


def gemm_shapes() -> list[tuple[int, int, int]]:
    # the same family as autopar.calibrate.bench.gemm_shapes(on_gpu=True, quick=False), which needs torch to import
    shapes = []
    for tokens in (4096, 16384):
        for h in (2048, 4096, 8192, 12288):
            for tp in (1, 2, 4, 8):
                shapes += [(tokens, 3 * h // tp, h), (tokens, h, h // tp), (tokens, 4 * h // tp, h),
                           (tokens, h, 4 * h // tp), (h, 4 * h // tp, tokens)]
    return shapes


# ---- statistics ------------------------------------------------------------------------------------------------

def test_median_and_quartiles_of_timed_runs():
    # 1..5: median 3; inclusive quartiles 2 and 4
    assert summarise_times([5.0, 1.0, 3.0, 2.0, 4.0]) == Timing(median_s=3.0, q1_s=2.0, q3_s=4.0, runs=5)
    assert summarise_times([0.5]) == Timing(0.5, 0.5, 0.5, 1)


# ---- generic least squares -------------------------------------------------------------------------------------

def test_least_squares_recovers_a_power_law_exactly():
    # y = 3·x^0.5 has log y = log 3 + 0.5 log x: exact data, exact fit
    x = np.array([1.0, 4.0, 9.0, 16.0, 100.0])
    fit = least_squares(lambda p: p["scale"] * x ** p["power"], 3.0 * np.sqrt(x), [{"scale": 1.0, "power": 1.0}])
    assert fit.params["scale"] == pytest.approx(3.0, rel=1e-6)
    assert fit.params["power"] == pytest.approx(0.5, rel=1e-6)
    assert fit.rms_relative_residual < 1e-6 and fit.at_bound == ()


def test_a_parameter_the_data_cannot_see_runs_to_its_bound():
    # every message is latency-bound (1 KiB at 1 TB/s is 1 ns next to alpha = 50 µs): bandwidth is unknowable
    rows = [CollectiveMeasurement("nvlink", "all_reduce", 8, 1024, timing(50e-6)) for _ in range(3)]
    rows.append(CollectiveMeasurement("nvlink", "all_reduce", 8, 2048, timing(50e-6)))
    base = LinkSpec(bandwidth_bytes_per_s=1e11, alpha_s=1e-5, nominal_bandwidth_bytes_per_s=1e11)
    fit = fit_link(rows, base)
    assert fit.params["alpha_s"] == pytest.approx(50e-6, rel=0.01)
    assert "bandwidth_bytes_per_s" in fit.at_bound


# ---- links -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("link, alpha_s, bandwidth, group_size", [
    ("nvlink", 12e-6, 0.8 * 450e9, 8),   # H100 NVLink: 450 GB/s per direction at 80%
    ("ib", 25e-6, 0.7 * 50e9, 4),        # 400 Gb/s NIC at 70%, 4 nodes
])
def test_link_fit_recovers_alpha_and_bandwidth_within_5_percent(link, alpha_s, bandwidth, group_size):
    rng = np.random.default_rng(6)
    rows = synthetic_collectives(link, alpha_s, bandwidth, group_size, rng)
    base = load_profile("h100").links[link]
    fit = fit_link(rows, base)
    assert fit.params["alpha_s"] == pytest.approx(alpha_s, rel=0.05)
    assert fit.params["bandwidth_bytes_per_s"] == pytest.approx(bandwidth, rel=0.05)
    assert fit.points == len(COLLECTIVE_KINDS) * len(SIZES)
    assert fit.rms_relative_residual < 2 * NOISE  # residuals are the noise, nothing systematic


@given(alpha_us=st.floats(1.0, 200.0), bandwidth_gb_per_s=st.floats(1.0, 1000.0),
       group_size=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 2**16))
def test_link_fit_within_5_percent_over_the_parameter_range(alpha_us, bandwidth_gb_per_s, group_size, seed):
    # Both parameters must be visible in 1 KiB … 256 MiB: the crossover size alpha·bandwidth (where the latency
    # and the transfer take equally long) at least 64 KiB, so six or more sizes are latency-bound, and at most
    # 64 MiB, so the largest messages are bandwidth-bound. Real links sit well inside (NVLink 10 µs × 360 GB/s
    # = 3.6 MB, IB 20 µs × 40 GB/s = 800 kB).
    crossover_bytes = alpha_us * 1e-6 * bandwidth_gb_per_s * 1e9
    assume(64 * 2**10 <= crossover_bytes <= 64 * 2**20)
    rng = np.random.default_rng(seed)
    rows = synthetic_collectives("ib", alpha_us * 1e-6, bandwidth_gb_per_s * 1e9, group_size, rng)
    fit = fit_link(rows, load_profile("a100").links["ib"])
    assert fit.params["alpha_s"] == pytest.approx(alpha_us * 1e-6, rel=0.05)
    assert fit.params["bandwidth_bytes_per_s"] == pytest.approx(bandwidth_gb_per_s * 1e9, rel=0.05)


# ---- GEMM efficiency -------------------------------------------------------------------------------------------

def test_gemm_fit_recovers_the_curve_within_5_percent():
    profile = load_profile("a100")  # starts from the bundled curve, fits a different one
    truth = {"peak_fraction": 0.62, "half_saturation_dim": 900.0}
    rows = gemm_rows(profile, truth, ("bf16",), np.random.default_rng(1))
    fit = fit_gemm_efficiency(rows, profile)
    for name, value in truth.items():
        assert fit.params[name] == pytest.approx(value, rel=0.05), name


def test_gemm_fit_with_fp8_adds_the_fp8_parameter():
    profile = load_profile("h100")
    truth = {"peak_fraction": 0.7, "half_saturation_dim": 600.0, "fp8_peak_fraction": 0.55}
    rows = gemm_rows(profile, truth, ("bf16", "fp8"), np.random.default_rng(2))
    fit = fit_gemm_efficiency(rows, profile)
    for name, value in truth.items():
        assert fit.params[name] == pytest.approx(value, rel=0.05), name


def test_gemm_fit_far_below_the_bundled_curve():
    # a CPU run measured against the A100 spec: efficiency ~3e-4, three orders of magnitude below the start
    profile = load_profile("a100")
    truth = {"peak_fraction": 3e-4, "half_saturation_dim": 64.0}
    rows = gemm_rows(profile, truth, ("bf16",), np.random.default_rng(3))
    fit = fit_gemm_efficiency(rows, profile)
    assert fit.params["peak_fraction"] == pytest.approx(3e-4, rel=0.05)


# ---- reading measurements strictly -----------------------------------------------------------------------------

GOOD_GEMM = {"precision": "bf16", "m": 256, "n": 256, "k": 256, "median_s": 1e-3, "q1_s": 9e-4, "q3_s": 1.1e-3,
             "runs": 5}
GOOD_COLLECTIVE = {"link": "nvlink", "kind": "all_reduce", "group_size": 2, "bytes": 1024, "median_s": 1e-4,
                   "q1_s": 9e-5, "q3_s": 1.1e-4, "runs": 5}


def test_good_measurements_read_back():
    read = measurements_from_dict({"gemm": [GOOD_GEMM], "collectives": [GOOD_COLLECTIVE]}, "m.yaml")
    assert read.gemm[0].flops == 2 * 256**3
    assert read.collectives[0].timing.median_s == 1e-4


@pytest.mark.parametrize("section, row_change, words", [
    ("gemm", {"median_s": float("nan")}, ["gemm[1].median_s", "finite", "nan"]),
    ("gemm", {"median_s": "fast"}, ["median_s", "finite", "fast"]),
    ("gemm", {"m": 256.5}, ["m", "whole number"]),
    ("gemm", {"precision": "fp4"}, ["precision", "bf16"]),
    ("gemm", {"q1_s": 2e-3}, ["q1_s <= median_s"]),
    ("collectives", {"kind": "broadcast"}, ["kind", "all_reduce"]),
    ("collectives", {"group_size": 1}, ["group_size", "at least 2"]),
    ("collectives", {"bytes": -1024}, ["bytes", "> 0"]),
    ("collectives", {"median_s": float("inf")}, ["median_s", "inf"]),
])
def test_bad_measurement_rows_are_refused(section, row_change, words):
    good = {"gemm": GOOD_GEMM, "collectives": GOOD_COLLECTIVE}[section]
    rows = [good, {**good, **row_change}]  # the defect is in the second row: nothing of the file is used
    with pytest.raises(InputError) as caught:
        measurements_from_dict({section: rows}, "m.yaml")
    message = caught.value.message
    assert f"{section}[1]" in message and "m.yaml" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("data", [{}, [], None, {"gemm": "lots"}, {"gemm": [], "collectives": []},
                                  {"surprise": []}])
def test_empty_or_shapeless_measurements_are_refused(data):
    with pytest.raises(InputError):
        measurements_from_dict(data, "m.yaml")


# ---- the calibrated profile --------------------------------------------------------------------------------------

def synthetic_run(device: str = "NVIDIA H100 80GB HBM3") -> RunInfo:
    return RunInfo(measured_at_utc="2026-11-29T10:00:00Z", hostnames=("node-a", "node-b"), device_name=device,
                   world_size=16, nodes=2, ranks_per_node=8, torch_version="2.13.0", backend="nccl")


def synthetic_measurements(rng: np.random.Generator) -> Measurements:
    h100 = load_profile("h100")
    collectives = (synthetic_collectives("nvlink", 8e-6, 0.85 * 450e9, 8, rng)
                   + synthetic_collectives("ib", 30e-6, 0.62 * 50e9, 2, rng))
    gemm = gemm_rows(h100, {"peak_fraction": 0.71, "half_saturation_dim": 480.0}, ("bf16",), rng)
    return Measurements(gemm=tuple(gemm), collectives=tuple(collectives),
                        memory_overheads_bytes={"cuda_context": 0.55 * 2**30, "nccl_buffers": 0.8 * 2**30,
                                                "allocator_reserve": 1.2 * 2**30})


def test_calibrated_profile_loads_with_fitted_values_and_provenance():
    text, _, _ = build_profile_text("h100-80gb", "test", synthetic_measurements(np.random.default_rng(4)),
                                    synthetic_run())
    profile = parse_profile(text, "calibrated.yaml")
    # bandwidth_efficiency = fitted bandwidth / nominal: 0.85 of NVLink's 450 GB/s, 0.62 of IB's 50 GB/s
    assert profile.links["nvlink"].bandwidth_bytes_per_s == pytest.approx(0.85 * 450e9, rel=0.05)
    assert profile.links["ib"].bandwidth_bytes_per_s == pytest.approx(0.62 * 50e9, rel=0.05)
    assert profile.links["ib"].alpha_s == pytest.approx(30e-6, rel=0.05)
    assert profile.gemm_efficiency["peak_fraction"] == pytest.approx(0.71, rel=0.05)
    assert profile.memory_overheads_bytes["cuda_context"] == pytest.approx(0.55 * 2**30, rel=1e-4)
    assert "allocator_reserve" not in profile.memory_overheads_bytes  # measured, but not a profile term
    assert profile.peak_flops_per_s == load_profile("h100").peak_flops_per_s  # spec sheet kept
    assert "autopar calibrate" in profile.provenance["links.ib.bandwidth_efficiency"]
    assert "node-a" in profile.provenance["compute.gemm_efficiency"]
    calibration = profile.extra["calibration"]
    assert calibration["base_profile"] == "h100-80gb" and calibration["world_size"] == 16
    assert calibration["fit"]["links"]["ib"]["rms_relative_residual"] < 0.1
    assert len(calibration["measurements"]["collectives"]) == 2 * len(COLLECTIVE_KINDS) * len(SIZES)


def test_unmeasured_parts_keep_the_base_values_and_say_so():
    rng = np.random.default_rng(5)
    only_intra = Measurements(collectives=tuple(synthetic_collectives("nvlink", 8e-6, 300e9, 8, rng)))
    text, _, notes = build_profile_text("h100-80gb", "test", only_intra, synthetic_run(),
                                        ("one node: inter-node link (ib) not measured",))
    profile, base = parse_profile(text, "c.yaml"), load_profile("h100")
    assert profile.links["ib"] == base.links["ib"]
    assert profile.gemm_efficiency == base.gemm_efficiency
    assert profile.memory_overheads_bytes == base.memory_overheads_bytes
    assert "not measured" in profile.provenance["links.ib.bandwidth_efficiency"]
    assert any("GEMMs not measured" in note for note in notes)


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "profile.yaml"
    target.write_text("old: profile\n")

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, "new: profile\n" * 1000)
    assert target.read_text() == "old: profile\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]  # no temporary file left behind


def test_atomic_write_replaces_whole(tmp_path):
    target = tmp_path / "profile.yaml"
    target.write_text("old\n")
    write_atomically(target, "new\n")
    assert target.read_text() == "new\n" and len(list(tmp_path.iterdir())) == 1


def test_profile_text_round_trips_through_yaml():
    text, _, _ = build_profile_text("a100-80gb", "test", synthetic_measurements(np.random.default_rng(7)),
                                    synthetic_run("cpu"))
    data = yaml.safe_load(text)
    read = measurements_from_dict(data["calibration"]["measurements"], "c.yaml")
    assert len(read.gemm) == len(gemm_shapes())
    assert all(math.isfinite(row.timing.median_s) for row in read.collectives)
    assert "CPU run" in data["display_name"]


@pytest.mark.parametrize("device_name, memory_gib, expected", [
    ("NVIDIA H100 80GB HBM3", 79.2, "h100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", 79.1, "a100-80gb"),
    ("NVIDIA H200", 139.8, "h200-141gb"),
    ("NVIDIA B200", 178.4, "b200-180gb"),
    ("NVIDIA GH200 480GB", 94.5, None),   # no bundled profile: calibrate asks for --base-gpu
    ("Tesla V100-SXM2-32GB", 31.7, None),
])
def test_base_profile_from_the_device_name(device_name, memory_gib, expected):
    assert base_profile_for_device(device_name, memory_gib) == expected
