"""Fit the cost model's own hardware parameters to calibration measurements (least squares, numpy only).

Nothing here invents a curve: the model functions are the cost model's —
`costmodels.comm.collective_time_s(link, kind, bytes, group_size)` (alpha–beta, DESIGN.md §4) for the links and
`costmodels.compute.gemm_efficiency(profile, m, n, k, precision)` for the GEMMs — and the fit adjusts the named
parameters those functions read from a profile (a `LinkSpec`'s alpha_s and bandwidth_bytes_per_s; the mapping
`HardwareProfile.gemm_efficiency`). `least_squares` itself is generic: any model function of named parameters.

Residuals: measurements span six orders of magnitude (a 1 KiB all-reduce against a 256 MiB one), so the fit
minimises squared *log* ratios log(model / measured) — a relative error, symmetric in over- and under-prediction —
and reports relative residuals model / measured − 1 (root-mean-square and worst).

All fitted parameters are positive physical quantities (seconds, bytes/s, fractions, dimensions), so they are
fitted in log space, which also keeps them positive. Per-collective points (`fit_collective_points`): the
same least squares through `costmodels.comm.group_collective_time_s`, one (alpha, bus bandwidth) pair per link,
collective and group size, since NCCL switches algorithm (ring, tree, NVLS, SHARP) by collective and group. The
solver is Levenberg–Marquardt (Marquardt 1963, SIAM J.
Appl. Math. 11(2); scaling by the diagonal of JᵀJ) with a forward-difference Jacobian, started from each of a few
initial guesses; the best end point wins. A parameter the data does not constrain (its Jacobian column is zero)
keeps its initial value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from autopar.calibrate.measurements import CollectiveMeasurement, GemmMeasurement, HostMeasurement
from costmodels.hardware import CollectivePoint, HardwareProfile, LinkSpec

Predict = Callable[[Mapping[str, float]], np.ndarray]


@dataclass(frozen=True)
class FitResult:
    """Fitted parameters and how well the model then matches the measurements."""

    params: dict[str, float]
    points: int
    rms_relative_residual: float
    """sqrt(mean((model / measured − 1)²)) over the points."""
    max_relative_residual: float
    """max |model / measured − 1|."""
    relative_residuals: tuple[float, ...]
    at_bound: tuple[str, ...] = ()
    """Parameters that ended on a bound: the data does not pin them down (e.g. a bandwidth when every message
    was too small to leave the latency regime)."""

    def summary(self) -> dict[str, float]:
        return {"points": self.points, "rms_relative_residual": round(self.rms_relative_residual, 6),
                "max_relative_residual": round(self.max_relative_residual, 6)}


# ---- generic least squares -----------------------------------------------------------------------------------------

DEFAULT_BOUNDS = (1e-12, 1e12)
"""Any fitted parameter stays within these (positive, finite); a tighter range per parameter can be given."""


def least_squares(predict: Predict, observed: Sequence[float], initial_guesses: Sequence[Mapping[str, float]],
                  bounds: Mapping[str, tuple[float, float]] | None = None, max_iterations: int = 200) -> FitResult:
    """Positive named parameters minimising Σ log(predict(params)_i / observed_i)², from each initial guess.

    `predict` maps a parameter mapping to one prediction per observation. Every guess names the same parameters.
    `bounds` (name -> (low, high)) keeps a parameter in range; the others stay within DEFAULT_BOUNDS.
    """
    measured = np.asarray(observed, dtype=float)
    assert measured.ndim == 1 and measured.size > 0 and np.all(measured > 0), "observations must be positive"
    assert initial_guesses, "least_squares needs at least one initial guess"
    names = tuple(initial_guesses[0])
    limits = np.log(np.array([(bounds or {}).get(name, DEFAULT_BOUNDS) for name in names], dtype=float))
    low, high = limits[:, 0], limits[:, 1]

    def log_residuals(theta: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            predicted = np.asarray(predict(dict(zip(names, np.exp(theta), strict=True))), dtype=float)
            residuals = np.log(predicted / measured)
        return residuals if np.all(np.isfinite(residuals)) else np.full_like(measured, np.inf)

    best_theta, best_cost = None, math.inf
    for guess in initial_guesses:
        assert tuple(guess) == names, "every initial guess must name the same parameters"
        theta0 = np.clip(np.log(np.array([max(float(guess[name]), 1e-300) for name in names])), low, high)
        theta, cost = _levenberg_marquardt(log_residuals, theta0, low, high, max_iterations)
        if cost < best_cost:
            best_theta, best_cost = theta, cost
    if best_theta is None:
        raise ValueError("the model gives no finite prediction for the measurements from any initial guess")
    params = dict(zip(names, (float(v) for v in np.exp(best_theta)), strict=True))
    relative = np.asarray(predict(params), dtype=float) / measured - 1.0
    at_bound = tuple(name for name, value, lo, hi in zip(names, best_theta, low, high, strict=True)
                     if value <= lo + 1e-6 or value >= hi - 1e-6)
    return FitResult(params=params, points=int(measured.size),
                     rms_relative_residual=float(np.sqrt(np.mean(relative**2))),
                     max_relative_residual=float(np.max(np.abs(relative))),
                     relative_residuals=tuple(float(r) for r in relative), at_bound=at_bound)


def _levenberg_marquardt(residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, low: np.ndarray,
                         high: np.ndarray, max_iterations: int) -> tuple[np.ndarray, float]:
    """Minimise |residuals(theta)|² with theta kept in [low, high] (each trial step is projected into the box)."""
    r = residuals(theta)
    cost = float(r @ r)
    if not math.isfinite(cost):
        return theta, math.inf
    damping = 1e-3
    for _ in range(max_iterations):
        jacobian = _jacobian(residuals, theta, r)
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ r
        scale = np.diag(normal).copy()
        scale[scale < 1e-12] = 1e-12  # an unconstrained parameter: its step is damped to ~0, it keeps its value
        improved = False
        while damping < 1e12:
            step = np.linalg.solve(normal + damping * np.diag(scale), -gradient)
            candidate = np.clip(theta + step, low, high)
            step = candidate - theta
            r_new = residuals(candidate)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                improved = True
                converged = cost - cost_new <= 1e-14 * max(cost, 1e-30) or np.max(np.abs(step)) < 1e-10
                theta, r, cost = candidate, r_new, cost_new
                damping = max(damping / 3.0, 1e-12)
                break
            damping *= 4.0
        if not improved or converged:
            break
    return theta, cost


def _jacobian(residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, r: np.ndarray) -> np.ndarray:
    jacobian = np.empty((r.size, theta.size))
    for j in range(theta.size):
        h = 1e-6 * max(1.0, abs(theta[j]))
        shifted = theta.copy()
        shifted[j] += h
        r_shifted = residuals(shifted)
        jacobian[:, j] = (r_shifted - r) / h if np.all(np.isfinite(r_shifted)) else 0.0
    return jacobian


# ---- links: alpha and bandwidth of the alpha–beta model ------------------------------------------------------------

CollectiveTime = Callable[[LinkSpec, str, float, int], float]

LINK_BOUNDS = {"alpha_s": (1e-9, 10.0), "bandwidth_bytes_per_s": (1e6, 1e14)}
"""1 ns … 10 s latency; 1 MB/s … 100 TB/s per GPU: far outside any real link on both sides, so a fit that ends on
a bound means the data did not determine the parameter."""


def _default_collective_time() -> CollectiveTime:
    from costmodels.comm import collective_time_s

    return collective_time_s


def fit_link(rows: Sequence[CollectiveMeasurement], base: LinkSpec,
             collective_time: CollectiveTime | None = None) -> FitResult:
    """alpha_s and bandwidth_bytes_per_s of one link, fitted over every collective measured on it.

    The model is the cost model's `collective_time_s(link, kind, bytes, group_size)`; the initial guesses are the
    base profile's link and one read off the data (alpha: the fastest run; bandwidth: the largest message).
    """
    time_s = collective_time or _default_collective_time()
    assert rows, "fit_link needs measurements"

    def predict(params: Mapping[str, float]) -> np.ndarray:
        link = LinkSpec(bandwidth_bytes_per_s=params["bandwidth_bytes_per_s"], alpha_s=params["alpha_s"],
                        nominal_bandwidth_bytes_per_s=base.nominal_bandwidth_bytes_per_s)
        return np.array([time_s(link, row.kind, row.bytes, row.group_size) for row in rows])

    observed = [row.timing.median_s for row in rows]
    largest = max(rows, key=lambda row: row.bytes)
    unit_link = LinkSpec(bandwidth_bytes_per_s=1.0, alpha_s=0.0, nominal_bandwidth_bytes_per_s=1.0)
    effective_bytes = time_s(unit_link, largest.kind, largest.bytes, largest.group_size)  # bytes × algorithm factor
    guesses = [
        {"alpha_s": max(base.alpha_s, 1e-7), "bandwidth_bytes_per_s": base.bandwidth_bytes_per_s},
        {"alpha_s": min(observed) / 2.0, "bandwidth_bytes_per_s": effective_bytes / largest.timing.median_s},
    ]
    return least_squares(predict, observed, guesses, bounds=LINK_BOUNDS)


def fit_link_by_collective(rows: Sequence[CollectiveMeasurement], base: LinkSpec,
                           collective_time: CollectiveTime | None = None) -> dict[str, FitResult]:
    """The same fit for each collective alone (diagnostics: is one collective slower than the model says?)."""
    by_kind: dict[str, list[CollectiveMeasurement]] = {}
    for row in rows:
        by_kind.setdefault(row.kind, []).append(row)
    return {kind: fit_link(kind_rows, base, collective_time) for kind, kind_rows in by_kind.items()
            if len({row.bytes for row in kind_rows}) >= 2}


# ---- GEMM efficiency -----------------------------------------------------------------------------------------------

GemmEfficiency = Callable[[HardwareProfile, int, int, int, str], float]

FP8_PEAK_FRACTION = "fp8_peak_fraction"
"""costmodels.compute's parameter for fp8 GEMMs (fraction of the fp8 peak); bundled profiles may lack it until fp8
has been measured, so a calibration with fp8 measurements adds it."""


ATTENTION_PARAMETERS = ("attention_peak_fraction", "attention_half_saturation_seq")
"""costmodels.compute's fused-attention curve (compute.ATTENTION_PARAMETERS): fitted by fit_attention_efficiency only."""

