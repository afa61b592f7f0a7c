"""Values in a user's hardware profile are checked where the file is loaded (costmodels.hardware.parse_profile).

A bad value is a bad input: exit 2 and one line naming the file and the key, never an AssertionError from deep in the
cost model. A good value is used: overlapping TP communication makes a tensor-parallel step faster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ClusterSpec, TrainingSpec

BUNDLED = Path(__file__).resolve().parent.parent / "costmodels" / "profiles" / "h100-80gb.yaml"
OVERLAP_LINE = "  tp_comm: 0.0\n"


def profile_with_overlap(folder: Path, overlap_lines: str) -> Path:
    """The bundled H100 profile with its `overlap:` entries replaced by `overlap_lines`."""
    text = BUNDLED.read_text(encoding="utf-8")
    assert text.count(OVERLAP_LINE) == 1, "the bundled profile's overlap section changed; update this test"
    path = folder / "my-h100.yaml"
    path.write_text(text.replace(OVERLAP_LINE, overlap_lines), encoding="utf-8")
    return path


def autopar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize("overlap_lines, must_contain", [
    ("  tp_comm: 1.5\n", ["overlap.tp_comm", "1.5", "<= 1"]),
    ("  tp_comm: -0.25\n", ["overlap.tp_comm", "-0.25", ">= 0"]),
    ("  tp_comm: half\n", ["overlap.tp_comm", "half", "number"]),
    ("  tp_com: 0.5\n", ["overlap.tp_com", "tp_comm"]),            # a misspelt key is not silently ignored
], ids=["above_one", "negative", "not_a_number", "unknown_key"])
def test_bad_overlap_value_exits_2_naming_file_and_key(tmp_path: Path, overlap_lines: str,
                                                       must_contain: list[str]) -> None:
    path = profile_with_overlap(tmp_path, overlap_lines)
    result = autopar("estimate", "llama-3.1-8b", "--profile", str(path), "--tp", "2")
    assert "Traceback" not in result.stderr and "AssertionError" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("autopar: error: profile: "), line
    assert str(path) in line, line
    for text in must_contain:
        assert text in line, (text, line)


def test_overlap_section_must_be_a_mapping(tmp_path: Path) -> None:
    text = BUNDLED.read_text(encoding="utf-8").replace("overlap:\n" + OVERLAP_LINE, "overlap: 0.5\n")
    path = tmp_path / "flat.yaml"
    path.write_text(text, encoding="utf-8")
    result = autopar("estimate", "llama-3.1-8b", "--profile", str(path))
    assert result.returncode == 2, result.stderr
    assert "overlap" in result.stderr and str(path) in result.stderr and "Traceback" not in result.stderr


def test_a_valid_overlap_is_used(tmp_path: Path) -> None:
    from autopar.models import load_model
    from costmodels.steptime import step_time_s

    model = load_model("llama-3.1-8b")
    training = TrainingSpec(seq_len=8192, global_batch_size=64)
    plan = PlanArrays.from_plans([Plan(tp=8)])
    times = {}
    for fraction in ("0.0", "0.5", "1.0"):
        profile = load_profile(profile_with_overlap(tmp_path, f"  tp_comm: {fraction}\n"))
        cluster = ClusterSpec(profile=profile, num_gpus=8)
        times[fraction] = float(step_time_s(model, cluster, training, plan)[0])
    # more of the TP communication hidden: strictly faster (tp 8 communicates every layer)
    assert times["0.0"] > times["0.5"] > times["1.0"] > 0


def test_an_overhead_named_like_a_memory_term_exits_2(tmp_path: Path) -> None:
    # a profile overhead called `logits` would shadow the modelled logits term and be counted twice
    text = BUNDLED.read_text(encoding="utf-8")
    assert text.count("  overheads_gib:\n") == 1, "the bundled profile's overheads section changed; update this test"
    path = tmp_path / "shadow.yaml"
    path.write_text(text.replace("  overheads_gib:\n", "  overheads_gib:\n    logits: 1.0\n"), encoding="utf-8")
    result = autopar("estimate", "llama-3.1-8b", "--profile", str(path))
    assert "Traceback" not in result.stderr and "AssertionError" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert str(path) in line and "'logits'" in line and "rename" in line, line
