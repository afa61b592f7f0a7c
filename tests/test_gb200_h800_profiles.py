"""GB200 NVL72 and H800 profiles: an NVLink domain larger than a node (72 GPUs on trays of 4) decides NVLink vs
InfiniBand for every group; the two profiles are fitted from the microbenchmarks that measured them; `autopar solve
--gpu gb200` runs end to end; the published GB200 rows become cases with what their sources state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.api import make_cluster
from autopar.models import load_model
from costmodels.errors import InputError
from costmodels.hardware import load_profile, parse_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.scoring import estimate
from costmodels.specs import ClusterSpec, TrainingSpec, job_nvlink_domain_gpus
from costmodels.steptime import step_time_s

TRAIN = TrainingSpec(seq_len=4096, global_batch_size=64)


def test_profiles_state_their_node_and_nvlink_domain():
    gb200, h800, h100 = load_profile("gb200"), load_profile("h800"), load_profile("h100")
    assert (gb200.name, gb200.gpus_per_node, gb200.nvlink_domain_size) == ("gb200-186gb", 4, 72)
    assert (h800.gpus_per_node, h800.nvlink_domain_size) == (8, 8)
    assert h100.nvlink_domain_size == h100.gpus_per_node == 8            # absent in the YAML: one node
    assert h800.peak_flops_per_s == h100.peak_flops_per_s                # H800 = H100 SXM compute
    assert h800.links["nvlink"].nominal_bandwidth_bytes_per_s == 200e9   # 400 GB/s bidirectional
    # DeepEP's ~155 GB/s of received bytes on H800 NVLink, 7/8 of them from the other ranks: ~135 GB/s over the
    # links, not H100's 450 GB/s
    (point,) = h800.collectives["nvlink"]["all_to_all"]
    assert 125e9 < point.bus_bandwidth_bytes_per_s < 145e9


@pytest.mark.parametrize("name", ["gb200-186gb", "h800-80gb"])
def test_spec_values_name_their_source_and_fits_their_files(name):
    profile = load_profile(name)
    for key in ("memory.hbm_gib", "memory.hbm_tb_per_s", "compute.peak_tflops", "links.nvlink.bandwidth_gb_per_s",
                "links.ib.bandwidth_gbit_per_s"):
        assert "spec" in profile.provenance[key], (key, profile.provenance[key])
    assert ".csv" in profile.provenance["compute.gemm_efficiency"]
    for link, kinds in profile.collectives.items():
        for kind in kinds:
            source = profile.provenance[f"collectives.{link}.{kind}"]
            assert ".csv" in source or "extrapolated" in source, (link, kind, source)


GB200_YAML = Path(__file__).resolve().parent.parent / "costmodels" / "profiles" / "gb200-186gb.yaml"


def _profile_text(domain_line: str) -> str:
    text = GB200_YAML.read_text(encoding="utf-8")
    assert "nvlink_domain_size: 72\n" in text
    return text.replace("nvlink_domain_size: 72\n", domain_line)


def test_nvlink_domain_size_must_be_whole_nodes():
    with pytest.raises(InputError, match="nvlink_domain_size must be a whole multiple of gpus_per_node=4"):
        parse_profile(_profile_text("nvlink_domain_size: 10\n"), "mine.yaml")
    with pytest.raises(InputError, match="nvlink_domain_size"):
        parse_profile(_profile_text("nvlink_domain_size: many\n"), "mine.yaml")
    assert parse_profile(_profile_text(""), "mine.yaml").nvlink_domain_size == 4     # absent: the node


@pytest.mark.parametrize("num_gpus, expected", [(4, 4), (8, 8), (64, 64), (72, 72), (128, 64), (144, 72),
                                                (256, 64), (1440, 72), (100, 20)])
def test_a_job_fills_every_rack_alike(num_gpus, expected):
    assert job_nvlink_domain_gpus(num_gpus, 4, 72) == expected
    cluster = ClusterSpec(profile=load_profile("gb200"), num_gpus=num_gpus)
    assert cluster.nvlink_domain_gpus == expected and cluster.gpus_per_node == min(4, num_gpus)


def test_a_cluster_resized_rederives_its_domain_unless_stated():
    import dataclasses

    gb200 = load_profile("gb200")
    assert dataclasses.replace(ClusterSpec(profile=gb200, num_gpus=256), num_gpus=128).nvlink_domain_gpus == 64
    stated = ClusterSpec(profile=gb200, num_gpus=256, nvlink_domain=32)
    assert dataclasses.replace(stated, num_gpus=64).nvlink_domain_gpus == 32
    h100 = ClusterSpec(profile=load_profile("h100"), num_gpus=16)
    assert dataclasses.replace(h100, num_gpus=4, gpus_per_node=4).nvlink_domain_gpus == 4   # scaling fronts


def test_one_node_systems_keep_the_node_as_the_domain():
    assert ClusterSpec(profile=load_profile("h100"), num_gpus=64).nvlink_domain_gpus == 8
    assert ClusterSpec(profile=load_profile("h100"), num_gpus=64, gpus_per_node=4).nvlink_domain_gpus == 4


@pytest.mark.parametrize("domain, message", [(36, "not a multiple of nvlink_domain_gpus=36"),
                                             (6, "whole nodes of 4"), (128, "within one NVLink domain of 72")])
def test_a_stated_domain_is_checked(domain, message):
    with pytest.raises(InputError, match=message):
        ClusterSpec(profile=load_profile("gb200"), num_gpus=256, nvlink_domain=domain)


def test_a_group_inside_the_rack_is_priced_on_nvlink_and_across_racks_on_ib():
    model = load_model("llama-3.1-8b")
    plan = PlanArrays.from_plans([Plan(tp=8, sp=True)])
    rack = make_cluster("gb200", num_gpus=16)                       # one NVLink domain of 16
    trays = make_cluster("gb200", num_gpus=16, nvlink_domain_gpus=4)  # NVLink only inside each tray
    assert rack.nvlink_domain_gpus == 16 and trays.nvlink_domain_gpus == 4
    inside = float(step_time_s(model, rack, TRAIN, plan)[0])
    across = float(step_time_s(model, trays, TRAIN, plan)[0])
    assert across > 1.05 * inside                                   # tp 8 over IB every layer costs
    # the guide's rule keeps TP inside the NVLink domain, not inside the 4-GPU tray
    assert "tp_node" not in estimate(model, rack, TRAIN, Plan(tp=8, sp=True)).violations
    assert "tp_node" in estimate(model, trays, TRAIN, Plan(tp=8, sp=True)).violations


def _autopar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_solve_on_gb200_end_to_end():
    result = _autopar("solve", "llama-3.1-8b", "--gpu", "gb200", "--gpus", "16", "--seq-len", "4096",
                      "--global-batch", "64", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    cluster = out["inputs"]["cluster"] if "inputs" in out else out["cluster"]
    assert (cluster["gpu"], cluster["gpus_per_node"], cluster["num_nodes"], cluster["nvlink_domain_gpus"]) == \
        ("gb200-186gb", 4, 4, 16)
    assert out["points"] and all(p["fits"] and p["num_gpus"] == 16 for p in out["points"])
    text = _autopar("solve", "llama-3.1-8b", "--gpu", "gb200", "--gpus", "256", "--global-batch", "256",
                    "--nvlink-domain-gpus", "32")
    assert text.returncode == 0, text.stderr
    assert "64 nodes of 4, NVLink domains of 32" in text.stdout
    bad = _autopar("solve", "llama-3.1-8b", "--gpu", "gb200", "--gpus", "256", "--nvlink-domain-gpus", "36")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_gpus_lists_the_new_profiles():
    rows = {row["name"]: row for row in json.loads(_autopar("gpus", "--json").stdout)}
    assert rows["gb200-186gb"]["nvlink_domain_size"] == 72 and rows["gb200-186gb"]["gpus_per_node"] == 4
    assert rows["h800-80gb"]["links"]["nvlink"]["nominal_bandwidth_bytes_per_s"] == 200e9
    assert rows["a800-80gb"]["links"]["nvlink"]["nominal_bandwidth_bytes_per_s"] == 200e9


# ---- the microbenchmarks these profiles were fitted to ---------------------------------------------------------

@pytest.mark.parametrize("file, profile, median_limit, max_limit", [
    # rack (NVLS over MNNVL, 512 MiB..8 GiB: alpha not determined) and 2 / 20 racks over IB
    ("nccl_allreduce_coreweave_gb200_h100_a100.csv", "gb200-186gb", 0.15, 0.50),
    ("p2p_bandwidth_matrices_ml_engineering.csv", "gb200-186gb", 0.01, 0.02),
    ("attention_cudnn_sdpa_training_h200_gb200.csv", "gb200-186gb", 0.10, 0.20),
    ("moe_deepep_v1_dispatch_combine_h800.csv", "h800-80gb", 0.03, 0.05),
    ("gemm_tilelang_h800_8192x8192xK.csv", "h800-80gb", 0.05, 0.12),
    ("gemm_fp8_deepgemm_h800.csv", "h800-80gb", 0.10, 0.25),
])
def test_new_profiles_reproduce_the_tables_they_were_fitted_to(file, profile, median_limit, max_limit,
                                                                microbench_tables):
    tables = microbench_tables
    from benchmarks.fidelity_microbench import predict_s

    rows = [row for row in next(t for t in tables.TABLES if t.file == file).read(tables.microbench_dir() / file)
            if row.role == "fit" and profile in row.profiles]
    assert rows
    bundled = load_profile(profile)
    found = np.array([abs(predict_s(bundled, row.measurement) / row.measurement.timing.median_s - 1) for row in rows])
    assert np.median(found) <= median_limit and np.max(found) <= max_limit, (np.median(found), np.max(found))


@pytest.mark.parametrize("profile", ["b200-180gb", "gb200-186gb"])
def test_a_gpu_measured_only_at_mamfs_best_shape_sits_below_it_as_hoppers_curve_does(profile, microbench_tables):
    """MAMF's row is a maximum over a brute-force shape sweep: the bundled B200 / GB200 curves run it at the share of
    that maximum where H100's (bf16) and H200's (fp8) fitted curves run their own MAMF rows, with H100's roll-off."""
    from benchmarks import fit_microbench
    from benchmarks.fidelity_microbench import predict_s

    tables = microbench_tables
    file = "gemm_mamf_max_achievable_matmul_ml_engineering.csv"
    rows = [row for row in next(t for t in tables.TABLES if t.file == file).read(tables.microbench_dir() / file)
            if row.role == "fit"]
    bundled = load_profile(profile)
    for precision, key, rolloff_donor, share_donor in fit_microbench.GEMM_DONORS:
        donor = load_profile(share_donor)
        donor_rows = [r.measurement for r in rows if share_donor in r.profiles and r.measurement.precision == precision]
        share = np.mean([r.timing.median_s / predict_s(donor, r) for r in donor_rows])
        assert 0.6 < share < 0.9                                   # Hopper's fitted curve sits below MAMF's maximum
        mine = [r.measurement for r in rows if profile in r.profiles and r.measurement.precision == precision]
        assert mine
        for measurement in mine:
            assert measurement.timing.median_s / predict_s(bundled, measurement) == pytest.approx(share, rel=0.01)
        source = load_profile(rolloff_donor)
        balance = (bundled.peak_flops_per_s[precision] / bundled.hbm_bandwidth_bytes_per_s) / \
            (source.peak_flops_per_s[precision] / source.hbm_bandwidth_bytes_per_s)
        assert bundled.gemm_efficiency[key] == pytest.approx(source.gemm_efficiency[key] * balance, rel=1e-3)


