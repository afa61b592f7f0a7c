"""costmodels.steptime prices each distinct candidate rank once (first_equal_stage, per_distinct_stage): with pp = 1
the four candidate stages are all rank 0, with pp = 2 the second-to-last is the first. Reusing the first equal
rank's pieces must change no value: a plan priced alone (where its ranks coincide and are priced once) and the same
plan priced in a batch with plans of other pipeline depths (where the rank arrays differ and every candidate is
priced) get exactly the same terms."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.models import load_model
from costmodels import steptime
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import ClusterSpec, Precision, TrainingSpec


def test_first_equal_stage_names_the_first_rank_array_equal_to_each():
    def ranks(*pps):
        return steptime.candidate_stages(PlanArrays.from_plans([Plan(pp=pp) for pp in pps]))

    assert steptime.first_equal_stage(ranks(1, 1)) == [0, 0, 0, 0]
    assert steptime.first_equal_stage(ranks(2)) == [0, 1, 0, 1]
    assert steptime.first_equal_stage(ranks(3)) == [0, 1, 1, 3]
    assert steptime.first_equal_stage(ranks(8)) == [0, 1, 2, 3]
    assert steptime.first_equal_stage(ranks(1, 2)) == [0, 1, 0, 1]    # arrays [0 0], [0 1], [0 0], [0 1]
    assert steptime.first_equal_stage(ranks(1, 4)) == [0, 1, 2, 3]


def test_per_distinct_stage_prices_each_distinct_rank_once():
    priced = []
    stages = steptime.candidate_stages(PlanArrays.from_plans([Plan(pp=2), Plan(pp=2)]))
    out = steptime.per_distinct_stage(stages, lambda s: priced.append(s) or len(priced))
    assert out == [1, 2, 1, 2] and len(priced) == 2


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8])
def test_a_plan_alone_and_in_a_batch_of_other_depths_gets_the_same_terms(precision):
    model = load_model("llama-3.1-8b")
    cluster = ClusterSpec(load_profile("h100"), 16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision=precision)
    plans = [Plan(tp=2, pp=1, mbs=1, sp=True, zero=1), Plan(tp=2, pp=2, mbs=2, sp=True, zero=1),
             Plan(tp=1, pp=4, vpp=2, mbs=1, recompute=Recompute.SELECTIVE), Plan(tp=4, pp=1, mbs=2, sp=True, zero=3),
             Plan(tp=1, pp=8, mbs=1, zero=1, recompute=Recompute.FULL)]
    batch = steptime.step_time_terms_s(model, cluster, training, PlanArrays.from_plans(plans))
    for k, plan in enumerate(plans):
        alone = steptime.step_time_terms_s(model, cluster, training, PlanArrays.from_plans([plan]))
        assert {name: float(value[0]) for name, value in alone.items()} == \
            {name: float(np.asarray(value)[k]) for name, value in batch.items()}, plan.short()
