"""The A800 80GB SXM profile: A100 80GB SXM's fit with NVLink cut from 300 to 200 GB/s per direction, derived by
benchmarks/fit_microbench.py's named rule (no microbenchmark measured an A800), and the run readers' GPU strings."""

from __future__ import annotations

import pytest
import yaml

from autopar.runs import gpu_profile
from costmodels.hardware import _bundled_text, load_profile

CUT = 200 / 300
"""A800 NVLink 400 GB/s bidirectional against A100's 600 (both per GPU; 200 and 300 per direction)."""


@pytest.fixture(scope="module")
def a800():
    return load_profile("a800-80gb")


@pytest.fixture(scope="module")
def a100():
    return load_profile("a100-80gb")


@pytest.mark.parametrize("alias", ["a800", "A800-SXM", "a800-80gb-sxm", "a800-80gb"])
def test_the_aliases_name_the_a800(alias):
    assert load_profile(alias).name == "a800-80gb"


def test_compute_memory_and_host_are_a100_80gbs(a800, a100):
    assert a800.display_name == "NVIDIA A800 80GB SXM" and a800.gpus_per_node == a100.gpus_per_node == 8
    for field in ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "peak_flops_per_s", "gemm_efficiency",
                  "memory_overheads_bytes", "streaming_multiprocessors", "bf16_flops_per_clock_per_sm",
                  "exp2_per_clock_per_sm", "compute_capability", "sustained_clock_fraction", "host_costs"):
        assert getattr(a800, field) == getattr(a100, field), field
    assert a800.extra["elementwise"] == a100.extra["elementwise"]
    assert {"grouped_hbm_efficiency", "attention_fa2_fwd_peak_fraction"} <= set(a800.gemm_efficiency)


def test_nvlink_is_two_thirds_of_a100s_and_ib_is_the_same(a800, a100):
    nvlink, a100_nvlink = a800.links["nvlink"], a100.links["nvlink"]
    assert nvlink.nominal_bandwidth_bytes_per_s == 200e9 and a100_nvlink.nominal_bandwidth_bytes_per_s == 300e9
    assert nvlink.bandwidth_bytes_per_s == pytest.approx(CUT * a100_nvlink.bandwidth_bytes_per_s, rel=1e-9)
    assert nvlink.alpha_s == a100_nvlink.alpha_s
    assert a800.links["ib"] == a100.links["ib"]
    assert set(a800.collectives) == set(a100.collectives)
    assert a800.collectives["ib"] == a100.collectives["ib"]
    assert set(a800.collectives["nvlink"]) == set(a100.collectives["nvlink"]) >= {"all_reduce", "all_gather"}
    for kind, points in a100.collectives["nvlink"].items():
        cut = a800.collectives["nvlink"][kind]
        assert [p.group_size for p in cut] == [p.group_size for p in points], kind
        for mine, theirs in zip(cut, points):
            assert mine.alpha_s == theirs.alpha_s, kind                       # latencies unchanged
            assert mine.bus_bandwidth_bytes_per_s == pytest.approx(CUT * theirs.bus_bandwidth_bytes_per_s,
                                                                   rel=1e-5), kind


def test_an_8_gpu_all_reduce_takes_longer_on_a800_only_where_bandwidth_bound(a800, a100):
    from costmodels.comm import link_collective_time_s

    def ratio(size_bytes: float) -> float:
        return float(link_collective_time_s(a800, "nvlink", "all_reduce", size_bytes, 8)
                     / link_collective_time_s(a100, "nvlink", "all_reduce", size_bytes, 8))

    assert ratio(4 * 2**30) == pytest.approx(1 / CUT, rel=0.02)   # 4 GiB: the bandwidth term dominates
    assert 1.0 < ratio(64 * 2**10) < 1.2                          # 64 KiB: mostly the unchanged latency


def test_every_fitted_key_names_the_rule_and_the_a100_fit(a800, a100):
    from benchmarks.fit_microbench import A800_RULE

    fitted = [key for key in a800.provenance
              if key.startswith(("compute.gemm_efficiency", "collectives.", "host.", "links.nvlink.alpha",
                                 "links.nvlink.bandwidth_eff", "links.ib.alpha", "links.ib.bandwidth_eff"))]
    assert set(fitted) == {key for key in a100.provenance if key in fitted} and len(fitted) >= 20
    for key in fitted:
        source = a800.provenance[key]
        assert source.startswith(f"extrapolated: the a100-80gb value ({A800_RULE})"), key
        assert source.endswith(f"a100-80gb: {a100.provenance[key]}"), key           # the donor's own source follows
    for kind in a800.collectives["nvlink"]:
        assert "× 0.6667" in a800.provenance[f"collectives.nvlink.{kind}"]
        assert "(200 / 300 GB/s), latencies unchanged" in a800.provenance[f"collectives.nvlink.{kind}"]
    assert "does not state its fabric" in a800.provenance["collectives.ib.all_reduce"]
    nvlink_spec = a800.provenance["links.nvlink.bandwidth_gb_per_s"]
    assert "400 GB/s" in nvlink_spec and "2406.06563" in nvlink_spec and "Reuters" in nvlink_spec
    for key in ("memory.hbm_gib", "memory.hbm_tb_per_s", "compute.peak_tflops", "links.ib.bandwidth_gbit_per_s"):
        assert "A100-80GB-SXM row of shared/reference/hardware.csv" in a800.provenance[key], key


def test_fit_microbench_derives_the_bundled_a800_from_the_bundled_a100():
    """`python benchmarks/fit_microbench.py --write` writes a100-80gb from its fit and a800-80gb from that; the bundled
    A800 is what the rule makes of the bundled A100 (refit the A100 and this fails until the A800 is rewritten)."""
    from benchmarks import fit_microbench

    assert "a800-80gb" in fit_microbench.ORDER
    rule = fit_microbench.EXTRAPOLATED["a800-80gb"]
    assert rule["fit_from_profile"] == "a100-80gb"
    _, data, _ = fit_microbench.derive_variant("a800-80gb", yaml.safe_load(_bundled_text("a100-80gb")), rule)
    assert fit_microbench.profile_text("a800-80gb", data) == _bundled_text("a800-80gb")


@pytest.mark.parametrize("gpu, expected", [
    ("A800", "a800-80gb"),
    ("A800-80G SXM", "a800-80gb"),                   # Skywork-MoE's row
    ("NVIDIA A800-SXM4-80GB", "a800-80gb"),
    ("H800", "h800-80gb"),
    ("A100 80GB", "a100-80gb"),
])
def test_run_gpu_strings_resolve_to_the_profile(gpu, expected):
    profile, why, _ = gpu_profile(gpu)
    assert profile is not None and profile.name == expected, why


@pytest.mark.parametrize("gpu", ["A800 40GB PCIe", "A800 PCIe 80GB", "A800-40G"])
def test_other_a800_cards_are_refused_with_the_reason(gpu):
    profile, why, _ = gpu_profile(gpu)
    assert profile is None and "80GB SXM" in why and gpu in why