# ---- published runs the profiles unlock ---------------------------------------------------------------------------

def _runs():
    from benchmarks import fidelity_runs
    try:
        if not (fidelity_runs.reference_dir() / "runs").is_dir():
            pytest.skip("shared/reference/runs not present")
    except FileNotFoundError:
        pytest.skip("shared/reference is not next to this checkout")
    return fidelity_runs


def test_dsv3_gb200_final_row_uses_the_stated_layout_and_rack_share():
    runs = _runs()
    rows = runs.dsv3_gb200()
    cases = [r for r in rows if isinstance(r, runs.Case)]
    assert len(rows) == 13 and [c.row_id for c in cases] == ["13"]
    case = cases[0]
    layout = case.fixed["layout"]
    assert len(layout) == 32 and sum(layout) == 61 and layout[0] == 1 and layout[-1] == 0   # 'Et|(tt|)*30L'
    assert (case.cluster.num_gpus, case.cluster.gpus_per_node, case.cluster.nvlink_domain_gpus) == (256, 4, 32)
    assert case.model.num_mtp_layers == 0 and case.fixed["ep"] == 32 and case.fixed["pp"] == 8
    flops = runs.megatron_flops_per_step(case.model, case.training, causal=True)
    assert case.measured_step_s == pytest.approx(flops / (970.01e12 * 256))
    assert runs.predict(case) is not None


