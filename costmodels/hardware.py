"""Hardware profiles: one YAML file per GPU type in `costmodels/profiles/`, or a user's calibrated file.

A profile is a physical description with few parameters: HBM capacity and bandwidth, peak FLOP/s per precision,
a GEMM-efficiency curve, alpha (latency) and bandwidth per link type (NVLink inside a node, InfiniBand between),
optionally a latency floor and bus bandwidth per collective and group size on each link (section `collectives:`,
fitted from NCCL measurements; a collective or link it does not name falls back to the link's values), and the
fixed memory overheads. Every number carries its provenance (spec sheet, or the fit that produced it).

Units are converted exactly once, here, when the YAML is parsed: GiB → bytes, TFLOP/s → FLOP/s, GB/s and Gb/s →
bytes/s, µs → s. Everything downstream works in base units.
"""

from __future__ import annotations

import difflib
import math
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from costmodels.errors import InputError
from costmodels.host import DEFAULT_HOST_COSTS, HOST_FIELDS, HostCosts, parse_host_section
from costmodels.limits import MAX_HBM_GIB, MAX_NUM_GPUS
from costmodels.units import GIB

SCHEMA_VERSION = 1
LINK_KINDS = ("nvlink", "ib")
COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
OVERLAP_TERMS = ("tp_comm",)
"""The communications a profile's `overlap:` section may hide behind compute, each with the fraction hidden in
[0, 1] (read by costmodels.steptime.overlap_fraction)."""

# ---- the fields a profile may have, and their ranges ------------------------------------------------------------
# A field the cost model does not read is refused by name (a misspelt `peak_fractoin` would otherwise leave the
# default in place without a word); every efficiency is a fraction of a peak, every rate is bounded above far past
# any GPU and below where the step-time sums stay finite. Adding a field to profiles: one entry here.

PROFILE_SECTIONS: Mapping[str, frozenset[str]] = {
    "": frozenset({"schema_version", "name", "display_name", "aliases", "gpus_per_node", "nvlink_domain_size",
                   "memory", "compute", "links", "collectives", "provenance", "elementwise", "overlap",
                   "calibration", "calibration_from_runs", "host"}),
    "host": frozenset(HOST_FIELDS),
    "memory": frozenset({"hbm_gib", "hbm_tb_per_s", "overheads_gib", "host_link_gb_per_s"}),
    "compute": frozenset({"peak_tflops", "gemm_efficiency", "sustained_clock_fraction", "streaming_multiprocessors",
                          "compute_capability", "bf16_flops_per_clock_per_sm", "exp2_per_clock_per_sm"}),
    "compute.peak_tflops": frozenset({"bf16", "fp8"}),
    "links": frozenset(LINK_KINDS),
    "links.nvlink": frozenset({"bandwidth_gb_per_s", "bandwidth_efficiency", "alpha_us"}),
    "links.ib": frozenset({"bandwidth_gbit_per_s", "bandwidth_efficiency", "alpha_us"}),
    "elementwise": frozenset({"traffic_per_activation_byte"}),
}
"""Section (dotted path, "" = the top level) -> the keys it may hold. `memory.overheads_gib` takes any name (each is
a memory term of its own), `compute.gemm_efficiency` the names GEMM_EFFICIENCY_FIELDS matches, `collectives` and
`overlap` are checked where they are read, `provenance`, `calibration` and `calibration_from_runs` are records."""

ATTENTION_KERNEL_NAMES = ("fa1", "fa2", "fa3", "cudnn", "fa_triton")
"""costmodels.compute.ATTENTION_KERNELS, restated because compute imports this module (tests/test_hostile_input.py
checks the two agree)."""
_KERNELS = "|".join(ATTENTION_KERNEL_NAMES)
GEMM_EFFICIENCY_FIELDS: tuple[tuple[str, float, float, str], ...] = (
    # (key pattern, lowest, highest, what the value is)
    (rf"(fp8_|grouped_|grouped_bf16_|attention_|attention_({_KERNELS})_(fwd|bwd)_)?peak_fraction", 1e-6, 1.0,
     "a fraction of the dense peak"),
    (r"grouped_hbm_efficiency", 1e-6, 1.0, "a fraction of the HBM bandwidth"),
    (r"(fp8_)?half_saturation_dim", 0.0, 1e12, "a GEMM dimension (elements)"),
    (r"kernel_floor_us", 0.0, 1e4, "microseconds"),
    (rf"attention_(({_KERNELS})_(fwd|bwd)_)?half_saturation_seq", 0.0, 1e12, "a sequence length (tokens)"),
    (rf"attention_({_KERNELS})_(fwd|bwd)_harness_dispatch_us", 0.0, 1e6, "microseconds"),
)
"""The keys of `compute.gemm_efficiency` (costmodels.compute, costmodels.moe_kernels) with their ranges: fractions
in [1e-6, 1] (autopar.calibrate.fit's bounds), half-saturation lengths in [0, 1e12] (0: no roll-off; a fit that
ends on its 1e-12 bound, as a CPU calibration's does), times bounded."""