FP8_HALF_SATURATION = "fp8_half_saturation_dim"
"""costmodels.compute's roll-off side for fp8 GEMMs (bf16's `half_saturation_dim` where absent)."""

KERNEL_FLOOR = "kernel_floor_us"
"""costmodels.compute's fixed time of a GEMM kernel (compute.KERNEL_FLOOR_US). It is fitted alone, with every other
curve parameter held (benchmarks/fit_microbench.py fits it so to the small GEMMs after the curve): fitted with the
roll-off, the two trade off (compute.gemm_efficiency takes the larger), and a fit can end with the floor doing the
roll-off's work. Where other parameters are free it keeps the base's value."""

GEMM_BOUNDS = {"peak_fraction": (1e-6, 1.0), FP8_PEAK_FRACTION: (1e-6, 1.0), KERNEL_FLOOR: (1e-3, 1e3)}
"""A fraction of the dense peak is at most 1 (a shape the curve cannot follow must not push it above); a kernel's
floor lies between a nanosecond and a millisecond."""


ROLL_OFF_GUESS_SCALE = 30.0
"""The last initial guess of a GEMM fit: the base's roll-off sides × this, the rest as the base."""


def _curve_free(base: HardwareProfile, fixed: Sequence[str]) -> bool:
    """Whether a GEMM fit frees any curve parameter besides the kernel floor (which it then holds: KERNEL_FLOOR)."""
    return any(name not in fixed and name != KERNEL_FLOOR and name not in ATTENTION_PARAMETERS
               and not name.startswith(OTHER_CURVES_PREFIXES) for name in base.gemm_efficiency)


