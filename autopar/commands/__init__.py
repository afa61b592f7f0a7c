"""Sub-commands of the `autopar` CLI, and the argument helpers they share.

Each command module here defines `register(subparsers)` and `run(args) -> int` and imports nothing heavy at module
level (see autopar/cli.py). `solve`, `estimate` and `explain` take the same model, cluster and training flags, built
by the `add_*_arguments` helpers below and converted to the frozen specs by the `*_from_args` helpers. Validation
is never repeated here: the specs' own checks raise `InputError`, which the CLI prints as one line (exit 2).

Flag names follow DESIGN.md §1 (`--tp`, `--pp`, `--vpp`, ...); spellings from Megatron-LM are accepted as aliases
where they are common (`--global-batch-size`, `--micro-batch-size`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import TYPE_CHECKING, Callable, TextIO

if TYPE_CHECKING:  # only for annotations: importing the specs pulls in numpy
    from autopar.megatron_args import MegatronRun
    from costmodels.plan import Plan
    from costmodels.scoring import Estimate
    from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

from costmodels.limits import MAX_GLOBAL_BATCH, MAX_NUM_GPUS, MAX_SEQ_LEN  # noqa: E402 (light: no numpy)
from costmodels.specs import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ_LEN  # noqa: E402 (autopar.cli has it loaded already)

DEFAULT_GPU = "h100"


# ---- argument types: a bad value is one line naming the flag (argparse prefixes 'argument --flag: ') ------------

ASCII_INTEGER = re.compile(r"[+-]?[0-9]+")
ASCII_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
MAX_DIGITS = 30
"""Digits a whole-number flag may have before it is refused by its length alone: every count autopar takes is at
most 2^24 (costmodels/limits.py), so a longer number is not converted, compared or echoed whole (a 10,000-digit
--gpus used to come back as a 10 KB error line)."""
SHOWN_CHARACTERS = 24
"""How much of a refused value an error message repeats."""


def shown_value(text: str) -> str:
    """`text` quoted for an error message, cut to SHOWN_CHARACTERS with its full length named."""
    if len(text) <= SHOWN_CHARACTERS:
        return repr(text)
    return f"{text[:SHOWN_CHARACTERS]!r}… ({len(text):,} characters)"


def integer(text: str, field: str = "", limit: int = 0) -> int:
    """An integer flag value in ASCII digits (no `1_6`, no full-width `８`, which Python's int() reads); the range
    is checked by the spec the value goes into. A number of more than MAX_DIGITS digits is refused here, naming the
    flag's `field` and `limit` where the caller gives them (`at_most`)."""
    stripped = text.strip()
    if not ASCII_INTEGER.fullmatch(stripped):
        raise argparse.ArgumentTypeError(f"expected a whole number in the digits 0-9, got {shown_value(text)}")
    digits = len(stripped.lstrip("+-"))
    if digits > MAX_DIGITS:
        bound = f"{field} is at most {limit:,}" if field else "every count autopar takes is at most 16,777,216"
        raise argparse.ArgumentTypeError(f"a {digits:,}-digit number, {shown_value(text)}, is over autopar's limit: "
                                         f"{bound} (costmodels/limits.py)")
    return int(stripped, 10)


def at_most(field: str, limit: int) -> Callable[[str], int]:
    """`integer` for a flag whose spec field is bounded by `limit` (costmodels.limits): a number too long to convert
    is refused naming them."""
    def parse(text: str) -> int:
        return integer(text, field, limit)

    parse.__name__ = f"integer ({field})"
    return parse


def number(text: str) -> float:
    """A real-number flag value (finite), in ASCII (`0.5`, `1e-3`; not `inf`, `nan`, `1_0` or full-width digits)."""
    stripped = text.strip()
    if not ASCII_NUMBER.fullmatch(stripped):
        raise argparse.ArgumentTypeError(f"expected a number such as 0.5 or 1e-3, got {shown_value(text)}")
    value = float(stripped)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {shown_value(text)}")
    return value


# ---- adding flags ----------------------------------------------------------------------------------------------

def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="bundled preset (see `autopar models`), a config.json file, a model directory, "
                             "or a Hugging Face id already in the local cache")
    parser.add_argument("--allow-network", action="store_true",
                        help="download MODEL's config.json from the Hugging Face Hub when it is not in the local "
                             "cache (default: offline)")


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--gpu", default=None,
                       help=f"GPU type of a bundled profile (see `autopar gpus`); default {DEFAULT_GPU}")
    group.add_argument("--gpus", "--num-gpus", dest="num_gpus", type=at_most("num_gpus", MAX_NUM_GPUS), default=None,
                       metavar="N",
                       help="number of GPUs; default one node (the profile's GPUs per node)")
    group.add_argument("--gpus-per-node", type=at_most("gpus_per_node", MAX_NUM_GPUS), default=None, metavar="N",
                       help="GPUs per node, >= 1; default from the profile (8; 4 on GB200)")
    group.add_argument("--nvlink-domain-gpus", type=at_most("nvlink_domain_gpus", MAX_NUM_GPUS), default=None,
                       metavar="N",
                       help="GPUs of the job on one NVLink fabric, whole nodes; default: one node, or on GB200 NVL72 "
                            "the largest even share of a 72-GPU rack (64 of 256 GPUs)")
    group.add_argument("--headroom", type=number, default=0.2, metavar="FRACTION",
                       help="fraction of GPU memory kept free, in [0, 1); default 0.2 (the guide's 20%%)")
    group.add_argument("--profile", default=None, metavar="FILE",
                       help="hardware profile YAML (e.g. from `autopar calibrate`) instead of --gpu")
    group.add_argument("--allow-cpu-profile", action="store_true",
                       help="accept a --profile measured on a CPU (`autopar calibrate --allow-cpu`), for testing "
                            "the calibration pipeline; its numbers describe that CPU, not a GPU")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    # defaults None, filled in by training_from_args: a typed value, even the default's, is told from none
    # (commands.output_flags checks typed ones against --from-megatron-args)
    group.add_argument("--seq-len", "--seq-length", dest="seq_len", type=at_most("seq_len", MAX_SEQ_LEN), default=None,
                       metavar="S", help=f"sequence length in tokens; default {DEFAULT_SEQ_LEN}")
    group.add_argument("--global-batch", "--global-batch-size", "--gbs", dest="global_batch",
                       type=at_most("global_batch_size", MAX_GLOBAL_BATCH),
                       default=None, metavar="B",
                       help=f"global batch in sequences per step; default {DEFAULT_GLOBAL_BATCH}")
    group.add_argument("--precision", default=None, metavar="{bf16,fp8}",
                       help="GEMM precision; default bf16 (fp8 needs H100 or later)")
    group.add_argument("--fp8-recipe", default=None, metavar="{delayed,tensorwise,blockwise,mxfp8}",
                       help="how Transformer Engine scales the fp8 tensors (Megatron-Core --fp8-recipe): delayed "
                            "(amax history), tensorwise (per-tensor current scaling: an amax pass before each cast), "
                            "blockwise (1x128 blocks, Hopper and later) or mxfp8 (32-element blocks, Blackwell only); "
                            "with --precision fp8; default delayed, Megatron-Core's")
    group.add_argument("--grad-reduce-in-bf16", action="store_true",
                       help="keep the main gradients and reduce them over data parallel in bf16 (Megatron-LM "
                            "--grad-reduce-in-bf16; NeMo / Megatron-Bridge grad_reduce_in_fp32=False, as Bridge's "
                            "performance recipes run): 2 bytes per gradient in memory and on the wire; default fp32")
    group.add_argument("--fp8-param-gather", action="store_true",
                       help="keep the weights as fp8 parameters, with no bf16 copy, and all-gather them over data "
                            "parallel in fp8 (MXFP8 at zero 1: in bf16, through the gradient buffer), as Megatron-LM "
                            "--fp8-param-gather and NeMo's / Megatron-Bridge's fp8 presets run; with --precision fp8 "
                            "and --zero 1 or higher")
    group.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                       help="attention stores the a·s² score matrix (no FlashAttention / fused attention)")
    group.add_argument("--attention-kernel", default="auto", metavar="{auto,fa2,fa3,cudnn,fa1,fa_triton}",
                       help="fused attention kernel the core runs: auto (what Megatron-Core's --attention-backend "
                            "auto gets from Transformer Engine: cuDNN on Hopper and later, FlashAttention-2 on "
                            "Ampere), fa2, fa3 (Hopper only), cudnn, or the kernels FlashAttention-2 replaced "
                            "(A100 only): fa1 (FlashAttention v1) and fa_triton (FlashAttention in Triton, MPT's "
                            "attn_impl triton); default auto")
    group.add_argument("--cross-entropy", dest="cross_entropy", default=None, metavar="{fused,unfused,xentropy}",
                       help="the loss kernels: fused (Megatron --cross-entropy-loss-fusion), unfused (Megatron-LM's "
                            "default and PyTorch's eager loss: an fp32 copy of the logits, kept) or xentropy "
                            "(apex / flash-attn's single-kernel loss, llm-foundry's fused_crossentropy); "
                            "default: the engine's (fused under Megatron-Core, unfused under torchtitan, DeepSpeed "
                            "and plain PyTorch, xentropy compiled and under llm.c)")
    group.add_argument("--no-fused-cross-entropy", dest="cross_entropy", action="store_const", const="unfused",
                       help="the same as --cross-entropy unfused")
    group.add_argument("--pipeline-schedule", default=None, metavar="{1f1b,zb-1p,zb-2p}",
                       help="pipeline schedule: 1f1b (Megatron-Core's; interleaved for plans with vpp > 1), or the "
                            "zero-bubble schedules of arXiv 2401.10241 (not interleaved; no recompute but the attention "
                            "core's): zb-1p (1F1B's peak of p micro-batches, on every rank) and zb-2p (2p - 1, no "
                            "bubble); the zero-bubble ones run in "
                            "sail-sg's Megatron-LM fork, which no export targets; default 1f1b")
    group.add_argument("--offload-modules", nargs="+", default=None, metavar="M",
                       help="Megatron-Core's fine-grained activation offloading (Megatron-LM "
                            "--fine-grained-activation-offloading --offload-modules): what these modules save for "
                            "the backward goes to host memory, of attn_norm, qkv_linear, core_attn, attn_proj, "
                            "mlp_norm, expert_fc1, moe_act, fused_group_mlp; priced in memory (about two layers' "
                            "worth stays on the GPU), and in time where the copies outlast the layers they overlap "
                            "(term offload_copies, at the GPU's host link: PCIe or NVLink-C2C); default none")
    group.add_argument("--activation-offload-fraction", dest="offload_fraction", type=number, default=None,
                       metavar="F", help="with --offload-modules: the share of their offload groups offloaded, the "
                                         "first of each model chunk in forward order (Megatron-LM's flag); default 1")
    group.add_argument("--moe-capacity-factor", type=number, default=None, metavar="F",
                       help="cap tokens per expert at F × the balanced share (GShard/Switch; Megatron-Core "
                            "--moe-expert-capacity-factor): the tokens past it are dropped, not computed and not "
                            "counted in model FLOPs or MFU; default dropless")
    group.add_argument("--moe-imbalance-factor", type=number, default=1.0, metavar="F",
                       help="busiest expert rank's load over a balanced one, dropless routing (>= 1); default 1")
    group.add_argument("--moe-dispatcher", default="alltoall", metavar="{alltoall,deepep}",
                       help="MoE token dispatcher: alltoall (NCCL all-to-all, one copy per routed expert) or deepep "
                            "(DeepEP through Megatron-Core's flex dispatcher: one copy per destination rank over "
                            "NVLink, per destination node over InfiniBand); default alltoall")
    group.add_argument("--expert-gemm", default=None, metavar="{cublas,grouped,loop}",
                       help="how the routed experts' GEMMs run: cublas (a cuBLAS GEMM per expert: Megatron-Core with "
                            "Transformer Engine's GroupedLinear), grouped (one grouped kernel: torchtitan's "
                            "torch._grouped_mm) or loop (a Python loop over the experts: Hugging Face's eager MoE "
                            "blocks); default: the framework's (cublas; grouped for torchtitan; loop for deepspeed "
                            "and pytorch)")
    engine = parser.add_argument_group("engine (what runs the step: its kernel launches and host synchronisations "
                                       "are priced; --framework picks it, megatron by default)")
    engine.add_argument("--compile", action="store_true",
                        help="torch.compile'd blocks (torchtitan's [compile] enable, a compiled PyTorch model): "
                             "Inductor's fused kernels, one graph call per block and pass; torchtitan, pytorch, "
                             "deepspeed")
    engine.add_argument("--cuda-graph-impl", default=None, metavar="{none,local,transformer_engine}",
                        help="Megatron-Core CUDA graphs (Megatron-LM's flag): the captured modules of every layer "
                             "replay as one graph each; megatron, nemo, bridge, verl; default none")
    engine.add_argument("--cuda-graph-modules", nargs="+", default=None, metavar="M",
                        help="with --cuda-graph-impl: the modules captured, of attn, mlp, moe, moe_router, "
                             "moe_preprocess (Megatron-LM's flag); default the whole layer")
    engine.add_argument("--fused-kernels", action="store_true",
                        help="the model's norms, RoPE and activations are fused kernels (apex, Transformer Engine, "
                             "xformers, flash-attn or Liger ops) rather than eager PyTorch ops; pytorch, deepspeed")
    engine.add_argument("--deepspeed-version", default=None, metavar="V",
                        help="the DeepSpeed release that runs the step (with --framework deepspeed): before 0.6, "
                             "ZeRO-3 gathered every parameter on its own behind a device synchronisation; default "
                             "the release autopar targets (0.19)")
    overlap = parser.add_argument_group("communication overlap (Megatron-LM flag names and defaults: off but for "
                                        "the interleaved schedule's P2P; the exports write what you set)")
    overlap.add_argument("--overlap-grad-reduce", action="store_true",
                         help="reduce gradients bucket by bucket during the backward pass")
    overlap.add_argument("--overlap-param-gather", action="store_true",
                         help="all-gather the distributed optimizer's parameters during the next forward "
                              "(needs --overlap-grad-reduce)")
    overlap.add_argument("--tp-comm-overlap", action="store_true",
                         help="overlap the sequence-parallel all-gather/reduce-scatter with the linear GEMMs "
                              "(Transformer Engine userbuffers; plans with SP)")
    overlap.add_argument("--overlap-moe-expert-parallel-comm", dest="moe_a2a_overlap", action="store_true",
                         help="overlap the expert-parallel all-to-all of one micro-batch with another's compute")
    overlap.add_argument("--no-overlap-p2p-communication", dest="overlap_p2p_comm", action="store_false",
                         help="block on every stage-to-stage transfer of the interleaved schedule (by default "
                              "Megatron-LM leaves its steady-state backward sends in flight beside the next chunk)")
    overlap.add_argument("--nccl-ctas", type=integer, default=16, metavar="N",
                         help="SMs an NCCL collective holds while it overlaps compute (one CTA per channel; "
                              "NCCL_DEBUG=INFO prints 'N coll channels', NCCL_MAX_CTAS caps it); the overlapped "
                              "compute runs on the other SMs; 0 prices NCCL overlap as free (Transformer Engine's "
                              "16 userbuffer SMs under --tp-comm-overlap stay); default 16")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Every knob of one plan (DESIGN.md §1), for `autopar estimate` and `explain`: one flag per `Plan` field, its
    help, Megatron-LM flag and default text from the field's metadata (costmodels.plan.knob). Defaults are None, so
    the flags a user typed can be told apart (`given_plan_flags`); `plan_from_args` fills in the rest."""
    from dataclasses import fields

    from costmodels.plan import Plan

    group = parser.add_argument_group("plan (DESIGN.md §1 names; Megatron-LM flags in brackets)")
    for knob in fields(Plan):
        meta = knob.metadata
        text = meta["help"] + (f" [{meta['megatron_flag']}]" if meta["megatron_flag"] else "")
        text += f"; default {meta['default_text']}"
        flag = "--" + knob.name.replace("_", "-")
        if knob.type == "bool":
            pair = group.add_mutually_exclusive_group()
            pair.add_argument(flag, dest=knob.name, action="store_true", default=None, help=text)
            pair.add_argument(f"--no-{flag[2:]}", dest=knob.name, action="store_false", help=f"no {meta['help']}")
        else:
            group.add_argument(flag, *meta["aliases"], dest=knob.name, default=None, metavar=meta["metavar"],
                               type=integer if knob.type == "int" else str, help=text.replace("%", "%%"))


def plan_defaults() -> dict[str, object]:
    """What a plan flag means when it is not given: the Plan field's default, except sp (None = on when tp > 1)."""
    from dataclasses import fields

    from costmodels.plan import Plan

    return {knob.name: None if knob.name == "sp" else knob.default for knob in fields(Plan)}


