"""The oracle in several processes: the same front, counts and progress as in one; the fork helper's messages,
results and errors."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import autopar
from autopar.cli import main
from autopar.errors import Infeasible
from autopar.search import oracle, processes
from autopar.search.solve import solve
from autopar.search.space import Controls, build_space
from costmodels.errors import InputError
from costmodels.rules import Problem, active_rules
from costmodels.specs import TrainingSpec

needs_fork = pytest.mark.skipif(not processes.can_fork(), reason="forked workers run on Linux only")


@needs_fork
@pytest.mark.parametrize("name,gpus", [("deepseek-v2-lite", 64), ("mixtral-8x7b", 32)])
def test_processes_find_the_front_one_process_finds(name, gpus, monkeypatch):
    """Shared out among 3 workers in small batches (each worker's running front prunes only its own batches), the
    front is the one process's, plan for plan, and so are the counts; progress ends at the whole search."""
    model = autopar.load_model(name)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=gpus)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls(maximum={"vpp": 2, "mbs": 2, "cp": 2}))
    problem, rules = Problem(model, cluster, training), active_rules()
    monkeypatch.setattr(oracle, "CHUNK_PLANS", 3000)
    monkeypatch.setattr(oracle, "PROCESS_MIN_PLANS", 0)
    monkeypatch.setattr(processes, "available_cpus", lambda: 8)     # 3 workers on any machine
    alone = oracle.solve_oracle(space, problem, rules, jobs=1)
    fractions: list[float] = []
    workers: list[int] = []
    run_forked = processes.run_forked

    def counted(tasks, on_message):
        workers.append(len(tasks))
        return run_forked(tasks, on_message)

    monkeypatch.setattr(processes, "run_forked", counted)
    shared = oracle.solve_oracle(space, problem, rules, jobs=3, progress=fractions.append)
    assert workers == [3], "the search was not shared out among 3 workers"
    assert (shared.plans_seen, shared.valid_plans, shared.fitting_plans, shared.complete) == \
        (alone.plans_seen, alone.valid_plans, alone.fitting_plans, alone.complete)
    np.testing.assert_array_equal(shared.time_units, alone.time_units)
    np.testing.assert_array_equal(shared.memory_units, alone.memory_units)
    assert list(shared.plans) == list(alone.plans)
    assert len(fractions) > 2 and fractions[-1] == pytest.approx(1.0), "progress came only at the end"


def test_a_time_limited_search_stays_in_one_process(monkeypatch):
    """A time budget is checked between batches against the running front: the search keeps it in one process."""
    monkeypatch.setattr(oracle, "PROCESS_MIN_PLANS", 0)
    monkeypatch.setattr(processes, "run_forked", lambda *a, **k: pytest.fail("a time-limited search forked"))
    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    front = solve(model, cluster, training, time_limit_s=60.0, jobs=4)
    assert front.points


@pytest.mark.parametrize("jobs", [0, -2, 1.5, True, "2"])
def test_jobs_must_be_a_positive_whole_number(jobs):
    model = autopar.load_model("llama-3.1-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=8)
    with pytest.raises(InputError) as raised:
        solve(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=64), jobs=jobs)
    assert raised.value.field == "jobs"


def test_cli_refuses_zero_jobs(capsys):
    assert main(["solve", "llama-3.1-8b", "--gpus", "8", "--jobs", "0"]) == 2
    assert "jobs" in capsys.readouterr().err


def test_usable_processes():
    assert processes.usable_processes(1) == 1
    if processes.can_fork():
        assert 1 <= processes.usable_processes(None) <= processes.MAX_SEARCH_PROCESSES
        assert processes.usable_processes(5) == min(5, processes.available_cpus())
        assert processes.usable_processes(10**6) == processes.available_cpus()
    else:
        assert processes.usable_processes(5) == 1


@needs_fork
def test_run_forked_results_in_order_and_messages_on_the_way():
    def task(k):
        def run(send):
            send(("step", k))
            return k * k
        return run

    messages: list = []
    assert processes.run_forked([task(k) for k in range(4)], messages.append) == [0, 1, 4, 9]
    assert sorted(messages) == [("step", k) for k in range(4)]


@needs_fork
def test_run_forked_raises_what_a_child_raised():
    def bad(send):
        raise InputError("tp", "a child's error")

    with pytest.raises(InputError, match="a child's error"):
        processes.run_forked([lambda send: 1, bad])


