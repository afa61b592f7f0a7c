"""Per-collective profile points, the fit that produces them, and the bundled profiles' fit to the public tables."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from autopar.calibrate.fit import (
    fit_collective_points,
    fit_gemm_efficiency,
    predict_collective_s,
)
from autopar.calibrate.measurements import (
    CollectiveMeasurement,
    GemmMeasurement,
    Timing,
    measurements_from_dict,
)
from costmodels import comm
from costmodels.compute import gemm_efficiency
from costmodels.errors import InputError
from costmodels.hardware import (
    CollectivePoint,
    _bundled_text,
    bundled_profile_names,
    load_profile,
    parse_profile,
)


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


def test_each_size_takes_the_fastest_regime_and_group_sizes_interpolate_in_log2():
    base = _link_only("h100-80gb")
    from autopar.calibrate.fit import with_collective_regimes
    small, large = CollectivePoint(4, 10e-6, 100e9), CollectivePoint(4, 50e-6, 400e9)
    profile = with_collective_regimes(base, "nvlink", "all_gather", 4, [small, large])
    profile = with_collective_regimes(profile, "nvlink", "all_gather", 8, [CollectivePoint(8, 30e-6, 300e9)])
    factor = 3 / 4
    for bytes_ in (1e3, 1e6, 1e8):
        latency, transfer = comm.link_stage_s(profile, "nvlink", "all_gather", bytes_, 4)
        want = min(p.alpha_s + bytes_ * factor / p.bus_bandwidth_bytes_per_s for p in (small, large))
        assert float(latency + transfer) == pytest.approx(want)
    # the crossover: below it the low-latency regime, above it the high-bandwidth one
    assert float(comm.link_stage_s(profile, "nvlink", "all_gather", 1e3, 4)[0]) == pytest.approx(10e-6)
    assert float(comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, 4)[0]) == pytest.approx(50e-6)
    # halfway in log2 between 4 and 8 GPUs (~5.66): latency and transfer halfway between the two sizes' values
    n = 2**2.5
    lo = comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, np.array([4.0]))
    hi = comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, np.array([8.0]))
    mid = comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, np.array([n]))
    f4, f8, fn = 3 / 4, 7 / 8, (n - 1) / n
    assert float(mid[0][0]) == pytest.approx(0.5 * (float(lo[0][0]) + float(hi[0][0])))
    # transfers are interpolated per wire byte of the asked size: the halfway mix of the two sizes' bandwidths
    want = 0.5 * (1e8 * fn / 400e9 + 1e8 * fn / 300e9)
    assert float(mid[1][0]) == pytest.approx(want)
    assert float(lo[1][0]) == pytest.approx(1e8 * f4 / 400e9) and float(hi[1][0]) == pytest.approx(1e8 * f8 / 300e9)
    # outside the measured sizes the nearest holds
    assert float(comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, 2)[0]) == pytest.approx(50e-6)
    assert float(comm.link_stage_s(profile, "nvlink", "all_gather", 1e8, 16)[0]) == pytest.approx(30e-6)
    # vectorised over plans: arrays of sizes and group sizes at once
    many = comm.link_stage_s(profile, "nvlink", "all_gather", np.array([1e3, 1e8, 1e8]), np.array([4.0, 4.0, 8.0]))
    assert many[0] == pytest.approx([10e-6, 50e-6, 30e-6])


def _bus_bandwidth(profile, kind: str, n: float, bytes_: float = 2.0**34) -> float:
    _, transfer = comm.link_stage_s(profile, "nvlink", kind, bytes_, n)
    return float(bytes_ * comm.algorithm_factor(kind, n) / transfer)


def test_nvls_all_reduce_and_ring_all_gather_differ_on_h200():
    profile = load_profile("h200-141gb")
    assert _bus_bandwidth(profile, "all_reduce", 8) > 1.15 * _bus_bandwidth(profile, "all_gather", 8)
    # NVLS from 5 GPUs on (nccl_points_nvls_vs_ring_ml_engineering.csv): 4 GPUs run the ring
    assert _bus_bandwidth(profile, "all_reduce", 4) < 0.85 * _bus_bandwidth(profile, "all_reduce", 8)


def test_a100_all_reduce_latency_floor_is_the_measured_one_not_10_us():
    profile = load_profile("a100-80gb")
    one_mib = comm.group_collective_time_s(profile, comm.place_group(8, 1, 8), "all_reduce", 1024**2)
    assert 80e-6 < float(one_mib) < 110e-6      # vTrain LUT and ml-engineering nccl-tests: ~92-102 µs at 1 MiB
    tiny = comm.group_collective_time_s(profile, comm.place_group(8, 1, 8), "all_reduce", 32 * 1024)
    assert 35e-6 < float(tiny) < 60e-6          # ml-engineering nccl-tests: 43.8 µs at 32 KiB (LL protocol)


def test_multi_node_collective_pipelines_its_two_stages():
    profile = load_profile("a100-80gb")
    placement = comm.place_group(32, 1, 8)                  # 4 nodes × 8
    bytes_ = 2.0**30
    on_latency, on_transfer = comm.link_stage_s(profile, "nvlink", "all_reduce", bytes_, 8.0)
    off_latency, off_transfer = comm.link_stage_s(profile, "ib", "all_reduce", bytes_ / 8, 4.0)
    want = on_latency + off_latency + max(on_transfer, off_transfer)
    assert float(comm.group_collective_time_s(profile, placement, "all_reduce", bytes_)) == pytest.approx(float(want))


@pytest.mark.parametrize("section, field", [
    ({"pcie": {"all_reduce": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "collectives.pcie"),
    ({"nvlink": {"broadcast": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "collectives.nvlink.broadcast"),
    ({"nvlink": {"all_reduce": [{"group_size": 1, "alpha_us": 1, "busbw_gb_per_s": 1}]}}, "group_size"),
    ({"nvlink": {"all_reduce": [{"group_size": 2, "alpha_us": 1}]}}, "busbw_gb_per_s"),
    ({"nvlink": {"all_reduce": [{"group_size": 2, "alpha_us": 1, "busbw_gb_per_s": 0}]}}, "busbw_gb_per_s"),
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
    from autopar.calibrate.fit import with_collective_regimes
    for (link, kind, group), point in truth.items():
        true_profile = with_collective_regimes(true_profile, link, kind, group, [point])
    rows = []
    for size in (2**14, 2**18, 2**22, 2**26, 2**30):
        for link, kind, group, per_node in (("nvlink", "all_reduce", 8, 1), ("nvlink", "all_gather", 8, 1),
                                            ("ib", "all_reduce", 32, 8)):
            row = CollectiveMeasurement(link, kind, group, size, _timing(1.0), ranks_per_node=per_node)
            rows.append(CollectiveMeasurement(link, kind, group, size,
                                              _timing(predict_collective_s(true_profile, row)),
                                              ranks_per_node=per_node, source="synthetic.csv"))
    fits = {(f.link, f.kind, f.group_size): f for f in fit_collective_points(rows, base)}
    assert set(fits) == set(truth)
    for key, point in truth.items():
        assert len(fits[key].regimes) == 1                     # one regime made the data: no second one kept
        assert fits[key].regimes[0].alpha_s == pytest.approx(point.alpha_s, rel=1e-3)
        assert fits[key].regimes[0].bus_bandwidth_bytes_per_s == pytest.approx(point.bus_bandwidth_bytes_per_s,
                                                                               rel=1e-3)
        assert fits[key].result.max_relative_residual < 1e-4


def test_fit_finds_two_protocol_regimes_when_the_data_has_them():
    base = _link_only("a100-80gb")
    from autopar.calibrate.fit import with_collective_regimes
    regimes = [CollectivePoint(8, 20e-6, 30e9), CollectivePoint(8, 90e-6, 230e9)]
    truth = with_collective_regimes(base, "nvlink", "all_reduce", 8, regimes)
    rows = []
    for size in [2**k for k in range(12, 31)]:
        row = CollectiveMeasurement("nvlink", "all_reduce", 8, size, _timing(1.0))
        rows.append(CollectiveMeasurement("nvlink", "all_reduce", 8, size,
                                          _timing(predict_collective_s(truth, row))))
    (fit,) = fit_collective_points(rows, base)
    assert len(fit.regimes) == 2
    for got, want in zip(fit.regimes, regimes):
        assert got.alpha_s == pytest.approx(want.alpha_s, rel=1e-2)
        assert got.bus_bandwidth_bytes_per_s == pytest.approx(want.bus_bandwidth_bytes_per_s, rel=1e-2)
    assert fit.result.max_relative_residual < 1e-3


def test_fp8_rows_fit_their_own_roll_off_and_fractions_stay_at_most_one():
    base = load_profile("h100-80gb")
    params = {"peak_fraction": 0.8, "half_saturation_dim": 400.0, "fp8_peak_fraction": 0.7,
              "fp8_half_saturation_dim": 900.0,
              "kernel_floor_us": base.gemm_efficiency["kernel_floor_us"]}   # held by the fit: the world's own
    import dataclasses
    truth = dataclasses.replace(base, gemm_efficiency=params)
    rows = []
    for precision in ("bf16", "fp8"):
        for m, n, k in ((256, 4096, 4096), (1024, 8192, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (128, 7168, 2048)):
            rate = base.peak_flops_per_s[precision] * float(gemm_efficiency(truth, m, n, k, precision))
            rows.append(GemmMeasurement(precision, m, n, k, _timing(2.0 * m * n * k / rate)))
    result = fit_gemm_efficiency(rows, base)
    for name, value in params.items():   # within 0.5%: where the floor binds the curve's max() has no slope
        assert result.params[name] == pytest.approx(value, rel=5e-3)
    impossible = [GemmMeasurement("bf16", 8192, 8192, 8192, _timing(2.0 * 8192**3 / (1.2 * 989e12)))]
    assert fit_gemm_efficiency(impossible, base).params["peak_fraction"] <= 1.0


def test_a_gemm_fit_below_the_base_curve_keeps_the_grouped_roofline_as_it_was():
    """A throttled GPU (its curve at 0.3 of the bundled one) fits best from a scaled-down guess; the grouped
    expert-GEMM roofline's keys, which the dense curve does not read, must come back at the base's values (they were
    once returned at whichever guess won: B200's fp8 grouped fraction written as 0.0008)."""
    import dataclasses
    base = load_profile("h100-80gb")
    slow = dataclasses.replace(base, gemm_efficiency={name: base.gemm_efficiency[name] * 0.3
                                                      for name in ("peak_fraction", "half_saturation_dim")})
    rows = []
    for m, n, k in ((256, 4096, 4096), (1024, 8192, 2048), (4096, 4096, 4096), (8192, 8192, 8192)):
        rate = base.peak_flops_per_s["bf16"] * float(gemm_efficiency(slow, m, n, k, "bf16"))
        rows.append(GemmMeasurement("bf16", m, n, k, _timing(2.0 * m * n * k / rate)))
    result = fit_gemm_efficiency(rows, base)
    assert result.params["peak_fraction"] == pytest.approx(slow.gemm_efficiency["peak_fraction"], rel=1e-2)
    for key in ("grouped_peak_fraction", "grouped_hbm_efficiency"):
        assert result.params[key] == base.gemm_efficiency[key], key


def test_attention_rows_fit_the_attention_curve_and_leave_the_gemm_curve_alone():
    import dataclasses

    from autopar.calibrate.fit import fit_attention_efficiency
    from costmodels.compute import attention_efficiency
    base = load_profile("h100-80gb")
    truth = dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, "attention_peak_fraction": 0.62,
                                                        "attention_half_saturation_seq": 900.0})
    rows = []
    for seq in (1024, 2048, 4096, 8192, 16384):
        rate = base.peak_flops_per_s["bf16"] * float(attention_efficiency(truth, seq, seq, 128))
        rows.append(GemmMeasurement("bf16", seq, seq, 128, _timing(2.0 * seq * seq * 128 / rate), kind="attention"))
    result = fit_attention_efficiency(rows, base)
    assert result.params["attention_peak_fraction"] == pytest.approx(0.62, rel=1e-3)
    assert result.params["attention_half_saturation_seq"] == pytest.approx(900.0, rel=1e-3)
    gemm_rows = [GemmMeasurement("bf16", 4096, 4096, 4096, _timing(2.0 * 4096**3 / 700e12))]
    gemm = fit_gemm_efficiency([*gemm_rows, *rows], base)            # attention rows are not GEMMs
    assert gemm.points == 1
    # a profile without attention parameters prices the core with the GEMM curve, as one kernel over every head
    plain = dataclasses.replace(base, gemm_efficiency={k: v for k, v in base.gemm_efficiency.items()
                                                       if not k.startswith("attention")})
    assert float(attention_efficiency(plain, 4096, 4096, 128)) == pytest.approx(
        float(gemm_efficiency(plain, 4096, 4096, 128, "bf16", concurrent=np.inf)))
    with pytest.raises(InputError, match="kind"):
        measurements_from_dict({"gemm": [{"precision": "bf16", "m": 1, "n": 1, "k": 1, "median_s": 1e-3,
                                          "q1_s": 1e-3, "q3_s": 1e-3, "runs": 1, "kind": "conv"}]}, "bad.yaml")


