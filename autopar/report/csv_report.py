"""CSV report: one row per front point, flat columns.

Columns: rank, label, every plan knob (DESIGN.md §1 names, dp/edp included), the layout (layers per virtual stage and
Megatron-Core's string; empty without one), the headline numbers in base units
(seconds, bytes, tokens/s, TFLOP/s per GPU, MFU as a fraction), then one `mem_<term>_bytes` column per memory term
of the worst stage and one `time_<term>_s` column per step-time term (the union over all points, in order of first
appearance; empty where a point has no such term), then the broken rules joined by ';'.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from costmodels.plan import Plan, plan_to_dict

PLAN_COLUMNS = tuple(plan_to_dict(Plan(), num_gpus=1))
"""Every knob with dp and edp, in DESIGN.md §1 order (the keys of each point's `plan` in the document)."""
LAYOUT_COLUMNS = ("layout", "pipeline_model_parallel_layout")
"""A plan's per-stage layout: decoder layers per virtual stage joined by '|' (e.g. 7|9|9|7) and Megatron-Core's
string (Et*7|t*9|t*9|t*7L); both empty for a plan without one."""
HEADLINE_COLUMNS = ("num_microbatches", "step_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu",
                    "hardware_tflops_per_gpu", "peak_memory_bytes", "memory_limit_bytes", "worst_stage", "fits")


def ordered_union(groups: "list[dict[str, Any]]") -> list[str]:
    names: list[str] = []
    for group in groups:
        names += [name for name in group if name not in names]
    return names


def worst_stage_terms(point: dict[str, Any]) -> dict[str, Any]:
    return point["stages"][point["worst_stage"]]["terms_bytes"]


def render_csv(document: dict[str, Any]) -> str:
    points = document["points"]
    memory_terms = ordered_union([worst_stage_terms(p) for p in points])
    time_terms = ordered_union([p["time_terms_s"] for p in points])
    header = (["rank", "label", *PLAN_COLUMNS, *LAYOUT_COLUMNS, *HEADLINE_COLUMNS]
              + [f"mem_{term}_bytes" for term in memory_terms] + [f"time_{term}_s" for term in time_terms]
              + ["violations"])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for point in points:
        memory = worst_stage_terms(point)
        row = [point["rank"], point["label"],
               *(" ".join(v) if isinstance(v := point["plan"][name], list) else v for name in PLAN_COLUMNS),
               "|".join(map(str, point["plan"].get("layout", []))), point.get("pipeline_model_parallel_layout"),
               *(point[name] for name in HEADLINE_COLUMNS)]
        row += [memory.get(term, "") for term in memory_terms]
        row += [point["time_terms_s"].get(term, "") for term in time_terms]
        row.append(";".join(point["violations"]))
        writer.writerow(["" if value is None else value for value in row])
    return buffer.getvalue()