def given_plan_flags(args: argparse.Namespace) -> list[str]:
    """The plan flags the user typed, as flags ('--tp', '--no-sp', ...), in DESIGN.md §1 order."""
    given = []
    for dest in plan_defaults():
        value = getattr(args, dest, None)
        if value is not None:
            given.append("--no-sp" if dest == "sp" and value is False else "--" + dest.replace("_", "-"))
    return given


def add_relax_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--relax", action="append", default=[], metavar="RULE",
                        help="do not enforce one of the guide's rules (tp_node, cp_needs_sp_tp); repeatable")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


# ---- flags -> specs --------------------------------------------------------------------------------------------

def model_from_args(args: argparse.Namespace, stderr: "TextIO | None" = None) -> "ModelSpec":
    """The model; the loader's warnings (an unknown model_type read as a known family) are printed as one
    `autopar: warning:` line each on stderr."""
    import warnings

    from autopar.models import load_model  # transformers only loads for model types without a fast path

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(args.model, allow_network=getattr(args, "allow_network", False))
    for warning in caught:
        print(f"autopar: warning: {warning.message}", file=stderr if stderr is not None else sys.stderr)
    return model


def cluster_from_args(args: argparse.Namespace, num_gpus: "int | None" = None) -> "ClusterSpec":
    """The cluster of the flags; `num_gpus` (a launch command's GPU count) stands in when --gpus was not given."""
    from costmodels.errors import InputError
    from costmodels.hardware import load_profile
    from costmodels.specs import ClusterSpec

    if args.profile is not None and args.gpu is not None:
        raise InputError("profile", "give either --gpu or --profile, not both (the profile names its GPU)")
    profile = load_profile(args.profile if args.profile is not None else (args.gpu or DEFAULT_GPU))
    if args.profile is not None:  # a calibrated file's raw measurements must read cleanly too (never half-used)
        from autopar.calibrate.calibration_section import check_profile_calibration
        check_profile_calibration(profile, allow_cpu=getattr(args, "allow_cpu_profile", False))
    gpus_per_node = getattr(args, "gpus_per_node", None)
    if gpus_per_node is not None and gpus_per_node < 1:  # the spec reads 0 as "the profile's": not what was typed
        raise InputError("gpus_per_node", f"must be a positive whole number, got {gpus_per_node}; leave "
                                          f"--gpus-per-node out for the profile's {profile.gpus_per_node}")
    if args.num_gpus is not None:
        num_gpus = args.num_gpus
    elif num_gpus is None:
        num_gpus = gpus_per_node or profile.gpus_per_node
    domain = getattr(args, "nvlink_domain_gpus", None)
    if domain is not None and domain < 1:
        raise InputError("nvlink_domain_gpus", f"must be a positive whole number, got {domain}; leave "
                                               "--nvlink-domain-gpus out for the profile's rule (one node, or the "
                                               f"job's share of its {profile.nvlink_domain_size}-GPU NVLink domain)")
    return ClusterSpec(profile=profile, num_gpus=num_gpus, gpus_per_node=gpus_per_node or 0,
                       headroom=args.headroom, nvlink_domain=domain or 0)


CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
"""Megatron-LM 0.19's --cuda-graph-impl choices that capture layers (full_iteration graphs a whole step)."""
EXPERT_GEMM_OF_ENGINE = {"megatron": "cublas", "torchtitan": "grouped", "deepspeed": "loop", "pytorch": "loop",
                         "native": "cublas"}
"""How each engine runs routed experts unless --expert-gemm says: TE's GroupedLinear (a cuBLAS GEMM per expert),
torchtitan's torch._grouped_mm, Hugging Face's eager loop over experts (DeepSpeed's and a plain PyTorch loop's
models)."""


def engine_fields(args: argparse.Namespace) -> dict[str, object]:
    """TrainingSpec's engine fields from --framework (or --emit), --compile, --cuda-graph-impl/-modules,
    --fused-kernels and --deepspeed-version; each refused where the engine has no such thing."""
    from autopar.export.names import ENGINE_OF_FRAMEWORK, framework_name
    from costmodels.engines import engine_loss
    from costmodels.errors import InputError

    framework = getattr(args, "framework", None) or getattr(args, "emit", None)
    name = framework_name(framework, field="framework") if framework else "megatron"
    engine = ENGINE_OF_FRAMEWORK[name]
    impl = getattr(args, "cuda_graph_impl", None)
    modules = getattr(args, "cuda_graph_modules", None)
    if impl is not None and impl not in CUDA_GRAPH_IMPLS:
        raise InputError("cuda_graph_impl", f"unknown --cuda-graph-impl {impl!r}; use one of "
                                            f"{', '.join(CUDA_GRAPH_IMPLS)} (full_iteration graphs are not priced)")
    graphs = impl not in (None, "none")
    if modules is not None and not graphs:
        raise InputError("cuda_graph_modules", "--cuda-graph-modules names what --cuda-graph-impl captures; add "
                                               "--cuda-graph-impl transformer_engine")
    if graphs and engine != "megatron":
        raise InputError("cuda_graph_impl", f"--cuda-graph-impl is Megatron-Core's; {name} does not run it")
    compiled = bool(getattr(args, "compile", False))
    if compiled and engine not in ("torchtitan", "pytorch", "deepspeed"):
        raise InputError("compile", f"--compile is torch.compile of whole blocks, which {name} does not run "
                                    "(Megatron-Core compiles its small fusions itself, priced as it runs them); use "
                                    "--framework torchtitan, pytorch or deepspeed, or drop --compile")
    fused = bool(getattr(args, "fused_kernels", False))
    if fused and engine not in ("pytorch", "deepspeed"):
        raise InputError("fused_kernels", f"--fused-kernels describes an eager PyTorch model's kernels; {name} "
                                          "runs its own (priced as they are); drop it or use --framework pytorch or "
                                          "deepspeed")
    version = getattr(args, "deepspeed_version", None)
    serial = False
    if version is not None:
        if engine != "deepspeed":
            raise InputError("deepspeed_version", "--deepspeed-version goes with --framework deepspeed")
        serial = _version_below(version, (0, 6), "deepspeed_version")
    return dict(engine=engine, launch="cuda_graph" if graphs else ("compile" if compiled else "eager"),
                cuda_graph_modules=tuple(modules or ()), cuda_graph_impl=impl if graphs else "transformer_engine",
                fused_kernels=fused, zero3_serial_fetch=serial,
                expert_gemm=getattr(args, "expert_gemm", None) or EXPERT_GEMM_OF_ENGINE[engine],
                cross_entropy=getattr(args, "cross_entropy", None) or engine_loss(engine, compiled).value)


