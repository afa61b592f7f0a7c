"""`autopar calibrate --from-runs`: the parameter table, the fit, what it says about itself, the file it writes, the
run format and the CLI's errors.

The fits here run on runs whose "measured" step times the cost model itself produced on a profile with known
scales (a hardware the test knows): the fit must find those scales back, and must say when the runs cannot tell two
of them apart. Fits to published runs are benchmarks/fit_runs.py's job.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from costmodels.host import HOST_FIELDS
from autopar.calibrate.from_runs import (FREE_PARAMETERS, RUN_SIGMA, _leave_one_out, _Pricer, apply_to_profile,
                                         fit_profile_to_runs, resolved_paths, same_inputs_groups, same_run_groups,
                                         scaled_values)
from autopar.calibrate.runs_profile import bundled_profile_data, fitted_profile_text, read_runs_section
from autopar.runs import MeasuredRun, cluster_for, read_run_file, step_time_of_plan
from costmodels.errors import InputError
from costmodels.hardware import load_profile, parse_profile
from costmodels.plan import Plan, Recompute
from costmodels.specs import TrainingSpec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100"), bundled_profile_data("h100-80gb")


def truth(base, data, scales: dict[str, float]):
    return apply_to_profile(base, data, scaled_values(data, scales))


def synthetic_runs(base, data, layouts, scales, model_name="gpt-1.7b"):
    """Runs of `model_name` on `layouts` ((gpus, tp, pp, mbs, seq, gbs, recompute)) whose measured step times are
    the model's own on the profile with `scales`."""
    from autopar.models import load_model

    model = load_model(model_name)
    hardware = truth(base, data, scales)
    runs = []
    for index, (gpus, tp, pp, mbs, seq, gbs, recompute) in enumerate(layouts):
        training = TrainingSpec(seq_len=seq, global_batch_size=gbs)
        fixed = dict(tp=tp, pp=pp, mbs=mbs, sp=tp > 1, zero=1, recompute=recompute)
        run = MeasuredRun("synthetic", f"run {index}", f"tp{tp} pp{pp}", model, cluster_for(base, gpus), training,
                          fixed)
        step = step_time_of_plan(run, Plan(**fixed), dataclasses.replace(run.cluster, profile=hardware))
        runs.append(dataclasses.replace(run, measured_step_s=step))
    return runs


VARIED = [(8, 1, 1, 1, 2048, 64, Recompute.NONE), (8, 2, 1, 2, 2048, 64, Recompute.NONE),
          (8, 4, 1, 1, 4096, 32, Recompute.SELECTIVE), (8, 8, 1, 4, 1024, 64, Recompute.NONE),
          (8, 2, 2, 1, 8192, 16, Recompute.FULL), (16, 4, 1, 2, 2048, 128, Recompute.NONE),
          (8, 1, 2, 2, 4096, 64, Recompute.NONE), (8, 4, 2, 1, 2048, 128, Recompute.SELECTIVE)]
"""Runs that differ in tp, pp, micro-batch, sequence and recompute: GEMM shapes, attention share, communication
and elementwise traffic vary from run to run."""


# ---- the table ---------------------------------------------------------------------------------------------------

def test_every_table_entry_names_values_of_the_bundled_profiles_or_is_reported_missing(h100):
    base, data = h100
    for parameter in FREE_PARAMETERS:
        paths = resolved_paths(data, parameter)
        assert paths, parameter.name
        if parameter.name == "host_kernel_cost":     # every launch path of the host: section, one scale
            assert len(paths) == len(HOST_FIELDS), paths
        for path in paths:
            assert any(path.startswith(p.split("*")[0].split(".")[0]) for p in parameter.paths)


