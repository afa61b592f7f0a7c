"""The host side of a training step: what it costs the CPU to enqueue a kernel, by launch path, and the timeline
algebra that turns a stream of launches and device-to-host synchronisations into GPU idle time.

A GPU runs the kernels of one stream in the order the host enqueues them. Enqueueing is asynchronous: while the GPU
works through long kernels the host runs ahead and the queue fills; where kernels are shorter than their enqueue
the host sets the pace; and a device-to-host synchronisation (`.item()`, `.tolist()`, `.cpu()` of a device tensor,
`torch.cuda.synchronize()`) drains the queue, so the kernels after it wait for the host to enqueue them again.

Host costs per launch path (`HostCosts`, the profile's `host:` section, µs in the YAML): fitted to
shared/reference/microbench/host_dispatch_launch_overhead_issue_threads.csv,
cuda_graphs_training_speedup_pytorch_blog.csv (a check) and launch_overhead_small_gemm_dgxc_sample.csv by
`benchmarks/fit_microbench.py` through `autopar profile fit`'s path (autopar.calibrate.fit.fit_host_costs). They
are properties of the host (CPU, Python, PyTorch build, driver), not of the GPU: every bundled profile carries the
same fitted values, and `autopar calibrate` on a team's own machine measures its own.

The timeline of one segment (kernels enqueued back to back, no synchronisation inside) is summarised by three
numbers, a max-plus algebra (the event recurrence of one in-order queue: kernel i starts at
max(end of kernel i-1, host time when it is enqueued)):

    host_s     the host's time to enqueue every kernel of the segment
    gpu_s      the GPU's busy time on them (its kernels and the collectives on its critical path)
    drained_s  when the segment's last kernel ends, counted from a drained queue (the host starts enqueueing and
               the GPU is idle at 0)

A segment ends no earlier than its GPU work after the first enqueue, nor before the host has enqueued all of it and
the GPU has run its last kernel: drained_s = max(gpu_s + first launch, host_s + last kernel) (`Segment.of`; exact
for a stretch of like kernels, a lower bound otherwise). Two segments back to back, Y after X with no sync
between: host_s and gpu_s add, drained_s = max(X.drained_s + Y.gpu_s, X.host_s + Y.drained_s) (`then`); n
identical segments: drained_s = X.drained_s + (n - 1)·max(X.gpu_s, X.host_s) (`repeat`). A synchronisation ends a
chain: the host waits for the GPU and then pays `HostCosts.sync_s` before the next enqueue, so the chains around
it add their drained times (`exposed_s` sums what each chain adds beyond its GPU work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from costmodels.errors import InputError

HOST_FIELDS: dict[str, str] = {
    "aten_op_us": "one eager PyTorch operator called from Python: ATen dispatch and one kernel launch (a C++ "
                  "extension op called from Python costs the same: vLLM's custom op, TE's tex.* kernels)",
    "aten_gemm_us": "one eager torch.matmul / linear called from Python (cuBLAS handle and workspace lookup, "
                    "heuristic, launch)",
    "triton_launch_us": "one Triton kernel launched from Python (torch.compile's Inductor wrapper code, a "
                        "hand-written Triton op)",
    "compiled_call_us": "entering one torch.compile'd graph beyond the launches of its kernels: guard evaluation, "
                        "the generated Python wrapper, its allocations",
    "cuda_graph_replay_us": "one CUDA-graph replay, fixed part (cudaGraphLaunch)",
    "cuda_graph_node_us": "one CUDA-graph replay, per kernel node",
    "launch_us": "one kernel launched from C/C++ with no Python on the path (cudaLaunchKernel / cuLaunchKernel: a "
                 "CUDA-C trainer such as llm.c, the second and later kernels one C++ op launches)",
    "sync_us": "one device-to-host synchronisation beyond draining the queue: the host's wake-up and the copy's "
               "round trip before it enqueues again",
}
"""The profile's `host:` keys (µs) and what each times."""


@dataclass(frozen=True)
class HostCosts:
    """Host seconds per launch, by launch path (HOST_FIELDS; the YAML gives µs)."""

    aten_op_s: float
    aten_gemm_s: float
    triton_launch_s: float
    compiled_call_s: float
    cuda_graph_replay_s: float
    cuda_graph_node_s: float
    launch_s: float
    sync_s: float


DEFAULT_HOST_COSTS_US: dict[str, float] = {
    "aten_op_us": 7.352, "aten_gemm_us": 14.2, "triton_launch_us": 16.89, "compiled_call_us": 35.39,
    "cuda_graph_replay_us": 15.5, "cuda_graph_node_us": 0.5686, "launch_us": 2.697, "sync_us": 9.0,
}
"""What `autopar.calibrate.fit.fit_host_costs` gives on the public microbenchmarks (benchmarks/fit_microbench.py
writes the same into every bundled profile's `host:` section; tests/test_host.py checks the two agree): the values
for a profile without a `host:` section."""

