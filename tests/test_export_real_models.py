"""Exports and reports of estimates from the real cost model on bundled presets (MLA, MoE with dense first
layers, learned positions, GQA with a wider head dim, fp8)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from autopar.api import Training, make_cluster
from costmodels.scoring import estimate
from autopar.export import FRAMEWORKS, emit
from autopar.export.capabilities import Unsupported
from autopar.megatron_args import parse_megatron_args
from autopar.models import load_model
from autopar.report import render
from autopar.report.document import load_schema
from autopar.results import ParetoFront
from costmodels.plan import Plan, Recompute

CASES = [
    ("deepseek-v3", 256, Training(seq_len=4096, global_batch_size=1024),
     Plan(tp=8, pp=4, first_stage_layers=13, last_stage_layers=16, ep=8, etp=1, sp=True, zero=1,
          recompute=Recompute.FULL)),  # 61 layers = 13 + 16 + 16 + 16
    ("gpt-3-175b", 64, Training(seq_len=2048, global_batch_size=512),
     Plan(tp=8, pp=8, vpp=3, sp=True, zero=1, recompute=Recompute.SELECTIVE)),  # 96 layers = 8 x 3 x 4
    ("qwen3-30b-a3b", 32, Training(seq_len=8192, global_batch_size=256),
     Plan(tp=2, pp=2, ep=8, etp=1, cp=2, sp=True, zero=1)),
    ("mixtral-8x7b", 64, Training(seq_len=4096, global_batch_size=512, precision="fp8"),
     Plan(tp=2, pp=4, vpp=2, ep=8, etp=2, sp=True, zero=1, recompute=Recompute.FULL, recompute_layers=2)),
]


@pytest.fixture(scope="module")
def estimates():
    return [estimate(load_model(name), make_cluster(num_gpus=gpus), training, plan)
            for name, gpus, training, plan in CASES]


def test_real_estimates_round_trip_through_megatron_flags(estimates):
    for result in estimates:
        run = parse_megatron_args(emit(result, "megatron"))
        assert run.plan == result.plan
        assert run.num_gpus == result.cluster.num_gpus
        assert run.model_mismatches(result.model) == []  # the emitted shape flags describe the preset
        for framework in FRAMEWORKS:  # a config, or a refusal naming what the framework lacks
            try:
                assert emit(result, framework).strip()
            except Unsupported as refused:
                assert refused.framework == framework and refused.reasons


def test_megatron_export_writes_the_dropout_the_memory_assumed(estimates):
    # Megatron-LM defaults both dropouts to 0.1; the export states the model's, and the import compares them
    for result in estimates:
        flags = parse_megatron_args(emit(result, "megatron")).flags
        assert float(flags["--attention-dropout"]) == float(flags["--hidden-dropout"]) == result.model.dropout
    by_name = {result.model.name: result for result in estimates}
    assert by_name["gpt-3-175b"].model.dropout == pytest.approx(0.1) and by_name["deepseek-v3"].model.dropout == 0
    deepseek = by_name["deepseek-v3"]
    command = emit(deepseek, "megatron")
    run = parse_megatron_args(command.replace("--hidden-dropout 0", "--hidden-dropout 0.1"))
    assert run.model_mismatches(deepseek.model) == [
        "hidden-dropout: the command has 0.1, deepseek-v3 has 0 (memory is estimated with the model's)"]
    # a launch command without the flags trains at Megatron-LM's 0.1: said; a command without the shape is a snippet
    without = command.replace("--attention-dropout 0", "").replace("--hidden-dropout 0", "")
    assert [line.split(":")[0] for line in parse_megatron_args(without).model_mismatches(deepseek.model)] == [
        "attention-dropout", "hidden-dropout"]
    assert "leaves Megatron-LM's default 0.1" in parse_megatron_args(without).model_mismatches(deepseek.model)[0]
    assert parse_megatron_args("--tensor-model-parallel-size 8").model_mismatches(deepseek.model) == []


def test_real_estimates_report_validates(estimates):
    schema = load_schema()
    for result in estimates:
        front = ParetoFront(model=result.model, cluster=result.cluster, training=result.training,
                            points=(result,), proven_optimal=True, rules=("world", "memory"))
        jsonschema.validate(json.loads(render(front, "json")), schema, cls=jsonschema.Draft202012Validator)
        assert render(front, "html").count('class="point-marker"') == 1