def _version_below(text: str, limit: tuple[int, ...], field: str) -> bool:
    """Whether a release number like '0.5.10' is below `limit`; InputError for anything else."""
    from costmodels.errors import InputError

    parts = text.strip().lstrip("v").split(".")
    if not 1 <= len(parts) <= 4 or not all(part.isdigit() and len(part) <= 6 for part in parts):
        raise InputError(field, f"expected a release number such as 0.5.10, got {text[:40]!r}")
    return tuple(int(part) for part in parts) < limit


def training_from_args(args: argparse.Namespace) -> "TrainingSpec":
    from costmodels.specs import TrainingSpec

    recipe = getattr(args, "fp8_recipe", None)
    precision = args.precision or "bf16"
    if recipe is not None and str(precision).strip().lower() != "fp8" \
            and getattr(args, "from_megatron_args", None) is None \
            and getattr(args, "from_bridge_config", None) is None:   # an imported run's precision: output_flags
        from costmodels.errors import InputError

        raise InputError("fp8_recipe", f"--fp8-recipe {recipe} only applies with --precision fp8; add it or drop "
                                       "--fp8-recipe")
    seq_len = DEFAULT_SEQ_LEN if args.seq_len is None else args.seq_len
    global_batch = DEFAULT_GLOBAL_BATCH if args.global_batch is None else args.global_batch
    return TrainingSpec(seq_len=seq_len, global_batch_size=global_batch, precision=precision,
                        fp8_recipe=recipe or "delayed", flash_attention=args.flash_attention,
                        attention_kernel=args.attention_kernel,
                        pipeline_schedule=getattr(args, "pipeline_schedule", None) or "1f1b",
                        moe_capacity_factor=args.moe_capacity_factor,
                        moe_imbalance_factor=args.moe_imbalance_factor, moe_dispatcher=args.moe_dispatcher,
                        **engine_fields(args),
                        overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather,
                        tp_comm_overlap=args.tp_comm_overlap, moe_a2a_overlap=args.moe_a2a_overlap,
                        overlap_p2p_comm=args.overlap_p2p_comm, nccl_ctas=args.nccl_ctas,
                        offload_modules=tuple(" ".join(getattr(args, "offload_modules", None) or ()).replace(
                            ",", " ").split()),
                        offload_fraction=1.0 if getattr(args, "offload_fraction", None) is None
                        else args.offload_fraction,
                        grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
                        # an imported command says whether its weights are fp8 (output_flags notes a typed flag)
                        fp8_param_gather=args.fp8_param_gather and getattr(args, "from_megatron_args", None) is None
                        and getattr(args, "from_bridge_config", None) is None)


