"""Per-collective profile points, the fit that produces them, and the bundled profiles' fit to the public tables."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from autopar.calibrate.fit import fit_collective_points, fit_gemm_efficiency, predict_collective_s
from autopar.calibrate.measurements import CollectiveMeasurement, GemmMeasurement, Timing, measurements_from_dict
from costmodels import comm
from costmodels.compute import gemm_efficiency
from costmodels.errors import InputError
from costmodels.hardware import (CollectivePoint, _bundled_text, bundled_profile_names, load_profile,
                                 parse_profile)

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _link_only(name: str):
    """A bundled profile with its `collectives:` section removed: what an older or hand-written profile holds."""
    data = yaml.safe_load(_bundled_text(name))
    data.pop("collectives", None)
    return parse_profile(yaml.safe_dump(data), f"link-only:{name}")


def _timing(seconds: float) -> Timing:
    return Timing(seconds, seconds, seconds, 1)


# ---- the model ---------------------------------------------------------------------------------------------------

def test_a_profile_with_only_link_values_prices_collectives_with_them():
    profile = _link_only("h100-80gb")
    assert profile.collectives == {}
    nvlink = profile.links["nvlink"]
    placement = comm.place_group(np.array([2, 4, 8]), 1, 8)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        got = comm.group_collective_time_s(profile, placement, kind, 1e8)
        want = comm.collective_time_s(nvlink, kind, 1e8, placement.size)
        assert got == pytest.approx(want, rel=1e-12)


def test_collective_points_interpolate_in_log_group_size_and_hold_outside():
    profile = load_profile("h200-141gb")
    points = {p.group_size: p for p in profile.collectives["nvlink"]["all_reduce"]}
    alpha, bandwidth = comm.collective_parameters(profile, "nvlink", "all_reduce", np.array([2.0, 4.0, 8.0, 16.0]))
    assert alpha[0] == pytest.approx(points[4].alpha_s)                        # below the smallest: held
    assert bandwidth[1] == pytest.approx(points[4].bus_bandwidth_bytes_per_s)
    assert bandwidth[2] == pytest.approx(points[8].bus_bandwidth_bytes_per_s)
    assert bandwidth[3] == pytest.approx(points[8].bus_bandwidth_bytes_per_s)  # above the largest: held
    # between 4 and 5 GPUs (log2 4.5 halfway-ish): geometric interpolation of the bandwidth
    x = (np.log2(4.5) - 2.0) / (np.log2(5.0) - 2.0)
    want = np.exp((1 - x) * np.log(points[4].bus_bandwidth_bytes_per_s) + x * np.log(points[5].bus_bandwidth_bytes_per_s))
    assert comm.collective_parameters(profile, "nvlink", "all_reduce", 4.5)[1] == pytest.approx(want)


def test_nvls_all_reduce_and_ring_all_gather_differ_on_h200():
    profile = load_profile("h200-141gb")
    ar = comm.collective_parameters(profile, "nvlink", "all_reduce", 8.0)[1]
    ag = comm.collective_parameters(profile, "nvlink", "all_gather", 8.0)[1]
    assert ar > 1.15 * ag      # NVLS reduces in the switch (~470 GB/s busbw) where all-gather stays on the ring


def test_a100_all_reduce_latency_floor_is_the_measured_one_not_10_us():
    profile = load_profile("a100-80gb")
    t = comm.group_collective_time_s(profile, comm.place_group(8, 1, 8), "all_reduce", 1024**2)
    # vTrain LUT: 93 µs, ml-engineering nccl-tests sweep: ~90 µs at 1 MiB; one alpha for both sources and sizes
    assert 60e-6 < float(t) < 110e-6


def test_multi_node_collective_pipelines_its_two_stages():
    profile = load_profile("a100-80gb")
    placement = comm.place_group(32, 1, 8)                  # 4 nodes × 8
    bytes_ = 2.0**30
    a_nv, b_nv = comm.collective_parameters(profile, "nvlink", "all_reduce", 8.0)
    a_ib, b_ib = comm.collective_parameters(profile, "ib", "all_reduce", 4.0)
    want = a_nv + a_ib + max(bytes_ * 2 * 7 / 8 / b_nv, bytes_ / 8 * 2 * 3 / 4 / b_ib)
    assert float(comm.group_collective_time_s(profile, placement, "all_reduce", bytes_)) == pytest.approx(float(want))


@pytest.mark.parametrize("section, field", [
    ({"pcie": {"all_reduce": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "collectives.pcie"),
    ({"nvlink": {"broadcast": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "collectives.nvlink.broadcast"),
    ({"nvlink": {"all_reduce": [{"group_size": 1, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "group_size"),
    ({"nvlink": {"all_reduce": [{"group_size": 2, "alpha_us": 1}]}}, "busbw_gb_per_s"),
    ({"nvlink": {"all_reduce": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 0}]}}, "busbw_gb_per_s"),
    ({"nvlink": {"all_reduce": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 1}] * 2}}, "twice"),
    ({"nvlink": {"all_reduce": []}}, "non-empty"),
])
def test_a_bad_collectives_section_is_refused_naming_the_field(section, field):
    data = yaml.safe_load(_bundled_text("a100-80gb"))
    data["collectives"] = section
    with pytest.raises(InputError, match=re.escape(field)):
        parse_profile(yaml.safe_dump(data), "bad.yaml")


# ---- the fit -----------------------------------------------------------------------------------------------------

def test_fit_recovers_per_collective_points_including_a_hierarchical_ib_row():
    base = _link_only("h100-80gb")
    truth = {("nvlink", "all_reduce", 8): CollectivePoint(8, 30e-6, 420e9),
             ("nvlink", "all_gather", 8): CollectivePoint(8, 15e-6, 350e9),
             ("ib", "all_reduce", 4): CollectivePoint(4, 40e-6, 25e9)}   # the NIC stage is the slower
    true_profile = base
    from autopar.calibrate.fit import with_collective_point
    for (link, kind, _), point in truth.items():
        true_profile = with_collective_point(true_profile, link, kind, point)
    rows = []
    for size in (2**14, 2**18, 2**22, 2**26, 2**30):
        for link, kind, group, per_node in (("nvlink", "all_reduce", 8, 1), ("nvlink", "all_gather", 8, 1),
                                            ("ib", "all_reduce", 32, 8)):
            row = CollectiveMeasurement(link, kind, group, size, _timing(1.0), ranks_per_node=per_node)
            rows.append(CollectiveMeasurement(link, kind, group, size,
                                              _timing(predict_collective_s(true_profile, row)),
                                              ranks_per_node=per_node, source="synthetic.csv"))
    fits = {(f.link, f.kind, f.point.group_size): f for f in fit_collective_points(rows, base)}
    assert set(fits) == set(truth)
    for key, point in truth.items():
        assert fits[key].point.alpha_s == pytest.approx(point.alpha_s, rel=1e-3)
        assert fits[key].point.bus_bandwidth_bytes_per_s == pytest.approx(point.bus_bandwidth_bytes_per_s, rel=1e-3)
        assert fits[key].result.max_relative_residual < 1e-4


def test_fp8_rows_fit_their_own_roll_off_and_fractions_stay_at_most_one():
    base = load_profile("h100-80gb")
    params = {"peak_fraction": 0.8, "half_saturation_dim": 100.0, "fp8_peak_fraction": 0.7,
              "fp8_half_saturation_dim": 900.0}
    import dataclasses
    truth = dataclasses.replace(base, gemm_efficiency=params)
    rows = []
    for precision in ("bf16", "fp8"):
        for m, n, k in ((256, 4096, 4096), (1024, 8192, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (128, 7168, 2048)):
            rate = base.peak_flops_per_s[precision] * float(gemm_efficiency(truth, m, n, k, precision))
            rows.append(GemmMeasurement(precision, m, n, k, _timing(2.0 * m * n * k / rate)))
    result = fit_gemm_efficiency(rows, base)
    for name, value in params.items():
        assert result.params[name] == pytest.approx(value, rel=1e-3)
    impossible = [GemmMeasurement("bf16", 8192, 8192, 8192, _timing(2.0 * 8192**3 / (1.2 * 989e12)))]
    assert fit_gemm_efficiency(impossible, base).params["peak_fraction"] <= 1.0


def test_measurement_rows_keep_source_and_ranks_per_node_and_refuse_a_bad_split():
    row = {"link": "ib", "kind": "all_reduce", "group_size": 32, "bytes": 1024, "median_s": 1e-4, "q1_s": 1e-4,
           "q3_s": 1e-4, "runs": 1, "ranks_per_node": 8, "source": "x.csv"}
    read = measurements_from_dict({"collectives": [row]}, "m.yaml")
    assert read.collectives[0].ranks_per_node == 8 and read.collectives[0].source == "x.csv"
    assert read.collectives[0].group_size_on_link == 4
    assert measurements_from_dict(read.to_dict(), "again.yaml").collectives == read.collectives
    old = {k: v for k, v in row.items() if k not in ("ranks_per_node", "source")}   # rows written before
    assert measurements_from_dict({"collectives": [old]}, "old.yaml").collectives[0].ranks_per_node == 1
    with pytest.raises(InputError, match="ranks_per_node"):
        measurements_from_dict({"collectives": [{**row, "ranks_per_node": 5}]}, "bad.yaml")
    with pytest.raises(InputError, match="ranks_per_node"):
        measurements_from_dict({"collectives": [{**row, "link": "nvlink"}]}, "bad.yaml")


# ---- the bundled profiles ------------------------------------------------------------------------------------------

def test_every_fitted_key_of_the_bundled_profiles_names_its_source():
    for name in bundled_profile_names():
        profile = load_profile(name)
        for link, kinds in profile.collectives.items():
            for kind in kinds:
                source = profile.provenance.get(f"collectives.{link}.{kind}", "")
                assert ".csv" in source or "extrapolated" in source, (name, link, kind, source)
        gemm = profile.provenance["compute.gemm_efficiency"]
        assert "gemm_" in gemm and ".csv" in gemm, (name, gemm)
        for key in ("links.nvlink.alpha_us", "links.nvlink.bandwidth_efficiency"):
            assert ".csv" in profile.provenance[key], (name, key)


def _tables():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import microbench_tables
        microbench_tables.microbench_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference/microbench not next to the repository")
    return microbench_tables


@pytest.mark.parametrize("file, median_limit, max_limit", [
    ("nccl_allreduce_a100_vtrain_lut.csv", 0.03, 0.25),
    ("nccl_allreduce_coreweave_gb200_h100_a100.csv", 0.05, 0.10),
    ("nccl_points_nvls_vs_ring_ml_engineering.csv", 0.05, 0.25),
    ("nccl_allreduce_h100_dgx_8gpu_dgxc.csv", 0.25, 0.80),
    ("nccl_allreduce_sweeps_ml_engineering.csv", 0.20, 1.00),
    ("gemm_cublas_fp16_vs_size_triton_tutorial_issues.csv", 0.08, 0.15),
    ("gemm_fp8_deepgemm_h800.csv", 0.10, 0.25),
    ("gemm_mamf_max_achievable_matmul_ml_engineering.csv", 0.15, 0.40),
])
def test_bundled_profiles_reproduce_the_tables_they_were_fitted_to(file, median_limit, max_limit):
    tables = _tables()
    from fidelity_microbench import errors
    rows = list(next(t for t in tables.TABLES if t.file == file).read(tables.microbench_dir() / file))
    found = errors(rows, {name: load_profile(name) for name in tables.PROFILES}, "fit")
    assert found.size > 0
    assert np.median(found) <= median_limit and np.max(found) <= max_limit, (np.median(found), np.max(found))
