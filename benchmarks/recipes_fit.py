"""Do the layouts the frameworks ship fit? Every performance recipe of the framework packages the conformance extra
installs, read through autopar's own readers and priced for memory (issue 43).

    python benchmarks/recipes_fit.py [--recipes DIR] [--conformance-python PATH] [--all]

- Megatron-Bridge 0.6.2's performance recipes (megatron/bridge/perf_recipes/<family>/<gpu>/*.py: one function per
  model, GPU count, GPU and precision): benchmarks/bridge_recipes.py builds each recipe's ConfigContainer under the
  conformance venv and writes it as the YAML Bridge writes (to_yaml); this script reads each YAML with
  autopar.bridge_config.read_bridge_config (what `autopar estimate --from-bridge-config FILE` runs), takes the model
  Bridge's config names (its hf_model_id, a bundled preset, with the shape the config sets), the GPU and GPU count
  from the recipe's name, and prices its memory with autopar's cost model (costmodels.scoring.estimate).
- NeMo 2's recommended configs: not read. nemo_toolkit is not in the conformance extra (its performance configs are a
  CSV in NeMo's repository scripts, not in an installable package).
- torchtitan 0.3.0: its bundled training configs name no GPU and no GPU count (torchtitan's run script takes NGPU
  from the environment), so none counts towards the target; they are listed as refused with that reason.

One line per recipe: the recipe, model, GPU × count, plan, predicted peak GiB (the worst pipeline stage), the GPU's HBM
GiB, the peak's share of HBM, and the switches the recipe sets that change memory and that no cost term prices (each
named once in a legend below the table). A recipe that cannot be priced is refused, with its reason (a GPU autopar has
no profile for, a model it does not bundle, a setting it cannot represent). The last line:

    recipes-fit: recipes=N within_hbm=K median_peak_of_hbm=P% refused=R

N recipes priced, K of them with a peak within the GPU's HBM, P the median of peak / HBM over the N, R refused (each
reason counted on the line before it). The peak is compared with the whole HBM, not autopar's planning limit (which
keeps 20% free by default): these layouts ran.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GIB = 2**30
PROFILE_OF_GPU = {"h100": "h100", "b200": "b200", "gb200": "gb200"}
"""Bridge's GPU folders -> autopar's bundled profiles. b300, gb300, vr200 and r100 have none (shared/reference has no
measured or specified figures for them): their recipes are refused."""


@dataclass
class Priced:
    recipe: str
    model: str
    gpu: str
    num_gpus: int
    plan: str
    peak_gib: float
    hbm_gib: float
    not_priced: list[str] = field(default_factory=list)
    launcher: list[str] = field(default_factory=list)
    """What Bridge's performance launcher changes before it trains (benchmarks/bridge_recipes.launcher_overrides)."""
    worst: str = ""
    """Where the peak is: the worst pipeline rank's model states and activations, its largest terms."""
    doc_disagrees: str = ""
    """Where the recipe's docstring states a layout (`TP=4 PP=8 CP=2`) other than its code sets: both (the code is
    what runs and what is priced)."""
    double_mbs_gib: float = 0.0
    """The peak with twice the micro-batch (the next size a recipe could take), 0 when the global batch does not
    split into it."""

    @property
    def at_largest_mbs(self) -> bool:
        """Twice the micro-batch would not fit the GPU (or does not split the global batch): the recipe's
        micro-batch is as large as its HBM allows."""
        return not self.double_mbs_gib or self.double_mbs_gib > self.hbm_gib

    @property
    def share(self) -> float:
        return self.peak_gib / self.hbm_gib