def _default_gemm_efficiency() -> GemmEfficiency:
    from costmodels.compute import gemm_efficiency

    return gemm_efficiency


def measured_gemm_efficiency(row: GemmMeasurement, profile: HardwareProfile) -> float:
    """Achieved FLOP/s of one GEMM over the profile's dense peak for its precision."""
    return row.achieved_flops_per_s / profile.peak_flops_per_s[row.precision]


OTHER_CURVES_PREFIXES = ("attention_", "grouped_")
"""compute.gemm_efficiency keys of other curves (fused attention, the grouped expert-GEMM roofline): the dense GEMM
curve does not read them, so its fit keeps them at the base's value (fitted, they would stay at whichever initial
guess won, e.g. the base's value scaled down 1000×)."""


def fit_gemm_efficiency(rows: Sequence[GemmMeasurement], base: HardwareProfile,
                        gemm_efficiency: GemmEfficiency | None = None, fixed: Sequence[str] = ()) -> FitResult:
    """The named parameters of the profile's GEMM-efficiency curve, fitted to measured efficiencies.

    The model is the cost model's `gemm_efficiency(profile, m, n, k, precision)` with the parameters replaced; the
    base profile's values are the first initial guess, the same values scaled down 10× and 1000× the others (a
    CPU or a throttled GPU sits far below the bundled curve). Parameters named in `fixed` keep the base's value
    (e.g. the half-saturation side when every measured shape is large); they are returned with the fitted ones.
    """
    efficiency = gemm_efficiency or _default_gemm_efficiency()
    assert rows, "fit_gemm_efficiency needs measurements"
    rows = [row for row in rows if row.precision in base.peak_flops_per_s and row.kind == "gemm"]

    kept = {name: float(value) for name, value in base.gemm_efficiency.items()
            if name in (*fixed, *ATTENTION_PARAMETERS) or name.startswith(OTHER_CURVES_PREFIXES)
            or (name == KERNEL_FLOOR and _curve_free(base, fixed))}

    def predict(params: Mapping[str, float]) -> np.ndarray:
        profile = dataclasses.replace(base, gemm_efficiency={**kept, **params})
        return np.array([float(efficiency(profile, row.m, row.n, row.k, row.precision)) for row in rows])

    observed = [measured_gemm_efficiency(row, base) for row in rows]
    start = {name: float(value) if value > 0 else 1e-3 for name, value in base.gemm_efficiency.items()
             if name not in kept}
    if any(row.precision == "fp8" for row in rows) and FP8_PEAK_FRACTION not in start and FP8_PEAK_FRACTION not in kept:
        start[FP8_PEAK_FRACTION] = start.get("peak_fraction", 0.5)  # the curve's fp8 parameter, first fitted here
    if any(row.precision == "fp8" for row in rows) and FP8_HALF_SATURATION not in start \
            and FP8_HALF_SATURATION not in kept and "half_saturation_dim" in {**start, **kept}:
        start[FP8_HALF_SATURATION] = {**kept, **start}["half_saturation_dim"]  # fp8's own roll-off, first fitted here
    if not any(row.precision == "fp8" for row in rows):
        kept.update({name: start.pop(name) for name in (FP8_PEAK_FRACTION, FP8_HALF_SATURATION) if name in start})
    if not any(row.precision != "fp8" for row in rows):
        kept.update({name: start.pop(name) for name in ("peak_fraction",) if name in start})
        if "half_saturation_dim" in start:
            kept["half_saturation_dim"] = start.pop("half_saturation_dim")
    guesses = [start] + [{name: value * scale for name, value in start.items()} for scale in (0.1, 1e-3)]
    # a roll-off far longer than the base's (an A100's is 46 elements): with the kernel floor held, a fit started
    # from a short one can settle with the floor doing the roll-off's work
    guesses += [{name: value * (ROLL_OFF_GUESS_SCALE if "half_saturation" in name else 1.0)
                 for name, value in start.items()}]
    result = least_squares(predict, observed, guesses, bounds=GEMM_BOUNDS)
    return dataclasses.replace(result, params={**kept, **result.params})


