"""Output a user reads without a legend (issue 12): one unit per column named in its header, neighbours that never
print alike, labels explained under the table, a scaling front that says so, and a progress bar on stderr only
when stderr is a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from autopar.report.terminal import plan_legend
from autopar.report.units import column_cells, format_rate, format_seconds, rate_cells, whole_count

ROOT = Path(__file__).resolve().parents[1]


def autopar(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "autopar.cli", *argv], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


# ---- units ----------------------------------------------------------------------------------------------------

def test_one_fixed_unit_whatever_the_magnitude() -> None:
    # issue 45: never minutes (`min` reads as "minimum"), never k/M prefixes that change from run to run
    assert [format_seconds(v) for v in (0.0123, 3.5, 95.0, 4312.4)] == ["0.0123 s", "3.50 s", "95.0 s", "4,312 s"]
    assert format_rate(950.4) == "950 tokens/s" and format_rate(1.25e6) == "1,250,000 tokens/s"
    assert rate_cells([2513427.3, 80000.2]) == ["2,513,427", "80,000"]
    assert rate_cells([2513427.3, 80000.2, 79999.7]) == ["2,513,427.3", "80,000.2", "79,999.7"]   # neighbours differ
    assert whole_count(2822400) == "2,822,400" and whole_count(148650) == "148,650"


def test_neighbours_get_enough_decimals_to_differ() -> None:
    gib = 1024**3
    cells = column_cells([35.44 * gib, 35.41 * gib, 20.1 * gib], gib)
    assert cells == ["35.44", "35.41", "20.10"]
    assert len(set(column_cells([64.001 * gib, 64.002 * gib], gib))) == 2
    assert column_cells([1.0, 0.00002], 1.0) == ["1.00", "0.000020"]   # tiny values keep 2 significant digits


def test_legend_explains_only_the_tokens_used() -> None:
    legend = plan_legend(["tp1 pp2 split-/15 mbs1 z2", "tp1 pp1 mbs1 full3 z2"])
    assert "splitF/L" in legend and "fullN" in legend and "zN = ZeRO-N" in legend and "peak stage" in legend
    assert "sequence parallel" not in legend and "selective" not in legend


# ---- whole commands --------------------------------------------------------------------------------------------

def test_front_table_names_units_and_explains_labels() -> None:
    # pp fixed at 2: the front's plans then carry a pipeline split (which plans lead otherwise depends on the profile)
    text = autopar("solve", "llama-3.1-8b", "--gpus", "64", "--top", "6", "--fix", "pp=2").stdout
    assert "step time (s)" in text and "throughput (tokens/s)" in text and "peak memory (GiB of 64.0)" in text
    assert "peak stage" in text and "splitF/L = F layers on the first pipeline stage" in text
    assert " min " not in text and " GiB /" not in text


def test_scaling_front_says_so_even_when_top_keeps_one_count() -> None:
    result = autopar("solve", "llama-3.1-8b", "--gpus", "1-16", "--top", "1")
    assert result.returncode == 0, result.stderr
    cluster = next(line for line in result.stdout.splitlines() if line.startswith("cluster"))
    assert "1-16 GPUs (scaling front)" in cluster
    assert "GPUs" in next(line for line in result.stdout.splitlines() if "step time" in line)
    assert "on 1 GPU:" in result.stdout and "1 GPUs" not in result.stdout


def test_estimate_memory_table_has_no_row_of_layer_counts() -> None:
    text = autopar("estimate", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4").stdout
    table = text[text.index("Memory per GPU"):text.index("Step time")]
    assert "20 layers" in table and "* = the stage with the peak" in table
    assert "time (s)" in text[text.index("Step time"):]


def read_pty(master: int, process: subprocess.Popen) -> str:
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=120)
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only() -> None:
    # a search of several seconds (the bar shows after 1 s): the scaling front over 1..1024 GPUs
    argv = [sys.executable, "-m", "autopar.cli", "solve", "llama-3.1-8b", "--gpus", "1-1024", "--top", "1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", COLUMNS="100")
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    try:
        on_terminal = read_pty(master, process)
    finally:
        os.close(master)
    assert process.returncode == 0
    assert "searching" in on_terminal and "GPUs" in on_terminal
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert piped.returncode == 0 and "searching" not in piped.stderr and "\r" not in piped.stderr
