"""`autopar profile show|fit`, `--profile FILE` and `autopar calibrate` without torch, through a real subprocess.

A damaged profile or measurements file — empty, not YAML, a missing or non-numeric field, a NaN — is refused with
exit 2 and one line naming the file and the field, never a traceback, and nothing is written or half-used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from autopar.calibrate.measurements import (
    COLLECTIVE_KINDS, CollectiveMeasurement, GemmMeasurement, Measurements, Timing, measurements_from_dict,
)
from autopar.calibrate.profile_file import RunInfo, build_profile_text
from costmodels.comm import collective_time_s
from costmodels.compute import OVERHEAD_NORM
from costmodels.hardware import LinkSpec, load_profile

MODEL = "llama-3.1-8b"


def autopar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


def _timing(seconds: float) -> Timing:
    return Timing(seconds, seconds * 0.97, seconds * 1.03, 10)


def calibrated_profile_text() -> str:
    """An H100 cluster whose IB runs at 62% of the 400 Gb/s spec (38% below) and GEMMs at 0.71 of peak."""
    rng = np.random.default_rng(0)
    collectives = []
    for link, alpha_s, bandwidth, n in (("nvlink", 9e-6, 0.85 * 450e9, 8), ("ib", 28e-6, 0.62 * 50e9, 2)):
        truth = LinkSpec(bandwidth, alpha_s, bandwidth)
        for kind in COLLECTIVE_KINDS:
            for size in (2**e for e in range(10, 29, 2)):
                seconds = float(collective_time_s(truth, kind, size, 2 if kind == "send_recv" else n))
                collectives.append(CollectiveMeasurement(link, kind, 2 if kind == "send_recv" else n, size,
                                                         _timing(seconds * (1 + 0.02 * rng.standard_normal()))))
    gemm = []
    floor_s = load_profile("h100-80gb").gemm_efficiency["kernel_floor_us"] * 1e-6   # the fit holds the bundled floor
    for m, n, k in ((4096, 4096, 4096), (4096, 1024, 8192), (16384, 12288, 4096), (4096, 512, 4096)):
        # efficiency 0.71 / (1 + the larger of 480/3·(1/m + 1/n + 1/k) and the kernel floor, smoothly as the cost
        # model takes it) of the 989 TFLOP/s bf16 peak
        roll_off, floor = 160.0 * (1 / m + 1 / n + 1 / k), 0.71 * 989e12 * floor_s / (2.0 * m * n * k)
        efficiency = 0.71 / (1 + (roll_off ** OVERHEAD_NORM + floor ** OVERHEAD_NORM) ** (1 / OVERHEAD_NORM))
        gemm.append(GemmMeasurement("bf16", m, n, k, _timing(2.0 * m * n * k / (efficiency * 989e12))))
    run = RunInfo(measured_at_utc="2026-11-29T09:00:00Z", hostnames=("gpu-node-1", "gpu-node-2"),
                  device_name="NVIDIA H100 80GB HBM3", world_size=16, nodes=2, ranks_per_node=8,
                  torch_version="2.13.0", backend="nccl")
    measurements = Measurements(gemm=tuple(gemm), collectives=tuple(collectives),
                                memory_overheads_bytes={"cuda_context": 0.6 * 2**30})
    text, _, _ = build_profile_text("h100-80gb", "detected device 'NVIDIA H100 80GB HBM3' (80 GiB)", measurements,
                                    run)
    return text


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profiles") / "cluster.yaml"
    path.write_text(calibrated_profile_text(), encoding="utf-8")
    return path


# ---- show ------------------------------------------------------------------------------------------------------

def test_profile_show_compares_with_the_bundled_gpu(calibrated):
    result = autopar("profile", "show", str(calibrated))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "measured 2026-11-29T09:00:00Z on gpu-node-1, gpu-node-2" in out
    assert "compared with bundled profile h100-80gb" in out
    assert "inter-node (ib) bandwidth" in out and "38% below spec" in out  # 0.62 of spec, fitted within noise
    assert "GEMM peak fraction 0.71 vs bundled" in out
    assert "cuda_context 0.6 GiB (measured" in out and "nccl_buffers" in out and "not measured" in out
    assert "fit: 50 collectives" in out


def test_profile_show_json(calibrated):
    result = autopar("profile", "show", str(calibrated), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["calibrated"] and summary["compared_with"] == "h100-80gb"
    ib = summary["links"]["ib"]
    assert ib["measured"] and ib["fraction_of_spec"] == pytest.approx(0.62, rel=0.03)
    assert summary["compute"]["gemm_efficiency"]["peak_fraction"]["value"] == pytest.approx(0.71, rel=0.03)
    assert summary["calibration"]["world_size"] == 16


def test_profile_show_of_a_bundled_gpu():
    result = autopar("profile", "show", "a100")
    assert result.returncode == 0, result.stderr
    assert "not a calibrated profile" in result.stdout


def test_profile_fit_refits_from_stored_measurements(calibrated, tmp_path):
    out = tmp_path / "refit.yaml"
    result = autopar("profile", "fit", str(calibrated), "--out", str(out), "--base-gpu", "h200")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(out.read_text())
    assert data["calibration"]["base_profile"] == "h200-141gb"
    assert data["memory"]["hbm_gib"] == 141  # spec sheet from the new base
    assert data["calibration"]["measured_at_utc"] == "2026-11-29T09:00:00Z"  # when measured, not when refitted
    assert any("refitted" in note for note in data["calibration"]["notes"])


def test_estimate_uses_the_calibrated_profile(calibrated):
    slow, fast = (autopar("estimate", MODEL, "--tp", "8", "--num-gpus", "8", "--json", *flags)
                  for flags in (["--profile", str(calibrated)], ["--gpu", "h100"]))
    assert slow.returncode == fast.returncode == 0, slow.stderr + fast.stderr
    assert json.loads(slow.stdout)["step_time_s"] != json.loads(fast.stdout)["step_time_s"]


# ---- a profile measured on a CPU (`autopar calibrate --allow-cpu`) --------------------------------------------------

def cpu_profile_text() -> str:
    """The same measurements, as a CPU run on host 'Build.Box_1' would record them (device_name 'cpu', gloo)."""
    data = yaml.safe_load(calibrated_profile_text())
    measurements = measurements_from_dict(data["calibration"]["measurements"], "cpu")
    run = RunInfo(measured_at_utc="2026-11-29T09:00:00Z", hostnames=("Build.Box_1", "Build.Box_1"),
                  device_name="cpu", world_size=2, nodes=1, ranks_per_node=2, torch_version="2.13.0",
                  backend="gloo")
    text, _, _ = build_profile_text("a100-80gb", "CPU run (--allow-cpu, no GPU)", measurements, run)
    return text


@pytest.fixture(scope="module")
def cpu_profiles(tmp_path_factory) -> dict[str, Path]:
    """'new': as written now; 'legacy': as written before CPU runs were marked (no `device`, an A100's name)."""
    folder = tmp_path_factory.mktemp("cpu")
    legacy = yaml.safe_load(cpu_profile_text())
    del legacy["calibration"]["device"]
    legacy["name"], legacy["display_name"] = "a100-80gb-calibrated", "NVIDIA A100 80GB, calibrated"
    paths = {"new": folder / "cpu.yaml", "legacy": folder / "legacy.yaml"}
    paths["new"].write_text(cpu_profile_text(), encoding="utf-8")
    paths["legacy"].write_text(yaml.safe_dump(legacy, sort_keys=False), encoding="utf-8")
    return paths


def test_a_cpu_profile_is_named_and_marked_as_cpu():
    data = yaml.safe_load(cpu_profile_text())
    assert data["name"] == "cpu-build-box-1-calibrated"  # the host, lower case, dashes only
    assert "CPU run" in data["display_name"] and "NOT a GPU" in data["display_name"]
    assert data["calibration"]["device"] == "cpu" and data["provenance"]["device"].startswith("cpu: ")
    assert yaml.safe_load(calibrated_profile_text())["calibration"]["device"] == "cuda"


CPU_COMMANDS = {
    "estimate": ["estimate", MODEL, "--tp", "8", "--num-gpus", "8"],
    "solve": ["solve", MODEL, "--gpus", "8"],
    "explain": ["explain", MODEL, "--gpus", "8"],
}


@pytest.mark.parametrize("kind", ["new", "legacy"])
@pytest.mark.parametrize("command", list(CPU_COMMANDS))
def test_a_cpu_profile_is_refused_without_the_acknowledgement(cpu_profiles, command, kind):
    path = cpu_profiles[kind]
    result = autopar(*CPU_COMMANDS[command], "--profile", str(path))
    assert_refused(result, path, ["measured on a CPU", "Build.Box_1", "not a GPU", "--allow-cpu-profile"])


def test_a_cpu_profile_is_used_with_the_acknowledgement(cpu_profiles):
    result = autopar(*CPU_COMMANDS["estimate"], "--profile", str(cpu_profiles["new"]), "--allow-cpu-profile",
                     "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["cluster"]["gpu"] == "cpu-build-box-1-calibrated"


def test_the_acknowledgement_changes_nothing_for_a_gpu_profile(calibrated):
    plain, acknowledged = (autopar(*CPU_COMMANDS["estimate"], "--profile", str(calibrated), "--json", *flags)
                           for flags in ([], ["--allow-cpu-profile"]))
    assert plain.returncode == acknowledged.returncode == 0, plain.stderr + acknowledged.stderr
    assert json.loads(plain.stdout)["step_time_s"] == json.loads(acknowledged.stdout)["step_time_s"]


@pytest.mark.parametrize("kind", ["new", "legacy"])
def test_profile_show_warns_that_a_cpu_profile_was_measured_on_cpu(cpu_profiles, kind):
    result = autopar("profile", "show", str(cpu_profiles[kind]))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("WARNING: measured on CPU")]
    assert len(warnings) == 1 and "not a GPU" in warnings[0] and "--allow-cpu-profile" in warnings[0]
    summary = json.loads(autopar("profile", "show", str(cpu_profiles[kind]), "--json").stdout)
    assert summary["measured_on_cpu"] and summary["calibration"]["device"] == "cpu"


def test_profile_show_of_a_gpu_profile_has_no_cpu_warning(calibrated):
    result = autopar("profile", "show", str(calibrated))
    assert result.returncode == 0 and "WARNING" not in result.stdout, result.stderr


def test_a_refit_cpu_profile_stays_a_cpu_profile(cpu_profiles, tmp_path):
    out = tmp_path / "refit.yaml"
    result = autopar("profile", "fit", str(cpu_profiles["legacy"]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "cpu-build-box-1-calibrated" and data["calibration"]["device"] == "cpu"


def test_a_device_that_contradicts_the_device_name_is_refused(cpu_profiles, tmp_path):
    data = yaml.safe_load(cpu_profiles["new"].read_text())
    data["calibration"]["device"] = "cuda"  # hand-edited to slip past the check: device_name still says cpu
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert_refused(autopar(*CPU_COMMANDS["estimate"], "--profile", str(path), "--allow-cpu-profile"), path,
                   ["calibration.device", "contradicts", "cpu"])


# ---- damaged files -----------------------------------------------------------------------------------------------

def damage(text: str, how: str) -> str:
    data = yaml.safe_load(text)
    if how == "nan_fitted_field":
        data["links"]["ib"]["bandwidth_efficiency"] = float("nan")
    elif how == "text_fitted_field":
        data["links"]["nvlink"]["alpha_us"] = "fast"
    elif how == "missing_field":
        del data["compute"]["peak_tflops"]
    elif how == "nan_measurement":
        data["calibration"]["measurements"]["collectives"][3]["median_s"] = float("nan")
    elif how == "text_measurement":
        data["calibration"]["measurements"]["gemm"][0]["m"] = "many"
    elif how == "quartiles_out_of_order":
        row = data["calibration"]["measurements"]["gemm"][1]
        row["q1_s"] = row["median_s"] * 2
    elif how == "no_measurements":
        del data["calibration"]["measurements"]
    elif how == "nan_fit_residual":
        data["calibration"]["fit"]["links"]["ib"]["rms_relative_residual"] = float("nan")
    else:
        raise AssertionError(how)
    return yaml.safe_dump(data, sort_keys=False)


BAD_PROFILES = {
    "empty": ("", ["empty"]),
    "not_yaml": ("links: [unclosed\n  - {", ["not valid YAML"]),
    "a_list": ("- 1\n- 2\n", ["not a mapping"]),
    "nan_fitted_field": (None, ["links.ib.bandwidth_efficiency", "finite", "nan"]),
    "text_fitted_field": (None, ["links.nvlink.alpha_us", "finite", "fast"]),
    "missing_field": (None, ["compute.peak_tflops", "missing"]),
    "nan_measurement": (None, ["collectives", "median_s", "finite"]),
    "text_measurement": (None, ["gemm[0].m", "finite", "many"]),
    "quartiles_out_of_order": (None, ["gemm[1]", "q1_s <= median_s"]),
    "no_measurements": (None, ["calibration.measurements", "missing"]),
    "nan_fit_residual": (None, ["rms_relative_residual", "finite"]),
}


@pytest.fixture(scope="module")
def bad_profiles(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    text = calibrated_profile_text()
    paths = {}
    for name, (content, _) in BAD_PROFILES.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(content if content is not None else damage(text, name), encoding="utf-8")
    return paths


def assert_refused(result: subprocess.CompletedProcess, path: Path, words: list[str]) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert path.name in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("name", list(BAD_PROFILES))
def test_profile_show_refuses_a_damaged_profile(bad_profiles, name):
    assert_refused(autopar("profile", "show", str(bad_profiles[name])), bad_profiles[name], BAD_PROFILES[name][1])


@pytest.mark.parametrize("name", ["empty", "nan_fitted_field", "missing_field", "nan_measurement",
                                  "quartiles_out_of_order", "text_measurement"])
def test_estimate_refuses_a_damaged_profile(bad_profiles, name):
    path = bad_profiles[name]
    assert_refused(autopar("estimate", MODEL, "--profile", str(path), "--tp", "8", "--num-gpus", "8"), path,
                   BAD_PROFILES[name][1])


@pytest.mark.parametrize("name", ["not_yaml", "text_fitted_field", "nan_measurement", "quartiles_out_of_order",
                                  "no_measurements"])
def test_solve_refuses_a_damaged_profile(bad_profiles, name):
    path = bad_profiles[name]
    assert_refused(autopar("solve", MODEL, "--gpus", "8", "--profile", str(path)), path, BAD_PROFILES[name][1])


def test_solve_uses_the_calibrated_profile(calibrated):
    result = autopar("solve", MODEL, "--gpus", "16", "--profile", str(calibrated), "--json")
    assert result.returncode == 0, result.stderr
    front = json.loads(result.stdout)
    assert front["inputs"]["cluster"]["gpu"] == "h100-80gb-calibrated" and front["points"]


@pytest.mark.parametrize("name", ["nan_measurement", "text_measurement", "quartiles_out_of_order", "not_yaml",
                                  "empty"])
def test_profile_fit_refuses_damaged_measurements_and_writes_nothing(bad_profiles, name, tmp_path):
    out = tmp_path / "never.yaml"
    result = autopar("profile", "fit", str(bad_profiles[name]), "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert bad_profiles[name].name in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bare_measurements_file_with_a_nan_is_refused(tmp_path):
    # a calibration section on its own (what `profile fit` also accepts), one NaN deep inside
    data = yaml.safe_load(calibrated_profile_text())["calibration"]
    data["measurements"]["gemm"][2]["median_s"] = float("nan")
    bad = tmp_path / "measurements.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = autopar("profile", "fit", str(bad), "--out", str(tmp_path / "out.yaml"))
    assert_refused(result, bad, ["gemm[2].median_s", "finite"])
    assert not (tmp_path / "out.yaml").exists()


# ---- calibrate without torch; torch never imported elsewhere --------------------------------------------------------

def test_calibrate_without_torch_says_how_to_install_it(tmp_path):
    hide_torch = ("import sys; sys.modules['torch'] = None\n"  # find_spec('torch') is None: as if not installed
                  "from autopar.cli import main\n"
                  f"sys.exit(main(['calibrate', '--out', {str(tmp_path / 'p.yaml')!r}]))")
    result = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "pip install 'autopar[calibrate]'" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_no_other_command_imports_torch(calibrated):
    script = ("import sys\n"
              "from autopar.cli import main\n"
              f"assert main(['profile', 'show', {str(calibrated)!r}, '--json']) == 0\n"
              f"assert main(['estimate', {MODEL!r}, '--profile', {str(calibrated)!r}, '--tp', '8', '--num-gpus', '8']) "
              "in (0, 1)\n"
              "assert main(['calibrate', '--help']) == 0\n"
              "assert 'torch' not in sys.modules, 'torch was imported'\n"
              "print('no torch')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "no torch" in result.stdout, result.stderr[-2000:]
