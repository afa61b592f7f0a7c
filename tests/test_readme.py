"""README promises: its Python example runs as written, and .ci/run runs exactly README's test command."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert blocks, "README has no Python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})  # noqa: S102 - our own README
    printed = capsys.readouterr().out
    assert "GiB" in printed and "tp" in printed


def test_ci_runs_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.DOTALL)
    assert len(commands) >= 2 and "pytest" in commands[1], "README's second command installs and runs the tests"
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == commands[1].strip()
