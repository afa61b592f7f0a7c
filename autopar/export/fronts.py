"""The five fronts the launch configs are checked on (tests/test_conformance_*.py, benchmarks/conformance.py).

Each is a Pareto front a user would ask for, chosen so that together they exercise every knob the exporters write:
dense TP/PP/DP with ZeRO (Llama 3.1 70B), interleaving with uneven first/last stages and the embedding/loss slots
(Llama 3.1 405B on 512 GPUs), expert parallelism (Mixtral 8x22B), expert parallelism with MLA and multi-token
prediction (DeepSeek-V3), and context parallelism at 128K tokens (Llama 3.1 70B, seq_len 131072).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrontCase:
    name: str
    model: str
    num_gpus: int
    seq_len: int
    global_batch_size: int
    gpu: str = "h100-80gb"


FRONT_CASES: tuple[FrontCase, ...] = (
    FrontCase("dense-70b", "llama-3.1-70b", 64, 8192, 512),
    FrontCase("405b-interleaved", "llama-3.1-405b", 512, 8192, 1024),
    FrontCase("mixtral", "mixtral-8x22b", 128, 4096, 1024),
    FrontCase("deepseek-v3", "deepseek-v3", 1024, 4096, 4096),
    FrontCase("128k-cp", "llama-3.1-70b", 128, 131072, 64),
)


def solve_case(case: FrontCase, framework: str | None = None):
    """The front of one case (all of it, or only what `framework` can run)."""
    import autopar

    model = autopar.load_model(case.model)
    cluster = autopar.make_cluster(gpu=case.gpu, num_gpus=case.num_gpus)
    training = autopar.Training(seq_len=case.seq_len, global_batch_size=case.global_batch_size)
    return autopar.solve(model, cluster, training, framework=framework)
