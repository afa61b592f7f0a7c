"""Hostile and careless input to the real CLI, and interrupted writes (issue 12).

Every case runs `python -m autopar.cli` in a subprocess under a wall-clock timeout and an address-space cap
(resource.setrlimit in preexec_fn), and expects: exit 2 (bad input), exactly one line on stderr that starts with
`autopar: error:` and names the input, no traceback, nothing on stdout. A hang, a MemoryError or a traceback fails.

The interrupted-write tests kill a process that is writing through autopar's one writer (autopar.atomic_write) at
random moments, SIGKILL and SIGINT (Ctrl-C), and check that the target is always absent, the old content, or one
complete new content; a control run with a plain `open(path, "w")` writer shows the harness does catch torn files.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "autopar" / "presets"
TIMEOUT_S = 60
MEMORY_CAP_BYTES = 4 * 2**30
LONG_NAME = "x" * 300


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def run_cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", COLUMNS="140")
    return subprocess.run([sys.executable, "-m", "autopar.cli", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, preexec_fn=_cap_memory, env=env, cwd=cwd or ROOT)


def assert_bad_input(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """Exit 2, one `autopar: error:` line naming each of `names`, no traceback, empty stdout."""
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autopar: error: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert len(lines[0]) < 600, lines[0]
    assert result.stdout == "", result.stdout[:500]
    return lines[0]


def llama() -> dict:
    return json.loads((PRESETS / "llama-3.1-8b.json").read_text())


def model_dir(tmp_path: Path, text: str, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


# ---- the model argument and config.json ---------------------------------------------------------------------

def test_model_size_past_the_bound_is_refused_not_overflowed(tmp_path: Path) -> None:
    # hidden_size 10^11 used to overflow int64 memory units on the solve path and list a plan of 13 million TiB as
    # fitting; sizes are now bounded at load (costmodels/limits.py)
    folder = model_dir(tmp_path, json.dumps(dict(llama(), hidden_size=10**11)))
    assert_bad_input(run_cli("solve", str(folder), "--gpus", "8", "--top", "1"), "hidden_size", "limit",
                     "1,048,576")


def test_a_billion_layers_is_refused(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, json.dumps(dict(llama(), num_hidden_layers=10**9)))
    assert_bad_input(run_cli("solve", str(folder), "--gpus", "8"), "num_layers", "limit of 192")


@pytest.mark.parametrize("digits", [400, 5000], ids=["10^400", "10^5000"])
def test_huge_integers_in_config(tmp_path: Path, digits: int) -> None:
    text = json.dumps(llama())[:-1] + ', "hidden_size": 1' + "0" * digits + "}"
    folder = model_dir(tmp_path, text)
    # the file is named (a path over 80 characters shown as its head ... its last 15: models.py _shown)
    line = assert_bad_input(run_cli("solve", str(folder), "--gpus", "8"), "config.json")
    assert "hidden_size" in line or "4,300 digits" in line


def test_deeply_nested_config(tmp_path: Path) -> None:
    text = json.dumps(llama())[:-1] + ', "extra": ' + "[" * 200_000 + "]" * 200_000 + "}"
    folder = model_dir(tmp_path, text)
    assert_bad_input(run_cli("solve", str(folder), "--gpus", "8"), "nests 200001 levels", "limit of 64")


def test_zero_kv_heads_is_an_error_not_mha(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, json.dumps(dict(llama(), num_key_value_heads=0)))
    assert_bad_input(run_cli("estimate", str(folder), "--gpus", "8"), "num_key_value_heads", "got 0")


def test_unknown_model_type_warns(tmp_path: Path) -> None:
    config = dict(llama(), model_type="acme_llama", architectures=["AcmeForCausalLM"])
    folder = model_dir(tmp_path, json.dumps(config))
    result = run_cli("estimate", str(folder), "--gpus", "8", "--tp", "8")
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("autopar: warning:")]
    assert any("'acme_llama' is unknown to transformers" in line for line in warnings), result.stderr


def test_dev_zero_as_the_model() -> None:
    assert_bad_input(run_cli("solve", "/dev/zero", "--gpus", "8"), "/dev/zero", "not a regular file")


def test_fifo_as_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "fifo-model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    assert_bad_input(run_cli("solve", str(folder), "--gpus", "8"), "config.json", "not a regular file")


def test_oversized_config_is_not_read_whole(tmp_path: Path) -> None:
    folder = tmp_path / "huge"
    folder.mkdir()
    with open(folder / "config.json", "wb") as handle:   # sparse: 64 MB that costs no disk
        handle.truncate(64 * 2**20)
    assert_bad_input(run_cli("solve", str(folder), "--gpus", "8"), "over the 4,194,304-byte limit")


def test_model_name_too_long() -> None:
    assert_bad_input(run_cli("solve", LONG_NAME, "--gpus", "8"), "model", "File name too long")


def test_model_path_too_long(tmp_path: Path) -> None:
    assert_bad_input(run_cli("solve", str(tmp_path / LONG_NAME / "config.json"), "--gpus", "8"), "model")


@pytest.mark.parametrize("repo_id", ["org/bad..name", "org/bad--name", "a/" + "b" * 120])
def test_invalid_hub_ids(repo_id: str) -> None:
    assert_bad_input(run_cli("solve", repo_id, "--gpus", "8"), "model")


# ---- profiles -------------------------------------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]) + "\n"


def test_yaml_alias_bomb_as_profile(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 3000
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--profile", str(bomb)), "bomb.yaml", "alias")


def test_deeply_nested_yaml_as_profile(tmp_path: Path) -> None:
    # refused from the event stream, before libyaml's C composer would recurse 100,000 levels deep
    deep = tmp_path / "deep.yaml"
    deep.write_text("gpu: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--profile", str(deep)), "deep.yaml", "nested deeper")


@pytest.mark.parametrize("text", [
    "gpu: " + "[" * 65 + "]" * 65 + "\n",            # one level past autopar's limit, far below libyaml's
    "gpu: " + "[" * 1_001 + "]" * 1_001 + "\n",      # past libyaml 0.2.6's own 1,000-level stop (PyYAML >= 6.0.3)
    "gpu:\n" + "- " * 2_000 + "x\n",                 # block style
    "a: {" * 3_000 + "}" * 3_000 + "\n",              # flow mappings
], ids=["flow-65", "flow-1001", "block-2000", "mapping-3000"])
def test_nested_yaml_refused_for_every_pyyaml(text: str) -> None:
    # The same message whichever libyaml PyYAML carries (the pins allow 6.0 .. 6.0.4; 6.0.4's scanner raises its own
    # "exceeded maximum nesting depth" 1,024 characters ahead of the events autopar counts).
    from costmodels.errors import InputError
    from costmodels.hardware import safe_yaml_load

    with pytest.raises(InputError, match="nested deeper than 64 levels at line"):
        safe_yaml_load(text, "deep.yaml")


def test_fifo_as_profile(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p.yaml")
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--profile", str(tmp_path / "p.yaml")), "p.yaml",
                     "not a regular file")


def test_profile_path_too_long(tmp_path: Path) -> None:
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--profile", str(tmp_path / (LONG_NAME + ".yaml"))),
                     "profile", "File name too long")


def test_gpu_name_too_long() -> None:
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--gpu", LONG_NAME), "File name too long")


# ---- numbers --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value,field,limit", [
    ("--gpus", "1000000000000000000", "num_gpus", "1,048,576"),
    ("--gpus", "1-1000000000000", "num_gpus", "1,048,576"),
    ("--global-batch", "10000000000000000000", "global_batch_size", "16,777,216"),
    ("--seq-len", "100000000000", "seq_len", "16,777,216"),
    ("--gpus-per-node", "1000000000000000000000", "gpus_per_node", "1,048,576"),
], ids=["gpus", "gpu-range", "global-batch", "seq-len", "gpus-per-node"])
def test_huge_numbers_are_bounded(flag: str, value: str, field: str, limit: str) -> None:
    assert_bad_input(run_cli("solve", "llama-3.1-8b", flag, value), field, limit)


# ---- --out ----------------------------------------------------------------------------------------------------

def test_out_name_too_long(tmp_path: Path) -> None:
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--out", str(tmp_path / (LONG_NAME + ".json"))), "out",
                     "File name too long")


def test_out_given_twice(tmp_path: Path) -> None:
    target = str(tmp_path / "a.json")
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--out", target, "--out", target), "given twice")


def test_out_to_an_unwritable_special_place_fails_before_the_report() -> None:
    # /proc refuses new files even to root (os.access says yes to root): the probe finds it before any output
    assert_bad_input(run_cli("solve", "llama-3.1-8b", "--out", "/proc/autopar-front.json"), "/proc/autopar-front")


def test_out_onto_a_device(tmp_path: Path) -> None:
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    assert_bad_input(run_cli("estimate", "llama-3.1-8b", "--out", str(link)), "not a regular file")


# ---- interrupted writes ---------------------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    # One process imports the writer once, then per trial forks a child that writes version after version of a
    # report, sleeps a random moment, kills the child (SIGKILL or SIGINT = Ctrl-C) and reports what the target holds.
    import hashlib, json, os, random, signal, sys, time
    sys.path.insert(0, {root!r})
    from autopar.atomic_write import write_text_atomically

    folder, atomic, trials, seed = sys.argv[1], sys.argv[2] == "atomic", int(sys.argv[3]), int(sys.argv[4])
    OLD = "old report\\n"

    def version(n):  # a complete content names itself and ends with the sha256 of everything before
        body = f"version {{n}}\\n" + (f"{{n:08d}}" * 8 + "\\n") * 40_000
        return body + hashlib.sha256(body.encode()).hexdigest() + "\\n"

    def naive(path, text):
        with open(path, "w") as handle:
            for start in range(0, len(text), 1 << 16):
                handle.write(text[start:start + (1 << 16)])
                handle.flush()

    def complete(text):
        body, digest = text[:-65], text[-65:-1]
        return text.endswith("\\n") and hashlib.sha256(body.encode()).hexdigest() == digest

    rng = random.Random(seed)
    found = []
    for trial in range(trials):
        target = os.path.join(folder, f"front-{{trial}}.json")
        had_old = trial % 2 == 1                       # half the trials start with an earlier report in place
        if had_old:
            with open(target, "w") as handle:
                handle.write(OLD)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(2)                             # Ctrl-C's traceback is not part of the test
                for n in range(1, 10_000):
                    (write_text_atomically if atomic else naive)(target, version(n))
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.12))
        how = rng.choice([signal.SIGKILL, signal.SIGINT])
        os.kill(pid, how)
        deadline = time.monotonic() + 5                # a forked child that cannot take Ctrl-C is killed
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        if not os.path.exists(target):
            found.append("absent, old removed" if had_old else "absent")
            continue
        text = open(target).read()
        found.append("old" if text == OLD else "complete" if complete(text) else f"torn ({{len(text)}} bytes)")
    print(json.dumps(found))
""")


def interrupted_writes(tmp_path: Path, trials: int, atomic: bool, seed: int) -> list[str]:
    """What each trial found in the target after the writer was killed at a random moment."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(root=str(ROOT)))
    result = subprocess.run([sys.executable, str(script), str(tmp_path), "atomic" if atomic else "naive",
                             str(trials), str(seed)], capture_output=True, text=True, timeout=TIMEOUT_S * 3,
                            preexec_fn=_cap_memory,
                            env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_interrupted_atomic_writes_leave_old_or_complete_files(tmp_path: Path) -> None:
    found = interrupted_writes(tmp_path, trials=60, atomic=True, seed=12)
    assert len(found) == 60
    assert set(found) <= {"absent", "old", "complete"}, [f for f in found if f not in ("absent", "old", "complete")]
    assert "complete" in found                     # the kills did land after some writes finished


def test_the_harness_catches_a_plain_writer(tmp_path: Path) -> None:
    # the control: the same kills on open(path, "w") + write leave torn files, so the test above can fail
    found = interrupted_writes(tmp_path, trials=20, atomic=False, seed=13)
    assert any(f.startswith("torn") or f == "absent, old removed" for f in found), found
