"""Every figure quoted in README.md and docs/*.md, with the command that prints it; checks them, or rewrites them.

    python benchmarks/docs_figures.py                  # re-run the cheap commands; exit 1 on a figure that drifted
    python benchmarks/docs_figures.py --all            # the expensive ones too (benchmarks/fidelity_runs.py, ~30 s)
    python benchmarks/docs_figures.py --update [--all] # rewrite the quoted figures in place from the commands' output
    python benchmarks/docs_figures.py --list           # every figure: its name, where it is quoted, its command

Two kinds of marker, HTML comments, so the rendered Markdown shows only the figure:

- a figure in prose: `<!-- fig NAME -->33.1%<!-- /fig -->`. NAME is an entry of FIGURES below: the command that
  prints it and the pattern that finds it in the output (a derived figure, such as "19% low", names the figures it
  is computed from). The prose next to a figure names its command too, so a reader can run it.
- a command's output, quoted whole: `<!-- output: autopar solve ... -->` right above a fenced block that holds
  exactly what the command prints on stdout (trailing spaces aside); `<!-- output: COMMAND | lines 1-5 -->` quotes
  those lines, `<!-- output: COMMAND | from Pareto front -->` the lines from the first that contains the text on.

The check (CI runs it from .ci/run, cheap figures only, under a minute on 2 cores) runs each distinct command once,
two at a time, compares every quoted figure and block with the fresh output, and prints one line per drifted figure
naming the figure, the file and the command, then `docs-figures: checked=N drifted=M ...`; exit 1 if any drifted.
`--update` writes the fresh values into the files instead (after a change to the cost model, one run refreshes every
figure; review the diff). Figures whose command takes longer than CI affords (`expensive`) are checked and updated
only with --all; those of benchmarks that read shared/reference are skipped, and counted, in a checkout without it
beside (CI clones the repository next to a copy of shared/). Wall-clock timings are not figures here: they differ from machine to machine and run to run, and the
documents quote them as measurements, with the command and the date.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/*.md")
"""The files whose figures are checked (glob patterns under the repository root)."""


@dataclass(frozen=True)
class Figure:
    """One quoted figure: the text `pattern`'s first group matches in `command`'s output (stdout, then stderr), or
    `derive` applied to the figures named in `inputs`."""

    command: str = ""
    pattern: str = ""
    derive: "Callable[..., str] | None" = None
    inputs: tuple[str, ...] = ()
    expensive: bool = False
    shown: "Callable[[str], str] | None" = None
    """How the matched text is quoted (`lambda v: f"{float(v):.2f} s"`), where the output is not in the document's form."""


SOLVE_70B = "autopar solve llama-3.1-70b --gpus 64 --gpu h100 --seq-len 8192 --global-batch 1024"
LLAMA_405B = ("autopar solve llama-3.1-405b --gpu h100 --num-gpus {gpus} --seq-len {seq} --global-batch {batch} "
              "--fix tp=8 --fix pp=16 --fix cp={cp} --headroom 0.05 --top 1")
LLAMA_405B_RUNS = {"8k": dict(gpus=8192, seq=8192, batch=2048, cp=1, published=43),
                   "16k": dict(gpus=16384, seq=8192, batch=2048, cp=1, published=41),
                   "128k": dict(gpus=16384, seq=131072, batch=128, cp=16, published=38)}
"""Llama 3 405B's three published runs (arXiv 2407.21783 Table 4: MFU 43%, 41%, 38%), as solved by autopar."""
FIRST_ROW_MFU = r"│ 0 │[^│\n]*│[^│\n]*│[^│\n]*│\s*([\d.]+%)"
"""The MFU of the fastest row of a front table."""
FIRST_ROW_PLAN = r"│ 0 │ (\S[^│\n]*?)\s*│[^\n]*\n(?:│\s+│ (\S[^│\n]*?)\s*│)?"
"""The plan label of the fastest row of a front table (a label that wraps is joined)."""
FIDELITY = "python benchmarks/fidelity.py"
LAYOUT_DEMO = "autopar solve llama-3.1-8b --gpus 32 --fix pp=4 --fix vpp=2 --top 1"
LAYOUT_EXPLAIN = "autopar explain llama-3.1-8b --gpus 32 --tp 2 --pp 4 --mbs 1"
RUNS = "python benchmarks/fidelity_runs.py"
FIT_RUNS_SOURCES = (("foundry-a100-40", "llm-foundry", "a100-40gb"), ("foundry-a100-80", "llm-foundry", "a100-80gb"),
                    ("foundry-h100", "llm-foundry", "h100-80gb"), ("modelzoo", "mcore-moe-modelzoo", "h100-80gb"),
                    ("nanogpt", "modded-nanogpt", "h100-80gb"), ("folding", "moe-parallel-folding", "h100-80gb"),
                    ("zb", "zero-bubble-pp", "a100-80gb"))
