"""Reports: JSON validates against the shipped schema, CSV/Markdown/HTML carry every point, units read well."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import jsonschema
import pytest

from autopar.report import render, report_format, write_report, write_reports
from autopar.report.document import SCHEMA_VERSION, load_schema, report_document
from autopar.report.html import MARKER_CLASS, nice_ticks, script_json
from autopar.report.units import (format_bytes, format_count, format_gib, format_gib_cell, format_percent,
                                  format_rate, format_seconds)
from costmodels.errors import InputError
from costmodels.plan import Plan
from costmodels.specs import TrainingSpec
from test_report_support import (DENSE_PLANS, MOE_PLANS, cluster, dense_model, moe_model, synthetic_estimate,
                                 synthetic_front)


@pytest.fixture(scope="module")
def schema():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.mark.parametrize("front_kind", ["dense", "moe", "time_limit"])
def test_json_report_validates_against_the_shipped_schema(schema, front_kind, tmp_path):
    front = {"dense": lambda: synthetic_front(dense_model(), DENSE_PLANS),
             "moe": lambda: synthetic_front(moe_model(), MOE_PLANS),
             "time_limit": lambda: synthetic_front(dense_model(), DENSE_PLANS[:2], proven_optimal=False)}[front_kind]()
    path = write_report(front, tmp_path / "front.json")
    document = json.loads(path.read_text())
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
    assert document["schema_version"] == SCHEMA_VERSION
    assert document["solver"]["status"] == ("optimal" if front.proven_optimal else "time_limit")
    assert len(document["points"]) == len(front)
    for rank, (point, estimate) in enumerate(zip(document["points"], front)):
        assert point["rank"] == rank
        assert point["label"] == estimate.plan.short()
        assert len(point["stages"]) == estimate.plan.pp
        assert math.isclose(point["step_time_s"], sum(point["time_terms_s"].values()))
        for stage in point["stages"]:
            assert math.isclose(stage["total_bytes"], sum(stage["terms_bytes"].values()))
    assert document["hardware"]["provenance"], "the profile's provenance is carried"
    assert document["rules"] == list(front.rules)


def test_schema_rejects_a_broken_report(schema):
    document = report_document(synthetic_front(dense_model(), DENSE_PLANS[:2]))
    broken = json.loads(json.dumps(document))
    del broken["points"][0]["plan"]["tp"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)
    broken = json.loads(json.dumps(document))
    broken["points"][1]["plan"]["recompute"] = "sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_non_finite_numbers_become_null_and_still_validate(schema):
    front = synthetic_front(dense_model(), DENSE_PLANS[:1])
    estimate = front[0]
    terms = dict(estimate.time_terms_s, pp_bubble=float("inf"))
    from dataclasses import replace

    front = replace(front, points=(replace(estimate, time_terms_s=terms, mfu=float("nan")),))
    document = json.loads(render(front, "json"))
    assert document["points"][0]["mfu"] is None
    assert document["points"][0]["time_terms_s"]["pp_bubble"] is None
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)


def test_an_estimate_renders_as_a_one_point_report(schema):
    estimate = synthetic_estimate(dense_model(), cluster(8), TrainingSpec(), Plan(tp=8, sp=True))
    document = json.loads(render(estimate, "json"))
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
    assert document["solver"]["status"] == "not_searched"
    assert len(document["points"]) == 1


def test_csv_has_one_flat_row_per_point():
    front = synthetic_front(dense_model(), DENSE_PLANS)
    rows = list(csv.DictReader(io.StringIO(render(front, "csv"))))
    assert len(rows) == len(front)
    for row, estimate in zip(rows, front):
        assert row["label"] == estimate.plan.short()
        assert int(row["tp"]) == estimate.plan.tp and int(row["pp"]) == estimate.plan.pp
        assert row["recompute"] == estimate.plan.recompute.label
        assert math.isclose(float(row["step_time_s"]), estimate.step_time_s)
        worst = estimate.stages[estimate.worst_stage]
        assert math.isclose(float(row["mem_weights_bytes"]), worst.terms_bytes["weights"])
        assert math.isclose(float(row["time_compute_s"]), estimate.time_terms_s["compute"])


def test_markdown_has_a_table_row_per_point_and_escapes_the_model_name():
    front = synthetic_front(dense_model("my|model <b>x</b>"), DENSE_PLANS)
    text = render(front, "markdown")
    assert text.startswith("# autopar: my\\|model \\<b\\>x\\</b\\> on 64x")
    front_table = text.split("## Front")[1].split("##")[0]
    assert sum(1 for line in front_table.splitlines() if line.startswith("| ") and "`tp" in line) == len(front)
    assert "<b>" not in text


def test_write_report_picks_the_format_from_the_extension(tmp_path):
    front = synthetic_front(dense_model(), DENSE_PLANS[:3])
    paths = write_reports(front, [tmp_path / "a.json", tmp_path / "a.csv", tmp_path / "a.md", tmp_path / "a.html"])
    assert [p.suffix for p in paths] == [".json", ".csv", ".md", ".html"]
    assert json.loads(paths[0].read_text())["points"]
    assert paths[1].read_text().startswith("rank,label,tp,")
    assert paths[2].read_text().startswith("# autopar:")
    assert paths[3].read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(InputError, match="out: .*use .json, .csv, .md or .html"):
        report_format("front.pdf")
    with pytest.raises(InputError, match="does not exist"):
        write_report(front, tmp_path / "missing" / "a.json")
    # nothing is written when one of several paths has an unknown extension
    with pytest.raises(InputError):
        write_reports(front, [tmp_path / "b.json", tmp_path / "b.txt"])
    assert not (tmp_path / "b.json").exists()


def test_reports_are_deterministic():
    front = synthetic_front(moe_model(), MOE_PLANS)
    for fmt in ("json", "csv", "markdown", "html"):
        assert render(front, fmt) == render(front, fmt)


def test_html_has_one_marker_per_point_and_is_self_contained():
    front = synthetic_front(dense_model(), DENSE_PLANS)
    page = render(front, "html")
    assert page.count(f'class="{MARKER_CLASS}"') == len(front)
    # offline: no external resources of any kind
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    assert page.count("<script") == 2  # the JSON data block and the one inline script


def test_user_text_is_escaped_in_html():
    name = '</script><script>document.title="pwned"</script><img src=x onerror=alert(1)><!--'
    front = synthetic_front(dense_model(name), DENSE_PLANS[:2])
    page = render(front, "html")
    assert page.count("<script") == 2
    assert "<img" not in page
    assert "&lt;/script&gt;&lt;script&gt;" in page  # shown as text in the headings and tables
    data = page.split('<script type="application/json" id="autopar-data">')[1].split("</script>")[0]
    assert "<" not in data and ">" not in data and "<!--" not in data
    assert json.loads(data)["inputs"]["model"]["name"] == name


def test_script_json_escapes_every_dangerous_sequence():
    text = script_json({"a": "</script><!-- & \u2028 \u2029"})
    assert "</" not in text and "<!--" not in text and "&" not in text
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"a": "</script><!-- & \u2028 \u2029"}


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 84) == [0, 20, 40, 60, 80, 100]
    ticks = nice_ticks(1.37, 1.92)
    assert ticks[0] <= 1.37 and ticks[-1] >= 1.92
    # raw step (1.92 - 1.37) / 5 = 0.11; the next round step is 0.2
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert steps == {0.2}


def test_units_are_chosen_per_value():
    gib = 1024**3
    assert format_bytes(80 * gib) == "80.0 GiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3.5 * 1024**2) == "3.50 MiB"
    assert format_bytes(2.25 * 1024**4) == "2.25 TiB"
    assert format_gib(40 * gib) == "40.0 GiB"
    assert format_seconds(0.0123) == "0.0123 s"       # one unit, seconds, whatever the size (issue 45)
    assert format_seconds(3.5) == "3.50 s"
    assert format_seconds(95) == "95.0 s"
    assert format_seconds(600) == "600 s"
    assert format_seconds(4e-6) == "0.00000400 s"
    assert format_seconds(0) == "0 s"
    assert format_seconds(float("inf")) == "∞"
    assert format_rate(1.25e6) == "1,250,000 tokens/s"
    assert format_rate(950) == "950 tokens/s"
    assert format_percent(0.4234) == "42.3%"
    assert format_count(70.6e9) == "70.6B"
    assert format_bytes(float("nan")) == "n/a"


def test_gib_cells_keep_one_unit_and_small_values_visible():
    gib = 1024**3
    assert format_gib_cell(60.29 * gib) == "60.29"
    assert format_gib_cell(0.25 * gib) == "0.25"
    assert format_gib_cell(0) == "-"                     # zero is always '-', never '0' or '0.00'
    assert format_gib_cell(256 * 1024) == "0.00024"      # 256 KiB = 2.44e-4 GiB: two significant digits, not 0.00
    assert format_gib_cell(32 * 1024**2) == "0.03"       # 32 MiB = 0.03125 GiB
    assert format_gib_cell(-3 * gib) == "-3.00"
    assert format_gib_cell(float("inf")) == "∞"


def test_the_assumptions_have_a_sentence_for_every_kernel_choice():
    """The report's assumptions name the dispatcher, the expert GEMMs and the loss of every choice TrainingSpec takes
    (a MoE front under DeepSpeed, whose experts run as a loop, once failed here with a KeyError)."""
    from autopar.report.document import DISPATCHER_TEXT, EXPERT_GEMM_TEXT, LOSS_TEXT
    from costmodels.specs import CrossEntropyKernel, ExpertGemm, MoEDispatcher

    assert set(EXPERT_GEMM_TEXT) == {member.value for member in ExpertGemm}
    assert set(DISPATCHER_TEXT) == {member.value for member in MoEDispatcher}
    assert set(LOSS_TEXT) == {member.value for member in CrossEntropyKernel}