def plan_from_args(args: argparse.Namespace) -> "Plan":
    from costmodels.errors import InputError
    from costmodels.plan import Plan

    knobs = {dest: default if getattr(args, dest, None) is None else getattr(args, dest)
             for dest, default in plan_defaults().items()}
    if knobs["sp"] is None:
        knobs["sp"] = knobs["tp"] > 1
    if getattr(args, "recompute_modules", None) is not None and str(knobs["recompute"]).strip().lower() != "selective":
        raise InputError("recompute_modules", "--recompute-modules only applies with --recompute selective; add it "
                                              "or drop --recompute-modules")
    return Plan(**knobs)   # Plan refuses a layout with a first/last split beside it


def specs_from_args(args: argparse.Namespace, load_model: "Callable[[], ModelSpec] | None" = None,
                    stderr: "TextIO | None" = None,
                    imported: "MegatronRun | None" = None) -> "tuple[ModelSpec, ClusterSpec, TrainingSpec]":
    """Model, cluster and training from the shared flags, checked against each other (precision on the GPU).

    The cheap specs are built first so a typo in --gpu or --seq-len is reported before a model is loaded.
    `load_model` replaces `model_from_args(args)` (a command that already needed the model passes its loader).
    `imported` (--from-megatron-args) supplies the launch command's sequence length, global batch, precision,
    overlap switches, attention backend, MoE dispatcher and loss kernels (`MegatronRun.training_spec`) and GPU count
    (unless --gpus was given).
    Inputs that are valid but have no effect or look wrong for this model are warned about on stderr
    (`input_warnings`).
    """
    from costmodels.scoring import require_precision_supported

    cluster = cluster_from_args(args, num_gpus=imported.num_gpus if imported is not None else None)
    training = training_from_args(args)
    if imported is not None:
        training = imported.training_spec(training)
    require_precision_supported(cluster, training)
    from costmodels.compute import attention_kernel_runs

    attention_kernel_runs(cluster.profile, training)  # InputError now for a kernel this GPU has no curve for
    model = load_model() if load_model is not None else model_from_args(args)
    for warning in input_warnings(model, training):
        print(f"autopar: warning: {warning}", file=stderr if stderr is not None else sys.stderr)
    return model, cluster, training