MAX_HOST_US = 100_000.0
"""A host cost above 0.1 s a launch is a unit mistake (the measured paths are 0.6-100 µs)."""


def host_costs_from_us(values_us: Mapping[str, float]) -> HostCosts:
    return HostCosts(**{key[:-3] + "_s": float(values_us[key]) * 1e-6 for key in HOST_FIELDS})


DEFAULT_HOST_COSTS = host_costs_from_us(DEFAULT_HOST_COSTS_US)


def parse_host_section(section: Any, origin: str) -> HostCosts:
    """The optional `host:` section of a profile: every key of HOST_FIELDS a number in (0, MAX_HOST_US] µs; a key
    left out takes DEFAULT_HOST_COSTS_US's value; an unknown key is refused (a typo would silently price nothing)."""
    if section is None:
        return DEFAULT_HOST_COSTS
    if not isinstance(section, dict):
        raise InputError("profile", f"{origin}: host must be a mapping of launch path -> µs (e.g. host: "
                                    "{aten_op_us: 7.3}); see costmodels/profiles/*.yaml")
    values = dict(DEFAULT_HOST_COSTS_US)
    for key, value in section.items():
        if key not in HOST_FIELDS:
            raise InputError("profile", f"{origin}: host.{key} is not a host cost; use one of "
                                        f"{', '.join(HOST_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_HOST_US:
            raise InputError("profile", f"{origin}: field host.{key} must be a number of µs in (0, "
                                        f"{MAX_HOST_US:,.0f}], got {value!r}")
        values[key] = float(value)
    return host_costs_from_us(values)


# ---- the timeline algebra ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    """Kernels enqueued back to back without a synchronisation: (host_s, gpu_s, drained_s), per plan (module
    docstring), with the host time of its first launch and the GPU time of its last kernel."""

    host_s: np.ndarray
    gpu_s: np.ndarray
    drained_s: np.ndarray
    first_host_s: np.ndarray
    last_gpu_s: np.ndarray

    @staticmethod
    def of(host_s, gpu_s, first_host_s, last_gpu_s=0.0) -> "Segment":
        """One stretch of work: `host_s` to enqueue it all, `gpu_s` to run it, `first_host_s` to enqueue its first
        kernel (the GPU idles that long after a drained queue), `last_gpu_s` to run its last (which starts no
        earlier than the host has enqueued everything): drained = max(gpu + first launch, host + last kernel)."""
        host_s, gpu_s, first_host_s, last_gpu_s = np.broadcast_arrays(
            *(np.asarray(x, dtype=float) for x in (host_s, gpu_s, first_host_s, last_gpu_s)))
        first_host_s, last_gpu_s = np.minimum(first_host_s, host_s), np.minimum(last_gpu_s, gpu_s)
        return Segment(host_s, gpu_s, np.maximum(gpu_s + first_host_s, host_s + last_gpu_s), first_host_s,
                       last_gpu_s)

    @staticmethod
    def empty(n: int) -> "Segment":
        zero = np.zeros(n)
        return Segment(zero, zero, zero, zero, zero)

    @staticmethod
    def wait(seconds, n: int) -> "Segment":
        """Host time with no GPU work (the host's wake-up after a synchronisation)."""
        seconds = np.broadcast_to(np.asarray(seconds, dtype=float), (n,))
        return Segment(seconds, np.zeros(n), seconds, seconds, np.zeros(n))

    def then(self, other: "Segment") -> "Segment":
        """`other` enqueued right after this, no synchronisation between."""
        return Segment(self.host_s + other.host_s, self.gpu_s + other.gpu_s,
                       np.maximum(self.drained_s + other.gpu_s, self.host_s + other.drained_s),
                       np.where(self.host_s > 0, self.first_host_s, other.first_host_s),
                       np.where(other.gpu_s > 0, other.last_gpu_s, self.last_gpu_s))

    def repeat(self, count) -> "Segment":
        """`count` (>= 0, per plan) copies back to back; 0 copies is the empty segment."""
        count = np.asarray(count, dtype=float)
        pace = np.maximum(self.gpu_s, self.host_s)
        drained = np.where(count > 0, self.drained_s + np.maximum(count - 1.0, 0.0) * pace, 0.0)
        some = count > 0
        return Segment(count * self.host_s, count * self.gpu_s, drained, np.where(some, self.first_host_s, 0.0),
                       np.where(some, self.last_gpu_s, 0.0))

    def split(self, parts) -> "Segment":
        """One of `parts` (>= 1, per plan) equal shares of this work, starting with its first launch and ending with
        its last kernel."""
        parts = np.asarray(parts, dtype=float)
        return Segment.of(self.host_s / parts, self.gpu_s / parts, self.first_host_s, self.last_gpu_s)

    @property
    def exposed_s(self) -> np.ndarray:
        """What the host adds to this chain's GPU work when the chain starts on a drained queue."""
        return self.drained_s - self.gpu_s
