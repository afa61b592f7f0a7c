"""Synthetic estimates and fronts for the report and export tests (no cost model needed).

The numbers are made up but structured like the cost model's output: named memory terms per pipeline stage that
sum to the stage total, named step-time terms that sum to the step time. They depend on the plan in simple
monotone ways (more TP → fewer weight bytes per GPU) so the fronts look plausible in the HTML screenshot.
"""

from __future__ import annotations

from autopar.results import ParetoFront
from costmodels.scoring import Estimate, StageMemory
from costmodels.hardware import load_profile
from costmodels.plan import Plan, Recompute
from costmodels.specs import ClusterSpec, ModelSpec, MoESpec, TrainingSpec

GIB = 1024**3


def dense_model(name: str = "llama-like-8b") -> ModelSpec:
    return ModelSpec(name=name, hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=128256, source="synthetic test model")


def moe_model(name: str = "mixtral-like-8x7b") -> ModelSpec:
    return ModelSpec(name=name, hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=32000,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336), source="synthetic")


def cluster(num_gpus: int = 64, gpu: str = "h100-80gb") -> ClusterSpec:
    return ClusterSpec(profile=load_profile(gpu), num_gpus=num_gpus)


def synthetic_estimate(model: ModelSpec, cluster_spec: ClusterSpec, training: TrainingSpec, plan: Plan,
                       violations: tuple[str, ...] = ()) -> Estimate:
    n = cluster_spec.num_gpus
    dp = max(plan.dp(n), 1)
    layer_params = 12 * model.hidden_size**2
    microbatches = training.global_batch_size / (dp * plan.mbs)
    activation_per_layer = training.seq_len * plan.mbs * model.hidden_size * (34 if plan.recompute is Recompute.NONE
                                                                               else 12 if plan.recompute is
                                                                               Recompute.SELECTIVE else 2)
    if plan.sp:
        activation_per_layer /= plan.tp
    activation_per_layer /= plan.cp
    stages = []
    for stage in range(plan.pp):
        if plan.pp == 1:
            layers = model.num_layers
        elif stage == 0 and plan.first_stage_layers:
            layers = plan.first_stage_layers
        elif stage == plan.pp - 1 and plan.last_stage_layers:
            layers = plan.last_stage_layers
        else:
            explicit = (1 if plan.first_stage_layers else 0) + (1 if plan.last_stage_layers else 0)
            layers = (model.num_layers - plan.first_stage_layers - plan.last_stage_layers) / (plan.pp - explicit)
        params = layers * layer_params / plan.tp
        if stage == 0 or stage == plan.pp - 1:
            params += model.vocab_size * model.hidden_size / plan.tp
        shard = {0: (1, 1, 1), 1: (1, 1, dp), 2: (1, dp, dp), 3: (dp, dp, dp)}[plan.zero]
        in_flight = min(plan.pp - stage, microbatches)
        terms = {"weights": 2 * params / shard[0], "gradients": 4 * params / shard[1],
                 "optimizer": 12 * params / shard[2], "activations": activation_per_layer * layers * in_flight,
                 "cuda_context": 0.75 * GIB, "nccl_buffers": 0.5 * GIB}
        stages.append(StageMemory(stage=stage, layers=float(layers), terms_bytes=terms))
    worst = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    tokens = training.tokens_per_step
    compute_s = 6 * 8e9 * tokens / (n * 989e12 * 0.5) * (1.33 if plan.recompute is Recompute.FULL else 1.0)
    time_terms = {"compute": compute_s, "tp_comm": 0.04 * compute_s * (plan.tp - 1),
                  "pp_bubble": compute_s * (plan.pp - 1) / (plan.vpp * microbatches),
                  "dp_comm": 0.02 * compute_s * (1 + plan.zero / 2), "cp_comm": 0.05 * compute_s * (plan.cp - 1)}
    step = sum(time_terms.values())
    return Estimate(model=model, cluster=cluster_spec, training=training, plan=plan, num_microbatches=microbatches,
                    stages=tuple(stages), worst_stage=worst, time_terms_s=time_terms, tokens_per_s=tokens / step,
                    model_tflops_per_gpu=6 * 8e9 * tokens / step / n / 1e12,
                    hardware_tflops_per_gpu=6 * 8e9 * tokens / step / n / 1e12,
                    mfu=6 * 8e9 * tokens / step / n / 989e12,
                    violations=violations)


def synthetic_front(model: ModelSpec, plans: list[Plan], num_gpus: int = 64,
                    training: TrainingSpec | None = None, proven_optimal: bool = True) -> ParetoFront:
    cluster_spec = cluster(num_gpus)
    training = training or TrainingSpec(seq_len=4096, global_batch_size=512)
    estimates = sorted((synthetic_estimate(model, cluster_spec, training, plan) for plan in plans),
                       key=lambda e: e.step_time_s)
    return ParetoFront(model=model, cluster=cluster_spec, training=training, points=tuple(estimates),
                       proven_optimal=proven_optimal, rules=("world", "heads", "layers", "batch", "memory"),
                       relaxed_rules=("cp_needs_sp_tp",), solver="cpsat", solve_time_s=1.25,
                       search_space_size=123456, notes=("synthetic front for tests",))


DENSE_PLANS = [
    Plan(tp=8, pp=1, mbs=1, sp=True, zero=1),
    Plan(tp=4, pp=2, vpp=2, mbs=1, sp=True, zero=1),
    Plan(tp=4, pp=4, vpp=2, mbs=2, sp=True, recompute=Recompute.SELECTIVE, zero=1),
    Plan(tp=2, pp=4, first_stage_layers=6, last_stage_layers=6, mbs=1, sp=True, zero=0),
    Plan(tp=2, pp=4, vpp=2, first_stage_layers=6, last_stage_layers=6, mbs=1, sp=True,
         recompute=Recompute.FULL, recompute_layers=2, zero=1),
    Plan(tp=4, pp=2, cp=2, mbs=1, sp=True, recompute=Recompute.FULL, zero=1),
    Plan(tp=1, pp=1, mbs=4, recompute=Recompute.FULL, zero=3),
    Plan(tp=2, pp=1, mbs=2, sp=True, zero=2),
    Plan(tp=8, pp=2, last_stage_layers=14, mbs=1, sp=True, recompute=Recompute.FULL, recompute_layers=3, zero=1),
]

MOE_PLANS = [
    Plan(tp=2, pp=2, ep=8, etp=1, mbs=1, sp=True, zero=1),
    Plan(tp=4, pp=2, vpp=4, ep=4, etp=2, mbs=1, sp=True, zero=1),
    Plan(tp=2, pp=4, ep=2, mbs=2, sp=True, recompute=Recompute.SELECTIVE, zero=1),
    Plan(tp=1, pp=4, first_stage_layers=5, ep=8, etp=1, mbs=1, recompute=Recompute.FULL, recompute_layers=1),
    Plan(tp=2, pp=2, cp=2, ep=4, etp=1, mbs=1, sp=True, zero=1),
]


def test_synthetic_estimates_are_consistent():
    front = synthetic_front(dense_model(), DENSE_PLANS)
    for estimate in front:
        assert abs(sum(estimate.time_terms_s.values()) - estimate.step_time_s) < 1e-12
        assert estimate.peak_memory_bytes == max(stage.total_bytes for stage in estimate.stages)
        # the stage layers add up to the model's
        assert sum(stage.layers for stage in estimate.stages) == estimate.model.num_layers
