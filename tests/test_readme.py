"""README promises: its first command prints the front it says it does, its Python example prints that same front,
and .ci/run runs exactly README's test command.

The first command's table is read back row by row and checked against `--json` of the same command (plan, step
time, throughput, MFU, peak memory, worst stage, micro-batches, in the units its headers name, to the digits the
table shows); every row fits its
memory limit; the front is fastest first and each later plan needs less memory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BASH_BLOCKS = re.findall(r"```bash\n(.*?)\n```", README, flags=re.DOTALL)
GIB = 2**30

SECONDS_PER = {"s": 1.0}
"""The step-time column's one unit (issue 45: never minutes, never a unit that changes with the magnitude)."""
TOKENS_PER = {"tokens/s": 1.0}
"""The throughput column's one unit."""
HEADER = re.compile(r"step time \((?P<time_unit>[^)]+)\).*throughput \((?P<rate_unit>[^)]+)\).*"
                    r"peak memory \(GiB of (?P<limit>[\d.]+)\)")


def readme_first_command() -> list[str]:
    """README's first command (after the install), run with this interpreter: `python -m autopar solve ...`."""
    line = BASH_BLOCKS[0].split("&&")[-1].strip()
    argv = shlex.split(line)
    assert argv[:2] == ["autopar", "solve"], line
    return [sys.executable, "-m", "autopar", *argv[1:]]


def run(argv: list[str]) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def first_command() -> tuple[str, dict]:
    """(the table README's first command prints, the JSON document of the same command)."""
    argv = readme_first_command()
    return run(argv), json.loads(run(argv + ["--json"]))


def parse_front_table(text: str) -> list[dict]:
    """The front table's rows; each column's unit comes from its header (one unit per column), a plan label that
    wraps onto a second line is joined."""
    header = next(HEADER.search(line) for line in text.splitlines() if HEADER.search(line))
    units = header.groupdict()
    rows: list[dict] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if not cells[0]:                                # the plan label's continuation line
            rows[-1]["plan"] += " " + cells[1]
            continue
        rank, plan, time, rate, mfu, peak, stage, microbatches = cells
        rows.append(dict(units, rank=rank, plan=plan, time=time, rate=rate, mfu=mfu.rstrip("%"), peak=peak,
                         stage=stage, microbatches=microbatches.replace(",", "")))
    assert rows, text
    return rows


def assert_shown(cell: str, value: float) -> None:
    """A table cell shows `value` rounded to the cell's decimals."""
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    assert abs(float(cell.replace(",", "")) - value) <= 0.5 * 10**-decimals * (1 + 1e-9), (cell, value)


def test_readme_first_command_prints_the_json_front(first_command):
    text, document = first_command
    rows, points = parse_front_table(text), document["points"]
    header = re.search(r"Pareto front: (\d+) plans, fastest first", text)
    assert header and int(header.group(1)) == len(points) == len(rows) > 3
    limit_gib = document["inputs"]["cluster"]["memory_limit_bytes"] / GIB
    for rank, (row, point) in enumerate(zip(rows, points, strict=True)):
        assert int(row["rank"]) == rank == point["rank"]
        assert row["plan"] == point["label"]
        time_unit = SECONDS_PER[row["time_unit"]]
        assert_shown(row["time"], point["step_time_s"] / time_unit)
        assert_shown(row["rate"], point["tokens_per_s"] / TOKENS_PER[row["rate_unit"]])
        assert_shown(row["mfu"], 100 * point["mfu"])
        assert_shown(row["peak"], point["peak_memory_bytes"] / GIB)
        assert_shown(row["limit"], limit_gib)
        assert int(row["stage"]) == point["worst_stage"]
        assert int(row["microbatches"]) == point["num_microbatches"]
        # every row fits: its peak is within the limit, in the table and in the JSON
        assert float(row["peak"]) <= float(row["limit"])
        assert point["fits"] and point["peak_memory_bytes"] <= point["memory_limit_bytes"] and not point["violations"]
    times = [p["step_time_s"] for p in points]
    memories = [p["peak_memory_bytes"] for p in points]
    assert times == sorted(times) and all(a > b for a, b in zip(memories, memories[1:]))


def test_readme_python_example_prints_the_same_front(capsys, first_command):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert blocks, "README has no Python example"
    namespace = {"__name__": "readme_example"}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    out = capsys.readouterr().out
    lines = out.splitlines()
    front, est = namespace["front"], namespace["est"]
    # the loop prints one line per point, "plan  time s  memory GiB", fastest first
    printed = [re.fullmatch(r"(.+) ([\d.]+) s ([\d.]+) GiB", line) for line in lines[:len(front)]]
    assert all(printed), lines
    # the example is the first command's problem: the API's front is the CLI's, point for point
    _, document = first_command
    assert [m.group(1) for m in printed] == [p["label"] for p in document["points"]]
    for match, point in zip(printed, document["points"], strict=True):
        assert float(match.group(2)) == pytest.approx(point["step_time_s"], abs=0.005)
        assert float(match.group(3)) == pytest.approx(point["peak_memory_bytes"] / GIB, abs=0.05)
    # then the estimate (fits, time terms, worst stage's memory terms) and the JSON document's first 200 characters
    assert lines[len(front)] == f"{est.fits} {est.time_terms_s} {est.stages[est.worst_stage].terms_bytes}"
    assert out.endswith("\n" + front.to_json()[:200] + "\n")
    assert sum(est.stages[est.worst_stage].terms_bytes.values()) == pytest.approx(est.peak_memory_bytes)


def test_ci_runs_readme_test_command():
    assert len(BASH_BLOCKS) >= 2 and "pytest" in BASH_BLOCKS[1], "README's second command installs and runs the tests"
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == BASH_BLOCKS[1].strip()
