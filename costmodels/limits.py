"""The largest inputs autopar accepts, one named bound per quantity, and the check that enforces them.

Why bounds at all: the search enumerates divisors, pipeline splits and layers, and ranks plans by integer units
(autopar.search.objective). Unbounded inputs turn into hangs (divisors of 10^19), out-of-memory (10^9 layers) or
overflowed integers. Each bound is far past the largest published model or cluster, so a real input never meets it:

- hidden_size: 25,600 in the largest Megatron GPT (1T, Narayanan et al. 2021, Table 1); bound 2^20.
- num_layers: 128 in the same table, 126 in Llama 3.1 405B; bound 192, 1.5x the deepest published. Not the
  size of a number but the search's time: the per-stage layout refinement's chain DP grows with layers squared per
  structure, and a 192-layer Llama-3.1-8B-shaped model is the deepest whose whole `autopar solve` stays within the
  10 s command target (`python benchmarks/solver.py --commands deepest`; 256 layers took 10-11 s, 4,096 took 142 s
  and 3.7 GB before its exit 1).
- ffn_hidden_size: 4·h for the above, 53,248 for Llama 3.1 405B; bound 2^22.
- vocab_size: 256,000 (Gemma); bound 2^24.
- attention heads, KV heads, head_dim: bounded by hidden_size's bound.
- experts: 256 routed (DeepSeek-V3); bound 2^16.
- seq_len: 1M-token contexts exist; bound 2^24 tokens.
- global batch: 16M tokens (Llama 3) is 4,096 sequences of 4,096; bound 2^24 sequences.
- GPUs: 100k-GPU clusters exist; bound 2^20.
- GPU memory (profile `memory.hbm_gib`): 141 GiB on H200; bound 2^20 GiB.
"""

from __future__ import annotations

from costmodels.errors import InputError

MAX_HIDDEN_SIZE = 2**20
MAX_NUM_LAYERS = 192
MAX_FFN_HIDDEN_SIZE = 2**22
MAX_VOCAB_SIZE = 2**24
MAX_NUM_HEADS = 2**20
MAX_HEAD_DIM = 2**20
MAX_NUM_EXPERTS = 2**16
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**24
MAX_NUM_GPUS = 2**20
MAX_HBM_GIB = 2**20


LIMIT_REASONS = {
    "num_layers": "the deepest model whose search (per-stage pipeline layouts included) stays within its 10 s target; "
                  "the deepest published models have 126-128 layers",
}
"""Why a bound is where it is, where that is not "far past any real model" (the module docstring)."""


def require_at_most(value: int | float, limit: int | float, field: str, what: str = "") -> None:
    """Raise `InputError` naming the field and the limit when `value` exceeds it."""
    if value > limit:
        shown = f"{value:,}" if isinstance(value, int) and value.bit_length() <= 96 else f"about 2^{_log2(value)}"
        reason = LIMIT_REASONS.get(field, "real models and clusters stay far below it")
        raise InputError(field, f"{shown} is over autopar's limit of {limit:,}{what}; {reason} "
                                "(costmodels/limits.py)")


def _log2(value: int | float) -> int:
    """floor(log2(value)) of a huge positive number, without converting a huge int to float or text."""
    return value.bit_length() - 1 if isinstance(value, int) else int(__import__("math").log2(value))