"""The rows of benchmarks/fit_runs.py's table docs/calibrate_from_runs.md quotes: (figure name, source, GPU)."""
SENSITIVITY = "python benchmarks/fidelity_sensitivity.py"
SENSITIVITY_VARIANTS = ("burst-clock", "triton-mma-sync", "triton-mma-sync+burst-clock", "elementwise-once")
"""benchmarks/fidelity_sensitivity.py's variants, in the order of its table's columns (after `bundled`)."""
SENSITIVITY_SOURCES = (("foundry", "llm-foundry"), ("llmc", "llmc"), ("nanogpt", "modded-nanogpt"),
                       ("readme", "megatron-lm-readme"), ("zb", "zero-bubble-pp"))
"""The sources whose cells of that table docs/fidelity.md quotes: (figure name, source); the cells are named
sens-VARIANT-NAME-mape|bias."""


def _low(mfu: str, published: int) -> str:
    """'36.3%' against a published 43% -> '16% low' (or 'high')."""
    gap = float(mfu.rstrip("%")) / published - 1
    return f"{abs(gap):.0%} {'low' if gap < 0 else 'high'}"


FIGURES: dict[str, Figure] = {
    # ---- Llama 3 405B, out of sample (docs/fidelity.md, README) ----
    **{f"405b-{run}-mfu": Figure(LLAMA_405B.format(**spec), FIRST_ROW_MFU) for run, spec in LLAMA_405B_RUNS.items()},
    **{f"405b-{run}-plan": Figure(LLAMA_405B.format(**spec), FIRST_ROW_PLAN) for run, spec in LLAMA_405B_RUNS.items()},
    **{f"405b-{run}-gap": Figure(derive=lambda mfu, published=spec["published"]: _low(mfu, published),
                                 inputs=(f"405b-{run}-mfu",)) for run, spec in LLAMA_405B_RUNS.items()},
    # ---- per-stage layouts (docs/layouts.md) ----
    "layout-demo-plan": Figure(LAYOUT_DEMO, FIRST_ROW_PLAN),
    "layout-demo-step": Figure(LAYOUT_DEMO + " --json", r'"step_time_s": ([\d.]+)', shown=lambda v: f"{float(v):.2f} s"),
    "layout-demo-uniform-step": Figure(LAYOUT_DEMO + " --no-layouts --json", r'"step_time_s": ([\d.]+)',
                                       shown=lambda v: f"{float(v):.2f} s"),
    "layout-demo-gain": Figure(derive=lambda layout, uniform: f"{float(uniform[:-2]) / float(layout[:-2]) - 1:.1%}",
                               inputs=("layout-demo-step", "layout-demo-uniform-step")),
    "layout-explain": Figure(LAYOUT_EXPLAIN, r"(layout: .*? per-stage model\))"),
    # ---- benchmarks/fidelity.py: the paper rows ----
    "fidelity-memory-mean": Figure(FIDELITY, r"fidelity-memory: mean_err=([\d.]+%)"),
    "fidelity-memory-max": Figure(FIDELITY, r"fidelity-memory: mean_err=[\d.]+% max_err=([\d.]+%)"),
    "fidelity-memory-rows": Figure(FIDELITY, r"fidelity-memory: .* rows=(\d+)"),
    "fidelity-time-mean": Figure(FIDELITY, r"fidelity-time: mean_err=([\d.]+%)"),
    "fidelity-time-max": Figure(FIDELITY, r"fidelity-time: mean_err=[\d.]+% max_err=([\d.]+%)"),
    "fidelity-time-rows": Figure(FIDELITY, r"fidelity-time: .* rows=(\d+)"),
    "host-loo-max": Figure("python benchmarks/fidelity_crossval.py", r"host_loo_max=([\d.]+%)", expensive=True),
    "microbatch-sweep-70b-b200": Figure("python benchmarks/microbatch_sweep.py",
                                        r"microbatch-sweep: llama-3.1-70b b200-180gb mbs1/mbs8=([\d.]+)", expensive=True),
    "fidelity-crossval-mean": Figure(FIDELITY, r"elementwise_loso_mean=([\d.]+%)"),
    "fidelity-crossval-max": Figure(FIDELITY, r"elementwise_loso_max=([\d.]+%)"),
    "guide-example-1": Figure(FIDELITY, r"guide +example 1: .* ([\d.]+%) +yes"),
    "guide-example-2": Figure(FIDELITY, r"guide +example 2: .* ([\d.]+%) +yes"),
    "guide-example-3-gib": Figure(FIDELITY, r"DeepSeek-V2-Lite shape holds only ([\d.]+ GiB)"),
    "guide-example-3-v3-gib": Figure(FIDELITY, r"full DeepSeek-V3 shape on the same layout needs ([\d.]+ GiB)"),
    "elementwise-crossval": Figure("python benchmarks/fit_profiles.py --elementwise-only --cross-validate",
                                   r"out-of-sample: mean_err=([\d.]+%) max_err=([\d.]+%)",
                                   shown=lambda v: "mean {}, max {}".format(*v.split()), expensive=True),
    "tp8-18.4b": Figure("python benchmarks/fidelity_time.py", r"18\.4B tp8 pp1 mbs\d+ full +TFLOP/s/GPU +[\d.]+ +[\d.]+ +[+-]([\d.]+)",
                        shown=lambda v: f"{float(v):.1f}%"),
    "tp8-39.1b": Figure("python benchmarks/fidelity_time.py", r"39\.1B tp8 pp2 mbs\d+ full +TFLOP/s/GPU +[\d.]+ +[\d.]+ +[+-]([\d.]+)",
                        shown=lambda v: f"{float(v):.1f}%"),
    "tp8-22b": Figure("python benchmarks/fidelity_time.py", r"22B tp8 pp1 full +iter s +[\d.]+ +[\d.]+ +[+-]([\d.]+)",
                      shown=lambda v: f"{float(v):.1f}%"),
    **{f"published-gap-{row}": Figure("python benchmarks/published_layouts.py",
                                      rf"{row} +│[^\n]*│ +\+?(-?[\d.]+%) │") for row in
       ("table1-18.4B", "table1-39.1B", "korthikanti-22B-full")},
    **{f"published-gap-{row}-e1": Figure("python benchmarks/published_layouts.py --nvlink-efficiency 1",
                                         rf"{row} +│[^\n]*│ +\+?(-?[\d.]+%) │", expensive=True) for row in
       ("table1-18.4B", "table1-39.1B", "korthikanti-22B-full")},
    "published-e1-refit-error": Figure("python benchmarks/published_layouts.py --nvlink-efficiency 1",
                                       r"published-layouts: .* mean_err=([\d.]+%)", expensive=True),
    # ---- benchmarks/fidelity_runs.py: 600 published end-to-end runs (expensive: ~30 s) ----
    "runs-mape": Figure(RUNS, r"fidelity-runs: mape=([\d.]+%)", expensive=True),
    "runs-max": Figure(RUNS, r"fidelity-runs: mape=[\d.]+% max=([\d.]+%)", expensive=True),
    "runs-rows": Figure(RUNS, r"fidelity-runs: .* rows=(\d+)", expensive=True),
    "runs-spearman": Figure(RUNS, r"fidelity-runs: .* spearman_median=([\d.]+)", expensive=True),
    "runs-regret": Figure(RUNS, r"fidelity-runs: .* regret_mean=([\d.]+%)", expensive=True),
    "runs-dense-a100": Figure(RUNS, r"fidelity-runs-categories: dense_A100=([\d.]+%)", expensive=True),
    "runs-dense-h100": Figure(RUNS, r"fidelity-runs-categories: .*dense_H100/H200=([\d.]+%)", expensive=True),
    "runs-moe": Figure(RUNS, r"fidelity-runs-categories: .* MoE=([\d.]+%)", expensive=True),
    "runs-small-kernel": Figure(RUNS, r"fidelity-runs-categories: .* small-kernel=([\d.]+%)", expensive=True),
    "runs-memory-mape": Figure(RUNS, r"fidelity-runs-memory: mape=([\d.]+%)", expensive=True),
    "runs-memory-max": Figure(RUNS, r"fidelity-runs-memory: mape=[\d.]+% max=([\d.]+%)", expensive=True),
    "runs-memory-rows": Figure(RUNS, r"fidelity-runs-memory: .* rows=(\d+)", expensive=True),
    **{f"runs-reserved-ratio-{n}": Figure(RUNS, rf"ladder Qwen3-30B-A3B Experiment {n} +[\d.]+ +[\d.]+ +([\d.]+)",
                                          expensive=True) for n in (1, 4, 5, 6, 7)},
    # ---- benchmarks/fit_runs.py ----
    "fit-runs-bundled": Figure("python benchmarks/fit_runs.py", r"fit-runs: .* bundled_mape=([\d.]+%)",
                               expensive=True),
    "fit-runs-fitted": Figure("python benchmarks/fit_runs.py", r"fit-runs: .* fitted_mape=([\d.]+%)",
                              expensive=True),
    "fit-runs-worst": Figure("python benchmarks/fit_runs.py", r"fit-runs: .* worst_source=(\S+)", expensive=True),
    **{f"fit-runs-{name}-{column}": Figure("python benchmarks/fit_runs.py",
                                           rf"(?m)^{source} +{gpu} +\d+ +\d+ +" + r" +".join(
                                               [r"[\d.]+"] * index + [r"([\d.]+)"]), expensive=True)
       for name, source, gpu in FIT_RUNS_SOURCES for index, column in ((0, "bundled"), (1, "fitted"))},
    **{f"fit-runs-{name}-adopted": Figure("python benchmarks/fit_runs.py",
                                          rf"(?m)^{source} +{gpu} +\d+ +\d+" + r" +[\d.]+" * 5 + r" +(yes|no)\b",
                                          expensive=True)
       for name, source, gpu in FIT_RUNS_SOURCES},
    "fit-runs-modelzoo-loo": Figure("python benchmarks/fit_runs.py", r"(?m)^mcore-moe-modelzoo .*leave-one-out RMS "
                                    r"([\d.]+%)", expensive=True),
    "fit-runs-modelzoo-loo-bundled": Figure("python benchmarks/fit_runs.py", r"(?m)^mcore-moe-modelzoo .*leave-one-out "
                                            r"RMS [\d.]+% >= bundled ([\d.]+%)", expensive=True),
    **{f"fit-runs-{name}-in-sample": Figure("python benchmarks/fit_runs.py", rf"(?m)^{source} .*reach only ([\d.]+%)",
                                            expensive=True)
       for name, source in (("modelzoo", "mcore-moe-modelzoo"), ("nanogpt", "modded-nanogpt"))},
    "fit-runs-folding-in-sample": Figure("python benchmarks/fit_runs.py",
                                         r"(?m)^moe-parallel-folding .*rows can be fitted to ([\d.]+%)",
                                         expensive=True),
    # ---- benchmarks/fidelity_sensitivity.py: the same rows under the variants (expensive: ~35 s) ----
    **{f"sens-{variant.replace('+', '-and-')}-{name}": Figure(
        SENSITIVITY, rf"fidelity-sensitivity: {re.escape(variant)} .*{category}=([\d.]+%)", expensive=True)
       for variant, name, category in (("burst-clock", "dense-h100", "dense_H100/H200"), ("burst-clock", "moe", "MoE"),
                                       ("triton-mma-sync", "dense-h100", "dense_H100/H200"),
                                       ("triton-mma-sync+burst-clock", "dense-h100", "dense_H100/H200"),
                                       ("triton-mma-sync+burst-clock", "moe", "MoE"),
                                       ("elementwise-once", "dense-a100", "dense_A100"))},
    **{f"sens-{variant}-{name}-{figure}": Figure(
        SENSITIVITY, rf"(?m)^{dict(SENSITIVITY_SOURCES)[name]} +\d+"
        + r" +[\d.]+ +[+-][\d.]+" * ("bundled", *SENSITIVITY_VARIANTS).index(variant)
        + (r" +([\d.]+) +[+-][\d.]+" if figure == "mape" else r" +[\d.]+ +([+-][\d.]+)"), expensive=True)
       for variant, name, figure in (("bundled", "foundry", "bias"), ("triton-mma-sync", "foundry", "bias"),
                                     *((variant, name, "mape") for variant, name in (
                                         ("bundled", "llmc"), ("bundled", "nanogpt"), ("bundled", "readme"),
                                         ("bundled", "zb"), ("burst-clock", "llmc"), ("burst-clock", "nanogpt"),
                                         ("burst-clock", "readme"), ("elementwise-once", "llmc"),
                                         ("elementwise-once", "nanogpt"), ("elementwise-once", "zb"))))},
    # ---- the other fidelity benchmarks ----
    "microbench-median": Figure("python benchmarks/fidelity_microbench.py",
                                r"fidelity-microbench: files=\d+ median=([\d.]+%)"),
    "microbench-max": Figure("python benchmarks/fidelity_microbench.py",
                             r"fidelity-microbench: files=\d+ median=[\d.]+% max=([\d.]+%)"),
    "microbench-files": Figure("python benchmarks/fidelity_microbench.py", r"fidelity-microbench: files=(\d+)"),
    "microbench-deepep-v2-median": Figure("python benchmarks/fidelity_microbench.py",
                                          r"moe_deepep_v2_dispatch_combine\.csv +- +- +0 +([\d.]+%)"),
    "microbench-deepep-v2-max": Figure("python benchmarks/fidelity_microbench.py",
                                       r"moe_deepep_v2_dispatch_combine\.csv +- +- +0 +[\d.]+% +([\d.]+%)"),
    "published-layouts-within": Figure("python benchmarks/published_layouts.py",
                                       r"published-layouts: within_10pct=(\d+/\d+)"),
    "published-layouts-max-gap": Figure("python benchmarks/published_layouts.py",
                                        r"published-layouts: .* max_gap=([\d.]+%)"),
    "fp8-activation-saving-low": Figure("python benchmarks/fp8_recipes.py",
                                        r"fp8-recipes: h100-80gb speedup/activation_saving delayed=[\d.]+x/([\d.]+)%"),
    "fp8-activation-saving-high": Figure("python benchmarks/fp8_recipes.py",
                                         r"fp8-recipes: h100-80gb .* tensorwise=[\d.]+x/([\d.]+)%"),
    "fp8-activation-saving": Figure(derive=lambda low, high: f"{int(float(low))}-{int(float(high))}%",
                                    inputs=("fp8-activation-saving-low", "fp8-activation-saving-high")),
    "fp8-params-saving": Figure("python benchmarks/fp8_params.py",
                                r"fp8-params: h100-80gb tp8 peak_saving/gather_ratio delayed=([\d.]+) ?GiB"),
    "fp8-params-gather": Figure("python benchmarks/fp8_params.py",
                                r"fp8-params: h100-80gb tp8 peak_saving/gather_ratio delayed=[\d.]+GiB/([\d.]+)x"),
}


