"""The shared --out / --emit / --pick / --from-megatron-args helpers the commands call."""

from __future__ import annotations

import argparse
import io
import json

import jsonschema
import pytest

from autopar.megatron_args import parse_megatron_args
from autopar.report import render
from autopar.report.document import load_schema
from autopar.report.options import (add_megatron_import_argument, add_output_arguments, import_megatron_run,
                                    write_outputs)
from costmodels.errors import InputError
from test_report_support import DENSE_PLANS, dense_model, synthetic_front


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gpus", dest="num_gpus", type=int, default=None)
    parser.set_defaults(seq_len=4096, global_batch=1024, precision="bf16")
    add_output_arguments(parser)
    add_megatron_import_argument(parser)
    return parser.parse_args(argv)


def test_out_and_emit_for_the_picked_point(tmp_path):
    front = synthetic_front(dense_model(), DENSE_PLANS)
    args = parse("--out", str(tmp_path / "f.json"), "--out", str(tmp_path / "f.html"), "--emit", "megatron",
                 "--pick", "3")
    stdout, stderr = io.StringIO(), io.StringIO()
    write_outputs(args, front, stdout, stderr)
    assert (tmp_path / "f.json").exists() and (tmp_path / "f.html").exists()
    assert stderr.getvalue().count("autopar: wrote") == 2
    assert parse_megatron_args(stdout.getvalue()).plan == front[3].plan


def test_emit_goes_to_stderr_under_json_and_deepspeed_notes_too():
    front = synthetic_front(dense_model(), DENSE_PLANS)
    stdout, stderr = io.StringIO(), io.StringIO()
    write_outputs(parse("--emit", "deepspeed", "--pick", "1", "--json"), front, stdout, stderr)
    assert stdout.getvalue() == ""
    text = stderr.getvalue()
    assert json.loads(text[:text.index("\n}\n") + 2])["train_micro_batch_size_per_gpu"] == front[1].plan.mbs
    stdout, stderr = io.StringIO(), io.StringIO()
    write_outputs(parse("--emit", "deepspeed", "--pick", "1"), front, stdout, stderr)
    json.loads(stdout.getvalue())  # pure JSON on stdout
    assert "# not expressible in DeepSpeed's config: pp=4" in stderr.getvalue()


def test_bad_pick_and_framework_are_input_errors():
    front = synthetic_front(dense_model(), DENSE_PLANS[:2])
    with pytest.raises(InputError, match="--pick 5 is not a point of the front; use 0 to 1"):
        write_outputs(parse("--emit", "megatron", "--pick", "5"), front, io.StringIO(), io.StringIO())
    with pytest.raises(InputError, match="unknown framework"):
        write_outputs(parse("--emit", "paxml"), front, io.StringIO(), io.StringIO())


def test_import_sets_the_training_flags_from_the_command():
    args = parse("--from-megatron-args", "torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py "
                                         "--tensor-model-parallel-size 4 --seq-length 8192 --global-batch-size 64 "
                                         "--micro-batch-size 1 --bf16 --fp8-format e4m3")
    run = import_megatron_run(args, io.StringIO())
    assert run.plan.tp == 4
    assert (args.seq_len, args.global_batch, args.precision, args.num_gpus) == (8192, 64, "fp8", 16)
    # an explicit --gpus wins, with a note
    args = parse("--gpus", "32", "--from-megatron-args", "torchrun --nproc-per-node 8 x.py --micro-batch-size 1")
    notes = io.StringIO()
    import_megatron_run(args, notes)
    assert args.num_gpus == 32 and "launches 8" in notes.getvalue()
    assert import_megatron_run(parse(), io.StringIO()) is None


def test_an_empty_front_still_renders(tmp_path):
    front = synthetic_front(dense_model(), [])
    document = json.loads(render(front, "json"))
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)
    assert "No feasible plan" in render(front, "html")
    assert render(front, "csv").count("\n") == 1
    assert "## Front" in render(front, "markdown")