RATE_BOUNDS: Mapping[str, tuple[float, float]] = {
    "compute.peak_tflops": (1e-3, 1e5),               # B200 fp8 4,500 TFLOP/s; a CPU's GFLOP/s at the bottom
    "memory.hbm_tb_per_s": (1e-3, 1e3),               # B200 8 TB/s
    "memory.host_link_gb_per_s": (1e-3, 1e5),         # PCIe Gen5 x16 64 GB/s; NVLink-C2C hundreds
    "links.nvlink.bandwidth_gb_per_s": (1e-3, 1e5),   # NVLink 5: 900 GB/s per direction
    "links.ib.bandwidth_gbit_per_s": (8e-3, 8e5),     # 400-800 Gb/s NICs
    "links.alpha_us": (0.0, 1e7),                     # tens of µs; 10 s is a broken measurement
    "collectives.busbw_gb_per_s": (1e-3, 1e5),        # NVLS all-reduce ~480 GB/s bus bandwidth
    "elementwise.traffic_per_activation_byte": (0.0, 1e3),
}
"""Every rate a profile states, bounded: (lowest, highest). A peak of 1e308 TFLOP/s or a bandwidth of 1e-300 GB/s
describes no GPU, and would print an MFU of 0.0% or a step time of infinity."""


@dataclass(frozen=True)
class LinkSpec:
    """One link type, alpha–beta model: time = alpha_s + bytes × algorithm_factor / bandwidth_bytes_per_s."""

    bandwidth_bytes_per_s: float
    """Achievable per-GPU, per-direction bandwidth (nominal × efficiency)."""
    alpha_s: float
    """Per-collective latency."""
    nominal_bandwidth_bytes_per_s: float
    """Spec-sheet per-GPU, per-direction bandwidth, for reports."""


