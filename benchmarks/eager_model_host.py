"""What an eager model's own Python adds to the host time of each kernel it launches in a training step.

costmodels.engines counts the kernels an eager decoder layer launches (EAGER_LAYER_KERNELS, from an op counter) and
prices each at the host profile's eager operator (host.aten_op_us, fitted to the public microbenchmarks: a bare
`torch.add` in a loop, 7.1 µs on A100). Inside a model a kernel costs the host more than that: the layer's Python
(nn.Module calls, the forward's own code), the view and reshape operators between the kernels (dispatched, no
kernel), and the autograd graph the forward records; in the backward the autograd engine's work per node
(input buffers, the ready queue, AccumulateGrad). None of that is in the bare operator's time.

Measured here on torch's CPU build, with weights so small that the kernels themselves take well under a microsecond:

1. a stack of decoder layers runs forward (gradients on) and backward, timed per layer (the difference between 4
   and 2 layers, so the embedding, the loss and the mask are left out);
2. the same forward's and backward's kernel operators (every operator a TorchDispatchMode sees, views and
   allocations left out as in EAGER_LAYER_KERNELS) are replayed bare, one after another with the same arguments,
   no module, no autograd;
3. the difference, per kernel operator of the pass, is what the model adds on the host (µs).

Two eager models of the kinds costmodels.engines prices with `_eager_layer`: nanoGPT's Block (LayerNorm with bias,
one fused QKV linear, the math attention with a causal mask, GELU MLP; nanoGPT master 3adf61e1, written out here)
and Hugging Face's LlamaDecoderLayer (transformers, eager attention; RMSNorm, rotary, q/k/v/o and a gated MLP).
costmodels.engines.EAGER_MODEL_PYTHON_TO_ATEN_OP is the measured µs over the host profile's eager operator (7.352 µs):
Python and C++ on the host, which the same class of server CPU runs at about the same speed (as
DTENSOR_DISPATCH_TO_ATEN_OP and ZERO3_HOOK_TO_ATEN_OP are carried).

    python benchmarks/eager_model_host.py

Prints per model and pass the kernels per layer, the layer's µs, the bare replay's µs and the extra per kernel, and
ends with `eager-model-host: fwd_extra_us=F bwd_extra_us=B fwd_ratio=RF bwd_ratio=RB torch=V` (the medians over the
models; needs torch and transformers, prints that they are not installed otherwise).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from costmodels.engines import MEASURED_ATEN_OP_US  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, TOKENS = 16, 2, 1, 32, 4
"""Weights and activations small enough that the CPU kernels take well under a microsecond each."""
LAYERS = (2, 4)
"""Stacks timed: the per-layer figure is their difference over 2 layers."""
CALLS = 200
REPEATS = 7
NOT_KERNELS = ("view", "transpose", "split", "detach", "expand", "alias", "t.default", "unsqueeze", "squeeze",
               "slice", "permute", "_unsafe_view", "empty", "as_strided", "select", "unbind", "_reshape_alias",
               "lift_fresh", "_to_copy")
"""Operators that launch no kernel (views, allocations), left out of the count as in EAGER_LAYER_KERNELS. (_to_copy
on CPU tensors of the dtype they have is a no-op; on a GPU under autocast it would be a cast kernel.)"""


@dataclass(frozen=True)
class PassCost:
    """One pass of one decoder layer: its kernel operators, the layer's host µs and the bare replay's."""

    kernels: float
    layer_us: float
    bare_us: float

    @property
    def extra_us(self) -> float:
        """What the model adds per kernel operator beyond the bare operator."""
        return (self.layer_us - self.bare_us) / self.kernels


def _is_kernel(func) -> bool:
    name = str(func)
    return not any(part in name for part in NOT_KERNELS)


def _recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        """The kernel operators a pass dispatches, with their arguments, to replay bare."""

        def __init__(self):
            super().__init__()
            self.calls: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _is_kernel(func):
                self.calls.append((func, args, kwargs))
            return func(*args, **kwargs)

    return Record()


def _median_us(run, calls: int = CALLS) -> float:
    """Median over REPEATS of the µs one call of `run` takes (after a warm-up)."""
    for _ in range(20):
        run()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def _recorded_pass(model, x):
    """(forward, backward) kernel operators with their arguments of one training pass of `model` on `x`."""
    record_forward, record_backward = _recorder(), _recorder()
    with record_forward:
        loss = model(x).sum()
    with record_backward:
        loss.backward()
    return record_forward.calls, record_backward.calls


def kernels_per_layer(make_model) -> tuple[float, float]:
    """(forward, backward) kernel operators of one decoder layer (stacks of LAYERS layers, differenced), after a
    warm-up pass (every parameter then holds a gradient, so the backward accumulates into it)."""
    import torch

    counts = []
    for layers in LAYERS:
        torch.manual_seed(0)
        model, x = make_model(layers), torch.randn(1, TOKENS, HIDDEN)
        model(x).sum().backward()
        forward, backward = _recorded_pass(model, x)
        counts.append((len(forward), len(backward)))
    span = LAYERS[1] - LAYERS[0]
    return ((counts[1][0] - counts[0][0]) / span, (counts[1][1] - counts[0][1]) / span)


def _pass_costs(make_model, make_input) -> tuple[PassCost, PassCost]:
    """(forward, backward) of one layer: stacks of LAYERS layers, differenced."""
    import torch

    measured = {}
    for layers in LAYERS:
        torch.manual_seed(0)
        model, x = make_model(layers), make_input()
        for _ in range(3):                       # every parameter holds a gradient: the backward accumulates
            model(x).sum().backward()
        forward_us = _median_us(lambda: model(x))
        step_us = _median_us(lambda: model(x).sum().backward())
        recorded_forward, recorded_backward = _recorded_pass(model, x)

        def replay(calls):
            def run():
                for func, args, kwargs in calls:
                    func(*args, **kwargs)
            return run
        with torch.no_grad():
            bare_forward_us = _median_us(replay(recorded_forward))
            bare_backward_us = _median_us(replay(recorded_backward))
        measured[layers] = (len(recorded_forward), forward_us, bare_forward_us,
                            len(recorded_backward), step_us - forward_us, bare_backward_us)
    low, high = (measured[n] for n in LAYERS)
    per = [(b - a) / (LAYERS[1] - LAYERS[0]) for a, b in zip(low, high)]
    return PassCost(per[0], per[1], per[2]), PassCost(per[3], per[4], per[5])


def nanogpt(layers: int):
    """nanoGPT's Block (model.py at 3adf61e1, dropout 0, the math attention path), `layers` of them."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.c_proj = nn.Linear(HIDDEN, HIDDEN)
            self.register_buffer("bias", torch.tril(torch.ones(TOKENS, TOKENS)).view(1, 1, TOKENS, TOKENS))

        def forward(self, x):
            batch, tokens, channels = x.size()
            q, k, v = self.c_attn(x).split(HIDDEN, dim=2)
            k = k.view(batch, tokens, HEADS, channels // HEADS).transpose(1, 2)
            q = q.view(batch, tokens, HEADS, channels // HEADS).transpose(1, 2)
            v = v.view(batch, tokens, HEADS, channels // HEADS).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :tokens, :tokens] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(batch, tokens, channels)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(HIDDEN, 4 * HIDDEN)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * HIDDEN, HIDDEN)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(HIDDEN)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(HIDDEN)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    return nn.Sequential(*[Block() for _ in range(layers)])


def hf_llama(layers: int):
    """Hugging Face's LlamaDecoderLayer stack (eager attention) behind LlamaModel, fed embeddings."""
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=32,
                         max_position_embeddings=64, attn_implementation="eager")
    model = LlamaModel(config)

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(inputs_embeds=x, use_cache=False).last_hidden_state

    return Body()


MODELS = {"nanogpt": nanogpt, "hf-llama": hf_llama}


def measure() -> dict[str, tuple[PassCost, PassCost]]:
    import torch
    torch.set_num_threads(1)
    return {name: _pass_costs(make, lambda: torch.randn(1, TOKENS, HIDDEN)) for name, make in MODELS.items()}


def main() -> int:
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"eager-model-host: {', '.join(missing)} not installed (pip install torch==2.13.0 transformers)")
        return 0
    import torch
    results = measure()
    print(f"{'model':10s} {'pass':4s} {'kernels':>8s} {'layer us':>9s} {'bare us':>8s} {'extra us/kernel':>16s}")
    for name, passes in results.items():
        for label, cost in zip(("fwd", "bwd"), passes):
            print(f"{name:10s} {label:4s} {cost.kernels:8.1f} {cost.layer_us:9.1f} {cost.bare_us:8.1f} "
                  f"{cost.extra_us:16.2f}")
    fwd = statistics.median(passes[0].extra_us for passes in results.values())
    bwd = statistics.median(passes[1].extra_us for passes in results.values())
    print(f"eager-model-host: fwd_extra_us={fwd:.2f} bwd_extra_us={bwd:.2f} "
          f"fwd_ratio={fwd / MEASURED_ATEN_OP_US:.3f} bwd_ratio={bwd / MEASURED_ATEN_OP_US:.3f} "
          f"torch={torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
