"""Where the published measurements live: shared/reference beside (or inside) the repository checkout."""

from __future__ import annotations

from pathlib import Path


def reference_dir() -> Path:
    """shared/reference inside the checkout or beside it (CI clones main next to a copy of shared/)."""
    root = Path(__file__).resolve().parent.parent
    for candidate in (root / "shared" / "reference", root.parent / "shared" / "reference"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("shared/reference not found next to the repository")