@needs_fork
def test_run_forked_marks_a_killed_child_lost_and_keeps_the_others():
    def killed(send):
        os.kill(os.getpid(), signal.SIGKILL)

    def gone(send):
        os._exit(3)

    results = processes.run_forked([lambda send: 1, killed, gone])
    assert results[0] == 1
    assert isinstance(results[1], processes.Lost) and "exit code -9" in results[1].why
    assert isinstance(results[2], processes.Lost) and "exit code 3" in results[2].why


@needs_fork
def test_a_child_error_carries_its_traceback_as_the_cause():
    def bad(send):
        raise ValueError("deep inside")

    with pytest.raises(ValueError) as raised:
        processes.run_forked([bad])
    assert isinstance(raised.value.__cause__, processes.RemoteTraceback)
    assert "deep inside" in str(raised.value.__cause__) and "in bad" in str(raised.value.__cause__)


@needs_fork
def test_a_fork_that_fails_is_a_lost_worker(monkeypatch):
    """A fork the OS refuses (a process limit) leaves that task Lost; the others still run."""
    import multiprocessing.context

    started = []

    def refuse(self):
        if started:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(self)
        return real_start(self)

    real_start = multiprocessing.context.Process.start
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    results = processes.run_forked([lambda send: "ran", lambda send: "never"])
    assert results[0] == "ran" and isinstance(results[1], processes.Lost) and "could not start" in results[1].why


@needs_fork
def test_a_lost_worker_share_is_searched_here(monkeypatch):
    """Workers that never come back (every fork refused) leave their shares to this process: the same front."""
    model = autopar.load_model("deepseek-v2-lite")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    space = build_space(model, cluster, training, Controls(maximum={"vpp": 2, "mbs": 2, "cp": 2}))
    problem, rules = Problem(model, cluster, training), active_rules()
    monkeypatch.setattr(oracle, "CHUNK_PLANS", 3000)
    monkeypatch.setattr(oracle, "PROCESS_MIN_PLANS", 0)
    alone = oracle.solve_oracle(space, problem, rules, jobs=1)
    monkeypatch.setattr(processes, "run_forked", lambda tasks, on_message: [processes.Lost("refused")] * len(tasks))
    fractions: list[float] = []
    rescued = oracle.solve_oracle(space, problem, rules, jobs=2, progress=fractions.append)
    assert (rescued.plans_seen, rescued.valid_plans, rescued.fitting_plans) == \
        (alone.plans_seen, alone.valid_plans, alone.fitting_plans)
    assert list(rescued.plans) == list(alone.plans)
    assert fractions[-1] == pytest.approx(1.0)


def test_an_infeasible_search_explains_itself_in_the_processes_asked_for(monkeypatch):
    """jobs=1 holds for the searches that explain why nothing fits, too."""
    monkeypatch.setattr(oracle, "PROCESS_MIN_PLANS", 0)
    monkeypatch.setattr(processes, "run_forked", lambda *a, **k: pytest.fail("jobs=1 forked"))
    model = autopar.load_model("llama-3.1-70b")
    cluster = autopar.make_cluster(gpu="a100", num_gpus=8)
    with pytest.raises(Infeasible):
        solve(model, cluster, TrainingSpec(seq_len=8192, global_batch_size=64), jobs=1)


def test_explain_takes_jobs(capsys):
    assert main(["explain", "llama-3.1-8b", "--gpus", "8", "--jobs", "0"]) == 2
    assert "jobs" in capsys.readouterr().err


def test_the_error_channels_round_trip_through_pickle():
    """A worker hands its error back pickled: both channels keep their fields, a subclass with its own
    constructor (autopar.export.capabilities.Unsupported) comes back whole."""
    import pickle

    from autopar.export.capabilities import Unsupported
    from costmodels.plan import Plan

    error = pickle.loads(pickle.dumps(InputError("tp", "must divide the heads")))
    assert (type(error), error.field, error.message, str(error)) == \
        (InputError, "tp", "must divide the heads", "tp: must divide the heads")
    infeasible = pickle.loads(pickle.dumps(Infeasible("nothing fits", ("memory",), ("raise --gpus",))))
    assert (infeasible.message, infeasible.rules, infeasible.details) == \
        ("nothing fits", ("memory",), ("raise --gpus",))
    refused = pickle.loads(pickle.dumps(Unsupported("megatron", Plan(tp=2), ("no reason at all",))))
    assert (type(refused), refused.field, refused.reasons, refused.plan) == \
        (Unsupported, "emit", ("no reason at all",), Plan(tp=2))
