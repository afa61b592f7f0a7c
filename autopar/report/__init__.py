"""Reports of a Pareto front: JSON (versioned schema), CSV, Markdown and a self-contained HTML page.

    from autopar.report import write_report
    write_report(front, "front.html")          # the format follows the extension: .json .csv .md .html
    write_reports(front, ["a.json", "a.html"])  # several --out files

All formats render the same document (`autopar.report.document.report_document`); units for people come from
`autopar.report.units` (format_bytes, format_seconds, ...), also used by the terminal tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from costmodels.errors import InputError

if TYPE_CHECKING:
    from autopar.results import Estimate, ParetoFront

FORMATS: dict[str, str] = {".json": "json", ".csv": "csv", ".md": "markdown", ".markdown": "markdown",
                           ".html": "html", ".htm": "html"}


def report_format(path: "str | Path") -> str:
    """'json' | 'csv' | 'markdown' | 'html' from the file extension, or InputError naming --out."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError("out", f"cannot tell the report format of {str(path)!r} from its extension; use .json, "
                                ".csv, .md or .html")
    return FORMATS[suffix]


def render(front: "ParetoFront | Estimate", fmt: str) -> str:
    """The report of `front` (or of one estimate, as a one-point front) in format `fmt`."""
    from autopar.report.document import front_of_one, report_document
    from costmodels.scoring import Estimate

    if isinstance(front, Estimate):
        front = front_of_one(front)
    document = report_document(front)
    if fmt == "json":
        import json

        return json.dumps(document, indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        from autopar.report.csv_report import render_csv

        return render_csv(document)
    if fmt == "markdown":
        from autopar.report.markdown import render_markdown

        return render_markdown(document)
    if fmt == "html":
        from autopar.report.html import render_html

        return render_html(document)
    raise InputError("out", f"unknown report format {fmt!r}; use json, csv, markdown or html")


def write_report(front: "ParetoFront | Estimate", path: "str | Path") -> Path:
    """Write the report in the format of `path`'s extension; returns the path written."""
    from autopar.atomic_write import check_writable, write_text_atomically

    target = Path(path)
    text = render(front, report_format(target))
    check_writable(target)
    return write_text_atomically(target, text)


def write_reports(front: "ParetoFront | Estimate", paths: Iterable["str | Path"]) -> list[Path]:
    """Every `--out` path; all formats are checked before anything is written."""
    paths = list(paths)
    for path in paths:
        report_format(path)
    return [write_report(front, path) for path in paths]
