"""`--emit FW` searches under FW's rules (issue 45): a user who names the framework wants the best plan that framework
runs, so `autopar solve ... --emit FW` behaves as `--framework FW --emit FW`, says so in one line, and writes the
config (before, the README's main job with `--emit nemo` printed the whole front and exited 2, the fastest plan
being one NeMo cannot run as priced). `--framework` and `--emit` naming two frameworks is bad input.

The issue's command, `autopar solve llama-3.1-70b --gpus 64 --seq-len 8192 --global-batch 1024 --emit FW`, runs for
each of the six frameworks; the config it prints is the one autopar.export writes for the chosen point, Megatron-LM's
passes its encoded validate_args asserts, and where the `conformance` extra is installed each framework's own
validator accepts it (tests/test_conformance_frameworks.py's harness; skipped without it).
"""

from __future__ import annotations

import json

import pytest

import autopar.export
from autopar.cli import main
from autopar.export.names import FRAMEWORKS

ISSUE_COMMAND = ["solve", "llama-3.1-70b", "--gpus", "64", "--seq-len", "8192", "--global-batch", "1024"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_emit_searches_the_plans_the_framework_runs(framework, capsys, monkeypatch):
    chosen = []
    real_launch_config = autopar.export.launch_config

    def recording(point, name, **options):
        chosen.append(point)
        return real_launch_config(point, name, **options)

    monkeypatch.setattr(autopar.export, "launch_config", recording)
    code = main(ISSUE_COMMAND + ["--emit", framework])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    notes = [line for line in err.splitlines() if line.startswith("autopar: note: --emit")]
    assert len(notes) == 1 and f"(as --framework {framework})" in notes[0], err[-3000:]
    assert f"nemo:" not in err or framework == "nemo"           # the rules line names only FW's own rules
    assert f"{framework}:" in err or framework == "megatron"    # ... and names them (Megatron-LM adds none here)
    [point] = chosen
    assert point.fits and point.feasible
    assert out == real_launch_config(point, framework).text
    if framework == "megatron":   # Megatron-LM's validate_args asserts, encoded (no framework installed)
        from test_conformance_megatron_asserts import MEGATRON_ASSERTS, parse_flags

        from autopar.export.conformance import megatron_command

        env, flags = megatron_command(out)
        args = parse_flags(flags)
        assert [line for line, _, holds in MEGATRON_ASSERTS if not holds(args, env)] == []
    from test_conformance_frameworks import missing

    if missing(framework) is None:                             # the framework's own validator, where installed
        from autopar.export.conformance import check

        assert check(point, framework).outcome == "accepted"


def test_emit_is_the_framework_search(capsys):
    # the same front and the same config as --framework FW --emit FW, without the note
    assert main(ISSUE_COMMAND + ["--emit", "nemo", "--json"]) == 0
    implied = capsys.readouterr()
    assert main(ISSUE_COMMAND + ["--emit", "nemo", "--framework", "nemo", "--json"]) == 0
    explicit = capsys.readouterr()
    assert json.loads(implied.out)["points"] == json.loads(explicit.out)["points"]
    assert "autopar: note: --emit nemo" in implied.err and "autopar: note: --emit" not in explicit.err


def test_framework_and_emit_must_agree(capsys):
    code = main(ISSUE_COMMAND + ["--emit", "nemo", "--framework", "deepspeed"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and "--emit nemo and --framework deepspeed name two frameworks" in err
    assert main(["solve", "llama-3.1-8b", "--gpus", "8", "--emit", "nemo2", "--framework", "NeMo", "--top", "1"]) == 0
    assert "autopar: note: --emit" not in capsys.readouterr().err   # aliases of one framework agree


@pytest.mark.parametrize("framework", ["deepspeed", "verl"])
def test_a_framework_without_layouts_gets_no_layout_plan(framework, capsys):
    """The layout search (autopar.search.refine) adds per-stage layouts to the front; DeepSpeed's PipelineModule and
    verl cannot express one, so under their rules none is searched (before, `--emit deepspeed` for this MoE on 16
    GPUs chose a 25|23 layout DeepSpeed cannot run and exited 2)."""
    command = ["solve", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100", "--seq-len", "4096", "--global-batch", "64",
               "--json"]
    code = main(command + ["--framework", framework])
    front = json.loads(capsys.readouterr().out)
    assert code == 0
    assert not any(point["plan"].get("layout") for point in front["points"])
    assert any("layouts: not searched" in note and framework in note for note in front["notes"])
    assert main(command[:-1] + ["--emit", framework]) == 0
    capsys.readouterr()