@dataclass(frozen=True)
class CollectivePoint:
    """One regime of one collective on one link at one group size: time = alpha_s + bytes × algorithm_factor / bus
    bandwidth. Several regimes at one group size are NCCL's alternatives (LL / LL128 / Simple protocols, ring / tree
    / NVLS algorithms); costmodels.comm prices each size with the fastest, as NCCL's tuner does.

    `group_size` is the number of ranks the link joins: GPUs of one node for `nvlink`, nodes for `ib` (a group
    spanning nodes runs hierarchically, costmodels.comm). `bus_bandwidth_bytes_per_s` is nccl-tests' busbw, so it may
    exceed the link's line rate where the switch reduces (NVLS, SHARP)."""

    group_size: int
    alpha_s: float
    bus_bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class HardwareProfile:
    """Everything the cost model knows about one GPU type and its links."""

    name: str
    display_name: str
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    peak_flops_per_s: Mapping[str, float]
    """Dense peak by precision ('bf16', 'fp8'); a precision absent here is unsupported on the GPU."""
    gemm_efficiency: Mapping[str, float]
    """Named parameters of the GEMM-efficiency curve (see costmodels.compute)."""
    links: Mapping[str, LinkSpec]
    memory_overheads_bytes: Mapping[str, float]
    """Fixed per-GPU memory terms by name (CUDA context, communication buffers, ...)."""
    collectives: Mapping[str, Mapping[str, tuple[CollectivePoint, ...]]] = field(default_factory=dict)
    """link -> collective -> regimes sorted by group size (section `collectives:`); empty where not measured, and
    then costmodels.comm uses the link's alpha and bandwidth."""
    gpus_per_node: int = 8
    nvlink_domain_size: int = 0
    """GPUs joined by one NVLink fabric (YAML `nvlink_domain_size`, optional; absent or 0: `gpus_per_node`, NVLink
    stops at the node), more where an NVLink switch tray joins nodes — GB200 NVL72: 72 GPUs on 18
    compute trays of 4 (Multi-Node NVLink). costmodels.comm prices a group inside one domain on NVLink, a group
    spanning domains on NVLink inside each domain and InfiniBand between them (ClusterSpec.nvlink_domain_gpus)."""
    streaming_multiprocessors: int = 0
    """SMs of the GPU (YAML `compute.streaming_multiprocessors`, optional, a whole number > 0; absent: 0, not
    stated): a communication kernel running beside a compute kernel holds some of them
    (costmodels.steptime.overlap_contention_share, overlapped_exposed_s); unknown, that contention is not priced."""
    bf16_flops_per_clock_per_sm: float = 0.0
    """Dense bf16 tensor-core FLOP per SM per clock with the GPU's native MMA instruction (YAML
    `compute.bf16_flops_per_clock_per_sm`, optional; absent: 0, not stated): 2048 on A100 (mma.sync, 1024 FMA; NVIDIA
    A100 Tensor Core GPU Architecture whitepaper), twice that on Hopper with wgmma and four times on Blackwell with
    tcgen05 (the datasheet peak over SMs × boost clock). With `exp2_per_clock_per_sm` it weighs the attention core's
    softmax exponentials against its matmuls (costmodels.compute.attention_head_dim_factor)."""
    exp2_per_clock_per_sm: float = 0.0
    """exp2 results per SM per clock of the special-function units (YAML `compute.exp2_per_clock_per_sm`, optional;
    absent: 0, not stated, and the attention core's rate does not depend on its head dimension)."""
    compute_capability: float = 0.0
    """CUDA compute capability (YAML `compute.compute_capability`, optional, e.g. 9.0; absent: 0, not stated; NVIDIA's
    CUDA GPUs list): which FP8 recipes Transformer Engine runs (`require_fp8_recipe`) and whether its FP8 GEMMs take
    only the TN layout, so a per-tensor cast also writes a transposed copy (costmodels.compute.fp8_tn_only)."""
    sustained_clock_fraction: float = 1.0
    """SM clock a training step sustains at the board's power limit over the clock the compute microbenchmarks
    ran at (YAML `compute.sustained_clock_fraction`, optional; absent = 1, no throttling). Tensor-core throughput
    is SMs × FLOP per clock × clock, so the step's compute-bound kernels run at their fitted (burst) rate × this;
    memory-bound kernels keep theirs (costmodels.compute.sustained_compute_s)."""
    host_link_bytes_per_s: float = 0.0
    """One GPU's link to host memory, per direction (YAML `memory.host_link_gb_per_s`, optional; the spec sheet's
    PCIe or NVLink-C2C rate): what activation offloading's copies run at (costmodels.steptime.offload_copies_s).
    0: not stated, and those copies are not priced."""
    host_costs: HostCosts = DEFAULT_HOST_COSTS
    """Host seconds per kernel launch by launch path (YAML `host:`, µs, optional; costmodels.host): a property of the
    CPU and software stack the GPU is driven from, the same fitted values in every bundled profile."""
    aliases: tuple[str, ...] = ()
    provenance: Mapping[str, str] = field(default_factory=dict)
    """For each field (dotted path as in the YAML): where its value comes from."""
    source_path: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the file holds (raw calibration measurements, fit residuals): kept, not interpreted."""

    def __post_init__(self) -> None:
        if not self.nvlink_domain_size:  # built in code without one: NVLink stops at the node
            object.__setattr__(self, "nvlink_domain_size", self.gpus_per_node)

    def supports(self, precision: str) -> bool:
        return precision in self.peak_flops_per_s

    def require_fp8_recipe(self, recipe: str) -> None:
        """InputError when Transformer Engine does not run the FP8 `recipe` on this GPU, by its compute capability
        (TE pytorch/quantization.py: MXFP8 needs 10.0 <= cc < 12.0, block scaling cc >= 9.0 with CUDA 12.9; delayed
        and per-tensor current scaling run wherever fp8 does, require_precision)."""
        self.require_precision("fp8")
        needs = {"mxfp8": ("compute capability 10.x (Blackwell: B200, GB200)", lambda cc: 10.0 <= cc < 12.0),
                 "blockwise": ("compute capability 9.0 or later (Hopper, Blackwell) and CUDA 12.9",
                               lambda cc: cc >= 9.0)}
        if recipe not in needs:
            return
        what, runs = needs[recipe]
        if not self.compute_capability:
            raise InputError("fp8_recipe", f"fp8 recipe {recipe} needs {what}, and profile {self.name} states no "
                                           f"compute.compute_capability; add it to the profile or use --fp8-recipe "
                                           f"delayed or tensorwise")
        if not runs(self.compute_capability):
            raise InputError("fp8_recipe", f"fp8 recipe {recipe} needs {what}; {self.display_name} is "
                                           f"{self.compute_capability:.1f}: use --fp8-recipe delayed or tensorwise"
                                           + (" or blockwise" if recipe == "mxfp8" and self.compute_capability >= 9.0
                                              else ""))

    def require_precision(self, precision: str) -> None:
        """InputError when the GPU has no peak FLOP/s for `precision` (fp8 on A100), naming the ones it has."""
        if not self.supports(precision):
            supported = sorted(self.peak_flops_per_s)
            raise InputError("precision", f"{self.display_name} has no {precision} support; use --precision "
                                          f"{supported[0]} (supported: {', '.join(supported)})")


# ---- loading ---------------------------------------------------------------------------------------------------

def bundled_profile_names() -> list[str]:
    """Names of the profiles shipped in costmodels/profiles/, sorted."""
    folder = resources.files("costmodels") / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _bundled_text(name: str) -> str:
    return (resources.files("costmodels") / "profiles" / f"{name}.yaml").read_text(encoding="utf-8")


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def resolve_gpu_name(name: str) -> str:
    """Bundled profile name for a GPU name or alias ('H100', 'a100-80gb-sxm', ...); InputError with suggestions."""
    wanted = _normalise(name)
    known: dict[str, str] = {}
    for profile_name in bundled_profile_names():
        known[profile_name] = profile_name
        for alias in parse_profile(_bundled_text(profile_name), profile_name).aliases:
            known[_normalise(alias)] = profile_name
    if wanted in known:
        return known[wanted]
    close = difflib.get_close_matches(wanted, list(known), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise InputError("gpu", f"unknown GPU {name!r}; {hint}run `autopar gpus` to list the bundled ones, "
                            "or pass --profile FILE")


MAX_PROFILE_BYTES = 16 * 2**20
"""A profile is a few KB (a calibrated one with its raw measurements, some hundred KB); larger files are refused."""


def read_text_file(path: str | Path, field: str, max_bytes: int = MAX_PROFILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; anything else is an InputError naming `field`
    (a FIFO or /dev/zero is refused before it is opened: reading it could never end)."""
    shown = _shown(str(path))
    try:
        info = Path(path).stat()
        if not stat.S_ISREG(info.st_mode):
            raise InputError(field, f"{shown} is not a regular file (a directory, device, FIFO or socket); give a "
                                    "YAML file")
        if info.st_size > max_bytes:
            raise InputError(field, f"{shown} is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(field, f"no file at {shown}; check the path") from None
    except OSError as exc:
        raise InputError(field, f"cannot read {shown} ({exc.strerror or exc.__class__.__name__}); give a "
                                "readable YAML file") from None
    if len(data) > max_bytes:
        raise InputError(field, f"{shown} is over the {max_bytes:,}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(field, f"{shown} is not UTF-8 text; give a YAML file") from None


MAX_YAML_NESTING = 64
"""Deepest nesting of mappings and sequences a YAML input may have (autopar's files use 4 or 5 levels)."""


def safe_yaml_load(text: str, origin: str, field: str = "profile") -> Any:
    """`yaml.safe_load` without aliases: autopar's YAML never needs `*alias`, and a few KB of nested aliases
    ("billion laughs") expand to more nodes than memory holds once walked. Nesting deeper than MAX_YAML_NESTING is
    refused too. Both are checked on the event stream before anything is built, so the document can then be built
    by libyaml's C loader where PyYAML has it (several times faster than the pure-Python one on the bundled
    profiles, which every `autopar solve` reads to resolve a GPU name)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def too_deep(line: int) -> InputError:
        return InputError(field, f"{origin}: YAML nested deeper than {MAX_YAML_NESTING} levels at line {line}; "
                                 "give a profile file")

    depth = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                raise InputError(field, f"{origin}: YAML alias at line {event.start_mark.line + 1} is not "
                                        "accepted (autopar files use none); write the values out")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_NESTING:
                    raise too_deep(event.start_mark.line + 1)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        # libyaml 0.2.6 (bundled in PyYAML >= 6.0.3's wheels) stops at 1,000 flow levels in its scanner, which reads
        # up to 1,024 characters ahead of the event this loop sees: "exceeded maximum nesting depth". The depth is
        # this check's to report; older libyaml and the pure-Python scanner have no limit and reach the loop above.
        if "nesting depth" in f"{exc.problem} {exc.context}":
            raise too_deep(exc.problem_mark.line + 1 if exc.problem_mark is not None else 1) from None
        raise
    return yaml.load(text, Loader=loader)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:60] + "…" + text[-15:])


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A bundled profile by GPU name/alias, or a profile YAML file by path."""
    path = Path(name_or_path)
    try:
        is_path = path.suffix in (".yaml", ".yml") or path.exists()
    except (OSError, ValueError) as exc:      # a name the OS refuses (too long, NUL byte)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a valid path"
        raise InputError("profile", f"{_shown(str(path))}: {reason}; give a GPU name or a profile file") from None
    if is_path:
        return parse_profile(read_text_file(path, "profile"), str(path))
    name = resolve_gpu_name(str(name_or_path))
    return parse_profile(_bundled_text(name), f"bundled:{name}")


def parse_profile(text: str, origin: str) -> HardwareProfile:
    """Parse and validate profile YAML; any defect is an InputError naming the file and the field."""
    import yaml  # light, but only needed here

    try:
        data = safe_yaml_load(text, origin)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError("profile", f"{origin} is not valid YAML{where}; fix the syntax") from None
    if not isinstance(data, dict) or not data:
        raise InputError("profile", f"{origin} is empty or not a mapping; see costmodels/profiles/*.yaml for the format")
    non_finite = _first_non_finite(data, "")
    if non_finite is not None:  # anywhere, raw calibration data included: a damaged file is refused whole
        raise InputError("profile", f"{origin}: field {non_finite[0]} must be a finite number, got {non_finite[1]!r}")
    _check_fields(origin, data)
    reader = _Reader(data, origin)
    version = reader.number("schema_version")
    if int(version) != SCHEMA_VERSION:
        raise InputError("profile", f"{origin}: schema_version {version} is not supported (expected {SCHEMA_VERSION})")
    peak = reader.mapping("compute.peak_tflops")
    if "bf16" not in peak:
        raise InputError("profile", f"{origin}: compute.peak_tflops.bf16 is missing; every profile needs it")
    links = {}
    for kind in LINK_KINDS:
        unit, scale = ("gb_per_s", 1e9) if kind == "nvlink" else ("gbit_per_s", 1e9 / 8)
        nominal = reader.number(f"links.{kind}.bandwidth_{unit}", bounds=RATE_BOUNDS[f"links.{kind}.bandwidth_{unit}"],
                                what="a bandwidth") * scale
        efficiency = reader.number(f"links.{kind}.bandwidth_efficiency", bounds=(1e-6, 1.0),
                                   what="a fraction of the link's bandwidth")
        links[kind] = LinkSpec(
            bandwidth_bytes_per_s=nominal * efficiency,
            alpha_s=reader.number(f"links.{kind}.alpha_us", allow_zero=True, bounds=RATE_BOUNDS["links.alpha_us"],
                                  what="a latency (µs)") * 1e-6,
            nominal_bandwidth_bytes_per_s=nominal,
        )
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise InputError("profile", f"{origin}: aliases must be a list of strings")
    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise InputError("profile", f"{origin}: provenance must be a mapping of field -> source")
    _check_overlap(reader, data.get("overlap"))
    if "elementwise" in data and not isinstance(data["elementwise"], dict):
        raise InputError("profile", f"{origin}: elementwise must be a mapping (elementwise: "
                                    "{traffic_per_activation_byte: 2.8})")
    if isinstance(data.get("elementwise"), dict) and "traffic_per_activation_byte" in data["elementwise"]:
        reader.number("elementwise.traffic_per_activation_byte", allow_zero=True,
                      bounds=RATE_BOUNDS["elementwise.traffic_per_activation_byte"], what="bytes per activation byte")
    known_keys = {"schema_version", "name", "display_name", "aliases", "gpus_per_node", "nvlink_domain_size", "memory",
                  "compute", "links", "collectives", "provenance", "host"}
    gpus_per_node = int(reader.number("gpus_per_node", upper=MAX_NUM_GPUS))
    nvlink_domain_size = _nvlink_domain_size(reader, data, gpus_per_node)
    return HardwareProfile(
        name=reader.string("name"),
        display_name=str(data.get("display_name", data.get("name"))),
        hbm_bytes=reader.number("memory.hbm_gib", upper=MAX_HBM_GIB) * GIB,
        hbm_bandwidth_bytes_per_s=reader.number("memory.hbm_tb_per_s", bounds=RATE_BOUNDS["memory.hbm_tb_per_s"],
                                                what="a bandwidth (TB/s)") * 1e12,
        peak_flops_per_s={str(k): reader.number(f"compute.peak_tflops.{k}", bounds=RATE_BOUNDS["compute.peak_tflops"],
                                                what="a peak (TFLOP/s)") * 1e12 for k in peak},
        gemm_efficiency={str(k): reader.number(f"compute.gemm_efficiency.{k}", allow_zero=bounds[0] == 0.0,
                                               bounds=bounds[:2], what=bounds[2])
                         for k in reader.mapping("compute.gemm_efficiency")
                         for bounds in [_gemm_efficiency_field(str(k))]},
        links=links,
        collectives=_collectives(reader, data.get("collectives")),
        memory_overheads_bytes={str(k): reader.number(f"memory.overheads_gib.{k}", allow_zero=True,
                                                      upper=MAX_HBM_GIB) * GIB
                                for k in reader.mapping("memory.overheads_gib")},
        gpus_per_node=gpus_per_node,
        nvlink_domain_size=nvlink_domain_size,
        streaming_multiprocessors=_streaming_multiprocessors(reader, data),
        bf16_flops_per_clock_per_sm=_per_clock_rate(reader, data, "bf16_flops_per_clock_per_sm"),
        exp2_per_clock_per_sm=_per_clock_rate(reader, data, "exp2_per_clock_per_sm"),
        compute_capability=_compute_capability(reader, data),
        sustained_clock_fraction=_sustained_clock_fraction(reader, data),
        host_costs=parse_host_section(data.get("host"), origin),
        host_link_bytes_per_s=(reader.number("memory.host_link_gb_per_s", bounds=RATE_BOUNDS[
            "memory.host_link_gb_per_s"], what="a bandwidth (GB/s)") * 1e9
            if "host_link_gb_per_s" in (data.get("memory") or {}) else 0.0),
        aliases=tuple(aliases),
        provenance={str(k): str(v) for k, v in provenance.items()},
        source_path=origin,
        extra={k: v for k, v in data.items() if k not in known_keys},
    )


def _nvlink_domain_size(reader: "_Reader", data: dict, gpus_per_node: int) -> int:
    """The optional `nvlink_domain_size`: whole nodes (a multiple of gpus_per_node); absent = one node."""
    if "nvlink_domain_size" not in data:
        return gpus_per_node
    size = reader.number("nvlink_domain_size", upper=MAX_NUM_GPUS)
    if size != int(size) or int(size) % gpus_per_node:
        raise InputError("profile", f"{reader.origin}: field nvlink_domain_size must be a whole multiple of "
                                    f"gpus_per_node={gpus_per_node} (an NVLink domain is whole nodes), got "
                                    f"{data['nvlink_domain_size']!r}")
    return int(size)


MAX_STREAMING_MULTIPROCESSORS = 1024
"""Far above any GPU's SM count (B200: 148); a larger value is a typo."""


def _has_compute_field(data: dict, name: str) -> bool:
    """Whether the profile's `compute:` section states the optional field `name`."""
    compute = data.get("compute")
    return isinstance(compute, dict) and name in compute


def _streaming_multiprocessors(reader: "_Reader", data: dict) -> int:
    """The optional `compute.streaming_multiprocessors`: a whole number of SMs; absent = 0 (not stated)."""
    if not _has_compute_field(data, "streaming_multiprocessors"):
        return 0
    count = reader.number("compute.streaming_multiprocessors", upper=MAX_STREAMING_MULTIPROCESSORS)
    if count != int(count):
        raise InputError("profile", f"{reader.origin}: field compute.streaming_multiprocessors must be a whole "
                                    f"number, got {data['compute']['streaming_multiprocessors']!r}")
    return int(count)


MAX_PER_CLOCK_RATE = 65536.0
"""Far above any GPU's per-SM rate per clock (B200: 8192 bf16 FLOP); a larger value is a typo."""


def _per_clock_rate(reader: "_Reader", data: dict, name: str) -> float:
    """An optional per-SM, per-clock throughput of the `compute:` section (> 0); absent = 0 (not stated)."""
    if not _has_compute_field(data, name):
        return 0.0
    return reader.number(f"compute.{name}", upper=MAX_PER_CLOCK_RATE)


MAX_COMPUTE_CAPABILITY = 20.0
"""Above any CUDA compute capability so far (Blackwell: 10.0-12.1); a larger value is a typo."""


def _compute_capability(reader: "_Reader", data: dict) -> float:
    """The optional `compute.compute_capability` (e.g. 9.0), at least 1; absent = 0 (not stated)."""
    if not _has_compute_field(data, "compute_capability"):
        return 0.0
    value = reader.number("compute.compute_capability", upper=MAX_COMPUTE_CAPABILITY)
    if value < 1.0:
        raise InputError("profile", f"{reader.origin}: field compute.compute_capability must be a CUDA compute "
                                    f"capability such as 9.0, got {data['compute']['compute_capability']!r}")
    return float(value)


MIN_SUSTAINED_CLOCK_FRACTION = 0.25
"""Power-limited GPUs hold ~0.8 of their boost clock (the bundled profiles' sources); a quarter or less is a
misconfigured or broken part, not a power limit, and would price every kernel 4× slower."""


def _sustained_clock_fraction(reader: "_Reader", data: dict) -> float:
    """The optional `compute.sustained_clock_fraction`, in [MIN_SUSTAINED_CLOCK_FRACTION, 1]; absent = 1."""
    if not _has_compute_field(data, "sustained_clock_fraction"):
        return 1.0
    fraction = reader.number("compute.sustained_clock_fraction", upper=1.0)
    if fraction < MIN_SUSTAINED_CLOCK_FRACTION:
        raise InputError("profile", f"{reader.origin}: field compute.sustained_clock_fraction must be >= "
                                    f"{MIN_SUSTAINED_CLOCK_FRACTION} (the sustained over the boost SM clock, ~0.8 "
                                    f"on power-limited GPUs), got {fraction!r}")
    return fraction


def _collectives(reader: "_Reader", section: Any) -> dict[str, dict[str, tuple[CollectivePoint, ...]]]:
    """The optional `collectives:` section: link -> collective -> list of {group_size, alpha_us, busbw_gb_per_s}."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InputError("profile", f"{reader.origin}: field collectives must be a mapping of link -> collective -> "
                                    "points")
    out: dict[str, dict[str, tuple[CollectivePoint, ...]]] = {}
    for link, kinds in section.items():
        if link not in LINK_KINDS:
            raise InputError("profile", f"{reader.origin}: field collectives.{link} is not a link; use one of "
                                        f"{', '.join(LINK_KINDS)}")
        if not isinstance(kinds, dict):
            raise InputError("profile", f"{reader.origin}: field collectives.{link} must be a mapping of collective "
                                        "-> points")
        out[link] = {}
        for kind, points in kinds.items():
            where = f"collectives.{link}.{kind}"
            if kind not in COLLECTIVE_NAMES:
                raise InputError("profile", f"{reader.origin}: field {where} is not a collective; use one of "
                                            f"{', '.join(COLLECTIVE_NAMES)}")
            if not isinstance(points, list) or not points:
                raise InputError("profile", f"{reader.origin}: field {where} must be a non-empty list of "
                                            "{group_size, alpha_us, busbw_gb_per_s}")
            parsed = []
            for i, point in enumerate(points):
                if not isinstance(point, dict):
                    raise InputError("profile", f"{reader.origin}: field {where}[{i}] must be a mapping with "
                                                "group_size, alpha_us, busbw_gb_per_s")
                point_reader = _Reader(point, reader.origin, prefix=f"{where}[{i}].")
                group = point_reader.number("group_size")
                if group != int(group) or group < 2:
                    raise InputError("profile", f"{reader.origin}: field {where}[{i}].group_size must be a whole "
                                                f"number >= 2, got {point['group_size']!r}")
                parsed.append(CollectivePoint(group_size=int(group),
                                              alpha_s=point_reader.number("alpha_us", allow_zero=True,
                                                                          bounds=RATE_BOUNDS["links.alpha_us"],
                                                                          what="a latency (µs)") * 1e-6,
                                              bus_bandwidth_bytes_per_s=point_reader.number(
                                                  "busbw_gb_per_s", bounds=RATE_BOUNDS["collectives.busbw_gb_per_s"],
                                                  what="a bus bandwidth (GB/s)") * 1e9))
            out[link][kind] = tuple(sorted(parsed, key=lambda p: (p.group_size, p.alpha_s)))
    return out


def _check_overlap(reader: _Reader, section: Any) -> None:
    """The optional `overlap:` section: each entry a known communication and the fraction of it hidden, in [0, 1]."""
    if section is None:
        return
    if not isinstance(section, dict):
        raise InputError("profile", f"{reader.origin}: overlap must be a mapping of communication -> fraction hidden "
                                    f"(e.g. overlap: {{tp_comm: 0.5}})")
    for key in section:
        if key not in OVERLAP_TERMS:
            raise InputError("profile", f"{reader.origin}: overlap.{key} is not a known overlap; "
                                        f"use {', '.join(OVERLAP_TERMS)}")
        reader.number(f"overlap.{key}", allow_zero=True, upper=1.0)


def _first_non_finite(node: Any, path: str) -> tuple[str, float] | None:
    """Dotted path and value of the first NaN or infinity in parsed YAML, or None."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        found = _first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return (path, node) if isinstance(node, float) and not math.isfinite(node) else None


class _Reader:
    """Typed access to dotted paths of the parsed YAML, with one-line errors naming file and field."""

    def __init__(self, data: dict, origin: str, prefix: str = "") -> None:
        self.data = data
        self.origin = origin
        self.prefix = prefix
        """Printed before a field name in errors (the path of `data` inside the file)."""

    def _get(self, dotted: str) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise InputError("profile", f"{self.origin}: field {self.prefix}{dotted} is missing; add it "
                                            "(see costmodels/profiles/*.yaml for the format)")
            node = node[part]
        return node

    def number(self, dotted: str, allow_zero: bool = False, upper: float | None = None,
               bounds: "tuple[float, float] | None" = None, what: str = "") -> float:
        """A finite number > 0 (>= 0 with `allow_zero`), at most `upper`; `bounds` (lowest, highest) instead names
        the range, with `what` the value is, in the message."""
        value = self._get(dotted)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError("profile", f"{self.origin}: field {self.prefix}{dotted} must be a finite number, "
                                        f"got {_short_repr(value)}")
        if bounds is not None:
            low, high = bounds
            if not low <= value <= high or (value == 0 and not allow_zero):
                closed = "[" if allow_zero or low > 0 else "("
                raise InputError("profile", f"{self.origin}: field {self.prefix}{dotted} must be "
                                            f"{what + ' ' if what else ''}in {closed}{low:g}, {high:g}], got "
                                            f"{_short_repr(value)}")
            return float(value)
        if value < 0 or (value == 0 and not allow_zero):
            raise InputError("profile", f"{self.origin}: field {self.prefix}{dotted} must be "
                                        f"{'>= 0' if allow_zero else '> 0'}, got {_short_repr(value)}")
        if upper is not None and value > upper:
            raise InputError("profile", f"{self.origin}: field {self.prefix}{dotted} must be <= {upper}, "
                                        f"got {_short_repr(value)}")
        return float(value)

    def string(self, dotted: str) -> str:
        value = self._get(dotted)
        if not isinstance(value, str) or not value:
            raise InputError("profile", f"{self.origin}: field {dotted} must be a non-empty string")
        return value

    def mapping(self, dotted: str) -> dict:
        value = self._get(dotted)
        if not isinstance(value, dict) or not value:
            raise InputError("profile", f"{self.origin}: field {dotted} must be a non-empty mapping")
        return value


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}… ({len(text):,} characters)"


def _check_fields(origin: str, data: dict) -> None:
    """Refuse a key the cost model does not read (PROFILE_SECTIONS, GEMM_EFFICIENCY_FIELDS), naming it and the keys
    its section takes: a misspelt field would otherwise be ignored and its default priced without a word."""
    for section, allowed in PROFILE_SECTIONS.items():
        node: Any = data
        for part in section.split(".") if section else ():
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key in node:
            if key not in allowed:
                where = f"{section}.{key}" if section else str(key)
                raise InputError("profile", f"{origin}: field {_short_repr(where)[1:-1]} is not a profile field "
                                            f"autopar reads; {section or 'the top level'} takes "
                                            f"{', '.join(sorted(allowed))} (fix the name or remove it)")
    curve = data.get("compute", {}).get("gemm_efficiency") if isinstance(data.get("compute"), dict) else None
    for key in curve if isinstance(curve, dict) else ():
        if _gemm_efficiency_field(str(key)) is None:
            raise InputError("profile", f"{origin}: field compute.gemm_efficiency.{_short_repr(str(key))[1:-1]} is "
                                        "not a curve parameter autopar reads (peak_fraction, half_saturation_dim, "
                                        "kernel_floor_us, fp8_*, grouped_*, attention_<kernel>_<fwd|bwd>_*; kernels "
                                        f"{', '.join(ATTENTION_KERNEL_NAMES)}); fix the name or remove it")


def _gemm_efficiency_field(key: str) -> "tuple[float, float, str] | None":
    """(lowest, highest, what) of a compute.gemm_efficiency key, or None for a key no curve reads."""
    import re

    for pattern, low, high, what in GEMM_EFFICIENCY_FIELDS:
        if re.fullmatch(pattern, key):
            return low, high, what
    return None
