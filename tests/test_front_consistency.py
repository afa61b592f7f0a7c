"""One truth for "fits" and for every number (issue 12): for random models, ordinary and extreme (up to the bounds of
costmodels/limits.py), every plan on `solve`'s front is one that `estimate` says fits and breaks no rule, and the
front's JSON document and its terminal table show the numbers `estimate` computes.

The solver ranks plans by saturating integer units (autopar.search.objective); these tests are what catches a unit
that wraps, a rounding that lets a plan over the limit through, or a table cell that shows another row's number.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.errors import Infeasible
from autopar.report import render
from autopar.report.terminal import front_columns
from costmodels import limits
from costmodels.hardware import load_profile
from costmodels.specs import ClusterSpec, ModelSpec, MoESpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
TIME_UNITS = {"s": 1.0}
"""The one unit of the step-time column (autopar.report.units.TIME_UNIT): any other header fails the lookup."""
RATE_UNITS = {"tokens/s": 1.0}
"""The one unit of the throughput column (autopar.report.units.RATE_UNIT)."""


@st.composite
def models(draw: st.DrawFn, max_layers: int) -> ModelSpec:
    """Dense or MoE decoders from tiny to the size bounds: hidden 2^6..2^20, vocab 1..2^24, layers 1..max_layers."""
    log_hidden = draw(st.integers(6, 20))
    hidden = 2**log_hidden
    heads = 2 ** draw(st.integers(0, min(log_hidden - 3, 10)))
    kv_heads = heads // 2 ** draw(st.integers(0, int(math.log2(heads))))
    ffn = min(limits.MAX_FFN_HIDDEN_SIZE, hidden * draw(st.sampled_from([1, 2, 4])))
    layers = draw(st.one_of(st.sampled_from([1, 2, 3, 7, 32, max_layers]), st.integers(1, max_layers)))
    vocab = draw(st.one_of(st.sampled_from([1, 256, 32000, 128256, limits.MAX_VOCAB_SIZE]),
                           st.integers(1, limits.MAX_VOCAB_SIZE)))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([2, 8, 64, 256]))
        moe = MoESpec(num_experts=experts, top_k=draw(st.integers(1, min(experts, 8))),
                      expert_ffn_hidden_size=max(1, ffn // draw(st.sampled_from([1, 4, 16]))))
    return ModelSpec(name="random", hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     num_kv_heads=kv_heads, ffn_hidden_size=ffn, vocab_size=vocab, moe=moe)


def trainings() -> st.SearchStrategy[TrainingSpec]:
    return st.builds(TrainingSpec,
                     seq_len=st.sampled_from([128, 4096, 65536, limits.MAX_SEQ_LEN]),
                     global_batch_size=st.sampled_from([1, 8, 1024, limits.MAX_GLOBAL_BATCH]))


def parse_cell(cell: str) -> float:
    return float(cell.split(" / ")[0].replace(",", ""))


def tolerance(cell: str, scale: float) -> float:
    """Half a unit in the cell's last shown digit, in base units (the 2-significant-digit form of tiny values
    included)."""
    number = cell.split(" / ")[0].replace(",", "")
    decimals = len(number.partition(".")[2])
    return 0.5 * 10**-decimals * scale * 1.000001 + 1e-12


def check_front(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> None:
    try:
        front = autopar.solve(model, cluster, training)
    except Infeasible:
        return
    document = json.loads(render(front, "json"))
    headers, rows = front_columns(front)
    index = {name.split(" (")[0]: i for i, name in enumerate(headers)}
    time_unit = re.search(r"\((.+)\)", headers[index["step time"]]).group(1)
    rate_unit = re.search(r"\((.+)\)", headers[index["throughput"]]).group(1)
    assert len(document["points"]) == len(rows) == len(front.points)
    for rank, point in enumerate(front.points):
        scored = autopar.estimate(model, point.cluster, training, point.plan)
        # one truth for "fits": the solver's plan fits and breaks no rule by the float model's own verdict
        assert scored.fits and scored.feasible, (point.plan.short(), scored.peak_memory_bytes, scored.violations)
        assert math.isclose(point.peak_memory_bytes, scored.peak_memory_bytes, rel_tol=1e-9)
        assert math.isclose(point.step_time_s, scored.step_time_s, rel_tol=1e-9)
        # the JSON document
        doc = document["points"][rank]
        assert doc["fits"] is True and doc["label"] == scored.plan.short()
        assert abs(doc["peak_memory_bytes"] - scored.peak_memory_bytes) <= 1
        assert math.isclose(doc["step_time_s"], scored.step_time_s, rel_tol=1e-12)
        assert math.isclose(doc["tokens_per_s"], scored.tokens_per_s, rel_tol=1e-12)
        assert doc["num_microbatches"] == scored.num_microbatches
        for term, seconds in scored.time_terms_s.items():
            assert math.isclose(doc["time_terms_s"][term], seconds, rel_tol=1e-12, abs_tol=1e-300)
        # the terminal table: each cell is the estimate's number within the digits it shows
        row = rows[rank]
        assert row[index["plan"]] == scored.plan.short()
        for column, value, scale in (("step time", scored.step_time_s, TIME_UNITS[time_unit]),
                                     ("throughput", scored.tokens_per_s, RATE_UNITS[rate_unit]),
                                     ("peak memory", scored.peak_memory_bytes, 1024**3)):
            cell = row[index[column]]
            assert abs(parse_cell(cell) * scale - value) <= max(tolerance(cell, scale), 0.05 * value), (column, cell)
        assert int(row[index["peak stage"]]) == scored.worst_stage
        assert parse_cell(row[index["microbatches"]]) == scored.num_microbatches
    # neighbours print different memory and step time (a front's points all differ in both), unless they differ by
    # less than the column's finest digit (autopar.report.units.MAX_COLUMN_DECIMALS): then they are true near-ties
    for column, values, scale in (("step time", [p.step_time_s for p in front.points], TIME_UNITS[time_unit]),
                                  ("peak memory", [p.peak_memory_bytes for p in front.points], 1024**3)):
        cells = [row[index[column]] for row in rows]
        for a, b, x, y in zip(cells, cells[1:], values, values[1:]):
            assert a != b or abs(x - y) <= 2 * tolerance(a, scale), (column, a, b, x, y)


@given(models(max_layers=64), trainings(), st.sampled_from([1, 8, 64]))
@settings(max_examples=10)
def test_front_fits_and_every_report_agrees(model: ModelSpec, training: TrainingSpec, gpus: int) -> None:
    check_front(model, ClusterSpec(profile=load_profile("h100"), num_gpus=gpus), training)


@pytest.mark.slow
@given(models(max_layers=limits.MAX_NUM_LAYERS), trainings(), st.sampled_from([1, 8, 64, 512]),
       st.sampled_from(["h100", "a100-80gb"]))
@settings(max_examples=4 if settings.default.max_examples <= 30 else 100)   # CI: a few; --slow: 100
def test_front_fits_and_every_report_agrees_up_to_the_bounds(model: ModelSpec, training: TrainingSpec, gpus: int,
                                                            gpu: str) -> None:
    check_front(model, ClusterSpec(profile=load_profile(gpu), num_gpus=gpus), training)


def test_cli_solve_and_estimate_agree_on_a_large_model(tmp_path: Path) -> None:
    # the whole CLI path on a user's config.json: the fastest point of `solve --json` read back by `estimate --json`
    config = json.loads((ROOT / "autopar" / "presets" / "llama-3.1-405b.json").read_text())
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(config, hidden_size=2 * 16384, num_attention_heads=256,
                                                        num_key_value_heads=16)))
    run = lambda *argv: subprocess.run([sys.executable, "-m", "autopar.cli", *argv], capture_output=True, text=True,
                                       timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                                                                   "PATH": "/usr/bin:/bin"})
    solved = run("solve", str(folder), "--gpus", "1024", "--json", "--top", "1")
    assert solved.returncode == 0, solved.stderr[-2000:]
    point = json.loads(solved.stdout)["points"][0]
    plan = point["plan"]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in plan.items()
             if k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "recompute", "recompute_layers", "zero",
                      "first_stage_layers", "last_stage_layers")]
    flags.append("--sp" if plan["sp"] else "--no-sp")
    estimated = run("estimate", str(folder), "--gpus", "1024", "--json", *flags)
    assert estimated.returncode == 0, estimated.stderr[-2000:]
    result = json.loads(estimated.stdout)
    result = result.get("estimate", result)
    assert result["fits"] is True
    assert result["peak_memory_bytes"] == point["peak_memory_bytes"]
    assert math.isclose(result["step_time_s"], point["step_time_s"], rel_tol=1e-12)