def build_recipes(python: str, out: Path) -> None:
    subprocess.run([python, str(REPO / "benchmarks" / "bridge_recipes.py"), str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def price_recipe(entry: dict, folder: Path) -> "Priced | str":
    """The recipe priced, or the reason it is refused."""
    import autopar
    from autopar.bridge_config import bridge_model_spec, read_bridge_config
    from autopar.models import preset_for_hub_id
    from costmodels.errors import InputError
    from costmodels.scoring import estimate
    from costmodels.specs import TrainingSpec

    if "error" in entry:
        missing = re.search(r"Failed to load configuration from (\S+) ", entry["error"])
        if missing:
            return f"autopar bundles no config.json for {missing.group(1)} (the recipe reads it from the Hub)"
        return f"recipe does not build here: {entry['error']}"
    gpu = PROFILE_OF_GPU.get(entry["gpu"])
    if gpu is None:
        return f"no autopar profile for GPU {entry['gpu']}"
    if not entry.get("num_gpus"):
        return "the recipe's name gives no GPU count"
    try:
        run = read_bridge_config(folder / entry["yaml"])
    except InputError as error:
        return f"reader: {error.message}"
    preset = preset_for_hub_id(run.hf_model_id) if run.hf_model_id else None
    if preset is None:
        return f"no bundled model for {run.hf_model_id or 'the config'}"
    try:
        model = bridge_model_spec(run, autopar.load_model(preset))
        cluster = autopar.make_cluster(gpu=gpu, num_gpus=entry["num_gpus"])
        training = run.training_spec(TrainingSpec())
        result = estimate(model, cluster, training, run.plan)
        double_gib = double_mbs_peak_gib(model, cluster, training, run.plan)
    except InputError as error:
        reason = f"{error.field}: {error.message}"
        return f"{reason} ({WORLD_RULE_SOURCE})" if "(rule world)" in reason else reason
    return Priced(recipe=entry["function"].removesuffix("_config"), model=preset, gpu=gpu,
                  num_gpus=entry["num_gpus"], plan=run.plan.short(), peak_gib=result.peak_memory_bytes / GIB,
                  hbm_gib=cluster.profile.hbm_bytes / GIB, not_priced=list(run.not_priced),
                  launcher=list(entry.get("launcher_overrides", [])), worst=worst_stage_summary(result),
                  doc_disagrees=docstring_disagreement(entry.get("doc", ""), run.plan), double_mbs_gib=double_gib)


DOC_LAYOUT = re.compile(r"\b(TP|PP|CP|EP|ETP|VP)=(\d+)")
"""A layout size in a recipe's docstring (Bridge's perf recipes: 'Llama3.1 405B pretrain: 128× B200, BF16, TP=4 PP=8
CP=2')."""


def docstring_disagreement(doc: str, plan) -> str:
    """'docstring TP=4 PP=8 CP=2, code tp4 pp16 cp1' where a size the docstring states differs from the plan the
    recipe's code sets; '' where it states none or all agree."""
    found = DOC_LAYOUT.findall(doc)
    stated = {("vpp" if name == "VP" else name.lower()): int(value) for name, value in found}
    actual = {name: getattr(plan, name) for name in stated}
    if all(actual[name] == value for name, value in stated.items()):
        return ""
    written = " ".join(f"{name}={value}" for name, value in found)
    return f"docstring {written}, code " + " ".join(f"{name}{actual[name]}" for name in stated)


def double_mbs_peak_gib(model, cluster, training, plan) -> float:
    """The peak memory of `plan` with twice its micro-batch, GiB; 0 where Megatron could not run it (the global
    batch does not split into it, or the interleaved schedule's micro-batches no longer divide by pp)."""
    from costmodels.errors import InputError
    from costmodels.scoring import estimate

    double = replace(plan, mbs=2 * plan.mbs)
    dp = double.dp(cluster.num_gpus)
    if not dp or training.global_batch_size % (dp * double.mbs):
        return 0.0
    try:
        return estimate(model, cluster, training, double).peak_memory_bytes / GIB
    except InputError:
        return 0.0


def worst_stage_summary(result) -> str:
    """The worst pipeline rank's model states and activations (costmodels.memory's groups) and its three largest
    terms, in GiB."""
    from costmodels import memory

    stage = result.stages[result.worst_stage]
    terms = stage.terms_bytes
    states = sum(v for k, v in terms.items() if k in memory.MODEL_STATE_TERMS) / GIB
    activations = sum(v for k, v in terms.items() if k in memory.ACTIVATION_TERMS) / GIB
    largest = sorted(terms.items(), key=lambda kv: -kv[1])[:3]
    return (f"stage {stage.stage} ({stage.layers:g} layers): model states {states:.1f} GiB, activations "
            f"{activations:.1f} GiB; largest " + ", ".join(f"{k} {v / GIB:.1f}" for k, v in largest))


WORLD_RULE_SOURCE = ("Megatron-Core refuses it too: parallel_state.initialize_model_parallel raises 'world_size is not "
                     "divisible by' tp·pp·cp or etp·ep·pp")


COMMON = "--bf16 --use-distributed-optimizer --sequence-parallel --cross-entropy-loss-fusion "
NEMO_340B = (COMMON + "--use-precision-aware-optimizer --grad-reduce-in-bf16 --tp-comm-overlap "
             "--defer-embedding-wgrad-compute --wgrad-deferral-limit 22 --tensor-model-parallel-size 8 "
             "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 12 --micro-batch-size 1 "
             "--seq-length 4096 ")
"""NeMo 2's Nemotron-4 340B performance run (scripts/performance/llm/pretrain_nemotron4_340b.py): the recipe's
pretrain_performance_optimizations (nemo/collections/llm/recipes/nemotron4_340b.py: grad_reduce_in_fp32 False,
MegatronCommOverlapCallback(tp_comm_overlap=True, defer_embedding_wgrad_compute=True, wgrad_deferral_limit=22)),
then scripts/performance/helpers.py set_precision_configs (bf16: use_precision_aware_optimizer True)."""
GPT_OSS = ("--bf16 --use-distributed-optimizer --cross-entropy-loss-fusion --grad-reduce-in-bf16 "
           "--recompute-granularity selective --recompute-modules layernorm moe_act --tensor-model-parallel-size 1 "
           "--pipeline-model-parallel-size 4 --expert-model-parallel-size 8 --seq-length 4096 "
           "--global-batch-size 1280 --num-experts 128 --moe-token-dispatcher-type alltoall "
           "--use-precision-aware-optimizer ")
"""Megatron-Bridge's GPT-OSS-120B H100 workload (scripts/performance/configs/gpt_oss, 0.4.2 to 0.6.x:
BASE_GPT_OSS_120B_CONFIG micro_batch_size=1, H100: pipeline_model_parallel_size=4, recompute_modules layernorm and
moe_act), bf16 with the launcher's precision-aware optimizer."""
ISSUE_LAYOUTS: tuple[tuple[str, str, str, int, str], ...] = (
    ("Nemotron-4 340B on 128 H100 as NeMo 2's performance script runs it (bf16 gradients, precision-aware "
     "optimizer, output-layer wgrad deferred, gbs 32)", "nemotron-4-340b", "h100", 128,
     NEMO_340B + "--global-batch-size 32"),
    ("Nemotron-4 340B, the same on 256 H100 (NeMo's recommended_model_configs/model_configs_h100.csv: 256 GPUs, "
     "gbs 64)", "nemotron-4-340b", "h100", 256, NEMO_340B + "--global-batch-size 64"),
    ("GPT-OSS-120B tp1 pp4 ep8 mbs1, Bridge's shipped H100 layout", "gpt-oss-120b", "h100", 64,
     GPT_OSS + "--micro-batch-size 1"),
    ("GPT-OSS-120B tp1 pp4 ep8 mbs4: not a shipped H100 layout (mbs 4 is the GB200/B200 one, on pp 1)",
     "gpt-oss-120b", "h100", 64, GPT_OSS + "--micro-batch-size 4"),
    ("Llama 3.1 405B fp8 (tensorwise, fp8 parameters), embedding and loss counted as layers",
     "llama-3.1-405b", "h100", 1024,
     COMMON + "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather --grad-reduce-in-bf16 "
     "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 8 "
     "--context-parallel-size 2 --micro-batch-size 1 --seq-length 8192 --global-batch-size 512 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --num-layers 126"),
    ("Llama 3.1 405B tp4 pp8 vpp8 cp2 on 128 B200 (Bridge's V1 B200 workload; its flat recipe's docstring)",
     "llama-3.1-405b", "b200", 128,
     COMMON + "--grad-reduce-in-bf16 --use-precision-aware-optimizer --tensor-model-parallel-size 4 "
     "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 8 --context-parallel-size 2 "
     "--micro-batch-size 1 --seq-length 8192 --global-batch-size 768 --account-for-embedding-in-pipeline-split "
     "--account-for-loss-in-pipeline-split --num-layers 126"),
    ("DeepSeek-V3 tp1 pp16 ep8, mla_up_proj recomputed, bf16 Adam moments (Bridge's DeepSeek-V3 optimizer)",
     "deepseek-v3", "b200", 256,
     "--bf16 --use-distributed-optimizer --cross-entropy-loss-fusion --grad-reduce-in-bf16 "
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 --expert-model-parallel-size 8 "
     "--micro-batch-size 1 --seq-length 4096 --global-batch-size 2048 --num-experts 256 "
     "--recompute-granularity selective --recompute-modules mla_up_proj --use-precision-aware-optimizer "
     "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --moe-token-dispatcher-type flex "
     "--pipeline-model-parallel-layout 'Et*4|(t*4|)*14tmL'"),
    ("DeepSeek-V3's own layout Et|(tt|)*30mL (estimate only: 61 layers on pp 8 vpp 4)",
     "deepseek-v3", "h100", 1024,
     "--bf16 --use-distributed-optimizer --sequence-parallel --cross-entropy-loss-fusion --grad-reduce-in-bf16 "
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 64 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --seq-length 4096 --global-batch-size 8192 "
     "--num-experts 256 --recompute-granularity selective --recompute-modules mla_up_proj mlp "
     "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 "
     "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'"),
)
"""The production layouts issue 43 names, each as the Megatron-LM command it ran with (as far as its framework's
recipe says: the switches are in the command), read through --from-megatron-args (autopar.megatron_args)."""


def issue_layouts() -> list[str]:
    import autopar
    from autopar.megatron_args import parse_megatron_args
    from costmodels.scoring import estimate
    from costmodels.specs import TrainingSpec

    lines = []
    for what, name, gpu, num_gpus, command in ISSUE_LAYOUTS:
        run = parse_megatron_args(command)
        cluster = autopar.make_cluster(gpu=gpu, num_gpus=num_gpus)
        result = estimate(autopar.load_model(name), cluster, run.training_spec(TrainingSpec()), run.plan)
        peak, hbm = result.peak_memory_bytes / GIB, cluster.profile.hbm_bytes / GIB
        lines.append(f"  {peak:6.1f} of {hbm:4.0f} GiB ({100 * peak / hbm:3.0f}%)  {gpu} x{num_gpus}  "
                     f"{run.plan.short()[:60]}  {what}")
    return lines


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=Path, help="a folder benchmarks/bridge_recipes.py wrote (default: build "
                                                     "them now with --conformance-python)")
    parser.add_argument("--conformance-python", default=str(REPO / ".venv-conformance" / "bin" / "python"),
                        help="the conformance venv's python (megatron-bridge 0.6.2 installed)")
    args = parser.parse_args(argv)
    folder = args.recipes
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="autopar-recipes-"))
        if not Path(args.conformance_python).exists():
            print(f"recipes-fit: no conformance venv at {args.conformance_python}; build it as .ci/run does, or "
                  "give --recipes", file=sys.stderr)
            return 2
        build_recipes(args.conformance_python, folder)
    index = json.loads((folder / "index.json").read_text())
    priced: list[Priced] = []
    refused: list[tuple[str, str]] = []
    for entry in index:
        outcome = price_recipe(entry, folder)
        name = (entry.get("function") or entry["module"]).removesuffix("_config")
        if isinstance(outcome, str):
            refused.append((name, outcome))
        else:
            priced.append(outcome)
    legend: dict[str, str] = {}

    def switch_ids(switches: list[str]) -> str:
        ids = []
        for text in switches:
            key = text.split(":", 1)[0]
            legend.setdefault(key, text.split(":", 1)[1].strip() if ":" in text else "")
            ids.append(key)
        return ", ".join(ids) or "-"

    print(f"{'recipe':64} {'model':16} {'GPU':>11} {'plan':44} {'peak GiB':>8} {'HBM GiB':>7} {'of HBM':>6}  "
          "not priced")
    for p in priced:
        print(f"{p.recipe:64} {p.model:16} {p.gpu + ' x' + str(p.num_gpus):>11} {p.plan:44} {p.peak_gib:8.1f} "
              f"{p.hbm_gib:7.0f} {100 * p.share:5.0f}%  {switch_ids(p.not_priced)}")
    if legend:
        print("\nnot priced (what each changes):")
        for key, what in legend.items():
            print(f"  {key}: {what}")
    launched = Counter(change for p in priced for change in p.launcher)
    if launched:
        print("\nset by Bridge's performance launcher before training (priced):")
        for change, count in launched.most_common():
            print(f"  {count:3d} recipes  {change}")
    over = [p for p in priced if p.share > 1.0]
    if over:
        print("\nover HBM:")
        for p in over:
            print(f"  {p.recipe}: {p.peak_gib:.1f} GiB of {p.hbm_gib:.0f} ({p.plan}); {p.worst}"
                  + (f"; its {p.doc_disagrees}" if p.doc_disagrees else ""))
    disagree = [p for p in priced if p.doc_disagrees]
    if disagree:
        print("\nrecipes whose docstring states another layout than their code sets (priced as the code sets it):")
        for p in disagree:
            print(f"  {p.recipe}: {p.doc_disagrees}; {100 * p.share:.0f}% of HBM")
    print("\nmedian peak of HBM by model (at largest mbs: twice the recipe's micro-batch would not fit, or does not "
          "split the global batch):")
    for model in sorted({p.model for p in priced}):
        group = [p for p in priced if p.model == model]
        shares = [p.share for p in group]
        print(f"  {model:16} {len(shares):3d} recipes  median {100 * statistics.median(shares):3.0f}%  "
              f"range {100 * min(shares):3.0f}-{100 * max(shares):3.0f}%  at largest mbs "
              f"{sum(p.at_largest_mbs for p in group)}")
    within = [p for p in priced if p.share <= 1.0]
    tuned = [p for p in within if p.at_largest_mbs]
    if within:
        print(f"  within HBM: {len(tuned)} of {len(within)} at their largest micro-batch; the other "
              f"{len(within) - len(tuned)} (median {100 * statistics.median([p.share for p in within if p not in tuned] or [0]):.0f}% of HBM) "
              "would fit twice it")
    print("\nrefused:")
    for reason, count in Counter(reason for _, reason in refused).most_common():
        names = [name for name, why in refused if why == reason]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} recipes)" if len(names) > 3 else "")
        print(f"  {count:3d}  {reason}: {shown}")
    print("  NeMo 2 recommended configs: not read (nemo_toolkit is not in the conformance extra)")
    titan = torchtitan_configs(args.conformance_python)
    print(f"  torchtitan 0.3.0 train configs ({titan}): not read (they name no GPU and no GPU count; autopar has no "
          "reader for torchtitan's Trainer.Config)")
    print("\nthe production layouts of issue 43 (through --from-megatron-args):")
    for line in issue_layouts():
        print(line)
    median = statistics.median(p.share for p in priced) if priced else float("nan")
    within = sum(1 for p in priced if p.share <= 1.0)
    print(f"recipes-fit: recipes={len(priced)} within_hbm={within} median_peak_of_hbm={100 * median:.0f}% "
          f"refused={len(refused)}")
    return 0


def torchtitan_configs(python: str) -> str:
    """How many train configs torchtitan's installed config registries define (`def <name>() -> Trainer.Config`)."""
    if not Path(python).is_file():
        return f"no interpreter at {python}: give --conformance-python"
    site = subprocess.run([python, "-c", "import torchtitan, os; print(os.path.dirname(torchtitan.__file__))"],
                          capture_output=True, text=True)
    if site.returncode != 0:
        return "torchtitan not installed"
    count = sum(len(re.findall(r"^def \w+\(\) -> Trainer\.Config", path.read_text(), re.MULTILINE))
                for path in Path(site.stdout.strip()).rglob("config_registry.py"))
    return f"{count} in its config registries"


if __name__ == "__main__":
    sys.exit(main())
