"""DTensor's dispatch under eager tensor parallelism (costmodels.engines.dtensor_dispatches): the counts against the
operators torch's own tensor-parallel API runs on DTensors, and where the engines price it."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels import engines
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ClusterSpec, Engine, LaunchPath, ModelSpec, TrainingSpec

LLAMA = ModelSpec(name="llama-like", hidden_size=2048, num_layers=4, num_attention_heads=16, num_kv_heads=8,
                  ffn_hidden_size=8192, vocab_size=32000)


def test_the_counts_are_what_torch_runs_on_dtensors():
    """A torchtitan-style tensor-parallel block (SequenceParallel norms, Colwise/Rowwise linears) on a one-rank gloo
    mesh, counted under a TorchDispatchMode (benchmarks/dtensor_dispatch.py): the formula gives the same numbers
    for a gated and a plain MLP."""
    pytest.importorskip("torch", reason="torch is not installed (the CPU build: pip install torch==2.13.0)")
    from benchmarks import dtensor_dispatch

    for gated in (True, False):
        assert dtensor_dispatch.count_dispatches(gated) == \
            engines.dtensor_dispatches(*dtensor_dispatch.BLOCK_SHAPE[gated]), gated


def test_by_hand():
    """Llama: 7 linears, 2 norms: forward 7·4 + 2; backward 7·8 + 2 + 9 parameters + 3 gradient sums."""
    assert engines.dtensor_dispatches(7.0, 2.0, 2.0, 3.0, False) == (30.0, 70.0)
    assert engines.layer_dtensor_dispatches(LLAMA, separate_qkv=True) == (30.0, 70.0)


def _dense(engine, launch=LaunchPath.EAGER, tp=2):
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=engine, launch=launch)
    plans = PlanArrays.from_plans([Plan(tp=1), Plan(tp=tp, sp=True)])
    return engines.layer_launches(LLAMA, training, plans)


@pytest.mark.parametrize("engine", [Engine.TORCHTITAN, Engine.PYTORCH])
def test_eager_tensor_parallelism_pays_the_dispatch_and_compiled_does_not(engine):
    eager = _dense(engine)
    assert eager.dense_fwd.dtensor[0] == 0 and eager.dense_fwd.dtensor[1] == 30.0
    assert eager.dense_bwd.dtensor[1] == 70.0
    compiled = _dense(engine, LaunchPath.COMPILE)
    assert np.all(np.asarray(compiled.dense_fwd.dtensor) == 0)
    costs = load_profile("a100-80gb").host_costs
    assert eager.dense_fwd.host_s(costs)[1] - eager.dense_fwd.host_s(costs)[0] > \
        30.0 * engines.DTENSOR_DISPATCH_TO_ATEN_OP * costs.aten_op_s


def test_deepspeed_autotp_is_not_dtensor():
    assert np.all(np.asarray(_dense(Engine.DEEPSPEED).dense_fwd.dtensor) == 0)


def test_a_small_model_at_tp_8_is_host_bound_in_a_plain_pytorch_loop(monkeypatch):
    """The mechanism of issue 42's small models at tp 8: the GEMMs shrink eightfold, the launches per layer do not,
    and every operator on a DTensor pays its dispatch; without that dispatch the host term is smaller."""
    from costmodels import steptime

    cluster = ClusterSpec(profile=load_profile("a100-80gb"), num_gpus=8)
    plans = PlanArrays.from_plans([Plan(tp=8, sp=True, mbs=1)])

    def host_and_compute() -> tuple[float, float]:
        training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.PYTORCH)
        terms = steptime.step_time_terms_s(LLAMA, cluster, training, plans)
        return float(terms["host"][0]), float(terms["compute"][0])

    host, compute = host_and_compute()
    assert host > compute
    monkeypatch.setattr(engines, "DTENSOR_DISPATCH_TO_ATEN_OP", 0.0)
    assert host_and_compute()[0] < host
