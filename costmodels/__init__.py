"""Analytic cost models for distributed LLM training: specs, parameter counts, memory, compute, communication,
pipeline schedules and step time, vectorised over numpy arrays of plans.

Depends on numpy and pyyaml only. `costmodels.evaluate.evaluate` is the single entry point over all terms.
"""

from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile, LinkSpec, bundled_profile_names, load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import (AttentionKernel, ClusterSpec, Fp8Recipe, MLASpec, MlpKind, ModelSpec, MoESpec, NormKind,
                              PositionEmbedding, Precision, RopeSpec, RouterSpec, TrainingSpec)

__all__ = [
    "AttentionKernel", "ClusterSpec", "Fp8Recipe", "HardwareProfile", "InputError", "LinkSpec", "MLASpec", "MlpKind", "ModelSpec", "MoESpec",
    "NormKind", "Plan", "PlanArrays", "PositionEmbedding", "Precision", "Recompute", "RopeSpec", "RouterSpec", "TrainingSpec",
    "bundled_profile_names", "load_profile",
]
