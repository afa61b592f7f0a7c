"""Fidelity of the cost model against published measurements (shared/reference/).

Runs the memory section (benchmarks/fidelity_memory.py) and the time section (benchmarks/fidelity_time.py); each
prints its table and ends with its one-line summary (`fidelity-memory: ...`, `fidelity-time: ...`).

    python benchmarks/fidelity.py
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import fidelity_memory, fidelity_time  # noqa: E402


def main() -> int:
    fidelity_memory.main()
    print()
    fidelity_time.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