def test_modelzoo_gb200_rows_count_trays_of_four_and_gb300_stays_refused():
    runs = _runs()
    rows = {r.row_id: r for r in runs.modelzoo()}
    assert rows["15"].cluster.num_gpus == 64 * 4 and rows["17"].cluster.num_gpus == 32 * 4
    assert rows["15"].cluster.nvlink_domain_gpus == 64
    assert rows["16"].training.precision.value == "fp8"                  # MXFP8 priced as fp8, said in a note
    assert any("MXFP8" in note for note in rows["16"].assumptions)
    assert isinstance(rows["18"], runs.Unexpressed) and "gb300" in rows["18"].reason
    # the H100 rows, which state both, agree with the causal formula used for the GB200 rows' TFLOP/s
    h100 = rows["1"]
    flops = runs.megatron_flops_per_step(h100.model, h100.training, causal=True)
    assert flops / (245e12 * 256) == pytest.approx(h100.measured_step_s, rel=0.02)


@pytest.mark.parametrize("device_name, memory_gib, expected", [
    ("NVIDIA GB200", 184.0, "gb200-186gb"),
    ("NVIDIA H800 80GB HBM3", 79.6, "h800-80gb"),
    ("NVIDIA H100 80GB HBM3", 79.2, "h100-80gb"),
    ("NVIDIA A800-SXM4-80GB", 79.3, "a800-80gb"),
])
def test_calibrate_picks_the_new_profiles_as_base(device_name, memory_gib, expected):
    from autopar.calibrate.profile_file import base_profile_for_device
    assert base_profile_for_device(device_name, memory_gib) == expected