def plan_input_warnings(model: "ModelSpec", training: "TrainingSpec", plan: "Plan") -> list[str]:
    """Overlap switches that this plan cannot run with (Megatron-Core refuses them there): priced exposed and left
    out of the exports; one line each."""
    from costmodels.plan import PlanArrays
    from costmodels.steptime import ep_a2a_overlap_applies

    warnings = []
    if model.is_moe and training.moe_a2a_overlap and not ep_a2a_overlap_applies(model, training,
                                                                                 PlanArrays.from_plans([plan]))[0]:
        warnings.append(f"--overlap-moe-expert-parallel-comm has no effect on {plan.short()}: Megatron-Core runs it "
                        "only with EP > 1, an interleaved pipeline (--vpp > 1) when pp > 1, no full recompute, "
                        "'moe' not recomputed and at most one MTP layer; the all-to-all is priced exposed and the "
                        "flag is not exported")
    from costmodels.plan import RecomputeModule

    modules = RecomputeModule.names(plan.recompute_modules)
    for idle, lacks in (([m for m in modules if m in MOE_ONLY_MODULES and not model.is_moe], "no MoE layers"),
                        ([m for m in modules if m == "mla_up_proj" and model.mla is None],
                         "no multi-latent attention"),
                        ([m for m in modules if m == "layernorm" and not model.num_separate_norms(model.is_moe)],
                         "its norms fused into the linear layers after them (Transformer Engine's "
                         "LayerNormLinear: input_layernorm and pre_mlp_layernorm are IdentityOp)")):
        if idle:
            warnings.append(f"--recompute-modules {','.join(idle)} has no effect: {model.name} has {lacks} "
                            "(Megatron-Core recomputes nothing there)")
    return warnings