def test_attention_fit_tells_an_exposed_harness_dispatch_from_the_kernel_rate():
    """A batch-1 benchmark that times one forward call on an idle GPU adds the host's dispatch to every row: at 512
    tokens a 70 µs dispatch beside a ~10 µs kernel. The fit takes it out as its own parameter and recovers the
    kernel's curve; read as the kernel's own roll-off (no dispatch parameter), the same rows put the half-saturation
    length far too long, and a training micro-batch of many more heads would pay the dispatch once per head."""
    import dataclasses

    from autopar.calibrate.fit import attention_row_time_s, fit_attention_efficiency
    from costmodels.compute import attention_curve_parameters, attention_dispatch_parameter, attention_efficiency
    base = load_profile("b200-180gb")
    peak_name, side_name = attention_curve_parameters("fa2", "fwd")
    dispatch_name = attention_dispatch_parameter("fa2", "fwd")
    kernel_curve = {**base.gemm_efficiency, peak_name: 0.2, side_name: 1000.0}
    truth = dataclasses.replace(base, gemm_efficiency={**kernel_curve, dispatch_name: 70.0})
    heads = 128                                                        # batch 1 × 128 query heads per call
    rows = []
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        row = GemmMeasurement("bf16", seq, seq, 128, _timing(1.0), kind="attention", attention_kernel="fa2",
                              attention_pass="fwd", exposed_dispatches=1.0 / heads)
        rows.append(dataclasses.replace(row, timing=_timing(attention_row_time_s(truth, row))))
    # hand check at 512 tokens: kernel 128·2·512²·128 FLOPs at 0.2·2250 TFLOP/s / (1 + 1000/512) = 25.3 µs, + 70 µs
    call_s = heads * rows[0].timing.median_s
    assert call_s == pytest.approx(128 * 2 * 512**2 * 128 / (0.2 * 2250e12 / (1 + 1000 / 512)) + 70e-6, rel=1e-6)
    result = fit_attention_efficiency(rows, base, "fa2", "fwd")
    assert result.params[peak_name] == pytest.approx(0.2, rel=1e-3)
    assert result.params[side_name] == pytest.approx(1000.0, rel=1e-3)
    assert result.params[dispatch_name] == pytest.approx(70.0, rel=1e-3)
    hidden = [dataclasses.replace(row, exposed_dispatches=0.0) for row in rows]
    misread = fit_attention_efficiency(hidden, base, "fa2", "fwd")
    assert dispatch_name not in misread.params and misread.params[side_name] > 1.5 * 1000.0
    # the step model prices the kernel alone: the dispatch key changes no attention rate
    kernel_only = dataclasses.replace(base, gemm_efficiency=kernel_curve)
    assert float(attention_efficiency(truth, 512, 512, 128, "fa2", "fwd")) == \
        float(attention_efficiency(kernel_only, 512, 512, 128, "fa2", "fwd"))