def fit_attention_efficiency(rows: Sequence[GemmMeasurement], base: HardwareProfile, kernel: str = "",
                             attention_pass: str = "") -> FitResult:
    """One fused-attention curve's parameters (`costmodels.compute.attention_efficiency`), fitted to the measured
    attention rows of `kernel` in `attention_pass` (fwd or bwd; both '' = the kernel-less curve over forward +
    backward, compute.ATTENTION_PARAMETERS); starts from the base's values, else from the measured maximum.

    Where the rows' times include the harness's host dispatch (GemmMeasurement.exposed_dispatches > 0), a third
    parameter, the dispatch time of one call (compute.attention_dispatch_parameter, µs), is fitted with them
    (`attention_row_time_s`): otherwise a fixed ~80 µs per call, most of a short sequence's time in a batch-1
    benchmark, would be read as the kernel rolling off at short sequences, and priced again for every batch ×
    head of a training micro-batch."""
    from costmodels.compute import ATTENTION_PARAMETERS as LEGACY, attention_curve_parameters, \
        attention_dispatch_parameter

    rows = [row for row in rows if row.kind == "attention" and row.attention_kernel == kernel
            and row.attention_pass == attention_pass]
    assert rows, "fit_attention_efficiency needs attention rows"
    peak_name, side_name = attention_curve_parameters(kernel, attention_pass) if kernel else LEGACY
    dispatch_name = attention_dispatch_parameter(kernel, attention_pass) if kernel else ""
    with_dispatch = bool(dispatch_name) and any(row.exposed_dispatches > 0 for row in rows)

    def predict(params: Mapping[str, float]) -> np.ndarray:
        profile = dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, **params})
        return np.array([row.flops / attention_row_time_s(profile, row) / base.peak_flops_per_s[row.precision]
                         for row in rows])

    observed = [measured_gemm_efficiency(row, base) for row in rows]
    params = base.gemm_efficiency
    start = {peak_name: float(params.get(peak_name, max(observed))), side_name: float(params.get(side_name, 1024.0))}
    guesses = [start, {peak_name: max(observed), side_name: 256.0}]
    bounds = {peak_name: (1e-6, 1.0)}
    if with_dispatch:
        guesses = [{**guess, dispatch_name: value} for guess in guesses for value in DISPATCH_GUESSES_US]
        bounds[dispatch_name] = DISPATCH_BOUNDS_US
    return least_squares(predict, observed, guesses, bounds=bounds)


