"""`autopar.estimate` (costmodels.scoring) and `autopar.remedies`: per-stage breakdown, rule checks, the guide's remedies, and `autopar estimate` end to end.

Rule cases are hand-derived on a toy model (arithmetic in the comments); estimate and remedy cases check the
structure the reports rely on (every stage's total is the sum of its terms, the worst stage is the one
`costmodels.evaluate` reports, remedies come in the guide's order with falling, *computed* memory).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from autopar.api import make_cluster
from autopar.models import load_model
from autopar.remedies import REMEDY_STEPS, remedies
from costmodels.errors import InputError
from costmodels.evaluate import evaluate
from costmodels.plan import Plan, Recompute
from costmodels.scoring import estimate, require_buildable, require_precision_supported, rule_violations
from costmodels.specs import ModelSpec, TrainingSpec

GIB = 1024**3
GUIDE_ORDER = [step.name for step in REMEDY_STEPS]

# 8 layers, 16 query heads, 4 kv heads: tp must divide 4; pp·vpp must divide 8.
TOY = ModelSpec(name="toy", hidden_size=1024, num_layers=8, num_attention_heads=16, num_kv_heads=4,
                ffn_hidden_size=4096, vocab_size=32000)
TRAIN = TrainingSpec(seq_len=4096, global_batch_size=1024)


def cluster16(**kwargs) -> "object":
    return make_cluster(gpu="h100", num_gpus=16, **kwargs)  # 2 nodes of 8


# ---- rules, hand-derived ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("plan, broken", [
    (Plan(tp=4, pp=2, sp=True), set()),                      # 4·1·2 = 8 | 16; 16 % 4 = 4 % 4 = 0; 8 % 2 = 0
    (Plan(tp=8, sp=True), {"heads"}),                        # kv heads 4 % 8 ≠ 0
    (Plan(tp=4, pp=8, sp=True), {"world", "batch"}),         # 4·8 = 32 does not divide 16 GPUs: no whole dp
    (Plan(pp=3, tp=1), {"world", "layers", "batch"}),        # 16 % 3 ≠ 0 and 8 % 3 ≠ 0
    (Plan(pp=2, vpp=4), set()),                              # 4 layers per stage, 1 per virtual chunk
    (Plan(pp=2, vpp=3), {"layers"}),                         # 4 layers per stage not divisible by 3
    (Plan(pp=4, first_stage_layers=1, last_stage_layers=1), set()),  # 8 - 2 = 6 over 2 middle stages
    (Plan(pp=4, first_stage_layers=1, last_stage_layers=2), {"layers"}),  # 5 over 2 middle stages
    (Plan(tp=2, sp=True, cp=2), set()),                      # 4096 % (2·2) = 0; 4096/2 % 2 = 0
    (Plan(cp=2), {"cp_needs_sp_tp"}),                        # the guide: CP needs TP > 1 with SP
    (Plan(sp=True), {"sp_needs_tp"}),
    (Plan(vpp=2), {"vpp"}),                                  # virtual stages need a pipeline
    (Plan(tp=4, pp=2, mbs=3, sp=True), {"batch"}),           # dp = 16/8 = 2; 1024 % (2·3) ≠ 0
    (Plan(ep=2), {"experts"}),                               # dense model
])
def test_rule_violations_on_toy_model(plan: Plan, broken: set[str]) -> None:
    assert set(rule_violations(TOY, cluster16(), TRAIN, plan)) == broken


def test_tp_beyond_a_node_is_a_guide_rule_not_a_build_rule() -> None:
    wide = ModelSpec(name="wide", hidden_size=4096, num_layers=8, num_attention_heads=32, num_kv_heads=16,
                     ffn_hidden_size=8192, vocab_size=32000)
    broken = require_buildable(wide, cluster16(), TRAIN, Plan(tp=16, sp=True))  # 32 % 16 = 16 % 16 = 0
    assert set(broken) == {"tp_node"}
    assert estimate(wide, cluster16(), TRAIN, Plan(tp=16, sp=True), relax=["tp_node"]).violations in ((), ("memory",))


@pytest.mark.parametrize("plan, field", [(Plan(tp=8, sp=True), "tp"), (Plan(pp=3, tp=1), "num_gpus"),
                                         (Plan(tp=4, pp=2, mbs=3, sp=True), "global_batch_size"),
                                         (Plan(recompute_layers=2), "recompute_layers")])
def test_build_rules_raise_input_error_naming_the_input(plan: Plan, field: str) -> None:
    with pytest.raises(InputError) as caught:
        require_buildable(TOY, cluster16(), TRAIN, plan)
    assert caught.value.field == field


def test_fp8_needs_a_gpu_with_fp8() -> None:
    require_precision_supported(make_cluster(gpu="h100"), TrainingSpec(precision="fp8"))
    with pytest.raises(InputError, match="fp8"):
        require_precision_supported(make_cluster(gpu="a100"), TrainingSpec(precision="fp8"))


# ---- the estimate ----------------------------------------------------------------------------------------------

LLAMA_70B = load_model("llama-3.1-70b")


@pytest.mark.parametrize("plan", [Plan(tp=8, pp=4, sp=True), Plan(tp=4, pp=8, vpp=2, sp=True, zero=1),
                                  Plan(tp=8, pp=4, sp=True, first_stage_layers=18, last_stage_layers=18,
                                       recompute=Recompute.FULL)])
def test_stage_breakdown_matches_evaluate(plan: Plan) -> None:
    cluster = make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=8192, global_batch_size=512)
    result = estimate(LLAMA_70B, cluster, training, plan)
    evaluation = evaluate(LLAMA_70B, cluster, training, plan)
    assert len(result.stages) == plan.pp
    assert sum(stage.layers for stage in result.stages) == LLAMA_70B.num_layers
    for stage in result.stages:
        assert stage.total_bytes == pytest.approx(sum(stage.terms_bytes.values()))
        assert all(value >= 0 for value in stage.terms_bytes.values())
    totals = [stage.total_bytes for stage in result.stages]
    assert result.peak_memory_bytes == max(totals)
    assert result.peak_memory_bytes == pytest.approx(float(evaluation.peak_memory_bytes[0]))
    worst_terms = result.stages[result.worst_stage].terms_bytes
    assert worst_terms == pytest.approx({k: float(v[0]) for k, v in evaluation.memory_terms_bytes.items()})
    assert result.step_time_s == pytest.approx(float(evaluation.step_time_s[0]))
    assert result.fits == (result.peak_memory_bytes <= cluster.memory_limit_bytes)
    assert ("memory" in result.violations) == (not result.fits)
    assert 0 < result.mfu < 1


def test_estimate_reports_guide_rules_as_violations() -> None:
    wide = ModelSpec(name="wide", hidden_size=4096, num_layers=8, num_attention_heads=32, num_kv_heads=16,
                     ffn_hidden_size=8192, vocab_size=32000)
    result = estimate(wide, cluster16(), TRAIN, Plan(tp=16, sp=True))
    assert "tp_node" in result.violations and not result.feasible


def test_estimate_refuses_a_plan_megatron_cannot_build() -> None:
    with pytest.raises(InputError, match="rule heads"):
        estimate(TOY, cluster16(), TRAIN, Plan(tp=8, sp=True))


# ---- remedies --------------------------------------------------------------------------------------------------

def assert_guide_order_and_falling_memory(start_peak: float, fixes) -> None:
    names = [fix.name for fix in fixes]
    assert names == GUIDE_ORDER[:len(names)], "remedies come in the guide's order, none left out before the end"
    peaks = [start_peak] + [fix.peak_memory_bytes for fix in fixes if fix.applied]
    assert all(later < earlier for earlier, later in zip(peaks, peaks[1:]))
    for fix in fixes:
        assert fix.applied or fix.skipped_because
    assert all(not fix.fits for fix in fixes[:-1])  # the walk stops at the first remedy after which it fits


def test_remedies_for_70b_on_one_plan_per_gpu_group() -> None:
    cluster = make_cluster(gpu="h100", num_gpus=64)
    plan = Plan(tp=1, pp=1, mbs=2)
    start = estimate(LLAMA_70B, cluster, TRAIN, plan)
    assert not start.fits
    fixes = remedies(LLAMA_70B, cluster, TRAIN, plan)
    assert_guide_order_and_falling_memory(start.peak_memory_bytes, fixes)
    assert fixes[-1].applied and fixes[-1].fits
    for fix in (f for f in fixes if f.applied):
        again = estimate(LLAMA_70B, cluster, TRAIN, fix.plan)  # the memory shown is the computed one
        assert again.peak_memory_bytes == pytest.approx(fix.peak_memory_bytes)
        assert not rule_violations(LLAMA_70B, cluster, TRAIN, fix.plan)
    more_tp = next(fix for fix in fixes if fix.name == "more_tp")
    assert not more_tp.applied or more_tp.plan.tp <= cluster.gpus_per_node


def test_remedies_skip_steps_that_break_rules_and_say_which() -> None:
    cluster = make_cluster(gpu="h100", num_gpus=16)  # 70B on 2 nodes: needs more than 16 × 64 GiB with 18 bytes/param
    plan = Plan(tp=8, pp=1, sp=True, zero=1, recompute=Recompute.FULL)
    fixes = remedies(LLAMA_70B, cluster, TRAIN, plan)
    by_name = {fix.name: fix for fix in fixes}
    assert not by_name["distributed_optimizer"].applied and "already" in by_name["distributed_optimizer"].skipped_because
    assert not by_name["full_recompute"].applied
    assert not by_name["more_tp"].applied and "tp_node" in by_name["more_tp"].broken_rules  # tp 16 > 8 per node
    assert by_name["more_pp"].applied
    start = estimate(LLAMA_70B, cluster, TRAIN, plan)
    assert_guide_order_and_falling_memory(start.peak_memory_bytes, fixes)
    if not fixes[-1].fits:
        assert [fix.name for fix in fixes] == GUIDE_ORDER
        assert "dense" in by_name["more_ep"].skipped_because


def test_remedies_raise_ep_for_moe_when_tp_and_pp_are_blocked() -> None:
    """Mixtral on 16 A100-80GB, tp 8 (a full node), pp 2, experts unsharded (etp 1, ep 1): TP cannot grow past the
    node (tp 16: world with pp 2 needs 32 GPUs), PP cannot grow (8·4 = 32 > 16 GPUs); EP can (1·ep·2 | 16)."""
    mixtral = load_model("mixtral-8x7b")
    cluster = make_cluster(gpu="a100-80gb", num_gpus=16)
    plan = Plan(tp=8, etp=1, pp=2, sp=True, zero=1, recompute=Recompute.FULL, mbs=2)
    start = estimate(mixtral, cluster, TRAIN, plan)
    fixes = remedies(mixtral, cluster, TRAIN, plan)
    assert_guide_order_and_falling_memory(start.peak_memory_bytes, fixes)
    by_name = {fix.name: fix for fix in fixes}
    assert "world" in by_name["more_tp"].broken_rules and "tp_node" in by_name["more_tp"].broken_rules
    assert by_name["more_pp"].broken_rules[0] == "world"
    assert by_name["more_ep"].applied and by_name["more_ep"].plan.ep > 1
    assert mixtral.moe.num_experts % by_name["more_ep"].plan.ep == 0


def test_no_remedies_when_it_fits() -> None:
    cluster = make_cluster(gpu="h100", num_gpus=64)
    plan = Plan(tp=8, pp=4, sp=True, zero=1, recompute=Recompute.FULL)
    assert estimate(LLAMA_70B, cluster, TRAIN, plan).fits
    assert remedies(LLAMA_70B, cluster, TRAIN, plan) == ()


# ---- the command -----------------------------------------------------------------------------------------------

def autopar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_estimate_command_fits_exit_0_with_tables() -> None:
    result = autopar("estimate", "llama-3.1-70b", "--tp", "8", "--pp", "4", "--num-gpus", "64", "--zero", "1",
                     "--recompute", "full")
    assert result.returncode == 0, result.stderr
    for text in ("Memory per GPU by pipeline stage", "stage 3", "total", "limit", "Step time", "tokens/s", "MFU",
                 "fits"):
        assert text in result.stdout, text
    assert "Remedies" not in result.stdout


def test_estimate_command_does_not_fit_exit_1_with_remedies() -> None:
    result = autopar("estimate", "llama-3.1-70b", "--tp", "1", "--pp", "1", "--num-gpus", "8", "--gpu", "a100")
    assert result.returncode == 1, result.stderr
    assert "does not fit" in result.stdout and "Remedies" in result.stdout
    assert "Traceback" not in result.stderr


def test_estimate_json_structure() -> None:
    result = autopar("estimate", "llama-3.1-70b", "--tp", "4", "--pp", "2", "--num-gpus", "16", "--json")
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    for key in ("inputs", "plan", "stages", "worst_stage", "peak_memory_bytes", "memory_limit_bytes", "fits",
                "time_terms_s", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "violations", "remedies"):
        assert key in data, key
    assert data["plan"]["tp"] == 4 and data["plan"]["pp"] == 2 and data["plan"]["dp"] == 2
    assert data["plan"]["sp"] is True  # sequence parallelism defaults on with tp > 1
    assert len(data["stages"]) == 2
    for stage in data["stages"]:
        assert stage["total_bytes"] == pytest.approx(sum(stage["terms_bytes"].values()))
    assert data["peak_memory_bytes"] == max(stage["total_bytes"] for stage in data["stages"])
    assert data["step_time_s"] == pytest.approx(sum(data["time_terms_s"].values()))
    assert data["fits"] == (result.returncode == 0) == (data["remedies"] == [])
    if data["remedies"]:
        names = [fix["name"] for fix in data["remedies"]]
        assert names == GUIDE_ORDER[:len(names)]
        applied = [fix["peak_memory_bytes"] for fix in data["remedies"] if fix["applied"]]
        assert applied == sorted(applied, reverse=True)
        assert all(math.isfinite(value) for value in applied)


def test_estimate_guide_rule_exit_1() -> None:
    result = autopar("estimate", "llama-3.1-8b", "--tp", "8", "--num-gpus", "16", "--gpus-per-node", "4",
                     "--zero", "1")
    assert result.returncode == 1, result.stderr
    assert "tp_node" in result.stdout


# ---- a remedy is never a fit while it breaks a rule --------------------------------------------------------------

CP_WITHOUT_SP = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --context-parallel-size 2 "
                 "--micro-batch-size 1 --global-batch-size 1024 --seq-length 8192")


def test_remedies_do_not_call_a_rule_breaking_plan_a_fit() -> None:
    # tp8 pp4 cp2 without SP breaks the guide's cp_needs_sp_tp; the memory remedies tolerate it but do not repair it
    model = load_model("llama-3.1-70b")
    cluster = make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=8192, global_batch_size=1024)
    plan = Plan(tp=8, pp=4, cp=2, mbs=1, sp=False)
    assert not estimate(model, cluster, training, plan).fits
    fixes = remedies(model, cluster, training, plan)
    last = [fix for fix in fixes if fix.applied][-1]
    assert last.fits_memory and last.peak_memory_bytes <= cluster.memory_limit_bytes
    assert last.still_breaks == ("cp_needs_sp_tp",) and not last.fits
    assert not any(fix.fits and fix.still_breaks for fix in fixes)
    assert last.to_dict(64)["fits"] is False and last.to_dict(64)["still_breaks"] == ["cp_needs_sp_tp"]
    # relaxing the rule makes the same walk a fit
    relaxed = [fix for fix in remedies(model, cluster, training, plan, relax=("cp_needs_sp_tp",)) if fix.applied]
    assert relaxed[-1].fits and relaxed[-1].still_breaks == ()


def test_estimate_command_does_not_say_fits_for_a_rule_breaking_remedy() -> None:
    result = autopar("estimate", "llama-3.1-70b", "--from-megatron-args", CP_WITHOUT_SP, "--gpus", "64")
    assert result.returncode == 1, result.stderr
    text = " ".join(result.stdout.split())
    assert "fits with" not in text
    assert "still breaks guide rule cp_needs_sp_tp" in text


# ---- JSON: versioned, integral counts as ints, whole bytes ---------------------------------------------------------

def test_estimate_json_is_versioned_with_integral_counts() -> None:
    result = autopar("estimate", "llama-3.1-70b", "--tp", "8", "--pp", "4", "--num-gpus", "64", "--seq-len", "8192",
                     "--json")
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1 and data["generator"]["name"] == "autopar"
    # 1024 sequences / (dp 2 · mbs 1) = 512 microbatches; 80 layers / pp 4 = 20 per stage
    assert data["num_microbatches"] == 512 and isinstance(data["num_microbatches"], int)
    assert [stage["layers"] for stage in data["stages"]] == [20, 20, 20, 20]
    assert all(isinstance(stage["layers"], int) for stage in data["stages"])
    assert isinstance(data["plan"]["dp"], int) and data["plan"]["dp"] == 2
    for stage in data["stages"]:
        assert isinstance(stage["total_bytes"], int)
        assert all(isinstance(value, int) for value in stage["terms_bytes"].values())
    assert isinstance(data["peak_memory_bytes"], int) and isinstance(data["inputs"]["cluster"]["hbm_bytes"], int)


# ---- the inputs header -------------------------------------------------------------------------------------------

def test_header_shows_edp_for_moe_only_and_uses_design_names() -> None:
    dense = autopar("estimate", "llama-3.1-8b", "--tp", "2", "--num-gpus", "8").stdout
    plan_line = next(line for line in dense.splitlines() if line.startswith("plan "))
    assert "dp 4" in plan_line and "edp" not in plan_line
    assert "seq_len 4096" in dense and "limit 64.0 GiB per GPU (80% of 80 GiB HBM)" in dense
    moe = autopar("estimate", "mixtral-8x7b", "--tp", "2", "--ep", "4", "--num-gpus", "8").stdout
    plan_line = next(line for line in moe.splitlines() if line.startswith("plan "))
    assert "edp 1" in plan_line  # 8 / (etp 2 · ep 4 · pp 1) = 1


def test_memory_table_uses_one_unit() -> None:
    text = autopar("estimate", "llama-3.1-70b", "--tp", "8", "--pp", "4", "--num-gpus", "64", "--seq-len",
                   "8192").stdout
    table = text[text.index("Memory per GPU"):text.index("Step time")]
    assert "GiB (- = none; * = the stage with the peak)" in table
    headings = table.splitlines()[1:5]
    assert any("stage 0 *" in line for line in headings) and any("20 layers" in line for line in headings)
    assert not any(line.strip("│ ").startswith("layers") for line in table.splitlines())   # no row of layer counts
    assert "KiB" not in table and "MiB" not in table
    # embedding_activations: int64 token ids only (8 B · 8192 tokens · 4 microbatches in flight on stage 0 =
    # 256 KiB = 0.00024 GiB); Llama has no embedding dropout, and the embedding output is layer 0's input
    row = next(line for line in table.splitlines() if "embedding_activations" in line)
    assert "0.00024" in row and row.count(" - ") >= 1


def test_estimate_warns_where_the_optimizer_steps_gradient_copy_is_the_peak() -> None:
    """tp 8 on 8 GPUs, dp 1: the distributed optimizer's shard is every parameter, and its fp32 copy of the bf16
    gradients (4 bytes each, ~3.7 GiB for 8B / 8) outweighs a one-sequence backward's activations."""
    args = ("estimate", "llama-3.1-8b", "--tp", "8", "--num-gpus", "8", "--zero", "1", "--global-batch", "8")
    warned = autopar(*args, "--grad-reduce-in-bf16")
    assert warned.returncode == 0, warned.stderr
    assert "autopar: warning: bf16 gradients: at the optimizer step" in warned.stderr
    assert "GiB priced for the backward" in warned.stderr and "over the limit" not in warned.stderr
    assert "optimizer step" not in autopar(*args).stderr        # fp32 gradients: no copy
    # dp 8 shards the copy 8 ways: the backward stays the peak
    assert "optimizer step" not in autopar("estimate", "llama-3.1-8b", "--tp", "1", "--num-gpus", "8", "--zero", "1",
                                           "--global-batch", "8", "--grad-reduce-in-bf16").stderr


@pytest.mark.parametrize("argument, bad", [("model", "llama-3.1-8b"), ("cluster", "h100"),
                                           ("training", {"seq_len": 4096}), ("plan", {"tp": 2}), ("plan", None)])
def test_the_python_api_names_an_argument_of_the_wrong_kind(argument, bad):
    """A planner embedding the API that passes a model name, a GPU name or a dict gets an InputError naming the
    argument and how to build it, not an AttributeError from deep inside."""
    import autopar

    arguments = {"model": load_model("llama-3.2-1b"), "cluster": make_cluster(gpu="h100", num_gpus=8),
                 "training": TrainingSpec(seq_len=1024, global_batch_size=64), "plan": Plan(tp=1)}
    arguments[argument] = bad
    with pytest.raises(InputError) as error:
        autopar.estimate(**arguments)
    assert error.value.field == argument and "e.g. autopar." in str(error.value)
    if argument != "plan":
        with pytest.raises(InputError) as error:
            autopar.solve(arguments["model"], arguments["cluster"], arguments["training"])
        assert error.value.field == argument
