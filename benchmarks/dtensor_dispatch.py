"""What tensor parallelism through DTensor adds to an eager step's host time: how many operators of a decoder layer
run on DTensor arguments, and what each costs the host beyond the same operator on plain tensors.

torchtitan and a plain PyTorch loop shard a layer for tensor parallelism with torch.distributed.tensor.parallel
(torchtitan's plan: SequenceParallel norms, PrepareModuleInput all-gathers before the attention and the MLP,
ColwiseParallel q/k/v and w1/w3, RowwiseParallel o and w2 with Shard(1) outputs). Eager, every operator that reads a
DTensor goes through DTensor's dispatch (its C++ fast path, the cached sharding propagation, unwrapping the local
tensors and wrapping the result) before its kernel is launched; compiled, the graph is traced through DTensor once and
runs on plain tensors.

1. The count: the layer built here with torchtitan's plan (nn.LayerNorm in place of RMSNorm: one operator each way,
   as the fused RMSNorm kernel of a CUDA build runs) on a one-rank CPU mesh, one forward and one backward under a
   TorchDispatchMode that counts the operators whose arguments hold a DTensor. costmodels.engines.dtensor_dispatches
   gives the same counts from the layer's linears, norms and parameters; tests/test_dtensor_dispatch.py holds the two
   equal.
2. The cost: detach, add, mul, mm and silu on small CPU tensors, DTensor against plain, the median of the differences
   (the kernel is the same in both, so the difference is the dispatch). costmodels.engines.DTENSOR_DISPATCH_TO_ATEN_OP
   is that median over the host profile's eager operator (host.aten_op_us, fitted to the public microbenchmarks):
   DTensor's dispatch is Python and C++ on the host, which the same class of server CPU runs at about the same speed.

    python benchmarks/dtensor_dispatch.py

Ends with `dtensor-dispatch: extra_us=X ratio_to_aten_op=R block_fwd=F block_bwd=B torch=V` (needs torch; prints
that it is not installed otherwise).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

BLOCK_SHAPE = {True: (7.0, 2.0, 2.0, 3.0, False), False: (6.0, 2.0, 2.0, 2.0, False)}
"""The blocks built here as costmodels.engines.dtensor_dispatches takes them (gated or not): linears (q, k, v, o and
three or two MLP linears), norms and their parameters (two bias-free norms), gradient sums of inputs read twice or
more (q, k and v: 2; w1 and w3: 1), no linear biases."""
TIMED_CALLS = 20_000
WARMUP_CALLS = 2_000


@contextlib.contextmanager
def one_rank_mesh():
    """A CPU device mesh over a one-rank gloo process group on this machine, destroyed on exit (a test process may
    start another group later)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        raise RuntimeError("a default process group is already initialized in this process")
    with socket.socket() as probe:               # a port no other process on this machine holds
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def build_block(gated: bool, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128):
    """A decoder layer of the shape torchtitan's models have (norm, attention with GQA and RoPE, norm, MLP)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = hidden // heads
            self.wq = nn.Linear(hidden, hidden, bias=False)
            self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.wo = nn.Linear(hidden, hidden, bias=False)

        def forward(self, x, rope):
            batch, tokens, _ = x.shape
            q = self.wq(x).view(batch, tokens, -1, self.head_dim)
            k = self.wk(x).view(batch, tokens, -1, self.head_dim)
            v = self.wv(x).view(batch, tokens, -1, self.head_dim)
            cos, sin = rope

            def rotate(z):
                first, second = z.chunk(2, dim=-1)
                return torch.cat((-second, first), -1) * sin + z * cos
            q, k = rotate(q), rotate(k)
            repeat = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(batch, tokens, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)
            self.w3 = nn.Linear(hidden, ffn, bias=False) if gated else None

        def forward(self, x):
            if self.w3 is None:
                return self.w2(F.gelu(self.w1(x)))
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.LayerNorm(hidden, bias=False)
            self.attention = Attention()
            self.ffn_norm = nn.LayerNorm(hidden, bias=False)
            self.feed_forward = FeedForward()

        def forward(self, x, rope):
            h = x + self.attention(self.attention_norm(x), rope)
            return h + self.feed_forward(self.ffn_norm(h))

    return Block()


def tensor_parallel(block, mesh, gated: bool):
    """torchtitan's tensor-parallel plan of a Llama block (models/llama3/infra/parallelize.py apply_tp)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    if gated:
        plan["feed_forward.w3"] = ColwiseParallel()
    return parallelize_module(block, mesh, plan)


