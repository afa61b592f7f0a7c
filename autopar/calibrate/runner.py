"""The calibration run: one process, or every rank of a `torchrun` job (torch.distributed, env:// rendezvous).

    rank layout   ranks grouped into nodes (torchrun's GROUP_RANK, else the host name, or --ranks-per-node)
    intra-node    every node's ranks form one group; all nodes measure at once          -> links.nvlink
    inter-node    local rank i of every node forms one group (one rank per node, every
                  local index at once, as data-parallel traffic crosses the NICs)        -> links.ib
    send/recv     ping-pong between neighbouring local ranks (intra) or matching ranks of
                  neighbouring nodes (inter)

Only rank 0 prints (a rich progress bar on stderr) and writes the profile, after every rank has finished every
measurement (each measurement ends with a collective, so a failed rank stops the run before anything is written).
The profile is written atomically; Ctrl-C or a failure leaves any existing file untouched.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autopar.calibrate import bench
from autopar.calibrate.measurements import (
    COLLECTIVE_KINDS,
    LINK_DESCRIPTIONS,
    CollectiveMeasurement,
    GemmMeasurement,
    Measurements,
)
from autopar.calibrate.profile_file import RunInfo, base_profile_for_device, build_profile_text, write_atomically
from costmodels.errors import InputError
from costmodels.hardware import load_profile, resolve_gpu_name
from costmodels.units import GIB

CPU_BASE_PROFILE = "a100-80gb"


@dataclass(frozen=True)
class CalibrateOptions:
    out: Path
    quick: bool
    base_gpu: str | None
    max_bytes: int | None
    min_bytes: int
    warmup: int | None
    iters: int | None
    ranks_per_node: int | None
    timeout_s: float
    allow_cpu: bool
    """--allow-cpu: measure this CPU when there is no GPU (tests the pipeline; the profile is marked CPU)."""


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    nodes: tuple[tuple[int, ...], ...]
    """Global ranks of each node, in node order."""
    hostnames: tuple[str, ...]

    @property
    def ranks_per_node(self) -> int:
        return len(self.nodes[0])

    @property
    def node_index(self) -> int:
        return next(i for i, ranks in enumerate(self.nodes) if self.rank in ranks)

    @property
    def local_index(self) -> int:
        return self.nodes[self.node_index].index(self.rank)


def run_calibration(options: CalibrateOptions) -> int:
    distributed = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    device = _device()
    if device.type != "cuda" and not options.allow_cpu:  # before any rendezvous: every rank stops here alike
        raise InputError("device", "no CUDA GPU here (torch sees none), and calibration measures GPUs; run it on "
                                   "the GPU nodes, or pass --allow-cpu to test the calibration pipeline on this "
                                   "CPU (the numbers describe this CPU, not a GPU)")
    context_bytes = bench.cuda_context_bytes(device) if device.type == "cuda" else None
    base_name, base_reason = choose_base_profile(options.base_gpu, device)
    if distributed:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, init_method="env://",
                                timeout=dt.timedelta(seconds=options.timeout_s))
    else:
        backend = "none"
    try:
        return _calibrate(options, device, distributed, backend, base_name, base_reason, context_bytes)
    finally:
        if distributed and dist.is_initialized():
            dist.destroy_process_group()


def _calibrate(options: CalibrateOptions, device: "torch.device", distributed: bool, backend: str,
               base_name: str, base_reason: str, context_bytes: float | None) -> int:
    topology = _topology(distributed, options.ranks_per_node)
    on_gpu = device.type == "cuda"
    quick = options.quick
    settings = bench.TimingSettings(
        warmup=options.warmup if options.warmup is not None else (2 if quick else 5),
        iters=options.iters if options.iters is not None else (5 if quick else 20),
        target_sample_s=1e-3 if (quick or not on_gpu) else 2e-3,
    )
    max_bytes = options.max_bytes or (256 * 2**20 if on_gpu else 16 * 2**20)
    if max_bytes < options.min_bytes:
        raise InputError("max-bytes", f"--max-bytes {max_bytes} is below --min-bytes {options.min_bytes}")
    sizes = bench.message_sizes(options.min_bytes, max_bytes, quick)
    timer = bench.Timer(device, settings, distributed)
    notes: list[str] = []

    precisions = ["bf16"]
    fp8_reason = bench.fp8_unsupported_reason(device)
    if distributed:  # every rank must run the same list
        fp8_everywhere = timer.max_over_ranks([1.0 if fp8_reason else 0.0])[0] == 0.0
        fp8_reason = None if fp8_everywhere else (fp8_reason or "fp8 GEMMs not measured: not supported on every rank")
    if fp8_reason is None and "fp8" in load_profile(base_name).peak_flops_per_s:
        precisions.append("fp8")
    elif fp8_reason is not None:
        notes.append(fp8_reason)
    shapes = bench.gemm_shapes(on_gpu, quick)
    link_groups = _link_groups(topology, notes)
    total = len(shapes) * len(precisions) + len(link_groups) * len(COLLECTIVE_KINDS) * len(sizes)

    with _progress(topology.rank == 0, total) as progress:
        gemm = []
        for precision in precisions:
            for shape in shapes:
                progress.step(f"GEMM {precision} {shape.m}×{shape.n}×{shape.k}")
                gemm.append(GemmMeasurement(precision=precision, m=shape.m, n=shape.n, k=shape.k,
                                            timing=bench.time_gemm(timer, shape, precision), label=shape.label))
        collectives = []
        for groups in link_groups:
            for kind in COLLECTIVE_KINDS:
                group_size = 2 if kind == "send_recv" else groups.size
                for size in sizes:
                    progress.step(f"{LINK_DESCRIPTIONS[groups.link]} {kind} {_format_bytes(size)}")
                    used = bench.usable_bytes(kind, size, group_size,
                                              torch.tensor([], dtype=bench.collective_dtype(device)).element_size())
                    collectives.append(CollectiveMeasurement(
                        link=groups.link, kind=kind, group_size=group_size, bytes=used,
                        timing=bench.time_collective(timer, kind, used, groups)))

    memory: dict[str, float] = {}
    if on_gpu:
        assert context_bytes is not None
        measured = timer.max_over_ranks([context_bytes, bench.non_allocator_bytes(device, context_bytes),
                                         bench.allocator_reserve_bytes(device)])
        memory = {"cuda_context": measured[0], "nccl_buffers": measured[1], "allocator_reserve": measured[2]}
        if not distributed:
            memory.pop("nccl_buffers")
            notes.append("memory.overheads_gib.nccl_buffers not measured (one process, no NCCL); base value kept")
        notes.append("allocator_reserve (peak reserved − peak allocated during the GEMMs) is recorded in the "
                     "measurements only: the profile has no such overhead term")
    else:
        notes.append("memory overheads not measured (CPU run, no GPU); memory.overheads_gib kept from the base profile")
    if not on_gpu:
        notes.append(f"CPU run: GEMM efficiency and link speeds describe this CPU host measured against the "
                     f"{base_name} spec sheet — useful to test the pipeline, not to plan a GPU job")

    if topology.rank != 0:
        return 0
    run = RunInfo(
        measured_at_utc=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        hostnames=topology.hostnames,
        device_name=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        world_size=topology.world_size, nodes=len(topology.nodes), ranks_per_node=topology.ranks_per_node,
        torch_version=str(torch.__version__), backend=backend,
        settings={"quick": quick, "warmup": settings.warmup, "iters": settings.iters,
                  "min_bytes": options.min_bytes, "max_bytes": max_bytes, "gemm_shapes": len(shapes),
                  "precisions": precisions},
    )
    measurements = Measurements(gemm=tuple(gemm), collectives=tuple(collectives), memory_overheads_bytes=memory)
    text, fit, all_notes = build_profile_text(base_name, base_reason, measurements, run, tuple(notes))
    write_atomically(options.out, text)
    _print_summary(options.out, fit, all_notes)
    return 0


# ---- where we are ----------------------------------------------------------------------------------------------------

def _device() -> "torch.device":
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def choose_base_profile(base_gpu: str | None, device: "torch.device") -> tuple[str, str]:
    """The bundled profile that fills in what is not measured, and why it was chosen."""
    if base_gpu is not None:
        return resolve_gpu_name(base_gpu), f"--base-gpu {base_gpu}"
    if device.type != "cuda":
        return CPU_BASE_PROFILE, (f"CPU run (--allow-cpu, no GPU): {CPU_BASE_PROFILE} fills in what is not "
                                  "measured; pass --base-gpu to choose")
    device_name = torch.cuda.get_device_name(device)
    memory_gib = torch.cuda.get_device_properties(device).total_memory / GIB
    name = base_profile_for_device(device_name, memory_gib)
    if name is None:
        raise InputError("base-gpu", f"the GPU {device_name!r} matches no bundled profile; pass --base-gpu NAME "
                                     "(see `autopar gpus`) for the spec-sheet values")
    return name, f"detected device {device_name!r} ({memory_gib:.0f} GiB)"


def _topology(distributed: bool, ranks_per_node: int | None) -> Topology:
    hostname = socket.gethostname()
    if not distributed:
        return Topology(rank=0, world_size=1, nodes=((0,),), hostnames=(hostname,))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if ranks_per_node is not None:
        if ranks_per_node < 1 or world_size % ranks_per_node:
            raise InputError("ranks-per-node", f"--ranks-per-node {ranks_per_node} does not divide the "
                                               f"world size {world_size}")
        key = f"node{rank // ranks_per_node}"
    else:
        key = f"group{os.environ['GROUP_RANK']}" if "GROUP_RANK" in os.environ else hostname
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, (key, hostname))
    nodes: dict[str, list[int]] = {}
    for r, (node_key, _) in enumerate(gathered):
        nodes.setdefault(node_key, []).append(r)
    sizes = {len(ranks) for ranks in nodes.values()}
    if len(sizes) != 1:
        raise InputError("nproc-per-node", f"nodes have different numbers of ranks ({sorted(sizes)}); launch the "
                                           "same --nproc-per-node on every node")
    return Topology(rank=rank, world_size=world_size, nodes=tuple(tuple(r) for r in nodes.values()),
                    hostnames=tuple(host for _, host in gathered))


def _link_groups(topology: Topology, notes: list[str]) -> list[bench.CollectiveGroup]:
    """Groups for the intra-node and the inter-node link; every rank creates every group (torch requires it)."""
    out = []
    nodes = topology.nodes
    if topology.world_size == 1:
        notes.append("one process: no collective measured (launch under torchrun to measure the links); "
                     "links.nvlink and links.ib kept from the base profile")
        return out
    if topology.ranks_per_node >= 2:
        mine = None
        for ranks in nodes:
            group = dist.new_group(list(ranks))
            if topology.rank in ranks:
                mine = group
        local = topology.local_index
        node_ranks = nodes[topology.node_index]
        peer_local = local + 1 if local % 2 == 0 else local - 1
        peer = node_ranks[peer_local] if peer_local < len(node_ranks) else None
        out.append(bench.CollectiveGroup("nvlink", mine, topology.ranks_per_node, peer, local % 2 == 0))
    else:
        notes.append("one rank per node: intra-node link (nvlink) not measured; base profile values kept")
    if len(nodes) >= 2:
        mine = None
        for local in range(topology.ranks_per_node):
            ranks = [node[local] for node in nodes]
            group = dist.new_group(ranks)
            if topology.rank in ranks:
                mine = group
        node = topology.node_index
        peer_node = node + 1 if node % 2 == 0 else node - 1
        peer = nodes[peer_node][topology.local_index] if peer_node < len(nodes) else None
        out.append(bench.CollectiveGroup("ib", mine, len(nodes), peer, node % 2 == 0))
    else:
        notes.append("one node: inter-node link (ib) not measured (run on two or more nodes to measure it); "
                     "links.ib kept from the base profile")
    return out


# ---- output ----------------------------------------------------------------------------------------------------------

class _Progress:
    """A rich progress bar on rank 0 (stderr); nothing elsewhere."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self.total = total
        self._bar: Any = None
        self._task: Any = None
        self._started = False

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("calibrate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"), console=Console(stderr=True), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def step(self, description: str) -> None:
        if self._bar is not None:
            if self._started:
                self._bar.advance(self._task)
            self._started = True
            self._bar.update(self._task, description=description)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            if exc[0] is None and self._started:
                self._bar.advance(self._task)
            self._bar.__exit__(*exc)


def _progress(enabled: bool, total: int) -> _Progress:
    return _Progress(enabled, total)


def _format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def _print_summary(out: Path, fit: Any, notes: tuple[str, ...]) -> None:
    print(f"wrote {out}")
    if fit.gemm is not None:
        params = ", ".join(f"{k}={v:.4g}" for k, v in fit.gemm.params.items())
        print(f"  GEMM efficiency: {params}  (rms residual {fit.gemm.rms_relative_residual:.1%}, "
              f"{fit.gemm.points} GEMMs)")
    for link, result in fit.links.items():
        print(f"  {LINK_DESCRIPTIONS[link]} ({link}): alpha {result.params['alpha_s'] * 1e6:.1f} µs, bandwidth "
              f"{result.params['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s  (rms residual "
              f"{result.rms_relative_residual:.1%}, {result.points} points)")
    for note in notes:
        print(f"  note: {note}")
    print(f"  see: autopar profile show {out}")
