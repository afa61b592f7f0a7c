"""`autopar calibrate` end to end under torchrun: 2 ranks, gloo on CPU, tiny sizes; then the profile is used.

torch is not in the light `test` extra (on the public registry it is the CUDA build): .ci/run installs the CPU build
where pip can find one, `pip install 'autopar[calibrate]'` installs it by hand; without it these tests skip, saying
so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autopar.calibrate.profile_file import cpu_profile_name
from costmodels.hardware import load_profile

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed: the calibration tests need its CPU build (pip install 'autopar[calibrate]'; "
                "the `test` extra leaves it out)", allow_module_level=True)

TINY = ["--quick", "--max-bytes", "4M", "--warmup", "1", "--iters", "3"]
CPU_PROFILE_NAME = cpu_profile_name(socket.gethostname())  # 'cpu-<this host>-calibrated'


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "-m", "autopar", "calibrate", "--out", str(out), "--allow-cpu", *TINY, *extra]  # gloo on this CPU


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment(), cwd=cwd)


def autopar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "autopar", *args], cwd)


@pytest.fixture(scope="module")
def one_node_profile(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("one_node")
    out = folder / "cluster.yaml"
    result = run(torchrun_command(out), folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"wrote {out}" in result.stdout
    return out


def test_two_ranks_on_one_node_measure_the_intra_node_link(one_node_profile):
    profile = load_profile(one_node_profile)  # the one validating parser accepts it
    calibration = profile.extra["calibration"]
    assert calibration["world_size"] == 2 and calibration["nodes"] == 1 and calibration["ranks_per_node"] == 2
    assert calibration["backend"] == "gloo" and calibration["device_name"] == "cpu"
    assert calibration["device"] == "cpu" and profile.provenance["device"].startswith("cpu: ")
    assert profile.name == CPU_PROFILE_NAME and "NOT a GPU" in profile.display_name  # never 'a100-80gb-calibrated'
    assert calibration["torch_version"].startswith("2.") and calibration["measured_at_utc"].endswith("Z")
    rows = calibration["measurements"]["collectives"]
    assert {row["kind"] for row in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                             "send_recv"}
    assert {row["link"] for row in rows} == {"nvlink"}
    assert min(row["bytes"] for row in rows) == 1024 and max(row["bytes"] for row in rows) == 4 * 2**20
    assert all(row["q1_s"] <= row["median_s"] <= row["q3_s"] and row["runs"] == 3 for row in rows)
    assert calibration["measurements"]["gemm"], "GEMMs measured"
    fit = calibration["fit"]
    assert fit["links"]["nvlink"]["points"] == len(rows) and "gemm_efficiency" in fit
    assert "autopar calibrate" in profile.provenance["links.nvlink.alpha_us"]
    # one node: the inter-node link keeps the base profile's values and says so
    base = load_profile(calibration["base_profile"])
    assert calibration["base_profile"] == "a100-80gb" and "CPU run" in calibration["base_profile_reason"]
    assert profile.links["ib"] == base.links["ib"]
    assert any("inter-node link (ib) not measured" in note for note in calibration["notes"])
    assert any("memory overheads not measured" in note for note in calibration["notes"])
    assert profile.memory_overheads_bytes == base.memory_overheads_bytes
    assert [p.name for p in one_node_profile.parent.iterdir()] == ["cluster.yaml"]  # no temporary file left


def test_the_calibrated_profile_drives_solve(one_node_profile):
    folder = one_node_profile.parent
    result = autopar("solve", "llama-3.1-8b", "--gpus", "8", "--profile", str(one_node_profile), "--json",
                     "--allow-cpu-profile", cwd=folder)
    assert result.returncode == 0, result.stderr
    front = json.loads(result.stdout)
    assert front["inputs"]["cluster"]["gpu"] == CPU_PROFILE_NAME
    assert front["inputs"]["cluster"]["profile_source"] == str(one_node_profile)
    assert front["points"], "a Pareto front of plans"


def test_the_calibrated_profile_drives_estimate(one_node_profile):
    folder = one_node_profile.parent
    result = autopar("estimate", "llama-3.1-8b", "--profile", str(one_node_profile), "--tp", "8",
                     "--num-gpus", "8", "--json", "--allow-cpu-profile", cwd=folder)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["inputs"]["cluster"]["gpu"] == CPU_PROFILE_NAME
    assert report["step_time_s"] > 0
    bundled = json.loads(autopar("estimate", "llama-3.1-8b", "--gpu", "a100-80gb", "--tp", "8", "--num-gpus", "8",
                                 "--json", cwd=folder).stdout)
    assert report["step_time_s"] > bundled["step_time_s"]  # a CPU is slower than the A100 it was measured against


def test_profile_show_of_the_calibrated_file(one_node_profile):
    result = autopar("profile", "show", str(one_node_profile), cwd=one_node_profile.parent)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s), 1 node(s) × 2, device cpu" in result.stdout
    assert "inter-node (ib): not measured" in result.stdout
    assert "intra-node (nvlink)" in result.stdout and "compared with bundled profile a100-80gb" in result.stdout
    assert "WARNING: measured on CPU" in result.stdout


@pytest.mark.parametrize("command", [["estimate", "llama-3.1-8b", "--tp", "8", "--num-gpus", "8"],
                                     ["solve", "llama-3.1-8b", "--gpus", "8"]])
def test_the_cpu_profile_is_refused_without_the_acknowledgement(one_node_profile, command):
    result = autopar(*command, "--profile", str(one_node_profile), cwd=one_node_profile.parent)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: profile: ") and "Traceback" not in result.stderr
    assert "measured on a CPU" in lines[0] and "--allow-cpu-profile" in lines[0]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU: calibrate measures it, no opt-in needed")
@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_calibrate_without_a_gpu_needs_allow_cpu(tmp_path, launcher):
    out = tmp_path / "p.yaml"
    if launcher == "direct":
        result = autopar("calibrate", "--out", str(out), *TINY, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("autopar: error: device: no CUDA GPU"), result.stderr
        assert "--allow-cpu" in lines[0] and "not a GPU" in lines[0]
    else:  # every rank stops before the rendezvous, and torchrun reports the failure
        command = [part for part in torchrun_command(out) if part != "--allow-cpu"]
        result = run(command, tmp_path)
        assert result.returncode != 0 and "no CUDA GPU" in result.stderr, result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_one_rank_per_node_measures_the_inter_node_link(tmp_path):
    out = tmp_path / "inter.yaml"
    result = run(torchrun_command(out, "--ranks-per-node", "1"), tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    calibration = load_profile(out).extra["calibration"]
    assert calibration["nodes"] == 2 and calibration["ranks_per_node"] == 1
    assert {row["link"] for row in calibration["measurements"]["collectives"]} == {"ib"}
    assert any("intra-node link (nvlink) not measured" in note for note in calibration["notes"])


def worker_pids(launcher_pid: int) -> list[int]:
    """The rank processes torchrun started (its children), from /proc."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def wait_for_workers(launcher_pid: int, count: int = 2, timeout_s: float = 120.0) -> list[int]:
    """The rank processes, once torchrun has started all `count` of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = worker_pids(launcher_pid)
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    pytest.fail(f"torchrun did not start {count} ranks in {timeout_s:.0f} s")


@pytest.mark.parametrize("failure", ["ctrl_c", "one_rank_killed"])
def test_an_interrupted_or_failed_run_never_leaves_a_partial_profile(tmp_path, failure):
    # Ctrl-C reaches torchrun and every rank; or one rank dies (SIGKILL) and torchrun stops the others. Whenever
    # it lands, the target is the old file or a complete new profile, and no temporary file is left behind.
    out = tmp_path / "cluster.yaml"
    out.write_text("previous: profile\n")
    process = subprocess.Popen(torchrun_command(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment(), cwd=tmp_path, start_new_session=True)
    ranks = wait_for_workers(process.pid)       # a fixed sleep could land before the ranks exist (a loaded machine)
    time.sleep(2.0)                             # ranks importing torch, measuring or writing: any moment will do
    if failure == "ctrl_c":
        os.killpg(process.pid, signal.SIGINT)
    else:
        try:
            os.kill(ranks[-1], signal.SIGKILL)
        except ProcessLookupError:              # that rank had already finished: the run must have completed
            pass
    try:
        process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"torchrun did not stop after {failure}")
    text = out.read_text()
    if text != "previous: profile\n":
        # the profile was renamed into place before the signal landed (the run may still have been tearing down,
        # so its exit status says nothing): what is there must be a whole, valid profile
        load_profile(out)
    else:
        assert process.returncode != 0
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.yaml"]


def test_message_sizes_and_shapes():
    from autopar.calibrate import bench

    # 1 KiB … 256 MiB: 19 powers of two; --quick every fourth size (2^10, 2^12, … 2^28)
    assert bench.message_sizes(1024, 256 * 2**20, quick=False) == [2**e for e in range(10, 29)]
    assert bench.message_sizes(1024, 256 * 2**20, quick=True) == [2**e for e in range(10, 29, 2)]
    assert bench.message_sizes(1024, 2**15, quick=True)[-1] == 2**15  # the largest is always measured
    # an all-gather over 3 ranks of fp32 needs whole 4-byte elements in 3 equal chunks: 1024 -> 1020
    assert bench.usable_bytes("all_gather", 1024, 3, 4) == 1020
    assert bench.usable_bytes("all_reduce", 1024, 3, 4) == 1024
    shapes = bench.gemm_shapes(on_gpu=True, quick=False)
    # 2 token counts × 4 hidden sizes × 4 TP degrees × 5 GEMMs of a layer
    assert len(shapes) == 160
    assert any(s.m == 16384 and s.n == 4096 and s.k == 4 * 4096 // 8 for s in shapes)  # MLP down, h=4096, tp=8


@pytest.mark.parametrize("args, words", [
    (["--out", "no/such/dir/p.yaml"], ["out", "no/such/dir", "does not exist"]),
    (["--out", "profile.txt"], ["out", ".yaml"]),
    (["--base-gpu", "h1000"], ["gpu", "h100"]),
    (["--max-bytes", "lots"], ["--max-bytes", "lots"]),
])
def test_calibrate_refuses_bad_options_before_measuring(tmp_path, args, words):
    result = autopar("calibrate", "--quick", *args, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr
    assert list(tmp_path.iterdir()) == []