def test_the_fast_profile_builder_agrees_with_parsing_the_changed_file(h100):
    """apply_to_profile (dataclasses) must give what the parser gives for the YAML the fit writes."""
    base, data = h100
    scales = {parameter.name: 0.8 + 0.05 * i for i, parameter in enumerate(FREE_PARAMETERS)}
    changes = scaled_values(data, scales)
    fast = apply_to_profile(base, data, changes)
    written = yaml.safe_load(yaml.safe_dump(data))
    from autopar.calibrate.from_runs import _set

    for path, (_, after) in changes.items():
        _set(written, path, after)
    parsed = parse_profile(yaml.safe_dump(written), "test")
    assert fast.gemm_efficiency == pytest.approx(parsed.gemm_efficiency)
    for link in parsed.links:
        assert fast.links[link].bandwidth_bytes_per_s == pytest.approx(parsed.links[link].bandwidth_bytes_per_s)
    for link, kinds in parsed.collectives.items():
        for kind, points in kinds.items():
            assert [p.bus_bandwidth_bytes_per_s for p in fast.collectives[link][kind]] == \
                pytest.approx([p.bus_bandwidth_bytes_per_s for p in points])
    assert fast.extra["elementwise"] == parsed.extra["elementwise"]
    # a fraction stays a fraction: the nvlink efficiency (0.896) scaled by 1.2 is capped at 1
    capped = scaled_values(data, {"nvlink_collective_efficiency": 1.2})
    assert capped["links.nvlink.bandwidth_efficiency"][1] == 1.0


def test_exercised_shortcut_skips_only_zero_derivatives(h100):
    """A parameter a run does not exercise must not change its step time at all (the shortcut is exact)."""
    base, data = h100
    runs = synthetic_runs(base, data, VARIED[:4], {})
    for run in runs:
        plan = Plan(**run.fixed)
        reference = step_time_of_plan(run, plan, run.cluster)
        for parameter in FREE_PARAMETERS:
            if parameter.exercised(run) or not resolved_paths(data, parameter):
                continue
            moved = truth(base, data, {parameter.name: 0.5})
            assert step_time_of_plan(run, plan, dataclasses.replace(run.cluster, profile=moved)) == reference, \
                parameter.name


# ---- the fit -----------------------------------------------------------------------------------------------------

def test_fit_finds_known_scales_back(h100):
    base, data = h100
    known = {"gemm_efficiency": 0.85, "elementwise_traffic": 1.3}
    runs = synthetic_runs(base, data, VARIED, known)
    fit = fit_profile_to_runs(runs, base, data)
    found = {q.parameter.name: q.scale for q in fit.parameters}
    # within the prior's pull and the linearisation: these runs also inform the host's per-launch cost (tp 8 at
    # micro-batch 16-128 on a 1.7B model), whose host share trades off a little against the GEMM plateau
    assert found["gemm_efficiency"] == pytest.approx(0.85, rel=0.05)
    assert found["host_kernel_cost"] == pytest.approx(1.0, rel=0.05)
    assert found["elementwise_traffic"] == pytest.approx(1.3, rel=0.10)
    assert found["fp8_gemm_efficiency"] == 1.0 and found["grouped_gemm_efficiency"] == 1.0   # no fp8, no experts
    assert fit.mape("prior_s") > 0.05 > 0.01 > fit.mape("fitted_s")
    assert fit.mape("leave_one_out_s") < 0.02
    assert fit.adopted
    assert "compute.gemm_efficiency.fp8_peak_fraction" not in fit.changes
    assert fit.changes["compute.gemm_efficiency.peak_fraction"][0] == base.gemm_efficiency["peak_fraction"]
    assert not [s for s in fit.skipped if s.startswith("host_kernel_cost")]      # the profiles' host: section


def test_a_fit_that_does_not_predict_left_out_runs_better_than_bundled_is_not_adopted(h100):
    """Runs scattered ±12% around the bundled profile's own prediction, in no pattern a scale could follow: a fit
    can lower its residuals on them, but leaving each run out it predicts that run worse than the bundled profile
    does, so the validation rule keeps the bundled profile, says so, and changes no value."""
    base, data = h100
    runs = synthetic_runs(base, data, VARIED, {})
    scatter = (1.12, 0.88, 0.88, 1.12, 1.12, 0.88, 1.12, 0.88)
    runs = [dataclasses.replace(run, measured_step_s=run.measured_step_s * f) for run, f in zip(runs, scatter)]
    fit = fit_profile_to_runs(runs, base, data)
    loo, bundled = fit.leave_one_out_check
    assert not fit.adopted and loo >= bundled > 0.1
    assert fit.profile is base and fit.changes == {}
    assert all(q.scale == 1.0 for q in fit.parameters)
    assert any(q.status.startswith("kept (the fit did not predict") for q in fit.parameters)
    assert fit.warnings[0].startswith("the fit is not adopted")
    assert [r.fitted_s for r in fit.residuals] == [r.prior_s for r in fit.residuals]


