"""The shared --out / --emit / --pick / --from-megatron-args helpers the commands call."""

from __future__ import annotations

import argparse
import io
import json

import jsonschema
import pytest
from test_report_support import DENSE_PLANS, dense_model, synthetic_front

from autopar.commands.output_flags import (
    add_megatron_import_argument,
    add_output_arguments,
    import_megatron_run,
    write_outputs,
)
from autopar.megatron_args import parse_megatron_args
from autopar.report import render
from autopar.report.document import load_schema
from costmodels.errors import InputError


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
    from autopar.export.capabilities import Unsupported, refusals
    from costmodels.rules import Problem as Context

    front = synthetic_front(dense_model(), DENSE_PLANS)
    ctx = Context(front[0].model, front[0].cluster, front[0].training)
    pick = next(i for i, point in enumerate(front) if not refusals(ctx, point.plan, "deepspeed"))
    stdout, stderr = io.StringIO(), io.StringIO()
    write_outputs(parse("--emit", "deepspeed", "--pick", str(pick), "--json"), front, stdout, stderr)
    assert stdout.getvalue() == ""
    text = stderr.getvalue()
    assert json.loads(text[:text.index("\n}\n") + 2])["train_micro_batch_size_per_gpu"] == front[pick].plan.mbs
    stdout, stderr = io.StringIO(), io.StringIO()
    write_outputs(parse("--emit", "deepspeed", "--pick", str(pick)), front, stdout, stderr)
    json.loads(stdout.getvalue())  # pure JSON on stdout
    assert "# deepspeed: DeepSpeed 0.19.8 config; train_batch_size" in stderr.getvalue()
    # a point DeepSpeed cannot run is refused with the reason, nothing on stdout (the CLI exits 2)
    refused = next(i for i, point in enumerate(front) if refusals(ctx, point.plan, "deepspeed"))
    stdout = io.StringIO()
    with pytest.raises(Unsupported, match="cannot run plan"):
        write_outputs(parse("--emit", "deepspeed", "--pick", str(refused)), front, stdout, io.StringIO())
    assert stdout.getvalue() == ""


def test_bad_pick_and_framework_are_input_errors():
    front = synthetic_front(dense_model(), DENSE_PLANS[:2])
    with pytest.raises(InputError, match="--pick 5 is not a point of the front; use 0 to 1"):
        write_outputs(parse("--emit", "megatron", "--pick", "5"), front, io.StringIO(), io.StringIO())
    with pytest.raises(InputError, match="unknown framework"):
        write_outputs(parse("--emit", "paxml"), front, io.StringIO(), io.StringIO())


def parse_estimate(*argv: str) -> argparse.Namespace:
    """`autopar estimate`'s real parser (model, plan, cluster, training, import and output flags)."""
    from autopar.cli import build_parser

    return build_parser().parse_args(["estimate", "llama-3.1-8b", *argv])


def test_import_takes_training_and_gpu_count_from_the_command_and_leaves_the_flags_as_typed():
    from autopar.commands import specs_from_args

    args = parse_estimate("--from-megatron-args", "torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py "
                                                  "--tensor-model-parallel-size 4 --seq-length 8192 "
                                                  "--global-batch-size 64 --micro-batch-size 1 --bf16 "
                                                  "--fp8-format e4m3")
    run = import_megatron_run(args, io.StringIO())
    assert run.plan.tp == 4
    assert (args.seq_len, args.global_batch, args.precision, args.num_gpus) == (None, None, None, None)  # untyped
    _, cluster, training = specs_from_args(args, load_model=dense_model, imported=run)
    assert (training.seq_len, training.global_batch_size, training.precision.value) == (8192, 64, "fp8")
    assert cluster.num_gpus == 16
    # an explicit --gpus wins, with a note
    args = parse_estimate("--gpus", "32", "--from-megatron-args", "torchrun --nproc-per-node 8 x.py --micro-batch-size 1")
    notes = io.StringIO()
    run = import_megatron_run(args, notes)
    assert specs_from_args(args, load_model=dense_model, imported=run)[1].num_gpus == 32
    assert "launches 8" in notes.getvalue()
    assert import_megatron_run(parse(), io.StringIO()) is None