def optimizer_step_warnings(result: "Estimate") -> list[str]:
    """With bf16 gradients, where the optimizer step's fp32 gradient copy (costmodels.memory.
    optimizer_step_grad_copy_bytes) outweighs the activations it replaces: the step, not the backward, is the peak
    of that stage, which the estimate does not price; one line."""
    from costmodels import memory
    from costmodels.plan import PlanArrays
    from costmodels.specs import Engine

    # the activations and working buffers are freed at the step; DDP's buckets, TE's registered userbuffers and the
    # CUDA graphs' static inputs stay for the whole run, and every gradient is there
    freed = (set(memory.ACTIVATION_TERMS) | set(memory.BUFFER_TERMS) | set(memory.GRADIENT_TERMS)) \
        - {"ddp_gradient_buckets", "tp_comm_userbuffers", "cuda_graph_attention_masks", "cuda_graph_loader_batches"}
    plans = PlanArrays.from_plans([result.plan])
    step_peaks = [(sum(v for name, v in stage.terms_bytes.items() if name not in freed)
                   + float(memory.full_gradient_bytes(result.model, result.cluster, result.training, plans,
                                                      stage.stage)[0])
                   + float(memory.optimizer_step_grad_copy_bytes(result.model, result.cluster, result.training, plans,
                                                                 stage.stage)[0]), stage.stage)
                  for stage in result.stages]
    peak, stage = max(step_peaks)
    if peak <= result.peak_memory_bytes:
        return []
    over = " (over the limit: the step would run out of memory)" if peak > result.memory_limit_bytes else ""
    megatron = result.training.engine is Engine.MEGATRON
    who = "Megatron copies them" if megatron else "an fp32-master optimizer copies them"
    sharded = "the distributed optimizer" if megatron else "a sharded optimizer"
    return [f"bf16 gradients: at the optimizer step {who} to fp32 after the activations are freed, "
            f"and stage {stage} then holds {peak / 2**30:.2f} GiB{over}, above the "
            f"{result.peak_memory_bytes / 2**30:.2f} GiB priced for the backward"
            + (f"; {sharded} (--zero 1) copies only its shard" if result.plan.zero == 0 else "")]


