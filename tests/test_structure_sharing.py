"""Evaluating structure-only cost functions once per structure (costmodels.structure) changes no number."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from costmodels.rules import Problem, active_rules
from autopar.search.space import Controls, build_space
from autopar.search import oracle
from costmodels import memory, steptime
from costmodels.plan import PlanArrays
from costmodels.specs import TrainingSpec
from costmodels.structure import link


@pytest.mark.parametrize("name,gpus", [("deepseek-v2-lite", 64), ("llama-3.1-8b", 32)])
def test_shared_structure_values_equal_direct_evaluation(name, gpus):
    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls())
    ctx = Problem(model, cluster, training)
    base = oracle.structures(space, ctx, active_rules())
    rng = np.random.default_rng(0)
    n = len(base["tp"])
    index = rng.integers(0, n, size=3000)
    columns = {k: v[index] for k, v in base.items()}
    columns.update(mbs=rng.choice([1, 2, 4], size=3000), sp=rng.integers(0, 2, size=3000).astype(bool),
                   recompute=rng.integers(0, 3, size=3000))
    plain = PlanArrays.from_columns(**columns)
    base_plans = PlanArrays.from_columns(**base)
    linked = link(plain, base_plans, index).take(np.arange(0, 3000, 2))
    plain = plain.take(np.arange(0, 3000, 2))
    with np.errstate(all="ignore"):
        for got, want in ((steptime.step_time_terms_s(model, cluster, training, linked),
                           steptime.step_time_terms_s(model, cluster, training, plain)),):
            for term in want:
                np.testing.assert_array_equal(got[term], want[term], err_msg=term)
        got = memory.peak_memory(model, cluster, training, linked)
        want = memory.peak_memory(model, cluster, training, plain)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert linked.structure.cache, "the structure-only functions were not shared"


def test_vectorised_stage_memory_equals_plan_by_plan():
    """costmodels.scoring.estimates evaluates rank r of every plan together: the same numbers as one plan at a
    time (stage_memory)."""
    from costmodels.scoring import stage_memories, stage_memory

    model = autopar.load_model("deepseek-v2-lite")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    front = autopar.solve(model, cluster, training)
    plans = PlanArrays.from_plans(p.plan for p in front.points)
    assert len({p.plan.pp for p in front.points}) > 1
    together = stage_memories(model, cluster, training, plans)
    for i in range(len(plans)):
        assert together[i] == stage_memory(model, cluster, training, plans.take([i]))
