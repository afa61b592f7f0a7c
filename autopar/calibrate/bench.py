"""The microbenchmarks: GEMMs, collectives, memory overheads, timed with torch (imported when they run).

Timing protocol, for every operation: `warmup` untimed runs, then `iters` timed samples; a sample runs the
operation `inner` times back to back and divides (so a 10 µs all-reduce is not swamped by the timer and the
device synchronisation), `inner` chosen from the warm-up so a sample lasts about `target_sample_s`. Collectives
start each sample after a barrier. Every rank times its own samples, and the slowest rank's time for each sample
is kept (a step waits for the slowest GPU), then summarised as median and inter-quartile range.

GEMM shapes are those the cost model produces for a transformer layer (DESIGN.md §4): tokens × hidden × hidden/tp
for the attention projections and tokens × hidden × ffn/tp for the MLP, over several hidden sizes and TP degrees,
plus the weight-gradient GEMM of the MLP (the token dimension as the reduction).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from autopar.calibrate.measurements import Timing, summarise_times


@dataclass(frozen=True)
class TimingSettings:
    warmup: int
    iters: int
    target_sample_s: float
    """Aim for samples this long by repeating short operations within one sample."""
    max_inner: int = 100


@dataclass(frozen=True)
class GemmShape:
    label: str
    m: int
    n: int
    k: int


def gemm_shapes(on_gpu: bool, quick: bool) -> list[GemmShape]:
    """GEMMs of a transformer layer: QKV, attention output, MLP up and down (forward), MLP up weight gradient.

    On a GPU: hidden sizes 2048…12288 and TP 1…8, 4096 and 16384 tokens; --quick keeps two hidden sizes, TP 1
    and 8, 4096 tokens. On a CPU the same family at toy sizes (the point there is exercising the pipeline).
    """
    if on_gpu:
        hiddens, tps, token_counts = ((4096, 8192), (1, 8), (4096,)) if quick else \
            ((2048, 4096, 8192, 12288), (1, 2, 4, 8), (4096, 16384))
    else:
        hiddens, tps, token_counts = ((256, 512), (1, 2), (256,)) if quick else ((512, 1024), (1, 2, 4), (512, 2048))
    shapes = []
    for tokens in token_counts:
        for hidden in hiddens:
            for tp in tps:
                ffn = 4 * hidden
                where = f"h={hidden} tp={tp} tokens={tokens}"
                shapes += [
                    GemmShape(f"qkv {where}", tokens, 3 * hidden // tp, hidden),
                    GemmShape(f"attn-out {where}", tokens, hidden, hidden // tp),
                    GemmShape(f"mlp-up {where}", tokens, ffn // tp, hidden),
                    GemmShape(f"mlp-down {where}", tokens, hidden, ffn // tp),
                    GemmShape(f"mlp-up-wgrad {where}", hidden, ffn // tp, tokens),
                ]
    return shapes


def message_sizes(min_bytes: int, max_bytes: int, quick: bool) -> list[int]:
    """Powers of two from min to max bytes (every fourth power with --quick), max always included."""
    step = 2 if quick else 1
    low, high = int(math.log2(min_bytes)), int(math.log2(max_bytes))
    sizes = [2**e for e in range(low, high + 1, step)]
    if sizes[-1] != 2**high:
        sizes.append(2**high)
    return sizes


# ---- timing --------------------------------------------------------------------------------------------------------

class Timer:
    """Times operations on `device`, with the slowest-rank reduction when a process group is up."""

    def __init__(self, device: "torch.device", settings: TimingSettings, distributed: bool) -> None:
        self.device = device
        self.settings = settings
        self.distributed = distributed

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.distributed:
            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def time(self, op: Callable[[], None], per_sample_runs: int = 1, with_barrier: bool = False) -> Timing:
        """Median and IQR of `op` (which performs `per_sample_runs` operations per call), slowest rank per sample.

        Every rank must call this the same number of times with the same settings (the reductions are
        collectives).
        """
        settings = self.settings
        self.synchronize()
        start = time.perf_counter()
        for _ in range(max(settings.warmup, 1)):
            op()
        self.synchronize()
        single_s = (time.perf_counter() - start) / max(settings.warmup, 1)
        inner = min(settings.max_inner, max(1, math.ceil(settings.target_sample_s / max(single_s, 1e-9))))
        inner = int(self.max_over_ranks([float(inner)])[0])  # every rank must run the same number of ops
        samples = []
        for _ in range(settings.iters):
            if with_barrier:
                self.barrier()
            self.synchronize()
            start = time.perf_counter()
            for _ in range(inner):
                op()
            self.synchronize()
            samples.append((time.perf_counter() - start) / (inner * per_sample_runs))
        return summarise_times(self.max_over_ranks(samples))


# ---- GEMMs ---------------------------------------------------------------------------------------------------------

def time_gemm(timer: Timer, shape: GemmShape, precision: str) -> Timing:
    device = timer.device
    if precision == "bf16":
        a = torch.randn(shape.m, shape.k, device=device, dtype=torch.bfloat16)
        b = torch.randn(shape.k, shape.n, device=device, dtype=torch.bfloat16)
        out = torch.empty(shape.m, shape.n, device=device, dtype=torch.bfloat16)
        op = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    else:
        op = _fp8_gemm(shape.m, shape.n, shape.k, device)
    return timer.time(op)


def _fp8_gemm(m: int, n: int, k: int, device: "torch.device") -> Callable[[], None]:
    """e4m3 × e4m3 → bf16 with per-tensor scales (torch._scaled_mm; the second operand column-major)."""
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
    scale = torch.tensor(1.0, device=device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def fp8_unsupported_reason(device: "torch.device") -> str | None:
    """None when fp8 GEMMs run here; else why not (for the profile's notes)."""
    if device.type != "cuda":
        return "fp8 GEMMs not measured: no GPU"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return f"fp8 GEMMs not measured: {torch.cuda.get_device_name(device)} has no fp8 tensor cores (needs sm_89+)"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"fp8 GEMMs not measured: torch {torch.__version__} has no torch._scaled_mm"
    try:
        _fp8_gemm(64, 64, 64, device)()
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any failure of the probe means fp8 is skipped, with the reason
        return f"fp8 GEMMs not measured: torch._scaled_mm failed ({exc.__class__.__name__}: {str(exc)[:120]})"
    return None


# ---- collectives ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CollectiveGroup:
    """The groups measured at once for one link: this rank's group (None if it sits out) and its size."""

    link: str
    group: object | None
    size: int
    pair_peer: int | None
    """send/recv partner of this rank (global rank), None if unpaired."""
    pair_first: bool
    """This rank sends first in the ping-pong."""


def collective_dtype(device: "torch.device") -> "torch.dtype":
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def usable_bytes(kind: str, size_bytes: int, group_size: int, element_bytes: int) -> int:
    """The message size actually sent: divisible into `group_size` equal chunks of whole elements."""
    chunk = element_bytes * (group_size if kind in ("all_gather", "reduce_scatter", "all_to_all") else 1)
    return max(chunk, size_bytes // chunk * chunk)


def time_collective(timer: Timer, kind: str, size_bytes: int, groups: CollectiveGroup) -> Timing:
    """One collective kind at one size on every group of the link at once; every rank calls this."""
    device, dtype = timer.device, collective_dtype(timer.device)
    element_bytes = torch.tensor([], dtype=dtype).element_size()
    numel = size_bytes // element_bytes
    group, n = groups.group, groups.size
    op: Callable[[], None] = lambda: None  # noqa: E731 - ranks outside every group only join the barriers
    per_sample_runs = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's rename in newer torch
        if kind == "send_recv":
            per_sample_runs = 2  # a ping-pong: there and back
            if groups.pair_peer is not None:
                buffer = torch.empty(numel, dtype=dtype, device=device)
                peer, first = groups.pair_peer, groups.pair_first

                def op() -> None:
                    if first:
                        dist.send(buffer, peer)
                        dist.recv(buffer, peer)
                    else:
                        dist.recv(buffer, peer)
                        dist.send(buffer, peer)
        elif group is not None:
            full = torch.empty(numel, dtype=dtype, device=device)
            part = torch.empty(numel // n, dtype=dtype, device=device)
            all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            received = torch.empty_like(full) if kind == "all_to_all" else full
            op = {
                "all_reduce": lambda: dist.all_reduce(full, group=group),
                "all_gather": lambda: all_gather(full, part, group=group),
                "reduce_scatter": lambda: reduce_scatter(part, full, group=group),
                "all_to_all": lambda: dist.all_to_all_single(received, full, group=group),
            }[kind]
        return timer.time(op, per_sample_runs=per_sample_runs, with_barrier=True)


# ---- memory overheads ----------------------------------------------------------------------------------------------

def cuda_context_bytes(device: "torch.device") -> float:
    """Device memory in use before torch allocates anything: the CUDA context (and driver reservations).

    Call before any allocation on the device; assumes this process has the GPU to itself (one rank per GPU)."""
    free, total = torch.cuda.mem_get_info(device)
    return float(total - free - torch.cuda.memory_reserved(device))


def non_allocator_bytes(device: "torch.device", context_bytes: float) -> float:
    """Device memory in use outside torch's caching allocator, less the CUDA context: NCCL's communicator
    buffers (and library handles), measured after the collectives have run."""
    free, total = torch.cuda.mem_get_info(device)
    return max(0.0, float(total - free - torch.cuda.memory_reserved(device)) - context_bytes)


def allocator_reserve_bytes(device: "torch.device") -> float:
    """Peak reserved minus peak allocated by the caching allocator: memory held but never used (fragmentation)."""
    return max(0.0, float(torch.cuda.max_memory_reserved(device) - torch.cuda.max_memory_allocated(device)))
