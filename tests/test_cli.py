"""The `autopar` CLI through a real subprocess: bad input gives exit 2 and one line, never a traceback.

Each case is a distinct mistake a user makes; the message must name the input (a flag, or the config field) so the
user knows what to fix. Commands run as `python -m autopar ...` with the test's interpreter, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def autopar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def write_config(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


LLAMA_8B = "llama-3.1-8b"  # 32 layers, 32 heads, 8 kv heads (bundled preset)

# (id, argv, substrings the one-line message must contain). Config files are written by the test; see below.
BAD_INPUTS = [
    ("tp_not_dividing_heads", ["estimate", LLAMA_8B, "--tp", "3", "--num-gpus", "3"], ["tp", "heads"]),
    ("gpus_not_divisible_by_tp_pp_cp", ["estimate", LLAMA_8B, "--tp", "8", "--pp", "4", "--num-gpus", "48"],
     ["num_gpus", "48", "32"]),
    ("zero_tp", ["estimate", LLAMA_8B, "--tp", "0"], ["tp", "positive"]),
    ("negative_gpu_count", ["estimate", LLAMA_8B, "--num-gpus", "-8"], ["num_gpus", "positive"]),
    ("zero_seq_len", ["estimate", LLAMA_8B, "--seq-len", "0"], ["seq_len", "positive"]),
    ("zero_global_batch", ["estimate", LLAMA_8B, "--global-batch", "0"], ["global_batch_size", "positive"]),
    ("unknown_gpu_with_suggestion", ["estimate", LLAMA_8B, "--gpu", "h1000"], ["gpu", "h100", "autopar gpus"]),
    ("unknown_preset_with_suggestions", ["estimate", "llama-3.1-7b"], ["llama-3.1-8b"]),
    ("bad_recompute", ["estimate", LLAMA_8B, "--recompute", "partial"], ["recompute", "selective"]),
    ("zero_stage_5", ["estimate", LLAMA_8B, "--zero", "5"], ["zero", "0, 1, 2 or 3"]),
    ("headroom_above_one", ["estimate", LLAMA_8B, "--headroom", "1.5"], ["headroom", "[0, 1)"]),
    ("non_integer_tp", ["estimate", LLAMA_8B, "--tp", "two"], ["--tp", "two"]),
    ("fractional_tp", ["estimate", LLAMA_8B, "--tp", "2.5"], ["--tp", "2.5"]),
    ("nonexistent_path", ["estimate", "./no/such/dir/config.json"], ["no/such/dir"]),
    ("bad_precision", ["estimate", LLAMA_8B, "--precision", "fp4"], ["precision", "bf16"]),
    ("fp8_on_a100", ["estimate", LLAMA_8B, "--gpu", "a100", "--precision", "fp8"], ["precision", "fp8", "A100"]),
    ("pp_not_dividing_layers", ["estimate", LLAMA_8B, "--pp", "3", "--num-gpus", "3"], ["pp", "num_layers=32"]),
    ("ep_on_dense_model", ["estimate", LLAMA_8B, "--ep", "2"], ["ep", "dense"]),
    ("ep_not_dividing_experts", ["estimate", "mixtral-8x7b", "--ep", "3", "--num-gpus", "3"],
     ["ep", "num_experts=8"]),
    ("batch_not_divisible", ["estimate", LLAMA_8B, "--global-batch", "1000", "--mbs", "3"],
     ["global_batch_size", "1000"]),
    ("vpp_without_pp", ["estimate", LLAMA_8B, "--vpp", "2"], ["vpp", "pp > 1"]),
    ("sp_without_tp", ["estimate", LLAMA_8B, "--sp"], ["sp", "tp > 1"]),
    ("cp_seq_not_divisible", ["estimate", LLAMA_8B, "--tp", "2", "--cp", "2", "--seq-len", "4098"],
     ["seq_len", "4098"]),
    ("recompute_layers_without_full", ["estimate", LLAMA_8B, "--recompute-layers", "4"], ["recompute_layers"]),
    ("gpus_not_whole_nodes", ["estimate", LLAMA_8B, "--num-gpus", "12"], ["num_gpus", "gpus_per_node"]),
    ("missing_profile_file", ["estimate", LLAMA_8B, "--profile", "no_such_profile.yaml"], ["profile"]),
    ("gpu_and_profile", ["estimate", LLAMA_8B, "--gpu", "h100", "--profile", "x.yaml"], ["profile", "--gpu"]),
    ("unknown_command", ["frobnicate"], ["frobnicate"]),
    # report flags are checked before anything is computed: exit 2, nothing on stdout
    ("unknown_emit_framework", ["estimate", LLAMA_8B, "--emit", "paxml"], ["emit", "paxml", "megatron"]),
    ("out_unknown_extension", ["estimate", LLAMA_8B, "--out", "report.txt"], ["out", "report.txt", ".json"]),
    ("out_missing_directory", ["estimate", LLAMA_8B, "--out", "no/such/dir/r.json"], ["out", "no/such/dir"]),
    ("out_is_a_directory", ["estimate", LLAMA_8B, "--out", "."], ["out"]),
    # 0 GPUs per node used to mean "the profile's 8"
    ("zero_gpus_per_node", ["estimate", LLAMA_8B, "--gpus-per-node", "0"], ["gpus_per_node", "0"]),
    ("plan_flags_with_megatron_args", ["estimate", LLAMA_8B, "--tp", "2", "--from-megatron-args",
                                       "--tensor-model-parallel-size 8"], ["from-megatron-args", "--tp"]),
    ("missing_model", ["estimate"], ["MODEL"]),
]

CONFIG_CASES = [
    ("malformed_json", '{"model_type": "llama", "hidden_size": 4096,,}', ["config.json", "json"]),
    ("config_missing_fields", json.dumps({"model_type": "llama", "hidden_size": 4096}), ["num_hidden_layers"]),
    ("unsupported_architecture",
     json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768,
                 "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                 "vocab_size": 30522}), ["bert"]),
]


def assert_one_line_bad_input(result: subprocess.CompletedProcess, must_contain: list[str]) -> None:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(error_lines) == 1, result.stderr
    (line,) = error_lines
    assert line.startswith("autopar: error: "), line
    for text in must_contain:
        assert text.lower() in line.lower(), (text, line)
    # argparse errors add one usage hint; nothing else may follow the message
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
    assert result.stdout == "", result.stdout


@pytest.mark.parametrize("argv, must_contain", [case[1:] for case in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(argv: list[str], must_contain: list[str], tmp_path: Path) -> None:
    assert_one_line_bad_input(autopar(*argv, cwd=tmp_path), must_contain)


@pytest.mark.parametrize("text, must_contain", [case[1:] for case in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_file_exits_2_with_one_line(text: str, must_contain: list[str], tmp_path: Path) -> None:
    config = write_config(tmp_path, "config.json", text)
    assert_one_line_bad_input(autopar("estimate", config), must_contain)


# ---- the parser itself -----------------------------------------------------------------------------------------

def test_help_lists_every_command() -> None:
    result = autopar("--help")
    assert result.returncode == 0
    for command in ("solve", "estimate", "explain", "models", "gpus", "calibrate", "profile"):
        assert command in result.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    result = autopar()
    assert result.returncode == 2
    assert "COMMAND" in result.stderr


def test_estimate_help_names_every_plan_flag() -> None:
    result = autopar("estimate", "--help")
    assert result.returncode == 0
    for flag in ("--tp", "--pp", "--vpp", "--ep", "--etp", "--cp", "--mbs", "--sp", "--no-sp", "--recompute",
                 "--recompute-layers", "--zero", "--first-stage-layers", "--last-stage-layers", "--num-gpus",
                 "--gpus", "--gpu", "--gpus-per-node", "--headroom", "--profile", "--seq-len", "--global-batch",
                 "--precision", "--no-flash-attention", "--moe-capacity-factor", "--json"):
        assert flag in result.stdout, flag


def test_main_returns_exit_codes_in_process(capsys: pytest.CaptureFixture) -> None:
    from autopar.cli import main

    assert main(["estimate", LLAMA_8B, "--zero", "7"]) == 2
    assert capsys.readouterr().err.startswith("autopar: error: zero: ")
    assert main(["estimate", LLAMA_8B, "--tp", "x"]) == 2


def test_console_script_is_installed() -> None:
    from importlib import metadata

    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("autopar") == "autopar.cli:main"


def test_cli_import_stays_light() -> None:
    """`autopar --help` must be instant: the heavy libraries load only inside the commands that need them."""
    code = ("import sys, autopar.cli; heavy = {'transformers', 'ortools', 'torch', 'rich'} & set(sys.modules); "
            "print(','.join(sorted(heavy)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
    parser_code = "import sys; from autopar.cli import build_parser; build_parser(); " + code.split("; ", 1)[1]
    result = subprocess.run([sys.executable, "-c", parser_code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "", "a command module imports something heavy at module level"


# ---- gpus -------------------------------------------------------------------------------------------------------

def test_gpus_lists_bundled_profiles() -> None:
    result = autopar("gpus")
    assert result.returncode == 0, result.stderr
    for name in ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb"):
        assert name in result.stdout


def test_gpus_json() -> None:
    result = autopar("gpus", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    h100 = rows["h100-80gb"]
    assert h100["hbm_bytes"] == 80 * 1024**3
    assert h100["peak_flops_per_s"] == {"bf16": 989e12, "fp8": 1979e12}  # spec sheet, dense
    assert h100["gpus_per_node"] == 8
    assert set(h100["links"]) == {"nvlink", "ib"}
    assert "fp8" not in rows["a100-80gb"]["peak_flops_per_s"]


# ---- error mapping in main() -----------------------------------------------------------------------------------

def test_infeasible_maps_to_exit_1_with_rules_and_details(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    import autopar.commands.gpus as gpus
    from autopar.cli import main
    from autopar.errors import Infeasible

    def nothing_fits(args):
        raise Infeasible("no plan fits in 64 GiB", rules=("memory", "tp_node"), details=("closest: 71.2 GiB",))

    monkeypatch.setattr(gpus, "run", nothing_fits)
    assert main(["gpus"]) == 1
    err = capsys.readouterr().err
    assert "no plan fits in 64 GiB" in err and "memory, tp_node" in err and "closest: 71.2 GiB" in err
    assert "Traceback" not in err


def test_ctrl_c_maps_to_exit_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import autopar.commands.gpus as gpus
    from autopar.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpus, "run", interrupted)
    assert main(["gpus"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_python_dash_m_autopar_and_version() -> None:
    result = autopar("--version")
    assert result.returncode == 0 and result.stdout.startswith("autopar ")


# ---- stdout holds one document (autopar.commands.output_flags.OUTPUT_RULE) ---------------------------------------------

def test_emit_puts_only_the_launch_config_on_stdout(tmp_path: Path) -> None:
    result = autopar("estimate", LLAMA_8B, "--tp", "2", "--no-sp", "--num-gpus", "8", "--zero", "1", "--emit",
                     "deepspeed", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)  # `... --emit deepspeed > ds.json` is a valid JSON file
    assert config["train_micro_batch_size_per_gpu"] == 1 and config["zero_optimization"]["stage"] == 1
    assert "Memory per GPU by pipeline stage" in result.stderr  # the report moved to stderr
    # a plan DeepSpeed cannot run (Megatron SP): exit 2, the knob named, nothing on stdout
    result = autopar("estimate", LLAMA_8B, "--tp", "2", "--num-gpus", "8", "--emit", "deepspeed", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "cannot run plan 'tp2 pp1 mbs1 sp" in result.stderr and "sp=true" in result.stderr
    # --json owns stdout; the launch config goes to stderr
    result = autopar("estimate", LLAMA_8B, "--tp", "2", "--num-gpus", "8", "--json", "--emit", "megatron",
                     cwd=tmp_path)
    assert json.loads(result.stdout)["plan"]["tp"] == 2
    assert "--tensor-model-parallel-size 2" in result.stderr


def test_emit_help_states_the_stdout_rule() -> None:
    assert "stdout holds one document" in " ".join(autopar("estimate", "--help").stdout.split())


def test_inputs_that_have_no_effect_are_warned_about() -> None:
    # llama-3.1-8b is dense; llama-2-7b was trained at 4096 positions (RoPE)
    result = autopar("estimate", LLAMA_8B, "--tp", "2", "--moe-capacity-factor", "1.25", "--moe-dispatcher", "deepep")
    assert result.returncode in (0, 1), result.stderr
    assert "warning: --moe-capacity-factor 1.25 has no effect" in result.stderr
    assert "warning: --moe-dispatcher deepep has no effect" in result.stderr
    result = autopar("estimate", "llama-2-7b", "--seq-len", "8192", "--tp", "2", "--emit", "megatron")
    assert "beyond llama-2-7b's max_position_embeddings 4096" in result.stderr
    assert "--max-position-embeddings 8192" in result.stdout


def test_the_cross_entropy_kernel_is_an_input_shown_and_priced() -> None:
    """--cross-entropy picks the loss kernels: the inputs name it, the loss's bytes (hence compute) follow it
    (unfused 52, fused 28, xentropy 8 bytes per logit), --no-fused-cross-entropy is unfused, and the Megatron export
    says that Megatron-Core runs its own fused loss in place of xentropy."""
    plan = ("estimate", LLAMA_8B, "--tp", "2", "--num-gpus", "8", "--json")
    runs = {kernel: autopar(*plan, "--cross-entropy", kernel) for kernel in ("fused", "unfused", "xentropy")}
    runs["legacy"] = autopar(*plan, "--no-fused-cross-entropy")
    assert all(run.returncode in (0, 1) for run in runs.values()), [run.stderr for run in runs.values()]
    docs = {kernel: json.loads(run.stdout) for kernel, run in runs.items()}
    assert [docs[k]["inputs"]["training"]["cross_entropy"] for k in ("fused", "unfused", "xentropy", "legacy")] == \
        ["fused", "unfused", "xentropy", "unfused"]
    assert docs["fused"]["inputs"]["training"]["fused_cross_entropy"] is True
    assert docs["xentropy"]["inputs"]["training"]["fused_cross_entropy"] is True      # no fp32 logits kept
    assert docs["unfused"]["inputs"]["training"]["fused_cross_entropy"] is False
    compute_s = {k: docs[k]["time_terms_s"]["compute"] for k in docs}
    assert compute_s["xentropy"] < compute_s["fused"] < compute_s["unfused"] == compute_s["legacy"]
    emitted = autopar("estimate", LLAMA_8B, "--tp", "2", "--num-gpus", "8", "--cross-entropy", "xentropy",
                      "--emit", "megatron")
    assert "--cross-entropy-loss-fusion" in emitted.stdout and "xentropy: not a Megatron-Core loss kernel" in \
        emitted.stdout + emitted.stderr
    bad = autopar(*plan, "--cross-entropy", "liger")
    assert bad.returncode == 2 and "cross_entropy" in bad.stderr and "xentropy" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_typed_loss_kernel_meets_an_imported_megatron_command() -> None:
    """The Megatron-LM command decides the loss (no --cross-entropy-loss-fusion: unfused); a different kernel typed
    beside it, in any case, gets one note naming it; an unknown one is exit 2; torchtitan's config notes its eager
    unfused loss for a plan priced fused (typed: torchtitan's own loss is its default)."""
    command = "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16"
    plan = ("estimate", LLAMA_8B, "--from-megatron-args", command, "--gpus", "8", "--json")
    typed = autopar(*plan, "--cross-entropy", "Fused")
    assert typed.returncode in (0, 1) and json.loads(typed.stdout)["inputs"]["training"]["cross_entropy"] == "unfused"
    assert "loss kernel fused you gave is ignored" in typed.stderr
    same = autopar(*plan, "--cross-entropy", "unfused")
    assert "ignored" not in same.stderr
    bad = autopar(*plan, "--cross-entropy", "liger")
    assert bad.returncode == 2 and "ignored" not in bad.stderr and "xentropy" in bad.stderr
    # --emit torchtitan prices torchtitan's eager loss; a loss typed beside it is written with a note
    titan = autopar("estimate", LLAMA_8B, "--gpus", "8", "--zero", "3", "--emit", "torchtitan")
    assert "# note: cross_entropy" not in titan.stdout
    typed_titan = autopar("estimate", LLAMA_8B, "--gpus", "8", "--zero", "3", "--emit", "torchtitan",
                          "--cross-entropy", "fused")
    assert "# note: cross_entropy fused: torchtitan runs PyTorch's eager cross entropy" in typed_titan.stdout


def test_interleaved_p2p_overlap_is_a_switch_shown_in_the_inputs() -> None:
    plan = ("estimate", LLAMA_8B, "--tp", "2", "--pp", "4", "--vpp", "2", "--num-gpus", "16", "--json")
    on, off = autopar(*plan), autopar(*plan, "--no-overlap-p2p-communication")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    on, off = json.loads(on.stdout), json.loads(off.stdout)
    assert on["inputs"]["training"]["overlap"]["overlap_p2p_comm"] is True
    assert off["inputs"]["training"]["overlap"]["overlap_p2p_comm"] is False
    # Megatron-LM's default hides the steady-state backward sends; blocking on them costs more, nothing else changes
    assert on["time_terms_s"]["pp_p2p"] < off["time_terms_s"]["pp_p2p"]
    # blocking transfers also drain the host's queue: Megatron-Core's batched p2p ends in torch.cuda.synchronize()
    # (costmodels.engines), so the host's share (and the bubble that carries it) grows; nothing else changes
    assert on["time_terms_s"]["host"] < off["time_terms_s"]["host"]
    assert {k: v for k, v in on["time_terms_s"].items() if k not in ("pp_p2p", "host", "pp_bubble")} == \
        {k: v for k, v in off["time_terms_s"].items() if k not in ("pp_p2p", "host", "pp_bubble")}
    header = autopar(*plan[:-1]).stdout
    assert "overlap: P2P of interleaved plans (others off)" in header


def test_an_a2a_overlap_megatron_core_refuses_for_the_plan_is_warned_about() -> None:
    # pp 4 without a virtual pipeline: TransformerConfig asserts; priced exposed, not exported, and said so
    plan = ("estimate", "mixtral-8x7b", "--tp", "2", "--pp", "4", "--ep", "8", "--num-gpus", "64",
            "--overlap-moe-expert-parallel-comm")
    result = autopar(*plan, "--emit", "megatron")
    assert result.returncode in (0, 1), result.stderr
    assert "warning: --overlap-moe-expert-parallel-comm has no effect on tp2 pp4 ep8" in result.stderr
    assert "--overlap-moe-expert-parallel-comm" not in result.stdout
    interleaved = autopar(*plan[:6], "--vpp", "2", *plan[6:], "--emit", "megatron")
    assert "has no effect" not in interleaved.stderr and "--overlap-moe-expert-parallel-comm" in interleaved.stdout
