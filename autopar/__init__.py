"""autopar: find every layout of a model on a cluster that fits in memory, and the Pareto-optimal ones.

    import autopar
    model = autopar.load_model("llama-3.1-70b")
    cluster = autopar.make_cluster(gpu="h100-80gb", num_gpus=64)
    train = autopar.Training(seq_len=8192, global_batch_size=1024)
    est = autopar.estimate(model, cluster, train, autopar.Plan(tp=8, pp=4))

Importing autopar is light: transformers, ortools and torch load only on the paths that need them.
"""

from autopar.api import Training, make_cluster
from autopar.errors import Infeasible, InputError
from autopar.models import load_model
from autopar.results import ParetoFront
from autopar.search.solve import solve
from costmodels.plan import Plan, Recompute
from costmodels.scoring import Estimate, estimate
from costmodels.specs import (ClusterSpec, CrossEntropyKernel, ExpertGemm, Fp8Recipe, ModelSpec, PipelineSchedule, Precision,
                              TrainingSpec)

__all__ = [
    "ClusterSpec", "CrossEntropyKernel", "Estimate", "ExpertGemm", "Fp8Recipe", "Infeasible", "InputError", "ModelSpec", "ParetoFront",
    "PipelineSchedule", "Plan", "Precision", "Recompute", "Training", "TrainingSpec", "estimate", "load_model", "make_cluster", "solve",
]