def test_a_fit_that_predicts_left_out_runs_better_is_adopted(h100):
    base, data = h100
    fit = fit_profile_to_runs(synthetic_runs(base, data, VARIED, {"gemm_efficiency": 0.85}), base, data)
    loo, bundled = fit.leave_one_out_check
    assert fit.adopted and loo < bundled and fit.changes


def test_leave_one_out_leaves_re_measurements_of_a_run_out_together():
    """The grouped PRESS formula against refitting the linearised ridge problem without each group."""
    rng = np.random.default_rng(7)
    n, p = 9, 3
    jacobian = rng.normal(size=(n, p))
    measured = np.exp(rng.normal(size=n) * 0.1)
    log_t = np.log(measured) + rng.normal(size=n) * 0.05
    sigmas = np.array([0.1, 0.2, 0.3])
    groups = [[0], [1, 2], [3], [4, 5, 6], [7], [8]]
    a = jacobian / RUN_SIGMA
    prior = np.diag(1 / sigmas ** 2)
    residual = log_t - np.log(measured)                             # at the prior; the model is log_t + J·θ
    theta = -np.linalg.solve(a.T @ a + prior, a.T @ residual / RUN_SIGMA)       # the fit to every run
    fitted_log_t = log_t + jacobian @ theta
    left_out = _leave_one_out(theta, fitted_log_t, jacobian, measured, sigmas, np.ones(p, dtype=bool), groups)
    for group in groups:
        rest = [i for i in range(n) if i not in group]
        theta_without = -np.linalg.solve(a[rest].T @ a[rest] + prior, a[rest].T @ residual[rest] / RUN_SIGMA)
        expected = residual[group] + jacobian[group] @ theta_without
        assert np.log(left_out[group] / measured[group]) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    alone = _leave_one_out(theta, fitted_log_t, jacobian, measured, sigmas, np.ones(p, dtype=bool),
                           [[i] for i in range(n)])
    assert not np.allclose(alone[[4, 5, 6]], left_out[[4, 5, 6]])   # a re-measurement left in predicts its twin


def test_runs_of_one_shape_are_priced_in_one_call_with_the_same_values(h100):
    """Runs with the same model, cluster and training but other layouts share one vectorised model call per
    profile, and each gets exactly the value it gets alone; runs with the same layout too are one run to the
    model (same_run_groups)."""
    base, data = h100
    layouts = [(8, 1, 1, 1, 2048, 64, Recompute.NONE), (8, 2, 1, 2, 2048, 64, Recompute.NONE),
               (8, 4, 2, 1, 2048, 64, Recompute.SELECTIVE), (8, 2, 1, 2, 2048, 64, Recompute.NONE),
               (16, 2, 1, 2, 2048, 64, Recompute.NONE)]
    runs = synthetic_runs(base, data, layouts, {})
    plans = [Plan(**run.fixed) for run in runs]
    assert same_inputs_groups(runs) == [0, 0, 0, 0, 4]
    assert same_run_groups(runs, plans) == [[0], [1, 3], [2], [4]]
    pricer = _Pricer(runs, plans, jobs=1)
    other = truth(base, data, {"gemm_efficiency": 0.9})
    values = pricer.step_times([(i, profile) for profile in (base, other) for i in range(len(runs))])
    assert pricer.evaluations == 10 and pricer.calls == 4
    alone = [step_time_of_plan(run, plan, dataclasses.replace(run.cluster, profile=profile))
             for profile in (base, other) for run, plan in zip(runs, plans)]
    assert list(values) == alone