def count_dispatches(gated: bool) -> tuple[int, int]:
    """(forward, backward) operators on DTensor arguments of one tensor-parallel block, after two warm-up steps
    (every parameter then holds a gradient, so the backward accumulates into it)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.on_dtensors = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat, _ = tree_flatten((args, kwargs or {}))
            self.on_dtensors += any(isinstance(a, DTensor) for a in flat)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    with one_rank_mesh() as mesh:
        block = tensor_parallel(build_block(gated), mesh, gated)
        tokens = 16
        x = torch.randn(2, tokens, 64, requires_grad=True)
        rope = (torch.randn(tokens, 1, 16), torch.randn(tokens, 1, 16))
        for _ in range(2):
            block(x, rope).sum().backward()
        forward, backward = Count(), Count()
        with forward:
            out = block(x, rope)
        loss = out.sum()
        with backward:
            loss.backward()
    return forward.on_dtensors, backward.on_dtensors


def dispatch_extra_us() -> tuple[float, dict[str, tuple[float, float]]]:
    """The median over a few operators of (DTensor − plain) µs a call, and each operator's (plain, DTensor) µs."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def per_call_us(call) -> float:
        for _ in range(WARMUP_CALLS):
            call()
        start = time.perf_counter()
        for _ in range(TIMED_CALLS):
            call()
        return (time.perf_counter() - start) / TIMED_CALLS * 1e6

    with one_rank_mesh() as mesh:
        a, b, w = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)
        da, db = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Shard(0)])
        dw = distribute_tensor(w, mesh, [Replicate()])
        ops = {"detach": (lambda: a.detach(), lambda: da.detach()),
               "add": (lambda: a + b, lambda: da + db),
               "mul": (lambda: a * b, lambda: da * db),
               "mm": (lambda: a @ w, lambda: da @ dw),
               "silu": (lambda: F.silu(a), lambda: F.silu(da))}
        times = {name: (per_call_us(plain), per_call_us(dtensor)) for name, (plain, dtensor) in ops.items()}
    return statistics.median(d - p for p, d in times.values()), times


def main() -> int:
    try:
        import torch
    except ImportError:
        print("dtensor-dispatch: torch is not installed (pip install torch==2.13.0, the CPU build)")
        return 0
    from costmodels import engines
    from costmodels.hardware import load_profile

    extra, times = dispatch_extra_us()
    for name, (plain, dtensor) in times.items():
        print(f"  {name:7} plain {plain:6.2f} µs  DTensor {dtensor:6.2f} µs  dispatch {dtensor - plain:5.2f} µs")
    aten_op_us = load_profile("h100-80gb").host_costs.aten_op_s * 1e6
    counts = {gated: count_dispatches(gated) for gated in (True, False)}
    for gated, (forward, backward) in counts.items():
        priced = engines.dtensor_dispatches(*BLOCK_SHAPE[gated])
        print(f"  {'gated (Llama)' if gated else 'plain MLP (GPT)':16} block: {forward} operators on DTensors forward, "
              f"{backward} backward (costmodels.engines.dtensor_dispatches: {priced[0]:.0f}, {priced[1]:.0f})")
    forward, backward = counts[True]
    print(f"dtensor-dispatch: extra_us={extra:.2f} ratio_to_aten_op={extra / aten_op_us:.2f} block_fwd={forward} "
          f"block_bwd={backward} torch={torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