def test_measurement_rows_keep_an_attention_rows_exposed_dispatches_and_refuse_them_elsewhere():
    row = {"precision": "bf16", "m": 512, "n": 512, "k": 128, "median_s": 1e-5, "q1_s": 1e-5, "q3_s": 1e-5,
           "runs": 1, "kind": "attention", "attention_kernel": "fa2", "attention_pass": "fwd",
           "exposed_dispatches": 0.0078125}
    read = measurements_from_dict({"gemm": [row]}, "m.yaml")
    assert read.gemm[0].exposed_dispatches == 0.0078125
    assert measurements_from_dict(read.to_dict(), "again.yaml").gemm == read.gemm
    old = {k: v for k, v in row.items() if k != "exposed_dispatches"}        # rows written before
    assert measurements_from_dict({"gemm": [old]}, "old.yaml").gemm[0].exposed_dispatches == 0.0
    assert "exposed_dispatches" not in measurements_from_dict({"gemm": [old]}, "old.yaml").to_dict()["gemm"][0]
    with pytest.raises(InputError, match="exposed_dispatches"):
        measurements_from_dict({"gemm": [{**row, "exposed_dispatches": -1.0}]}, "bad.yaml")
    gemm = {k: v for k, v in row.items() if k not in ("kind", "attention_kernel", "attention_pass")}
    with pytest.raises(InputError, match="exposed_dispatches"):
        measurements_from_dict({"gemm": [gemm]}, "bad.yaml")
    kernel_less = {k: v for k, v in row.items() if k not in ("attention_kernel", "attention_pass")}
    with pytest.raises(InputError, match="exposed_dispatches"):      # only a named kernel's curve fits a dispatch
        measurements_from_dict({"gemm": [kernel_less]}, "bad.yaml")