DISPATCH_GUESSES_US = (20.0, 80.0)
"""Where the fit of a harness's per-call dispatch starts: a light host path (a cuDNN graph execute) and a Python
framework call (PyTorch SDPA, flash_attn_func), of the order the cudnn-frontend forward rows show at 512 tokens."""
DISPATCH_BOUNDS_US = (1e-3, 1e3)
"""A call's host dispatch lies between a nanosecond and a millisecond."""


def attention_row_time_s(profile: HardwareProfile, row: GemmMeasurement) -> float:
    """What `profile` predicts for one measured attention row: the kernel's equivalent-GEMM time on its curve
    (compute.attention_efficiency), plus, where the row's time includes the harness's host dispatch, that share of
    one call's dispatch time (compute.attention_dispatch_parameter; 0 where the profile has none)."""
    from costmodels.compute import attention_dispatch_parameter, attention_efficiency

    attention_pass = row.attention_pass or "fwd"
    kernel_s = row.flops / (profile.peak_flops_per_s[row.precision] * float(
        attention_efficiency(profile, row.m, row.n, row.k, row.attention_kernel, attention_pass)))
    dispatch_us = profile.gemm_efficiency.get(attention_dispatch_parameter(row.attention_kernel, attention_pass),
                                              0.0) if row.attention_kernel else 0.0
    return kernel_s + row.exposed_dispatches * dispatch_us * 1e-6


def attention_curves_measured(rows: Sequence[GemmMeasurement]) -> list[tuple[str, str]]:
    """The (kernel, pass) curves that attention rows measured, in a stable order ('', '' = the kernel-less one)."""
    return sorted({(row.attention_kernel, row.attention_pass) for row in rows if row.kind == "attention"})


GROUPED_HBM_FROM_SHARE = 0.2
"""The grouped roofline's HBM fraction is fitted only when operand traffic is at least 20% of some row's time (at
the starting values); below, every row is compute-bound, the data does not determine it, and it stays the base's
(ALPHA_FROM_BYTES_BELOW is the same rule for a collective's latency)."""
GROUPED_HBM_PRIOR = 0.8
"""Where the HBM fraction starts, and what it is held at when the base has none: an assumption."""


def fit_grouped_gemm(rows: Sequence[GemmMeasurement], base: HardwareProfile) -> FitResult:
    """The grouped-GEMM roofline's parameters (`costmodels.moe_kernels.grouped_gemm_time_s`), fitted to measured
    grouped expert GEMMs (rows of kind 'grouped_gemm', each the time of one group of m×k·k×n): the compute-bound
    fraction of the fp8 peak (from fp8 rows), of the bf16 peak (from bf16 rows; without them bf16 grouped GEMMs take
    the bf16 curve's `peak_fraction`) and, where the rows determine it (GROUPED_HBM_FROM_SHARE), the achieved
    fraction of HBM bandwidth. `params` holds what was fitted; the rest stays the base's."""
    from costmodels.moe_kernels import GROUPED_BF16_PEAK_FRACTION, GROUPED_PARAMETERS, grouped_gemm_bytes, \
        grouped_gemm_time_s

    rows = [row for row in rows if row.kind == "grouped_gemm" and row.precision in base.peak_flops_per_s]
    assert rows, "fit_grouped_gemm needs grouped_gemm rows"
    peak_name, memory_name = GROUPED_PARAMETERS
    params = base.gemm_efficiency
    start: dict[str, float] = {}
    if any(row.precision == "fp8" for row in rows):
        start[peak_name] = float(params.get(peak_name, params.get(FP8_PEAK_FRACTION, params["peak_fraction"])))
    if any(row.precision == "bf16" for row in rows):
        start[GROUPED_BF16_PEAK_FRACTION] = float(params.get(GROUPED_BF16_PEAK_FRACTION, params["peak_fraction"]))
    held = {memory_name: float(params.get(memory_name, GROUPED_HBM_PRIOR))}

    def profile_with(fitted: Mapping[str, float]) -> HardwareProfile:
        return dataclasses.replace(base, gemm_efficiency={**params, **held, **fitted})

    def predict_s(profile: HardwareProfile) -> np.ndarray:
        return np.array([float(grouped_gemm_time_s(profile, np.array(row.flops), np.array(row.m), np.array(row.n),
                                                   np.array(row.k), row.precision)) for row in rows])

    at_start = profile_with(start)
    traffic_s = np.array([float(grouped_gemm_bytes(np.array(row.flops), row.m, row.n, row.k, row.precision))
                          for row in rows]) / (at_start.hbm_bandwidth_bytes_per_s * held[memory_name])
    if np.max(traffic_s / predict_s(at_start)) >= GROUPED_HBM_FROM_SHARE:
        start[memory_name] = held.pop(memory_name)

    def predict(fitted: Mapping[str, float]) -> np.ndarray:
        profile = profile_with(fitted)
        return np.array([row.flops for row in rows]) / predict_s(profile) / np.array(
            [profile.peak_flops_per_s[row.precision] for row in rows])

    observed = [measured_gemm_efficiency(row, base) for row in rows]
    guesses = [start, {name: value * 0.5 for name, value in start.items()}]
    return least_squares(predict, observed, guesses, bounds={name: (1e-6, 1.0) for name in start})