def figure_command(name: str) -> str:
    return FIGURES[name].command


# ---- markers -----------------------------------------------------------------------------------------------------

INLINE = re.compile(r"(?<!`)<!-- fig (?P<name>[\w.-]+) -->(?P<text>.*?)<!-- /fig -->", re.DOTALL)
"""An inline figure; one written inside inline code (`<!-- fig NAME -->`, as in docs/development.md) is prose."""
BLOCK = re.compile(r"(?m)^<!-- output: (?P<command>.+?)(?: \| (?P<lines>lines [\d,\- ]+|from .+?))? -->\n"
                   r"(?P<fence>```[a-z]*\n)(?P<text>.*?)```", re.DOTALL)


@dataclass
class Quote:
    """One marker found in a document: an inline figure (`name`) or an output block (`command`, `lines`)."""

    path: Path
    start: int
    end: int
    text: str
    name: str = ""
    command: str = ""
    lines: str = ""

    @property
    def label(self) -> str:
        return self.name or f"output of `{self.command}`" + (f" ({self.lines})" if self.lines else "")


def documents(root: Path = ROOT) -> list[Path]:
    found: list[Path] = []
    for pattern in DOCUMENTS:
        found += sorted(root.glob(pattern))
    return found


def quotes_in(path: Path) -> list[Quote]:
    text = path.read_text(encoding="utf-8")
    found = [Quote(path, m.start("text"), m.end("text"), m.group("text"), name=m.group("name"))
             for m in INLINE.finditer(text)]
    found += [Quote(path, m.start("text"), m.end("text"), m.group("text"), command=m.group("command").strip(),
                    lines=(m.group("lines") or "").strip())
              for m in BLOCK.finditer(text)]
    return sorted(found, key=lambda q: q.start)


