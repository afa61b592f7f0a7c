"""The decomposed-CP-SAT experiment (benchmarks/cpsat_decomposed.py) compares like with like: the points its CP-SAT
walk finds are the numpy front's, in order. A short walk limit keeps this a few seconds; the benchmark runs it whole."""

from __future__ import annotations

import pytest

from benchmarks import cpsat_decomposed


@pytest.fixture(scope="module")
def instance():
    return cpsat_decomposed.build_instance("S1")


def test_factor_tables_are_small(instance):
    # the premise of the experiment: no table comes near the 1.29M-plan space
    assert instance.space.size > 1_000_000
    assert max(table.rows for table in instance.tables.values()) <= 2_000


def test_cpsat_points_are_the_numpy_front_in_order(instance):
    numpy = cpsat_decomposed.numpy_front(instance)
    assert len(numpy.front) > 3
    walk = cpsat_decomposed.walk_front(instance, cpsat_decomposed.DEFAULT_SETTING, solve_limit_s=30.0,
                                       walk_limit_s=2.0)
    assert walk.front, "the walk found no point"
    assert walk.front == numpy.front[:len(walk.front)]
