"""What DeepSpeed ZeRO-3's module hooks cost the host, per hooked module and per fetched parameter in each pass, and
what its optimizer step costs per parameter.

ZeRO-3 registers hooks on every submodule of the model (deepspeed/runtime/zero/parameter_offload.py
`_register_deepspeed_module`): before a module's forward it fetches the module's own parameters (the coordinator's
trace and prefetch bookkeeping, one coalesced all-gather, a copy-out per parameter), after it releases them, and it
wraps the module's outputs in autograd Functions so that its backward hooks run (PreBackwardFunctionForModule,
PostBackwardFunctionModule), which fetch again before the module's backward and release and reduce after. This is
Python on the host, per module and per parameter, beyond the kernels it launches (costmodels.engines prices those
as launches: the copy-in, the copy-out per parameter, the NCCL call).

Measured here on DeepSpeed 0.19.8 (the conformance extra's pin) with its CPU accelerator on a one-rank gloo group:
models of small weights (16 x 16, so the kernels themselves are ~1 µs), one or four to a module, grouped into
containers; forward, backward and optimizer step timed against the same model without DeepSpeed. The extra time of
each pass is fitted by least squares (the median of three runs of the whole measurement) as

    extra = module_us x hooked modules + param_us x parameters + pass_us

over the modules whose forward runs (a ModuleList carries hooks but is never called) and the parameters they hold;
per module and per parameter are told apart by the containers (none) and the modules of four weights. Every weight is
partitioned (stage3_param_persistence_threshold 0: the default keeps these small weights whole, as it keeps a real
layer's norms and biases). On one rank DeepSpeed gathers nothing (partition_parameters.py: a one-rank group takes
`_no_gather_coalesced`), so what is timed is the hooks' Python around the fetch and release, without the fetch's own
copies and collective (costmodels.engines prices those as launches); pass_us, what a pass costs once, is printed
and not priced (held at zero where the free fit makes it negative). costmodels.engines.ZERO3_HOOK_TO_ATEN_OP carries
the fitted µs over the host profile's eager operator (host.aten_op_us, fitted to the public microbenchmarks): Python
on the same class of server CPU. The optimizer step is fitted as a fixed part and a part per parameter (ZeRO-3's step
walks every parameter's partition once a step): costmodels.engines.ZERO3_STEP_TO_ATEN_OP.

    python benchmarks/deepspeed_zero3_host.py

Ends with `deepspeed-zero3-host: fwd_module_us=A fwd_param_us=B bwd_module_us=C bwd_param_us=D step_us=E
step_param_us=F rms=R% deepspeed=V` (needs deepspeed and torch: the conformance extra; prints that they are not
installed otherwise).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

MODELS = ((8, 4, 1), (32, 4, 1), (32, 1, 1), (16, 8, 1), (16, 2, 4), (8, 4, 4))
"""(containers, weight modules per container, weights per module): the modules that run (the root, each container,
each weight module) and the parameters vary apart, the last two with four weights in one module."""
HIDDEN = 16
TIMED_STEPS = 12
WARMUP_STEPS = 3
REPEATS = 3


@contextlib.contextmanager
def one_rank_cpu_deepspeed():
    """The environment of a one-rank DeepSpeed job on its CPU accelerator (gloo), the process group destroyed on
    exit."""
    with socket.socket() as probe:               # a port no other process on this machine holds
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saved = {key: os.environ.get(key) for key in ("DS_ACCELERATOR", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                                  "WORLD_SIZE", "LOCAL_RANK")}
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_model(containers: int, modules: int, weights: int):
    """A model of `containers` containers of `modules` modules, each applying its `weights` HIDDEN x HIDDEN weights
    in turn (one weight: an nn.Linear's)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Weights(nn.Module):
        """Its weights held as its own parameters (as an nn.Linear holds its weight: ZeRO-3 fetches a module's own
        parameters before its forward; a ParameterList's would be fetched on access instead)."""

        def __init__(self):
            super().__init__()
            for index in range(weights):
                self.register_parameter(f"weight{index}", nn.Parameter(torch.randn(HIDDEN, HIDDEN) / HIDDEN))

        def forward(self, x):
            for index in range(weights):
                x = F.linear(x, getattr(self, f"weight{index}"))
            return x

    class Chain(nn.Module):
        """Its children applied in turn (the root model, and each container)."""

        def __init__(self, children):
            super().__init__()
            self.chain = nn.ModuleList(children)

        def forward(self, x):
            for child in self.chain:
                x = child(x)
            return x

    return Chain([Chain([Weights() for _ in range(modules)]) for _ in range(containers)])


def _median_pass_seconds(step) -> list[float]:
    """Median seconds of each pass (forward, backward, optimizer step) over the timed steps."""
    samples = []
    for index in range(WARMUP_STEPS + TIMED_STEPS):
        seconds = step()
        if index >= WARMUP_STEPS:
            samples.append(seconds)
    return [statistics.median(column) for column in zip(*samples)]


def modules_run(model, x) -> int:
    """Submodules whose forward runs in one forward of `model` (those whose ZeRO-3 hooks fire)."""
    called = set()
    handles = [module.register_forward_pre_hook(lambda module, args: called.add(id(module)))
               for module in model.modules()]
    model(x)
    for handle in handles:
        handle.remove()
    return len(called)


def measure_model(containers: int, modules: int, weights: int) -> tuple[int, int, list[float]]:
    """(modules run, parameters, extra seconds of forward / backward / step under ZeRO-3 over plain PyTorch)."""
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = build_model(containers, modules, weights)
    x = torch.randn(4, HIDDEN)
    hooked = modules_run(model, x)
    parameters = sum(1 for _ in model.parameters())
    # every parameter partitioned, fetched and released (the default threshold keeps ones under 100,000 elements
    # whole on every rank: costmodels.engines.ZERO3_PERSISTENCE_THRESHOLD_PARAMS; a real layer's weights are above)
    config = {"train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 1e-4}}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())

    def zero3_step() -> tuple[float, float, float]:
        start = time.perf_counter()
        loss = engine(x).sum()
        forward = time.perf_counter()
        engine.backward(loss)
        backward = time.perf_counter()
        engine.step()
        return forward - start, backward - forward, time.perf_counter() - backward

    plain = build_model(containers, modules, weights)
    optimizer = torch.optim.SGD(plain.parameters(), lr=1e-4)

    def plain_step() -> tuple[float, float, float]:
        start = time.perf_counter()
        loss = plain(x).sum()
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        return forward - start, backward - forward, time.perf_counter() - backward

    zero3, eager = _median_pass_seconds(zero3_step), _median_pass_seconds(plain_step)
    return hooked, parameters, [a - b for a, b in zip(zero3, eager)]


def fit_pass(rows: list[tuple[int, int, float]]) -> tuple[float, float, float, float]:
    """(µs per hooked module, µs per parameter, µs per pass, rms relative residual) of one pass's extra seconds, by
    least squares over (modules run, parameters, extra seconds) rows, with a constant for what a pass costs once
    (the engine's own entry, the backward's reduce of the last bucket), held at zero where the free fit makes it
    negative (no cost is negative)."""
    import numpy as np

    extra = np.array([seconds for _, _, seconds in rows])
    design = np.array([[hooked, parameters, 1.0] for hooked, parameters, _ in rows], dtype=float)
    coefficients, *_ = np.linalg.lstsq(design, extra, rcond=None)
    if coefficients[2] < 0.0:
        coefficients, *_ = np.linalg.lstsq(design[:, :2], extra, rcond=None)
        coefficients = np.append(coefficients, 0.0)
    residual = design @ coefficients - extra
    rms = float(np.sqrt(np.mean((residual / extra) ** 2)))
    return coefficients[0] * 1e6, coefficients[1] * 1e6, coefficients[2] * 1e6, rms


def fit_step(rows: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(µs per step, µs per parameter, rms relative residual) of the optimizer step's extra seconds, by least
    squares over (modules run, parameters, extra seconds) rows: ZeRO-3's step walks the parameters (each one's
    partition bookkeeping, its gradient's release), once a step."""
    _, param_us, step_us, rms = fit_pass([(0, parameters, seconds) for _, parameters, seconds in rows])
    return step_us, param_us, rms


def measure_once() -> dict:
    """Every model of MODELS under ZeRO-3 and the fit of each pass (inside one_rank_cpu_deepspeed)."""
    rows = [measure_model(*shape) for shape in MODELS]
    fits = {name: fit_pass([(hooked, params, extra[index]) for hooked, params, extra in rows])
            for index, name in enumerate(("fwd", "bwd"))}
    fits["step"] = fit_step([(hooked, params, extra[2]) for hooked, params, extra in rows])
    return {"rows": rows, "fits": fits}


def measure(repeats: int = REPEATS) -> dict:
    """`measure_once` `repeats` times in one process group (DeepSpeed keeps its groups for the process; a shared
    machine is noisy): the last run's rows and the median of each fitted value. DeepSpeed is imported inside the
    one-rank environment, which names its CPU accelerator (DeepSpeed picks the accelerator once, at import)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ds_logger = logging.getLogger("DeepSpeed")
    level = ds_logger.level
    ds_logger.setLevel(logging.ERROR)
    try:
        with one_rank_cpu_deepspeed(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            import deepspeed

            runs = [measure_once() for _ in range(repeats)]
    finally:
        torch.set_num_threads(threads)
        ds_logger.setLevel(level)
    fits = {name: tuple(statistics.median(run["fits"][name][index] for run in runs)
                        for index in range(len(runs[0]["fits"][name])))
            for name in ("fwd", "bwd", "step")}
    return {"rows": runs[-1]["rows"], "fits": fits, "deepspeed": deepspeed.__version__, "repeats": repeats}


def main() -> int:
    if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("torch") is None:
        print("deepspeed-zero3-host: deepspeed and torch are not installed here (pip install -e '.[conformance]')")
        return 0
    from costmodels.engines import ZERO3_HOOK_TO_ATEN_OP, ZERO3_STEP_TO_ATEN_OP
    from costmodels.host import DEFAULT_HOST_COSTS_US

    result = measure()
    print(f"{'containers x modules x weights':>30} {'run':>7} {'params':>7} {'fwd ms':>8} {'bwd ms':>8} {'step ms':>8}")
    for (containers, modules, weights), (hooked, params, extra) in zip(MODELS, result["rows"]):
        print(f"{containers:>18} x {modules:<3} x {weights:<4} {hooked:>7} {params:>7} "
              + " ".join(f"{seconds * 1e3:>8.2f}" for seconds in extra))
    aten_op_us = DEFAULT_HOST_COSTS_US["aten_op_us"]
    print(f"\n(the last of {result['repeats']} runs above; the fits below are the medians of the runs)")
    for name in ("fwd", "bwd"):
        module_us, param_us, pass_us, rms = result["fits"][name]
        bundled_module, bundled_param = (ratio * aten_op_us for ratio in ZERO3_HOOK_TO_ATEN_OP[name])
        print(f"{name}: {module_us:.1f} µs a hooked module, {param_us:.1f} µs a parameter, {pass_us:.0f} µs a pass "
              f"(rms {rms:.1%}); "
              f"bundled {bundled_module:.1f} / {bundled_param:.1f} µs "
              f"(costmodels.engines.ZERO3_HOOK_TO_ATEN_OP x host.aten_op_us {aten_op_us:g})")
    fwd, bwd, step = result["fits"]["fwd"], result["fits"]["bwd"], result["fits"]["step"]
    fixed_us, per_param_us = (ratio * aten_op_us for ratio in ZERO3_STEP_TO_ATEN_OP)
    print(f"step: {step[0]:.0f} µs a step, {step[1]:.1f} µs a parameter (rms {step[2]:.1%}); bundled "
          f"{fixed_us:.0f} / {per_param_us:.1f} µs (costmodels.engines.ZERO3_STEP_TO_ATEN_OP)")
    print(f"deepspeed-zero3-host: fwd_module_us={fwd[0]:.1f} fwd_param_us={fwd[1]:.1f} bwd_module_us={bwd[0]:.1f} "
          f"bwd_param_us={bwd[1]:.1f} step_us={step[0]:.0f} step_param_us={step[1]:.1f} "
          f"rms={max(fwd[3], bwd[3], step[2]):.1%} deepspeed={result['deepspeed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
