"""Shared pytest configuration: hypothesis profiles and the --slow switch.

CI runs property tests with a bounded number of examples (profile 'ci'); `pytest --slow` runs the slow tests with
their full example counts (profile 'slow').
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("slow", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False, help="run slow tests with full example counts")


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("slow" if config.getoption("--slow") else "ci")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network


@pytest.fixture
def microbench_tables():
    """benchmarks.microbench_tables, or a skip where shared/reference/microbench is not next to the repository."""
    from benchmarks import microbench_tables
    try:
        microbench_tables.microbench_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference/microbench not next to the repository")
    return microbench_tables