def test_the_b200_sdpa_table_carries_one_harness_dispatch_per_call(microbench_tables):
    """cudnn-frontend's benchmark times each call with its host dispatch (microbench_tables.SDPA_HARNESS_DISPATCH):
    one dispatch per call of batch 1 × 128 heads, i.e. 2·S²·d / (the call's 4·1·S²·128·d/2 causal FLOPs) = 1/128
    of one per equivalent GEMM (2.5× less in the backward, whose call counts 2.5× the FLOPs). The fit finds ~80 µs
    in flash_attn's forward and none in its backward (randn_like runs on the GPU while the host dispatches it)."""
    tables = microbench_tables
    file = "attention_sdpa_backends_b200_cudnn_frontend.csv"
    rows = [row.measurement for row in next(t for t in tables.TABLES if t.file == file).read(
        tables.microbench_dir() / file)]
    # (the FLOPs come from the table's rounded TFLOP/s × ms: 3 significant digits)
    for attention_pass, share in (("fwd", 1.0 / 128), ("bwd", 1.0 / 320)):
        timed = [row for row in rows if row.attention_pass == attention_pass]
        assert timed and all(row.exposed_dispatches == pytest.approx(share, rel=1e-2) for row in timed)
    profile = load_profile("b200-180gb")
    from costmodels.compute import attention_dispatch_parameter
    assert 40.0 <= profile.gemm_efficiency[attention_dispatch_parameter("fa2", "fwd")] <= 120.0
    assert profile.gemm_efficiency[attention_dispatch_parameter("fa2", "bwd")] < 1.0


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
        if "attention_peak_fraction" in profile.gemm_efficiency:
            assert "attention_" in profile.provenance["compute.gemm_efficiency.attention"], name
        for key in ("links.nvlink.alpha_us", "links.nvlink.bandwidth_efficiency"):
            assert ".csv" in profile.provenance[key], (name, key)