# ---- host costs per launch path -------------------------------------------------------------------------------------

HOST_BOUNDS_US = (1e-3, 1e5)
"""Every host cost stays within 1 ns .. 0.1 s a launch (costmodels.host.MAX_HOST_US)."""


def host_row_parameters(row: HostMeasurement) -> tuple[str, ...]:
    """The `host:` keys a host row's time is made of (costmodels.host.HOST_FIELDS): a compiled call is the graph's
    entry plus its Triton launches, a replay the graph's fixed part plus its nodes, any other row its one path."""
    if row.path == "compiled_call":
        return ("compiled_call_us", "triton_launch_us")
    if row.path == "cuda_graph_replay":
        return ("cuda_graph_replay_us", "cuda_graph_node_us")
    return (f"{row.path}_us",)


def predict_host_row_us(row: HostMeasurement, values_us: Mapping[str, float]) -> float:
    """The cost model's host time of one measured call (µs) from `host:` values."""
    if row.path == "compiled_call":
        return values_us["compiled_call_us"] + row.kernels * values_us["triton_launch_us"]
    if row.path == "cuda_graph_replay":
        return values_us["cuda_graph_replay_us"] + row.kernels * values_us["cuda_graph_node_us"]
    return row.kernels * values_us[f"{row.path}_us"]


def fit_host_costs(rows: Sequence[HostMeasurement], base: HardwareProfile) -> FitResult:
    """The profile's `host:` values (µs, costmodels.host) the rows determine, by least squares on log ratios over
    every row at once (a compiled call shares its Triton launches with the plain Triton rows); the keys no row
    touches keep the base profile's value and are not in `params`."""
    from costmodels.host import HOST_FIELDS

    assert rows, "fit_host_costs needs host rows"
    base_us = {key: getattr(base.host_costs, key[:-3] + "_s") * 1e6 for key in HOST_FIELDS}
    fitted = tuple(key for key in HOST_FIELDS if any(key in host_row_parameters(row) for row in rows))

    def predict(params: Mapping[str, float]) -> np.ndarray:
        values = {**base_us, **params}
        return np.array([predict_host_row_us(row, values) for row in rows])

    observed = [row.timing.median_s * 1e6 for row in rows]
    start = {key: base_us[key] for key in fitted}
    return least_squares(predict, observed, [start, {key: value * 2.0 for key, value in start.items()}],
                         bounds={key: HOST_BOUNDS_US for key in fitted})


# ---- per-collective latency floor and bus bandwidth ------------------------------------------------------------------

