"""Self-contained HTML report: one file, no network (inline SVG, inline CSS, one inline script).

- a Pareto scatter of step time against peak memory per GPU, with the GPU's memory and the usable limit
  (headroom) as vertical lines; every point is a `circle.point-marker[data-index]`, labelled with its plan and
  showing its details on hover (SVG <title>) and in the details panel on hover or click;
- stacked bars of the worst stage's memory terms and of the step-time terms, one bar per point;
- the front as a table, the inputs, the assumptions and the hardware profile's provenance.

Escaping: every string that reaches the markup goes through `html.escape` (model names and paths are typed by
users); the report data is embedded as JSON in a `<script type="application/json">` block with `<`, `>`, `&` and
the JavaScript line separators written as \\uXXXX escapes, so no `</script>` or `<!--` can occur in it; the
script reads it with JSON.parse and writes to the page only through textContent.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from autopar.report.csv_report import ordered_union, worst_stage_terms
from autopar.report.units import (
    format_bytes,
    format_count,
    format_percent,
    format_rate,
    format_seconds,
    front_columns,
    whole_count,
)
from costmodels.units import GIB

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#1f77b4", "#8c564b")
MARKER_CLASS = "point-marker"

CSS = """
:root { color-scheme: light; --ink: #1d2330; --muted: #5b6475; --line: #d7dbe3; --accent: #2a62c9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
header h1 { font-size: 22px; margin: 0 0 4px; }
header p { margin: 0; color: var(--muted); }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px; margin-top: 18px; }
h2 { font-size: 16px; margin: 0 0 10px; }
h3 { font-size: 15px; margin: 0 0 8px; }
.layout { display: grid; grid-template-columns: minmax(0, 1fr) 340px; gap: 18px; align-items: start; }
svg.chart { width: 100%; height: auto; display: block; }
svg text { font: 11px system-ui, sans-serif; fill: var(--ink); }
.grid line { stroke: #eceef2; }
.axis-label { fill: var(--muted); font-size: 12px; }
.tick { fill: var(--muted); }
.limit-hbm { stroke: #c0392b; stroke-width: 1.5; }
.limit-usable { stroke: #e67e22; stroke-width: 1.5; stroke-dasharray: 6 4; }
.limit-text-hbm { fill: #c0392b; }
.limit-text-usable { fill: #b35f0c; }
.front-line { fill: none; stroke: #9aa7bd; stroke-width: 1.2; stroke-dasharray: 3 3; }
.point-marker { fill: var(--accent); stroke: #fff; stroke-width: 1.5; cursor: pointer; }
.point-marker:hover, .point-marker.selected { fill: #e15759; }
.point-label { font-size: 11px; fill: #2f3747; pointer-events: none; }
.bar-row { cursor: pointer; }
.bar-row.selected .bar-name { font-weight: 700; fill: #e15759; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 6px 0 0; padding: 0; list-style: none;
          color: var(--muted); font-size: 12px; }
.legend li::before { content: ""; display: inline-block; width: 10px; height: 10px; margin-right: 5px;
                     border-radius: 2px; background: var(--swatch); vertical-align: -1px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eef0f4; vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.selected td { background: #fff3f3; }
.details { border-top: 3px solid var(--accent); padding-top: 12px; margin-top: 12px; display: grid;
           grid-template-columns: 320px minmax(0, 1fr); gap: 8px 28px; }
.details .wide { overflow-x: auto; }
.details table { margin-bottom: 10px; }
.details pre { white-space: pre-wrap; word-break: break-all; background: #f3f5f8; padding: 8px; border-radius: 4px;
               font-size: 11.5px; }
.muted { color: var(--muted); }
code { font-size: 12.5px; }
@media (max-width: 900px) { .layout, .details { grid-template-columns: 1fr; } }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("autopar-data").textContent);
  var points = data.points;
  var panel = document.getElementById("details");

  function el(tag, text, className) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (className) { node.className = className; }
    return node;
  }
  function sig(value, digits) {
    if (value === 0) { return "0"; }
    var magnitude = Math.floor(Math.log10(Math.abs(value)));
    return value.toFixed(Math.max(0, digits - 1 - magnitude));
  }
  function bytes(value) {
    if (value === null || value === undefined) { return "n/a"; }
    var units = [["TiB", Math.pow(1024, 4)], ["GiB", Math.pow(1024, 3)], ["MiB", Math.pow(1024, 2)], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(value) >= units[i][1]) { return sig(value / units[i][1], 3) + " " + units[i][0]; }
    }
    return value.toFixed(0) + " B";
  }
  function gib(value) {              // a cell of a table in GiB: '-' for none, small values kept visible
    if (value === null || value === undefined) { return "n/a"; }
    if (value === 0) { return "-"; }
    var g = value / Math.pow(1024, 3);
    return Math.abs(g) >= 0.005 ? g.toFixed(2) : sig(g, 2);
  }
  function seconds(value) {          // always seconds (autopar.report.units.TIME_UNIT)
    if (value === null || value === undefined) { return "n/a"; }
    if (value === 0) { return "0 s"; }
    return sig(value, 3) + " s";
  }
  function rate(value) {             // always whole tokens/s (autopar.report.units.RATE_UNIT)
    if (value === null || value === undefined) { return "n/a"; }
    return Math.round(value).toLocaleString("en-US") + " tokens/s";
  }
  function percent(value) { return value === null || value === undefined ? "n/a" : (100 * value).toFixed(1) + "%"; }

  function table(header, rows, numericFrom) {
    var t = el("table"), head = el("tr");
    header.forEach(function (name, i) { head.appendChild(el("th", name, i >= numericFrom ? "num" : "")); });
    t.appendChild(head);
    rows.forEach(function (row) {
      var tr = el("tr");
      row.forEach(function (cell, i) { tr.appendChild(el("td", cell, i >= numericFrom ? "num" : "")); });
      t.appendChild(tr);
    });
    return t;
  }

  function show(index) {
    var p = points[index];
    if (!p) { return; }
    panel.textContent = "";
    var left = el("div"), right = el("div", null, "wide");
    panel.appendChild(left);
    panel.appendChild(right);
    left.appendChild(el("h3", "#" + p.rank + "  " + p.label));
    left.appendChild(table(["", ""], [
      ["step time", seconds(p.step_time_s)],
      ["throughput", rate(p.tokens_per_s)],
      ["MFU", percent(p.mfu)],
      ["peak memory", bytes(p.peak_memory_bytes) + " (stage " + p.worst_stage + ")"],
      ["usable memory", bytes(p.memory_limit_bytes)],
      ["microbatches", String(p.num_microbatches)],
      ["dp / edp", p.plan.dp + " / " + p.plan.edp]
    ], 1));
    var knobs = Object.keys(p.plan).filter(function (k) { return k !== "dp" && k !== "edp"; });
    left.appendChild(el("h3", "Plan"));
    left.appendChild(table(["knob", "value"], knobs.map(function (k) { return [k, String(p.plan[k])]; }), 1));
    right.appendChild(el("h3", "Memory per pipeline stage, GiB"));   // one unit for the whole table
    var terms = [];
    p.stages.forEach(function (s) { Object.keys(s.terms_bytes).forEach(function (t) {
      if (terms.indexOf(t) < 0) { terms.push(t); } }); });
    right.appendChild(table(["stage", "layers", "total"].concat(terms), p.stages.map(function (s) {
      return [String(s.stage), String(s.layers), gib(s.total_bytes)].concat(terms.map(function (t) {
        return t in s.terms_bytes ? gib(s.terms_bytes[t]) : ""; }));
    }), 1));
    right.appendChild(el("h3", "Step time, s"));
    right.appendChild(table(["term", "time (s)"], Object.keys(p.time_terms_s).map(function (t) {
      return [t, sig(p.time_terms_s[t], 4)]; }).concat([["total", sig(p.step_time_s, 4)]]), 1));
    right.appendChild(el("h3", "Megatron-LM flags"));
    right.appendChild(el("pre", p.megatron_flags.join(" ")));
    document.querySelectorAll("[data-index]").forEach(function (node) {
      node.classList.toggle("selected", node.getAttribute("data-index") === String(index));
    });
  }

  document.querySelectorAll("[data-index]").forEach(function (node) {
    var index = Number(node.getAttribute("data-index"));
    node.addEventListener("click", function () { show(index); });
    if (node.classList.contains("point-marker")) {
      node.addEventListener("mouseenter", function () { show(index); });
      node.addEventListener("keydown", function (event) { if (event.key === "Enter") { show(index); } });
    }
  });
  show(0);
  document.body.setAttribute("data-autopar-ready", String(points.length));
  console.log("autopar report ready: " + points.length + " points");
})();
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def script_json(document: dict[str, Any]) -> str:
    """JSON safe inside <script>: no '<', '>', '&' (so no '</script>' or '<!--') and no JS line separators."""
    text = json.dumps(document, ensure_ascii=False, allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values covering [low, high] (steps of 1, 2, 2.5 or 5 × 10^k)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        high = low + 1.0
    raw_step = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw_step)
    start = math.floor(low / step) * step
    ticks, value = [], start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def _fmt_tick(value: float) -> str:
    return f"{value:g}"


def _scatter(document: dict[str, Any]) -> str:
    points = [p for p in document["points"] if p["step_time_s"] is not None and p["peak_memory_bytes"] is not None]
    cluster = document["inputs"]["cluster"]
    hbm_gib, limit_gib = cluster["hbm_bytes"] / GIB, cluster["memory_limit_bytes"] / GIB
    width, height = 1000, 500
    left, right, top, bottom = 70, 30, 24, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    max_mem = max([hbm_gib] + [p["peak_memory_bytes"] / GIB for p in points])
    x_ticks = nice_ticks(0.0, max_mem * 1.04)
    times = [p["step_time_s"] for p in points] or [1.0]
    in_ms = max(times) < 1.0
    scale = 1e3 if in_ms else 1.0
    low, high = min(times) * scale, max(times) * scale
    pad = (high - low) * 0.12 or high * 0.1 or 1.0
    y_ticks = nice_ticks(max(0.0, low - pad), high + pad)

    def x_of(gib: float) -> float:
        return left + plot_w * (gib - x_ticks[0]) / (x_ticks[-1] - x_ticks[0])

    def y_of(seconds: float) -> float:
        return top + plot_h * (1 - (seconds * scale - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]))

    parts = [f'<svg class="chart" id="pareto-chart" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="Pareto front: step time against peak memory per GPU">',
             '<g class="grid">']
    for tick in x_ticks:
        x = x_of(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}"/>')
    for tick in y_ticks:
        y = top + plot_h * (1 - (tick - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]))
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/>')
    parts.append("</g>")
    for tick in x_ticks:
        parts.append(f'<text class="tick" x="{x_of(tick):.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                     f'{_fmt_tick(tick)}</text>')
    for tick in y_ticks:
        y = top + plot_h * (1 - (tick - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]))
        parts.append(f'<text class="tick" x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(tick)}</text>')
    parts.append(f'<text class="axis-label" x="{left + plot_w / 2:.1f}" y="{height - 12}" text-anchor="middle">'
                 f'peak memory per GPU, worst pipeline stage (GiB)</text>')
    parts.append(f'<text class="axis-label" transform="translate(16 {top + plot_h / 2:.1f}) rotate(-90)" '
                 f'text-anchor="middle">step time ({"ms" if in_ms else "s"})</text>')
    for gib, css, text in ((hbm_gib, "hbm", f"GPU memory {hbm_gib:.0f} GiB"),
                           (limit_gib, "usable", f"usable {limit_gib:.1f} GiB "
                                                 f"(headroom {format_percent(cluster['headroom'], 0)})")):
        x = x_of(gib)
        parts.append(f'<line class="limit-{css}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}"/>')
        anchor, dx = ("end", -4) if css == "usable" else ("start", 4)
        parts.append(f'<text class="limit-text-{css}" x="{x + dx:.1f}" y="{top + 12}" text-anchor="{anchor}">'
                     f'{esc(text)}</text>')
    by_memory, fastest_so_far = [], math.inf
    for p in sorted(points, key=lambda q: (q["peak_memory_bytes"], q["step_time_s"])):
        if p["step_time_s"] < fastest_so_far:  # the non-dominated staircase (every point, for a true front)
            by_memory.append(p)
            fastest_so_far = p["step_time_s"]
    if len(by_memory) > 1:
        path, previous_y = [], None
        for p in by_memory:  # a staircase: across at the previous time, then down to this point
            x, y = x_of(p["peak_memory_bytes"] / GIB), y_of(p["step_time_s"])
            path.append(f"M{x:.1f},{y:.1f}" if previous_y is None else f"L{x:.1f},{previous_y:.1f} L{x:.1f},{y:.1f}")
            previous_y = y
        parts.append(f'<path class="front-line" d="{" ".join(path)}"/>')
    placed = [(x_of(p["peak_memory_bytes"] / GIB) - 7, y_of(p["step_time_s"]) - 7,
               x_of(p["peak_memory_bytes"] / GIB) + 7, y_of(p["step_time_s"]) + 7) for p in points]  # markers
    for p in sorted(points, key=lambda q: q["rank"]):
        x, y = x_of(p["peak_memory_bytes"] / GIB), y_of(p["step_time_s"])
        tooltip = (f"#{p['rank']} {p['label']}\nstep time {format_seconds(p['step_time_s'])}\n"
                   f"peak memory {format_bytes(p['peak_memory_bytes'])} (stage {p['worst_stage']})\n"
                   f"{format_rate(p['tokens_per_s'] or 0)}, MFU {format_percent(p['mfu'] or 0)}")
        text = f"#{p['rank']} {p['label']}"
        label_x, label_y, anchor = _label_position(x, y, len(text), placed, (left, top, left + plot_w, top + plot_h))
        parts.append(f'<g class="point"><circle class="{MARKER_CLASS}" data-index="{p["rank"]}" cx="{x:.1f}" '
                     f'cy="{y:.1f}" r="6" tabindex="0"><title>{esc(tooltip)}</title></circle>'
                     f'<text class="point-label" x="{label_x:.1f}" y="{label_y:.1f}" text-anchor="{anchor}">'
                     f'{esc(text)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _label_position(x: float, y: float, length: int, placed: list[tuple[float, float, float, float]],
                    bounds: tuple[float, float, float, float]) -> tuple[float, float, str]:
    """Greedy label placement: the first of right / left / above / below / further out that overlaps no label
    or marker already placed and stays inside the plot; records the chosen box in `placed`."""
    width, height = 6.1 * length, 12.0
    candidates = [(x + 9, y + 4, "start"), (x - 9, y + 4, "end"), (x + 6, y - 9, "start"), (x + 6, y + 17, "start"),
                  (x - 6, y - 9, "end"), (x - 6, y + 17, "end")]
    candidates += [(x + 9, y + 4 + dy, "start") for dy in (-24, 24, -36, 36, -48, 48)]
    for label_x, label_y, anchor in candidates:
        x0 = label_x if anchor == "start" else label_x - width
        box = (x0, label_y - height + 2, x0 + width, label_y + 2)
        inside = box[0] >= bounds[0] and box[2] <= bounds[2] + 20 and box[1] >= bounds[1] - 14 and box[3] <= bounds[3]
        if inside and not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
            placed.append(box)
            return label_x, label_y, anchor
    label_x, label_y, anchor = candidates[0] if x < (bounds[0] + bounds[2]) / 2 else candidates[1]
    x0 = label_x if anchor == "start" else label_x - width
    placed.append((x0, label_y - height + 2, x0 + width, label_y + 2))
    return label_x, label_y, anchor


def _term_colors(terms: list[str]) -> dict[str, str]:
    return {term: PALETTE[i % len(PALETTE)] for i, term in enumerate(terms)}


def _stacked_bars(document: dict[str, Any], kind: str) -> str:
    """One horizontal stacked bar per point: memory terms of the worst stage, or step-time terms."""
    points = document["points"]
    if kind == "memory":
        values = [worst_stage_terms(p) for p in points]
        fmt, unit_scale, unit = format_bytes, GIB, "GiB"
        limits = [(document["inputs"]["cluster"]["memory_limit_bytes"], "usable"),
                  (document["inputs"]["cluster"]["hbm_bytes"], "hbm")]
    else:
        values = [p["time_terms_s"] for p in points]
        fmt, unit_scale, unit, limits = format_seconds, 1.0, "s", []   # always seconds, as every report
    terms = ordered_union(values)
    colors = _term_colors(terms)
    totals = [sum(max(v or 0.0, 0.0) for v in terms_of.values()) for terms_of in values]
    axis_max = max(totals + [value for value, _ in limits] + [1e-12]) / unit_scale
    ticks = nice_ticks(0.0, axis_max * 1.02)
    label_w, width, row_h, top = 300, 1000, 26, 8
    bar_w = width - label_w - 20
    height = top + row_h * len(points) + 30

    def x_of(value: float) -> float:
        return label_w + bar_w * (value / unit_scale) / ticks[-1]

    parts = [f'<svg class="chart" id="{kind}-bars" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{esc(kind)} breakdown per point">', '<g class="grid">']
    for tick in ticks:
        x = label_w + bar_w * tick / ticks[-1]
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + row_h * len(points)}"/>')
    parts.append("</g>")
    for tick in ticks:
        parts.append(f'<text class="tick" x="{label_w + bar_w * tick / ticks[-1]:.1f}" '
                     f'y="{top + row_h * len(points) + 14}" text-anchor="middle">{_fmt_tick(tick)}</text>')
    parts.append(f'<text class="axis-label" x="{label_w + bar_w / 2:.1f}" y="{height - 2}" text-anchor="middle">'
                 f'{esc(unit)}</text>')
    for p, terms_of, total in zip(points, values, totals):
        y = top + row_h * p["rank"]
        parts.append(f'<g class="bar-row" data-index="{p["rank"]}"><text class="bar-name" x="{label_w - 8}" '
                     f'y="{y + 16}" text-anchor="end">#{p["rank"]} {esc(p["label"])}</text>')
        x = label_w
        for term in terms:
            value = max(terms_of.get(term) or 0.0, 0.0)
            if value <= 0:
                continue
            w = x_of(value) - label_w
            parts.append(f'<rect x="{x:.2f}" y="{y + 4}" width="{w:.2f}" height="{row_h - 8}" '
                         f'fill="{colors[term]}"><title>{esc(term)}: {esc(fmt(value))}</title></rect>')
            x += w
        parts.append(f'<text class="tick" x="{x + 4:.1f}" y="{y + 16}">{esc(fmt(total))}</text></g>')
    for value, css in limits:
        x = x_of(value)
        parts.append(f'<line class="limit-{css}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" '
                     f'y2="{top + row_h * len(points)}"/>')
    parts.append("</svg>")
    legend = "".join(f'<li style="--swatch: {colors[t]}">{esc(t)}</li>' for t in terms)
    return "".join(parts) + f'<ul class="legend">{legend}</ul>'


def _points_table(document: dict[str, Any]) -> str:
    """The front, one unit per column (named in the header), enough decimals that neighbouring rows differ."""
    points = document["points"]
    cells = front_columns(points)
    time_unit, rate_label = cells["time_unit"], cells["rate_unit"]
    time_cells, rate_cells, peak_cells = cells["time"], cells["rate"], cells["peak_gib"]
    rows = []
    for i, p in enumerate(points):
        rows.append(
            f'<tr data-index="{p["rank"]}"><td>{p["rank"]}</td><td><code>{esc(p["label"])}</code></td>'
            f'<td class="num">{esc(time_cells[i])}</td>'
            f'<td class="num">{esc(rate_cells[i])}</td>'
            f'<td class="num">{esc(format_percent(p["mfu"] or 0))}</td>'
            f'<td class="num">{esc(peak_cells[i])}</td>'
            f'<td class="num">{p["worst_stage"]}</td>'
            f'<td class="num">{esc(whole_count(p["num_microbatches"] or 0))}</td></tr>')
    header = (f'<tr><th>#</th><th>plan</th><th class="num">step time ({esc(time_unit)})</th>'
              f'<th class="num">throughput ({esc(rate_label)})</th>'
              '<th class="num">MFU</th><th class="num">peak memory (GiB)</th><th class="num">peak stage</th>'
              '<th class="num">microbatches</th></tr>')
    return f'<table id="front-table">{header}{"".join(rows)}</table>'


def _key_values(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{esc(key)}</th><td>{esc(value)}</td></tr>" for key, value in rows)
    return f"<table>{body}</table>"


def _inputs(document: dict[str, Any]) -> str:
    inputs, solver, hardware = document["inputs"], document["solver"], document["hardware"]
    model, cluster, training = inputs["model"], inputs["cluster"], inputs["training"]
    model_rows = [("name", model["name"]), ("source", model["source"] or "—"),
                  ("parameters", f"{format_count(model['total_params'])} total, "
                                 f"{format_count(model['active_params'])} active"),
                  ("layers", model["num_layers"]), ("hidden size", model["hidden_size"]),
                  ("attention heads", f"{model['num_attention_heads']} ({model['num_kv_heads']} KV)"),
                  ("FFN size", model["ffn_hidden_size"]), ("vocabulary", model["vocab_size"])]
    if "moe" in model:
        moe = model["moe"]
        model_rows.append(("MoE", f"{moe['num_experts']} experts, top-{moe['top_k']}, expert FFN "
                                  f"{moe['expert_ffn_hidden_size']}"))
    cluster_rows = [("GPU", f"{cluster['gpu_display_name']} ({cluster['gpu']})"),
                    ("GPUs", f"{cluster['num_gpus']} = {cluster['num_nodes']} node(s) x {cluster['gpus_per_node']}"),
                    ("HBM", format_bytes(cluster["hbm_bytes"])),
                    ("usable", f"{format_bytes(cluster['memory_limit_bytes'])} "
                               f"(headroom {format_percent(cluster['headroom'], 0)})"),
                    ("profile", cluster.get("profile_source") or hardware["name"])]
    training_rows = [("sequence length", training["seq_len"]), ("global batch", training["global_batch_size"]),
                     ("precision", training["precision"]),
                     ("flash attention", training.get("flash_attention")),
                     ("attention kernel", training.get("attention_kernel_runs")),
                     ("cross entropy", training.get("cross_entropy")),
                     ("pipeline schedule", training.get("pipeline_schedule"))]
    if "moe" in model:
        training_rows.append(("MoE dispatcher", training.get("moe_dispatcher")))
        training_rows.append(("expert GEMMs", training.get("expert_gemm")))
    status = {"optimal": "proven optimal", "time_limit": "not proven optimal (stopped by the time limit)",
              "not_searched": "one estimated plan (no search)"}[solver["status"]]
    solver_rows = [("solver", solver["name"]), ("status", status),
                   ("solve time", format_seconds(solver["solve_time_s"] or 0)),
                   ("plans in the search space", solver["search_space_size"]),
                   ("rules applied", ", ".join(document["rules"]) or "none"),
                   ("rules relaxed", ", ".join(document["relaxed_rules"]) or "none")]
    provenance = "".join(f"<li><code>{esc(k)}</code>: {esc(v)}</li>" for k, v in hardware["provenance"].items())
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in document["assumptions"])
    notes = "".join(f"<li>{esc(n)}</li>" for n in document["notes"])
    return (f'<div class="layout"><div><h3>Model</h3>{_key_values(model_rows)}<h3>Training</h3>'
            f'{_key_values(training_rows)}</div><div><h3>Cluster</h3>{_key_values(cluster_rows)}<h3>Search</h3>'
            f'{_key_values(solver_rows)}</div></div>'
            f'<h3>Assumptions</h3><ul id="assumptions">{assumptions}</ul>'
            + (f'<h3>Notes</h3><ul>{notes}</ul>' if notes else "")
            + (f'<h3>Hardware profile provenance</h3><ul class="muted">{provenance}</ul>' if provenance else ""))


def render_html(document: dict[str, Any]) -> str:
    inputs, points = document["inputs"], document["points"]
    model, cluster, training = inputs["model"], inputs["cluster"], inputs["training"]
    title = f"autopar: {model['name']} on {cluster['num_gpus']}x {cluster['gpu_display_name']}"
    subtitle = (f"{len(points)} Pareto-optimal plan(s), fastest first · seq {training['seq_len']} · global batch "
                f"{training['global_batch_size']} · {training['precision']} · solver {document['solver']['name']} "
                f"({document['solver']['status'].replace('_', ' ')})")
    body = [f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header>"]
    if points:
        body.append('<section id="front"><h2>Step time against peak memory</h2>'
                    f'{_scatter(document)}<p class="muted">Hover or click a point for its details. Dashed orange: '
                    'usable memory after the headroom; red: the GPU\'s memory; dotted: the front.</p>'
                    '<div id="details" class="details" aria-live="polite"></div></section>')
        body.append(f'<section id="memory"><h2>Memory per GPU, worst pipeline stage</h2>'
                    f'{_stacked_bars(document, "memory")}</section>')
        body.append(f'<section id="time"><h2>Step time by term</h2>{_stacked_bars(document, "time")}</section>')
        body.append(f'<section id="table"><h2>Plans</h2>{_points_table(document)}</section>')
    else:
        body.append('<section><h2>No feasible plan</h2><div id="details" class="details"></div></section>')
    body.append(f'<section id="inputs"><h2>Inputs and assumptions</h2>{_inputs(document)}</section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>{''.join(body)}</main>"
            f'<script type="application/json" id="autopar-data">{script_json(document)}</script>'
            f"<script>{SCRIPT}</script></body></html>\n")
