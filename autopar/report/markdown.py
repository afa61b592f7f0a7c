"""Markdown report, for pasting into a pull request or a design doc (GitHub-flavoured tables)."""

from __future__ import annotations

from typing import Any

from autopar.report.csv_report import ordered_union, worst_stage_terms
from autopar.report.units import (
    column_cells,
    format_bytes,
    format_count,
    format_gib_cell,
    format_percent,
    format_seconds,
    front_columns,
    whole_count,
)

_MARKDOWN_SPECIAL = "\\`*_{}[]<>()#+!|~"


def md_text(value: Any) -> str:
    """User text inside Markdown: every character with Markdown or HTML meaning escaped, one line."""
    text = " ".join(str(value).split())
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in text)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _number(value: Any, formatter) -> str:
    return "n/a" if value is None else formatter(value)


def _in_unit(seconds: float, scale: float) -> str:
    """A duration in the table's unit, 3 significant digits (tiny ones 2), no unit text (it is in the heading)."""
    return column_cells([seconds], scale)[0]


def render_markdown(document: dict[str, Any]) -> str:
    inputs, solver, points = document["inputs"], document["solver"], document["points"]
    model, cluster, training = inputs["model"], inputs["cluster"], inputs["training"]
    status = {"optimal": "proven optimal", "time_limit": "not proven optimal (time limit)",
              "not_searched": "single estimated plan"}[solver["status"]]
    lines = [f"# autopar: {md_text(model['name'])} on {cluster['num_gpus']}x {md_text(cluster['gpu_display_name'])}",
             "",
             f"{len(points)} Pareto-optimal plan(s), fastest first; solver `{md_text(solver['name'])}`, {status}, "
             f"{format_seconds(solver['solve_time_s'] or 0)}.",
             "",
             "## Inputs", ""]
    lines += _table(["", ""], [
        ["model", f"{md_text(model['name'])} ({format_count(model['total_params'])} params, "
                  f"{format_count(model['active_params'])} active)"],
        ["shape", f"{model['num_layers']} layers, hidden {model['hidden_size']}, {model['num_attention_heads']} "
                  f"heads ({model['num_kv_heads']} KV), FFN {model['ffn_hidden_size']}, vocab {model['vocab_size']}"],
        ["cluster", f"{cluster['num_gpus']}x {md_text(cluster['gpu_display_name'])}, {cluster['gpus_per_node']} per "
                    f"node, {format_bytes(cluster['hbm_bytes'])} HBM, limit "
                    f"{format_bytes(cluster['memory_limit_bytes'])} "
                    f"(headroom {format_percent(cluster['headroom'], 0)})"],
        ["training", f"seq {training['seq_len']}, global batch {training['global_batch_size']}, "
                     f"{training['precision']}"],
        ["rules", md_text(", ".join(document["rules"]) or "none")
         + (f" (relaxed: {md_text(', '.join(document['relaxed_rules']))})" if document["relaxed_rules"] else "")],
    ])
    lines += ["", "## Front", ""]
    # one unit per column, named in the header; enough decimals that neighbouring rows differ
    cells = front_columns(points)
    time_unit, rate_label = cells["time_unit"], cells["rate_unit"]
    time_cells, rate_cells, peak_cells = cells["time"], cells["rate"], cells["peak_gib"]
    lines += _table(["#", "plan", f"step time ({time_unit})", f"throughput ({rate_label})", "MFU",
                     "peak memory (GiB)", "peak stage", "microbatches"], [
        [str(p["rank"]), f"`{p['label']}`", time_cells[i], rate_cells[i], _number(p["mfu"], format_percent),
         peak_cells[i], str(p["worst_stage"]), _number(p["num_microbatches"], whole_count)]
        for i, p in enumerate(points)])
    if points:
        lines += ["", "## Memory per GPU, worst stage, GiB (- = none)", ""]
        terms = ordered_union([worst_stage_terms(p) for p in points])
        lines += _table(["term", *(f"#{p['rank']}" for p in points)],
                        [[md_text(term), *(_number(worst_stage_terms(p).get(term), format_gib_cell) for p in points)]
                         for term in terms]
                        + [["**total**", *(f"**{_number(p['peak_memory_bytes'], format_gib_cell)}**"
                                           for p in points)]])
        step_scale = cells["time_scale"]   # the front table's unit
        lines += ["", f"## Step time, {time_unit}", ""]
        terms = ordered_union([p["time_terms_s"] for p in points])
        rows = [[md_text(term), *(p["time_terms_s"].get(term) for p in points)] for term in terms]
        rows.append(["**total**", *(p["step_time_s"] for p in points)])
        cells = [[row[0], *("n/a" if v is None else "-" if v == 0 else _in_unit(v, step_scale) for v in row[1:])]
                 for row in rows]
        cells[-1] = [cells[-1][0], *(f"**{cell}**" for cell in cells[-1][1:])]
        lines += _table(["term", *(f"#{p['rank']}" for p in points)], cells)
        lines += ["", "## Megatron-LM flags of the fastest plan", "", "```", " ".join(points[0]["megatron_flags"]),
                  "```"]
    lines += ["", "## Assumptions", ""] + [f"- {md_text(a)}" for a in document["assumptions"]]
    if document["notes"]:
        lines += ["", "## Notes", ""] + [f"- {md_text(n)}" for n in document["notes"]]
    provenance = document["hardware"]["provenance"]
    if provenance:
        lines += ["", "## Hardware profile provenance", ""]
        lines += [f"- {md_text(key)}: {md_text(value)}" for key, value in provenance.items()]
    return "\n".join(lines) + "\n"
