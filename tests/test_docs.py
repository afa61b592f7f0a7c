"""The documentation's own promises (issue 45): README.md is a front door under 200 lines with the two commands at the
top; every link between the documents resolves; docs/cli.md is what the parser generates; every figure marker names
a figure benchmarks/docs_figures.py knows, and the script's check and update do what they say (on copies, with the
commands' output given, so these tests run no command; CI runs the script itself from .ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import cli_reference, docs_figures

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) < 200, len(lines)
    blocks = re.findall(r"```bash\n(.*?)\n```", README, flags=re.DOTALL)
    assert blocks[:2] == ["pip install -e . && autopar solve llama-3.1-70b --gpus 64 --gpu h100 --seq-len 8192 "
                          "--global-batch 1024", "pip install -e '.[test]' && python -m pytest"]
    assert README.index("pip install -e .") < 1500          # the two commands come first


def test_every_link_between_the_documents_resolves() -> None:
    for path in docs_figures.documents():
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (path.parent / target).exists(), (path.relative_to(ROOT), target)


def test_the_cli_reference_is_current() -> None:
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == cli_reference.render(), \
        "docs/cli.md is out of date: run python benchmarks/cli_reference.py"


def test_the_cli_reference_lists_every_flag() -> None:
    from autopar.cli import build_parser

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name, sub in cli_reference._subparsers(build_parser()).items():
        assert f"## `autopar {name}`" in text
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, (name, flag)


def test_every_marker_names_a_known_figure_and_every_figure_is_quoted() -> None:
    quoted = {q.name for path in docs_figures.documents() for q in docs_figures.quotes_in(path) if q.name}
    assert quoted <= set(docs_figures.FIGURES), quoted - set(docs_figures.FIGURES)
    inputs = {name for figure in docs_figures.FIGURES.values() for name in figure.inputs}
    assert set(docs_figures.FIGURES) - quoted - inputs == set()


def test_every_figure_command_is_one_the_script_can_run() -> None:
    for name in docs_figures.FIGURES:
        for command in docs_figures.commands_of(name):
            argv = docs_figures.argv_of(command)
            assert argv[0].endswith("python") or "python" in Path(argv[0]).name, argv


SAMPLE = """Intro <!-- fig runs-mape -->7.8%<!-- /fig --> and <!-- fig 405b-16k-mfu -->39.3%<!-- /fig -->, low by
<!-- fig 405b-16k-gap -->4% low<!-- /fig -->.

<!-- output: autopar models | lines 2-3 -->
```text
old line two
old line three
```
"""


def fake_runner(outputs: dict[str, str]):
    def run(command: str) -> str:
        return outputs[command] + "\n\x00stderr\x00\n"
    return run


def sample_outputs() -> dict[str, str]:
    row = ("│ 0 │ tp8 pp16 vpp8 split7/7 mbs1  │          7.89 │             2,126,052 │ 33.1% │   43.8 │   1 │  16 │\n"
           "│   │ sp sel(attn+mlp) z1          │               │                       │       │        │     │     │\n")
    return {docs_figures.FIGURES["405b-16k-mfu"].command: "header\n" + row,
            docs_figures.FIGURES["runs-mape"].command: "fidelity-runs: mape=7.8% max=44.9% rows=380",
            "autopar models": "line one\nline two   \nline three\nline four\n"}


def test_the_check_names_the_drifted_figure_the_file_and_the_command(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SAMPLE)
    report = docs_figures.check_or_update([page], include_expensive=True, update=False,
                                          runner=fake_runner(sample_outputs()))
    assert report.checked == 4
    drifted = "\n".join(report.drifted)
    assert "405b-16k-mfu in" in drifted and "quoted '39.3%', now '33.1%'" in drifted
    assert "autopar solve llama-3.1-405b --gpu h100 --num-gpus 16384" in drifted
    assert "405b-16k-gap" in drifted and "'19% low'" in drifted        # derived from the MFU: 33.1 / 41 - 1
    assert "output of `autopar models` (lines 2-3)" in drifted
    assert "runs-mape" not in drifted                                  # 7.8% is what the command prints
    assert page.read_text() == SAMPLE                                  # a check writes nothing


def test_update_rewrites_the_figures_in_place(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SAMPLE)
    report = docs_figures.check_or_update([page], include_expensive=True, update=True,
                                          runner=fake_runner(sample_outputs()))
    assert report.updated == 3
    text = page.read_text()
    assert "<!-- fig 405b-16k-mfu -->33.1%<!-- /fig -->" in text and "<!-- fig 405b-16k-gap -->19% low<!-- /fig -->" in text
    assert "```text\nline two\nline three\n```" in text
    again = docs_figures.check_or_update([page], include_expensive=True, update=False,
                                         runner=fake_runner(sample_outputs()))
    assert again.drifted == []


def test_expensive_figures_wait_for_all(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SAMPLE)
    outputs = sample_outputs()
    del outputs[docs_figures.FIGURES["runs-mape"].command]             # would fail if it were run
    report = docs_figures.check_or_update([page], include_expensive=False, update=False,
                                          runner=fake_runner(outputs))
    assert report.skipped == 1 and report.checked == 3


def test_an_unknown_figure_name_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- fig no-such-figure -->1<!-- /fig -->")
    with pytest.raises(SystemExit, match="no-such-figure"):
        docs_figures.check_or_update([page], include_expensive=True, update=False, runner=fake_runner({}))


def test_figures_of_benchmarks_without_their_reference_data_are_skipped_and_counted(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SAMPLE)
    outputs = sample_outputs()
    outputs[docs_figures.FIGURES["runs-mape"].command] = docs_figures.NO_REFERENCE

    def run(command: str) -> str:
        return outputs[command] if outputs[command] == docs_figures.NO_REFERENCE else outputs[command] + "\n\x00stderr\x00\n"

    report = docs_figures.check_or_update([page], include_expensive=True, update=False, runner=run)
    assert report.no_reference == 1 and report.checked == 3