def test_every_bundled_profile_states_its_sm_count():
    expected = {"a100-40gb": 108, "a100-80gb": 108, "a800-80gb": 108, "h100-80gb": 132, "h200-141gb": 132,
                "h800-80gb": 132, "b200-180gb": 148, "gb200-186gb": 148}
    for name, sms in expected.items():
        profile = load_profile(name)
        assert profile.streaming_multiprocessors == sms
        assert profile.provenance["compute.streaming_multiprocessors"]


@pytest.mark.parametrize("field, value, bad_values, absent", [
    ("streaming_multiprocessors", "148", ("12.5", "-3", "2000", "many"), 0),     # not stated: contention not priced
    ("sustained_clock_fraction", "0.804", ("0", "0.1", "1.2", "-0.5", "fast"), 1.0),  # not stated: burst rate
    ("bf16_flops_per_clock_per_sm", "8192", ("0", "-3", "1e9", "fast"), 0.0),  # not stated: no head-dim factor
    ("exp2_per_clock_per_sm", "16", ("0", "-1", "1e6", "many"), 0.0),
])
def test_optional_compute_fields_are_checked_and_default_when_absent(field, value, bad_values, absent):
    text = GB200_YAML.read_text(encoding="utf-8")
    line = f"  {field}: {value}\n"
    assert line in text
    for bad in bad_values:
        with pytest.raises(InputError, match=f"compute.{field}"):
            parse_profile(text.replace(line, f"  {field}: {bad}\n"), "mine.yaml")
    assert getattr(parse_profile(text.replace(line, ""), "mine.yaml"), field) == absent