# ---- running the commands ------------------------------------------------------------------------------------------

def argv_of(command: str) -> list[str]:
    """`autopar ...` as `python -m autopar.cli ...`, `python ...` with this interpreter (no shell)."""
    words = shlex.split(command)
    if words[0] == "autopar":
        return [sys.executable, "-m", "autopar.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise ValueError(f"a figure's command starts with autopar or python, not {words[0]!r}: {command}")


NO_REFERENCE = "\x00no shared/reference\x00"
"""What `run` returns for a benchmark that needs shared/reference where the checkout has none beside it (a plain
clone): its figures are skipped and counted, as the tests that read the reference skip (tests/conftest.py)."""


def run(command: str) -> str:
    """stdout, then stderr, of `command` in the repository, offline, without colour, in UTF-8."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1", PYTHONIOENCODING="utf-8", PYTHONPATH=str(ROOT))
    env.pop("COLUMNS", None)
    done = subprocess.run(argv_of(command), capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    if done.returncode not in (0, 1):
        if "shared/reference" in done.stderr and "not found" in done.stderr:
            return NO_REFERENCE
        raise RuntimeError(f"`{command}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout + "\n\x00stderr\x00\n" + done.stderr


def stdout_of(output: str) -> str:
    return output.split("\n\x00stderr\x00\n", 1)[0]


def selected_lines(stdout: str, selection: str) -> str:
    """The lines of `stdout` a block quotes, trailing spaces removed: all of them (`selection` empty), `lines 1-9,12`
    (1-based), or `from TEXT` (from the first line that contains TEXT to the end)."""
    rows = [row.rstrip() for row in stdout.splitlines()]
    if selection.startswith("lines "):
        keep: list[int] = []
        for part in selection[len("lines "):].replace(" ", "").split(","):
            low, _, high = part.partition("-")
            keep += range(int(low), int(high or low) + 1)
        rows = [rows[i - 1] for i in keep if 0 < i <= len(rows)]
    elif selection.startswith("from "):
        start = next((i for i, row in enumerate(rows) if selection[len("from "):] in row), len(rows))
        rows = rows[start:]
    return "\n".join(rows) + "\n"


def figure_values(names: set[str], outputs: dict[str, str]) -> dict[str, str]:
    """The current text of each figure in `names` (derived ones after their inputs): the pattern's groups, joined by
    a space, whitespace collapsed; a pattern that finds nothing gives '<not printed>'."""
    values: dict[str, str] = {}

    def value(name: str) -> str:
        if name in values:
            return values[name]
        figure = FIGURES[name]
        if figure.derive is not None:
            inputs = [value(n) for n in figure.inputs]
            result = "<not printed>" if "<not printed>" in inputs else figure.derive(*inputs)
        else:
            match = re.search(figure.pattern, outputs[figure.command])
            result = " ".join(" ".join(g for g in match.groups() if g).split()) if match else "<not printed>"
            if match and figure.shown is not None:
                result = figure.shown(result)
        values[name] = result
        return result

    for name in names:
        value(name)
    return values


def commands_of(name: str) -> set[str]:
    figure = FIGURES[name]
    if figure.derive is not None:
        return set().union(*(commands_of(n) for n in figure.inputs))
    return {figure.command}


def is_expensive(name: str) -> bool:
    figure = FIGURES[name]
    return figure.expensive or any(is_expensive(n) for n in figure.inputs)


def expensive_commands() -> set[str]:
    """Commands of expensive figures: an output block of one of them is expensive too."""
    return {figure.command for figure in FIGURES.values() if figure.expensive}


def quote_is_expensive(quote: Quote) -> bool:
    return is_expensive(quote.name) if quote.name else quote.command in expensive_commands()


# ---- check and update ----------------------------------------------------------------------------------------------

@dataclass
class Report:
    checked: int = 0
    drifted: list[str] = field(default_factory=list)
    skipped: int = 0
    no_reference: int = 0
    updated: int = 0


def check_or_update(paths: list[Path], include_expensive: bool, update: bool, workers: int = 2,
                    runner: Callable[[str], str] = run) -> Report:
    quotes = [q for path in paths for q in quotes_in(path)]
    unknown = sorted({q.name for q in quotes if q.name and q.name not in FIGURES})
    if unknown:
        raise SystemExit(f"docs-figures: unknown figure name(s) {', '.join(unknown)}: add them to FIGURES in "
                         f"{Path(__file__).relative_to(ROOT)}")
    report = Report()
    wanted = [q for q in quotes if include_expensive or not quote_is_expensive(q)]
    report.skipped = len(quotes) - len(wanted)
    commands = sorted({c for q in wanted for c in (commands_of(q.name) if q.name else {q.command})})
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outputs = dict(zip(commands, pool.map(runner, commands)))
    missing = {command for command, output in outputs.items() if output == NO_REFERENCE}
    runnable = [q for q in wanted if not (commands_of(q.name) if q.name else {q.command}) & missing]
    report.no_reference = len(wanted) - len(runnable)
    wanted = runnable
    values = figure_values({q.name for q in wanted if q.name}, outputs)
    fresh: dict[int, str] = {}
    for q in wanted:
        report.checked += 1
        now = values[q.name] if q.name else selected_lines(stdout_of(outputs[q.command]), q.lines)
        quoted = q.text if q.name else "\n".join(row.rstrip() for row in q.text.splitlines()) + "\n"
        if now != quoted:
            fresh[id(q)] = now
            where = q.path.relative_to(ROOT) if q.path.is_relative_to(ROOT) else q.path
            command = " | ".join(sorted(commands_of(q.name))) if q.name else q.command
            shown = (repr(quoted), repr(now)) if q.name else (f"{len(quoted.splitlines())} lines",
                                                             _first_difference(quoted, now))
            report.drifted.append(f"{q.label} in {where}: quoted {shown[0]}, now {shown[1]} (`{command}`)")
    if update:
        for path in paths:
            text = path.read_text(encoding="utf-8")
            for q in sorted((q for q in wanted if q.path == path and id(q) in fresh), key=lambda q: -q.start):
                text = text[:q.start] + fresh[id(q)] + text[q.end:]
                report.updated += 1
            path.write_text(text, encoding="utf-8")
    return report


def _first_difference(quoted: str, now: str) -> str:
    for number, (a, b) in enumerate(zip(quoted.splitlines(), now.splitlines()), start=1):
        if a != b:
            return f"line {number} reads {b.strip()[:80]!r}"
    return f"{len(now.splitlines())} lines"


def list_figures(paths: list[Path]) -> None:
    where: dict[str, list[str]] = {}
    blocks: list[tuple[str, str]] = []
    for path in paths:
        for q in quotes_in(path):
            relative = str(path.relative_to(ROOT))
            if q.name:
                where.setdefault(q.name, []).append(relative)
            else:
                blocks.append((relative, q.command + (f" | {q.lines}" if q.lines else "")))
    for name in FIGURES:
        command = " + ".join(sorted(commands_of(name)))
        cost = "expensive" if is_expensive(name) else "cheap"
        files = ", ".join(sorted(set(where.get(name, [])))) or "not quoted"
        print(f"{name:28s} {cost:9s} {files:40s} {command}")
    for relative, command in blocks:
        cost = "expensive" if command.split(" | ")[0] in expensive_commands() else "cheap"
        print(f"{'(output block)':28s} {cost:9s} {relative:40s} {command}")


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also the expensive figures (fidelity_runs.py)")
    parser.add_argument("--update", action="store_true", help="rewrite drifted figures in place")
    parser.add_argument("--list", action="store_true", help="list every figure, where it is quoted, its command")
    parser.add_argument("--workers", type=int, default=2, help="commands run at once (default 2)")
    args = parser.parse_args(argv)
    paths = documents()
    if args.list:
        list_figures(paths)
        return 0
    report = check_or_update(paths, include_expensive=args.all, update=args.update, workers=args.workers)
    for line in report.drifted:
        print(f"docs-figures: {'updated' if args.update else 'DRIFTED'}: {line}")
    print(f"docs-figures: checked={report.checked} drifted={len(report.drifted)} updated={report.updated} "
          f"skipped_expensive={report.skipped}{'' if args.all else ' (--all checks them)'} "
          f"skipped_no_reference={report.no_reference}"
          + (" (shared/reference is not next to this checkout)" if report.no_reference else ""))
    return 1 if report.drifted and not args.update else 0


if __name__ == "__main__":
    sys.exit(main())