MOE_ONLY_MODULES = ("moe_act", "moe", "shared_experts")
"""Recompute modules that exist only in MoE layers (Megatron-Core recompute_modules)."""


def input_warnings(model: "ModelSpec", training: "TrainingSpec") -> list[str]:
    """Inputs autopar accepts but that have no effect, or that the model was not built for; one line each."""
    from costmodels.specs import MoEDispatcher, PositionEmbedding

    warnings = []
    if model.moe is None and training.moe_capacity_factor is not None:
        warnings.append(f"--moe-capacity-factor {training.moe_capacity_factor:g} has no effect: {model.name} is "
                        "a dense model (no experts)")
    if model.moe is not None and training.moe_capacity_factor is not None and training.moe_capacity_factor < 1.0:
        from costmodels.compute import moe_kept_token_fraction

        kept = moe_kept_token_fraction(training)
        warnings.append(f"--moe-capacity-factor {training.moe_capacity_factor:g} drops {1 - kept:.0%} of the routed "
                        f"tokens under balanced routing (each expert keeps {kept:.0%} of its share; Megatron-Core "
                        "passes the rest around the expert on the residual): the experts' FLOPs, model TFLOP/s and "
                        "MFU count only the tokens kept")
    if model.moe is None and training.moe_imbalance_factor != 1.0:
        warnings.append(f"--moe-imbalance-factor {training.moe_imbalance_factor:g} has no effect: {model.name} is "
                        "a dense model (no experts)")
    if model.moe is None and training.moe_dispatcher is not MoEDispatcher.ALLTOALL:
        warnings.append(f"--moe-dispatcher {training.moe_dispatcher.value} has no effect: {model.name} is a dense "
                        "model (no experts)")
    if model.moe is None and training.expert_gemm.value != EXPERT_GEMM_OF_ENGINE[training.engine.value]:
        warnings.append(f"--expert-gemm {training.expert_gemm.value} has no effect: {model.name} is a dense "
                        "model (no experts)")
    if 0 < model.max_position_embeddings < training.seq_len:
        if model.position_embedding is PositionEmbedding.ROPE:
            warnings.append(f"seq_len {training.seq_len} is beyond {model.name}'s max_position_embeddings "
                            f"{model.max_position_embeddings}: RoPE runs, but quality past the trained length needs "
                            "RoPE scaling / long-context training (the Megatron-LM export sets "
                            f"--max-position-embeddings {training.seq_len})")
        else:
            warnings.append(f"seq_len {training.seq_len} is beyond {model.name}'s max_position_embeddings "
                            f"{model.max_position_embeddings}: learned absolute positions have no embedding past "
                            "it; the model needs a larger position table to train at this length")
    return warnings