@pytest.mark.parametrize("file, median_limit, max_limit", [
    ("nccl_allreduce_a100_vtrain_lut.csv", 0.02, 0.08),
    ("nccl_allreduce_coreweave_gb200_h100_a100.csv", 0.03, 0.05),
    ("nccl_points_nvls_vs_ring_ml_engineering.csv", 0.02, 0.05),
    ("nccl_allreduce_h100_dgx_8gpu_dgxc.csv", 0.06, 0.80),      # one 5× spike at 32 B in the source
    ("nccl_allreduce_sweeps_ml_engineering.csv", 0.05, 0.95),   # B200 4-node 32-64 KiB: 3-6 ms warm-up spikes
    ("nccl_sendrecv_a100_8gpu_liplus.csv", 0.20, 0.40),
    ("gemm_cublas_fp16_vs_size_triton_tutorial_issues.csv", 0.08, 0.15),
    ("gemm_fp8_deepgemm_h800.csv", 0.10, 0.25),
    ("attention_cudnn_sdpa_training_h200_gb200.csv", 0.08, 0.20),
    ("attention_fa3_h100_tritonbench_prs.csv", 0.12, 0.30),
    ("attention_sdpa_backends_b200_cudnn_frontend.csv", 0.04, 0.20),  # FA2 bwd at 1024 tokens: 17% off its curve
    ("grouped_mm_bf16_b200_torchao.csv", 0.08, 0.15),            # in benchmarks/microbench/, random group sizes
])
def test_bundled_profiles_reproduce_the_tables_they_were_fitted_to(file, median_limit, max_limit, microbench_tables):
    tables = microbench_tables
    from benchmarks.fidelity_microbench import errors
    table = next(t for t in tables.TABLES if t.file == file)
    rows = list(table.read(tables.table_path(table)))
    # the GB200 / H800 rows of shared files have their own limits (tests/test_gb200_h800_profiles.py)
    rows = [row for row in rows if row.profiles[0] not in (*tables.GB200, *tables.H800)]
    found = errors(rows, {name: load_profile(name) for name in tables.PROFILES}, "fit")
    assert found.size > 0
    assert np.median(found) <= median_limit and np.max(found) <= max_limit, (np.median(found), np.max(found))


def test_bundled_gemm_curves_stay_under_the_max_achievable_matmul_rates(microbench_tables):
    """MAMF (ml-engineering) is the best rate over a sweep of shapes, a maximum: a curve fitted to it and to cuBLAS
    sweeps at training-like shapes (A100, H100) must not promise more than that maximum at its shape, and stays
    within 30% under it."""
    tables = microbench_tables
    from benchmarks.fidelity_microbench import predict_s
    file = "gemm_mamf_max_achievable_matmul_ml_engineering.csv"
    rows = [r for r in next(t for t in tables.TABLES if t.file == file).read(tables.microbench_dir() / file)
            if r.role == "fit"]
    assert rows
    for row in rows:
        predicted_s = predict_s(load_profile(row.profiles[0]), row.measurement)
        measured_s = row.measurement.timing.median_s
        assert 0.70 * predicted_s <= measured_s <= 1.02 * predicted_s, (row.measurement.label, measured_s / predicted_s)