def test_an_empty_front_still_renders(tmp_path):
    front = synthetic_front(dense_model(), [])
    document = json.loads(render(front, "json"))
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)
    assert "No feasible plan" in render(front, "html")
    assert render(front, "csv").count("\n") == 1
    assert "## Front" in render(front, "markdown")


def parse_with_plan(*argv: str) -> argparse.Namespace:
    """The estimate command's flags: plan flags included (their defaults are None until plan_from_args)."""
    from autopar.commands import add_plan_arguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gpus", dest="num_gpus", type=int, default=None)
    parser.set_defaults(seq_len=4096, global_batch=1024, precision="bf16")
    add_plan_arguments(parser)
    add_output_arguments(parser, pick=False)
    add_megatron_import_argument(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("argv, message", [
    (["--emit", "paxml"], "unknown framework"),
    (["--out", "report.txt"], "cannot tell the report format"),
    (["--out", "/no/such/folder/front.json"], "does not exist"),
    (["--pick", "-1", "--emit", "megatron"], "--pick -1: must be >= 0"),
    (["--pick", "2"], "add --emit FRAMEWORK"),
])
def test_output_arguments_are_checked_before_computing(argv, message):
    from autopar.commands.output_flags import validate_output_arguments

    with pytest.raises(InputError, match=message):
        validate_output_arguments(parse(*argv))


def test_out_naming_a_directory_is_refused(tmp_path):
    from autopar.commands.output_flags import validate_output_arguments

    (tmp_path / "r.json").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        validate_output_arguments(parse("--out", str(tmp_path / "r.json")))
    args = parse("--out", str(tmp_path / "ok.md"), "--emit", "Megatron-LM", "--pick", "1")
    validate_output_arguments(args)
    assert args.emit == "megatron"  # normalised once, here


def test_report_goes_to_stderr_when_the_launch_config_owns_stdout():
    from autopar.commands.output_flags import report_stream

    out, err = io.StringIO(), io.StringIO()
    assert report_stream(parse(), out, err) is out
    assert report_stream(parse("--emit", "deepspeed"), out, err) is err
    assert report_stream(parse("--emit", "deepspeed", "--json"), out, err) is out  # --json owns stdout then


def test_plan_flags_with_an_imported_command_are_refused():
    args = parse_with_plan("--tp", "4", "--no-sp", "--from-megatron-args", "--tensor-model-parallel-size 8")
    with pytest.raises(InputError, match="drop --tp, --no-sp"):
        import_megatron_run(args, io.StringIO())
    # no plan flag typed: the command's plan is used
    args = parse_with_plan("--from-megatron-args", "--tensor-model-parallel-size 8 --micro-batch-size 1")
    assert import_megatron_run(args, io.StringIO()).plan.tp == 8


def test_model_layer_count_fills_in_for_virtual_stages():
    command = ("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 --micro-batch-size 1 "
               "--overlap-grad-reduce --overlap-param-gather --use-distributed-optimizer")
    asked = []
    args = parse_with_plan("--from-megatron-args", command)
    # 80 layers (the MODEL's) / (pp 4 · 5 layers per virtual stage) = vpp 4
    run = import_megatron_run(args, io.StringIO(), num_layers=lambda: asked.append(1) or 80)
    assert run.plan.vpp == 4 and asked == [1]
    # the command's own --num-layers wins, and the model is then not needed
    run = import_megatron_run(parse_with_plan("--from-megatron-args", command + " --num-layers 40"),
                              io.StringIO(), num_layers=lambda: asked.append(2) or 80)
    assert run.plan.vpp == 2 and asked == [1]