def test_runs_at_one_tp_cannot_separate_gemm_from_tp_communication(h100):
    """Every run at tp=8 on one node, differing only in the number of micro-batches: GEMM time and TP collectives
    keep one ratio, so their scales trade off and the fit must say so (from the estimates' correlation). (A model
    large enough for its GEMMs to count: gpt-1.7b at tp=8 runs at the host's launch floor, where no GEMM scale
    shows.)"""
    base, data = h100
    same_tp = [(8, 8, 1, 2, 4096, gbs, Recompute.NONE) for gbs in (4, 8, 16, 32, 64)]
    runs = synthetic_runs(base, data, same_tp, {"gemm_efficiency": 0.9}, model_name="llama-3.1-8b")
    fit = fit_profile_to_runs(runs, base, data)
    assert any("gemm_efficiency" in w and "nvlink_collective_efficiency" in w and "cannot separate" in w
               for w in fit.warnings), fit.warnings


def test_varied_runs_separate_gemm_from_tp_communication(h100):
    base, data = h100
    runs = synthetic_runs(base, data, VARIED, {"gemm_efficiency": 0.9}, model_name="llama-3.1-8b")
    fit = fit_profile_to_runs(runs, base, data)
    assert not any("gemm_efficiency and nvlink_collective_efficiency" in w for w in fit.warnings), fit.warnings


def test_fit_in_worker_processes_is_the_same_fit(h100):
    base, data = h100
    runs = synthetic_runs(base, data, VARIED[:5], {"gemm_efficiency": 0.9})
    one, two = fit_profile_to_runs(runs, base, data, jobs=1), fit_profile_to_runs(runs, base, data, jobs=2)
    assert [q.scale for q in one.parameters] == pytest.approx([q.scale for q in two.parameters], rel=1e-12)


def test_written_profile_has_before_after_provenance_and_the_fit(h100, tmp_path):
    base, data = h100
    runs = synthetic_runs(base, data, VARIED[:5], {"gemm_efficiency": 0.9})
    fit = fit_profile_to_runs(runs, base, data)
    text = fitted_profile_text(fit, data, ["runs.csv"], when="2026-01-01T00:00:00Z")
    path = tmp_path / "fitted.yaml"
    path.write_text(text)
    profile = load_profile(path)
    assert profile.name == "h100-80gb-fitted-to-runs" and profile.aliases == ()
    entry = profile.provenance["compute.gemm_efficiency.peak_fraction"]
    before, after = fit.changes["compute.gemm_efficiency.peak_fraction"]
    assert f"{before:.6g} -> {after:.6g}" in entry and "5 measured runs (synthetic (5))" in entry
    assert profile.gemm_efficiency["peak_fraction"] == pytest.approx(after, rel=1e-5)
    section = read_runs_section(profile)
    assert len(section["residuals"]) == 5 and section["base_profile"] == "h100-80gb"


# ---- the run format ----------------------------------------------------------------------------------------------

HEADER = "row_id,model,gpu,num_gpus,precision,seq_len,global_batch_seqs,micro_batch,tp,pp,sharding,recompute,"


def write(tmp_path: Path, rows: str, columns: str = "step_time_s") -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("# our runs\n" + HEADER + columns + "\n" + rows)
    return path


def test_run_format_row(tmp_path):
    path = write(tmp_path, "1,llama-3.1-8b,H100 80GB,16,bf16,8192,128,2,2,1,distributed optimizer,selective,"
                           "10.5\n", "step_time_s")
    (run,) = read_run_file(path, "h100")
    assert (run.fixed["tp"], run.fixed["pp"], run.fixed["cp"], run.fixed["zero"]) == (2, 1, 1, 1)
    assert run.fixed["recompute"] is Recompute.SELECTIVE and run.measured_step_s == 10.5
    per_gpu = write(tmp_path, "1,llama-3.1-8b,H100,16,bf16,8192,128,2,2,1,,,4000\n", "tokens_per_s_per_gpu")
    (run,) = read_run_file(per_gpu, "h100")
    assert run.measured_step_s == pytest.approx(128 * 8192 / (4000 * 16))
    assert run.fixed["zero"] == 0 and run.fixed["recompute"] is Recompute.NONE      # empty: the frameworks' default


