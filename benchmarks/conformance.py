"""Conformance of the launch configs: every point of fourteen fronts, emitted for every framework and run through
that framework's own launch path up to where a GPU is needed (autopar/export/conformance.py says what runs for
each; NeMo in its own environment, .venv-nemo, as .ci/run builds it).

    pip install -e '.[conformance]'      # the frameworks, pinned (pyproject.toml)
    python benchmarks/conformance.py                 # all fourteen fronts, every point (the full run)
    python benchmarks/conformance.py --sample 3      # the first 3 points of each front (CI's bounded sample)
    python benchmarks/conformance.py --framework deepspeed

Prints one line per rejected or silently changed config, then per framework
`conformance: FW accepted=A/N refused_with_reason=R silently_changed=S` (target: A + R = N, S = 0) over the full
fronts, and `conformance --framework: FW accepted=A/N` over the fronts `autopar solve --framework FW` returns (the
fronts a user of FW sees; a refusal there is a model the framework cannot build, said with the reason) for the
frameworks with a capability table; exits 1 when a framework rejects a config or a config is silently changed, 0
otherwise. A framework whose package is not
installed is reported as `conformance: FW not installed (...)`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autopar.export import FRAMEWORKS  # noqa: E402
from autopar.export.capabilities import TARGET_VERSIONS  # noqa: E402
from autopar.export.conformance import NotInstalled, check_all  # noqa: E402
from autopar.export.fronts import FRONT_CASES, solve_case  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, metavar="K", help="only the first K points of each front")
    parser.add_argument("--framework", action="append", choices=FRAMEWORKS, help="only these frameworks")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    frameworks = args.framework or list(FRAMEWORKS)
    start = time.perf_counter()
    fronts = []
    for case in FRONT_CASES:
        points = solve_case(case).points
        fronts.append((case, points[: args.sample] if args.sample else points))
        print(f"front {case.name}: {case.model} on {case.num_gpus} GPUs, seq {case.seq_len}, gbs "
              f"{case.global_batch_size}: {len(fronts[-1][1])} points")
    failures = 0
    summaries = []
    for framework in frameworks:
        counts: Counter[str] = Counter()
        try:
            everything = [(case, point) for case, points in fronts for point in points]
            verdicts = check_all([point for _, point in everything], framework)
            for (case, _), verdict in zip(everything, verdicts):
                counts[verdict.outcome] += 1
                if verdict.outcome in ("rejected", "silently_changed"):
                    print(f"  {framework} {case.name} {verdict.plan}: {verdict.outcome}: {verdict.detail}")
        except NotInstalled as missing:
            summaries.append(f"conformance: {framework} not installed ({missing})")
            continue
        total = sum(counts.values())
        failures += counts["rejected"] + counts["silently_changed"]
        summaries.append(f"conformance: {framework} accepted={counts['accepted']}/{total} "
                         f"refused_with_reason={counts['refused_with_reason']} "
                         f"silently_changed={counts['silently_changed']} rejected={counts['rejected']}"
                         f"  [{TARGET_VERSIONS[framework]}]")
    from autopar.export.capabilities import CAPABILITIES

    for framework in frameworks:
        if not CAPABILITIES[framework] or any(line.startswith(f"conformance: {framework} not") for line in summaries):
            continue
        counts = Counter()
        searched = []
        for case in FRONT_CASES:
            try:
                points = solve_case(case, framework=framework).points
            except Exception as nothing:  # Infeasible: no plan this framework runs fits (said, not counted)
                print(f"  {framework} {case.name}: no front ({nothing})")
                continue
            searched += [(case, point) for point in (points[: args.sample] if args.sample else points)]
        for (case, _), verdict in zip(searched, check_all([point for _, point in searched], framework)):
            counts[verdict.outcome] += 1
            if verdict.outcome != "accepted":
                print(f"  {framework} --framework {case.name} {verdict.plan}: {verdict.outcome}: {verdict.detail}")
        failures += counts["rejected"] + counts["silently_changed"]
        summaries.append(f"conformance --framework: {framework} accepted={counts['accepted']}/{sum(counts.values())} "
                         f"refused_with_reason={counts['refused_with_reason']} "
                         f"silently_changed={counts['silently_changed']} rejected={counts['rejected']}")
    print(f"({time.perf_counter() - start:.0f} s on this machine, shared; fronts of {', '.join(c.name for c in FRONT_CASES)})")
    for line in summaries:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