ALPHA_FROM_BYTES_BELOW = 16 * 1024**2
"""Alpha is fitted only when some message is below 16 MiB; above, every run is bandwidth-bound (an 8-GPU NVLink
all-reduce of 16 MiB takes ~150 µs against a ~10–90 µs floor) and alpha stays the base profile's."""
BANDWIDTH_FROM_BYTES_ABOVE = 1024**2
"""Bandwidth is fitted only when some message reaches 1 MiB; below, the runs measure latency only."""
MAX_REGIMES = 3
"""NCCL has three protocols (LL, LL128, Simple); a fit uses at most that many (alpha, bandwidth) regimes."""
REGIME_GAIN = 0.7
"""A further regime is kept only when it cuts the median |log residual| to 70% or less of the fit without it (the
median, so that one noisy row — nccl-tests prints the odd 5× spike at a tiny size — does not decide)."""
ROWS_PER_PARAMETER = 2
"""And only when there are at least two measured sizes per fitted parameter."""


def predict_collectives_s(profile: HardwareProfile, rows: Sequence[CollectiveMeasurement]) -> np.ndarray:
    """The cost model's time for measured collectives: `costmodels.comm.group_collective_time_s` on the group each
    row describes (all on one node for nvlink; `ranks_per_node` per node for ib, 1 = the inter-node link alone)."""
    from costmodels.comm import GroupPlacement, group_collective_time_s

    out = np.empty(len(rows))
    by_kind: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_kind.setdefault(row.kind, []).append(i)
    for kind, index in by_kind.items():
        chosen = [rows[i] for i in index]
        size = np.array([float(r.group_size) for r in chosen])
        per_node = np.array([float(r.group_size if r.link == "nvlink" else r.ranks_per_node) for r in chosen])
        placement = GroupPlacement(size=size, members_per_node=per_node)
        out[index] = group_collective_time_s(profile, placement, kind, np.array([float(r.bytes) for r in chosen]))
    return out


def predict_collective_s(profile: HardwareProfile, row: CollectiveMeasurement) -> float:
    """`predict_collectives_s` of one row."""
    return float(predict_collectives_s(profile, [row])[0])


def with_collective_regimes(profile: HardwareProfile, link: str, kind: str, group_size: int,
                            regimes: Sequence[CollectivePoint]) -> HardwareProfile:
    """A copy of `profile` whose (link, collective) regimes at `group_size` are `regimes` (the others kept)."""
    collectives = {name: dict(kinds) for name, kinds in profile.collectives.items()}
    kept = [p for p in collectives.setdefault(link, {}).get(kind, ()) if p.group_size != group_size]
    collectives[link][kind] = tuple(sorted([*kept, *regimes], key=lambda p: (p.group_size, p.alpha_s)))
    return dataclasses.replace(profile, collectives=collectives)


@dataclass(frozen=True)
class CollectivePointFit:
    """The fitted regimes of one (link, collective, group size on the link) and the rows they came from."""

    link: str
    kind: str
    group_size: int
    regimes: tuple[CollectivePoint, ...]
    result: FitResult
    fitted: tuple[str, ...]
    """'alpha' and/or 'bandwidth': what the rows determined; the rest is the base's value."""
    rows: tuple[CollectiveMeasurement, ...]


def fit_collective_points(rows: Sequence[CollectiveMeasurement], base: HardwareProfile) -> list[CollectivePointFit]:
    """(alpha, bus bandwidth) regimes per link, collective and group size on the link, by least squares through
    `predict_collectives_s`: one regime, then two and three while each cuts the residual enough (REGIME_GAIN) —
    NCCL switches protocol with the message size. NVLink first: an ib row spanning nodes with several ranks each
    includes the NVLink stage, priced with the NVLink regimes just fitted (or the base's link values)."""
    from costmodels.comm import algorithm_factor, link_stage_s

    groups: dict[tuple[str, str, int], list[CollectiveMeasurement]] = {}
    for row in rows:
        groups.setdefault((row.link, row.kind, row.group_size_on_link), []).append(row)
    profile = base
    fits = []
    for link, kind, group in sorted(groups, key=lambda key: (key[0] != "nvlink", key[1], key[2])):
        members = sorted(groups[(link, kind, group)], key=lambda row: row.bytes)
        observed = np.array([row.timing.median_s for row in members])
        latency, transfer = link_stage_s(base, link, kind, np.array([0.0, 2.0**30]), np.array([group, group]))
        alpha0 = float(latency[0])
        bandwidth0 = float(2.0**30 * algorithm_factor(kind, group) / transfer[1])
        fitted = tuple(name for name, ok in (("alpha", members[0].bytes < ALPHA_FROM_BYTES_BELOW),
                                             ("bandwidth", members[-1].bytes >= BANDWIDTH_FROM_BYTES_ABOVE)) if ok)
        current = profile

        def regimes_of(params: Mapping[str, float], count: int) -> list[CollectivePoint]:
            return [CollectivePoint(group, params.get(f"alpha_s_{i}", alpha0),
                                    params.get(f"bandwidth_{i}", bandwidth0)) for i in range(count)]

        def predictor(count: int, current: HardwareProfile = current, link: str = link, kind: str = kind,
                      group: int = group, members: list = members) -> Predict:
            return lambda params: predict_collectives_s(
                with_collective_regimes(current, link, kind, group, regimes_of(params, count)), members)

        best: tuple[int, FitResult, float] | None = None
        sizes = len({row.bytes for row in members})
        for count in range(1, MAX_REGIMES + 1 if len(fitted) == 2 else 2):
            if count > 1 and sizes < ROWS_PER_PARAMETER * 2 * count:
                break
            result = least_squares(predictor(count), observed, _regime_guesses(members, kind, count, fitted,
                                                                               alpha0, bandwidth0),
                                   bounds=_regime_bounds(count))
            typical = float(np.median(np.abs(np.log1p(np.asarray(result.relative_residuals)))))
            if best is None or typical <= REGIME_GAIN * best[2]:
                best = (count, result, typical)
            else:
                break
        count, result, _ = best
        regimes = _used_regimes(regimes_of(result.params, count), members, kind)
        profile = with_collective_regimes(profile, link, kind, group, regimes)
        fits.append(CollectivePointFit(link, kind, group, tuple(regimes), result, fitted, tuple(members)))
    return fits


