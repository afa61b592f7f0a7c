"""The eight fronts the launch configs are checked on (tests/test_conformance_*.py, benchmarks/conformance.py).

Each is a Pareto front a user would ask for, chosen so that together they exercise every knob the exporters write:
dense TP/PP/DP with ZeRO (Llama 3.1 70B), interleaving with uneven first/last stages and the embedding/loss slots
(Llama 3.1 405B on 512 GPUs), expert parallelism (Mixtral 8x22B), expert parallelism with MLA and multi-token
prediction (DeepSeek-V3), context parallelism at 128K tokens (Llama 3.1 70B, seq_len 131072), and fp8 with its
recipe on Blackwell (Llama 3.1 70B in MXFP8 on 64 B200, bf16 weights: the presets that keep fp8 ones are overridden),
gradients reduced in bf16 (Llama 3.1 8B on 32 H100, --grad-reduce-in-bf16, as Megatron-Bridge's performance recipes
run), and fp8 parameters (Llama 3.1 8B in delayed scaling on 32 H100, --fp8-param-gather: the weights kept and
all-gathered in fp8, which torchtitan and DeepSpeed cannot run).

Six more (issue 44, the fronts a user launching the configs tried): Qwen3-30B-A3B on 128 H200, GPT-OSS-120B on 64
B200, Llama 3.1 405B at 32K tokens on 1,024 H100 (context parallelism), Mixtral-8x22B on 256 H100, Nemotron-4 340B
in fp8 on 512 H100 (the last three have no Megatron-Bridge recipe, Nemotron-4's architecture no AutoBridge
converter), and a small model read from its config.json (Llama 3.2 1B's, shipped in benchmarks/conformance_models)
on 8 A100.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "conformance_models"
"""Models given as a config.json (a user's own model, no bundled preset)."""


@dataclass(frozen=True)
class FrontCase:
    name: str
    model: str
    num_gpus: int
    seq_len: int
    global_batch_size: int
    gpu: str = "h100-80gb"
    precision: str = "bf16"
    fp8_recipe: str = "delayed"
    grad_reduce_in_fp32: bool = True
    fp8_param_gather: bool = False


FRONT_CASES: tuple[FrontCase, ...] = (
    FrontCase("dense-70b", "llama-3.1-70b", 64, 8192, 512),
    FrontCase("405b-interleaved", "llama-3.1-405b", 512, 8192, 1024),
    FrontCase("mixtral", "mixtral-8x22b", 128, 4096, 1024),
    FrontCase("deepseek-v3", "deepseek-v3", 1024, 4096, 4096),
    FrontCase("128k-cp", "llama-3.1-70b", 128, 131072, 64),
    FrontCase("fp8-b200", "llama-3.1-70b", 64, 8192, 512, gpu="b200-180gb", precision="fp8", fp8_recipe="mxfp8"),
    FrontCase("bf16-grads", "llama-3.1-8b", 32, 8192, 256, grad_reduce_in_fp32=False),
    FrontCase("fp8-params", "llama-3.1-8b", 32, 8192, 256, precision="fp8", fp8_param_gather=True),
    FrontCase("qwen3-moe-h200", "qwen3-30b-a3b", 128, 4096, 512, gpu="h200-141gb"),
    FrontCase("gpt-oss-b200", "gpt-oss-120b", 64, 4096, 512, gpu="b200-180gb"),
    FrontCase("405b-cp-1024", "llama-3.1-405b", 1024, 32768, 256),
    FrontCase("mixtral-256", "mixtral-8x22b", 256, 4096, 1024),
    FrontCase("nemotron4-fp8", "nemotron-4-340b", 512, 4096, 768, precision="fp8"),
    FrontCase("config-json-1b", str(CONFIG_MODELS / "llama-3.2-1b" / "config.json"), 8, 8192, 64,
              gpu="a100-80gb"),
)


def case_specs(case: FrontCase):
    """(model, cluster, training) of one case."""
    from autopar.models import load_model
    from costmodels.hardware import load_profile
    from costmodels.specs import ClusterSpec, TrainingSpec

    return (load_model(case.model), ClusterSpec(profile=load_profile(case.gpu), num_gpus=case.num_gpus),
            TrainingSpec(seq_len=case.seq_len, global_batch_size=case.global_batch_size, precision=case.precision,
                         fp8_recipe=case.fp8_recipe, grad_reduce_in_fp32=case.grad_reduce_in_fp32,
                         fp8_param_gather=case.fp8_param_gather))


def solve_case(case: FrontCase, framework: str | None = None):
    """The front of one case (all of it, or only what `framework` can run)."""
    from autopar.export.capabilities import framework_rules
    from autopar.search.solve import solve

    return solve(*case_specs(case), extra_rules=framework_rules(framework) if framework else ())