@pytest.mark.parametrize("row, columns, message", [
    ("1,llama-3.1-8b,A100 80GB,16,bf16,8192,128,2,2,1,,,10\n", "step_time_s", "is a100-80gb, not the --gpu h100-80gb"),
    ("1,llama-3.1-8b,H100,16,fp4,8192,128,2,2,1,,,10\n", "step_time_s", "row 1: precision: 'fp4'"),
    ("1,llama-3.1-8b,H100,16,bf16,8192,128,,2,1,,,10\n", "step_time_s", "row 1: micro_batch: empty"),
    ("1,llama-3.1-8b,H100,16,bf16,8192,128,2,2,1,,,412\n", "tflops_per_gpu", "only TFLOP/s or MFU columns"),
    ("1,llama-3.1-8b,H100,16,bf16,8192,128,2,2,1,,,ten\n", "step_time_s", "step_time_s: 'ten' is not a number"),
    ("1,llama-3.1-8b,H100,16,bf16,8192,100,2,2,1,,,10\n", "step_time_s", "cannot run llama-3.1-8b on 16 GPUs"),
    ("1,llama-3.1-8b,H100,16,bf16,8192,128,2,2,1,zero9,,10\n", "step_time_s", "sharding: 'zero9'"),
])
def test_run_format_rows_that_cannot_be_read_are_refused_with_row_and_column(tmp_path, row, columns, message):
    with pytest.raises(InputError, match=message):
        read_run_file(write(tmp_path, row, columns), "h100")


def test_run_format_architecture_cells_must_match_the_model(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("row_id,model,hidden,gpu,num_gpus,precision,seq_len,global_batch_seqs,micro_batch,step_time_s\n"
                    "7,llama-3.1-8b,5120,H100,8,bf16,8192,64,1,10\n")
    with pytest.raises(InputError, match="row 7: hidden: the row has 5120, model llama-3.1-8b has 4096"):
        read_run_file(path, "h100")


# ---- the CLI -----------------------------------------------------------------------------------------------------

def autopar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}, timeout=600)


def test_cli_fits_writes_and_the_profile_ranks_and_compares(tmp_path, h100):
    base, data = h100
    runs = synthetic_runs(base, data, VARIED[:5], {"gemm_efficiency": 0.9}, model_name="llama-3.1-8b")
    rows = "".join(f"{i},llama-3.1-8b,H100 80GB,{r.cluster.num_gpus},bf16,{r.training.seq_len},"
                   f"{r.training.global_batch_size},{r.fixed['mbs']},{r.fixed['tp']},{r.fixed['pp']},zero1,"
                   f"{r.fixed['recompute'].name.lower()},{r.measured_step_s}\n" for i, r in enumerate(runs, 1))
    write(tmp_path, rows)
    done = autopar("calibrate", "--from-runs", "runs.csv", "--gpu", "h100", "--out", "mine.yaml", "--jobs", "1",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "MAPE: bundled" in done.stdout and "compute.gemm_efficiency.peak_fraction:" in done.stdout
    shown = autopar("profile", "show", "mine.yaml", cwd=tmp_path)
    assert shown.returncode == 0 and "fitted to 5 measured runs" in shown.stdout
    assert "compared with bundled profile h100-80gb" in shown.stdout
    solved = autopar("solve", "llama-3.1-8b", "--gpus", "8", "--profile", "mine.yaml", "--top", "1", "--json",
                     cwd=tmp_path)
    assert solved.returncode == 0, solved.stderr


@pytest.mark.parametrize("args, message", [
    (["--from-runs", "missing.csv", "--gpu", "h100"], "no file at 'missing.csv'"),
    (["--from-runs", "runs.csv"], "--from-runs needs --gpu"),
    (["--from-runs", "runs.csv", "--gpu", "h100"], "1 run(s) in runs.csv: a fit needs at least 3"),
    (["--from-runs", "notes.txt", "--gpu", "h100"], "neither a run-format CSV"),
    (["--gpu", "h100"], "--gpu: only with --from-runs"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, args, message):
    write(tmp_path, "1,llama-3.1-8b,H100,8,bf16,8192,64,1,1,1,,,10\n")
    (tmp_path / "notes.txt").write_text("nothing to see\n")
    done = autopar("calibrate", *args, "--out", "x.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("autopar: error: ") and message in done.stderr