def _link_stage_bytes(row: CollectiveMeasurement, kind: str) -> float:
    """Bus bytes the measured link's stage of `row` moves as the cost model prices it (costmodels.comm
    group_collective_time_s): the buffer × the kind's algorithm factor over the ranks the link joins; an ib row
    across nodes with several ranks a node, each local rank's 1/k share, and for a ring all-gather / reduce-scatter
    the ring's share over all n ranks (comm.ring_nic_share)."""
    from costmodels.comm import RING_KINDS, algorithm_factor, ring_nic_share

    wire = row.bytes / row.ranks_per_node * float(algorithm_factor(kind, row.group_size_on_link))
    if row.link == "ib" and kind in RING_KINDS:
        wire *= float(ring_nic_share(row.group_size, row.group_size_on_link))
    return wire


def _regime_guesses(members: Sequence[CollectiveMeasurement], kind: str, count: int, fitted: tuple[str, ...],
                    alpha0: float, bandwidth0: float) -> list[dict[str, float]]:
    """Start points: the base's values, and the rows split into `count` bands of message size, each band's regime
    read off its smallest (alpha) and largest (bandwidth) message."""
    bands = np.array_split(np.arange(len(members)), count)
    read_off: dict[str, float] = {}
    for i, band in enumerate(bands):
        small, large = members[band[0]], members[band[-1]]
        read_off[f"alpha_s_{i}"] = small.timing.median_s * 0.8
        # the bytes this link's stage moves (an ib row spanning nodes: each local rank's share, costmodels.comm), so
        # the start point is this link's bus bandwidth, not the whole group's
        read_off[f"bandwidth_{i}"] = float(_link_stage_bytes(large, kind) / large.timing.median_s)
    base = {**{f"alpha_s_{i}": alpha0 * (1 + i) for i in range(count)},
            **{f"bandwidth_{i}": bandwidth0 * (0.5 + 0.5 * i) for i in range(count)}}
    keep = [name for i in range(count) for name in (f"alpha_s_{i}", f"bandwidth_{i}")
            if ("alpha" in fitted or not name.startswith("alpha")) and ("bandwidth" in fitted
                                                                       or not name.startswith("bandwidth"))]
    return [{name: guess[name] for name in keep} for guess in (read_off, base)]


def _regime_bounds(count: int) -> dict[str, tuple[float, float]]:
    return {**{f"alpha_s_{i}": LINK_BOUNDS["alpha_s"] for i in range(count)},
            **{f"bandwidth_{i}": LINK_BOUNDS["bandwidth_bytes_per_s"] for i in range(count)}}


def _used_regimes(regimes: list[CollectivePoint], members: Sequence[CollectiveMeasurement],
                  kind: str) -> list[CollectivePoint]:
    """The regimes that are the fastest for at least one measured size (a regime never chosen says nothing)."""
    used = set()
    for row in members:
        wire = _link_stage_bytes(row, kind)
        used.add(min(range(len(regimes)), key=lambda i: regimes[i].alpha_s + wire / regimes[i].bus_bandwidth_bytes_per_s))
    return [regimes[i] for i in sorted(used)]
