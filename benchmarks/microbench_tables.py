"""The public microbenchmark tables (shared/reference/microbench/) as calibration measurements, per bundled profile.

Each reader turns one CSV into the rows `autopar calibrate` would have measured (`autopar.calibrate.measurements`:
GemmMeasurement, CollectiveMeasurement, each naming its source file), for the bundled profiles whose GPU the table
measured. A table has a role: `fit` (its rows feed the profile's fit) or `check` (its rows are predicted, not fitted:
the hardware or kernel differs from what the bundled profile describes). Tables that give no time for a GEMM or a
collective the cost model prices are listed in UNUSED with the reason.

Conventions (README of the folder): sizes in bytes (2^k), GB/s = 1e9 B/s; all_reduce `size_bytes` is the per-rank
buffer, time = size × 2(n-1)/n / busbw where only busbw is printed; nccl-tests rows use the out-of-place time (vTrain
LUT: the second pair, as vTrain's predictor does). A published number is one median-like figure, so each row is a
Timing with q1 = median = q3 and runs = 1.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from autopar.calibrate.measurements import (CollectiveMeasurement, GemmMeasurement, HostMeasurement, Measurements,
                                           Timing)
from costmodels.comm import algorithm_factor, expected_destinations
from costmodels.hardware import load_profile

A100 = ("a100-80gb", "a100-40gb")
H100 = ("h100-80gb",)
H200 = ("h200-141gb",)
B200 = ("b200-180gb",)
GB200 = ("gb200-186gb",)
H800 = ("h800-80gb",)
PROFILES = (*A100, *H100, *H200, *B200, *GB200, *H800)

MIN_GEMM_IDEAL_S = 50e-6
"""GEMMs whose ideal time (2mnk at the dense peak) is below 50 µs are far from the curve's plateau — a 256³ fp16
cuBLAS call on A100 takes ~11 µs for 0.1 µs of math (gemm_cublas_fp16_vs_size_triton_tutorial_issues.csv): a
kernel's fixed time, and an output of fewer tiles than the GPU has SMs. They do not fit the plateau and roll-off
(peak_fraction, half_saturation_dim); the cuBLAS sweeps' rows under FLOOR_GEMM_IDEAL_S fit the kernel floor (role
SMALL_GEMM_ROLE, compute.KERNEL_FLOOR_US), the others are checked."""

SMALL_GEMM_ROLE = "small_gemm"
"""Rows that fit compute.gemm_efficiency's kernel_floor_us, the rest of the curve held at its fit (fit_microbench)."""
FLOOR_GEMM_IDEAL_S = 5e-6
"""The sweeps' GEMMs under 5 µs of math at the dense peak fit the kernel floor: their time is mostly the floor. Between
5 and 50 µs neither the floor nor the roll-off alone follows them (on H100 the time falls off faster than either from
1024 to 2688, its output too few tiles to fill the SMs), and they are checked."""
BETWEEN_FLOOR_AND_CURVE_WHY = ("between 5 and 50 µs of math at the dense peak: neither the kernel floor nor the "
                               "curve's roll-off alone follows these (FLOOR_GEMM_IDEAL_S)")
CUBLAS_SMALL_GEMM_WHY = (
    "under 5 µs of math at the dense peak, where a kernel's fixed time is most of it: fits kernel_floor_us. The sweeps "
    "time the kernel, not its launch: triton.testing.do_bench zeroes a 256 MB buffer before every call (fast_flush), "
    "a GPU memset of ~100 µs during which the host has long enqueued the GEMM, and times the call between CUDA events")

PEAK_TFLOPS = {"bf16": {"A100": 312.0, "H100": 989.0, "H200": 989.0, "B200": 2250.0, "GB200": 2500.0, "H800": 989.0},
               "fp8": {"H100": 1979.0, "H200": 1979.0, "B200": 4500.0, "GB200": 5000.0, "H800": 1979.0}}
"""Dense peaks of shared/reference/hardware.csv (the bundled profiles' compute.peak_tflops; GB200 and H800 as their
profiles state), for MIN_GEMM_IDEAL_S."""


@dataclass(frozen=True)
class Row:
    """One measurement for some bundled profiles."""

    profiles: tuple[str, ...]
    measurement: "GemmMeasurement | CollectiveMeasurement | HostMeasurement"
    role: str = "fit"
    """'fit' or 'check' (predicted only; `why` says why)."""
    why: str = ""
    extrapolated: str = ""
    """For a row carried over from another GPU's measurement: the rule (the profile's provenance says so)."""


@dataclass(frozen=True)
class Table:
    file: str
    read: Callable[[Path], Iterator[Row]]
    feeds: str
    """The profile keys this file's fit rows feed."""
    in_repository: bool = False
    """In the repository's benchmarks/microbench/ (a public measurement shared/reference does not hold; its header
    says where it comes from), not in shared/reference/microbench/."""


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def _timing(seconds: float) -> Timing:
    return Timing(median_s=seconds, q1_s=seconds, q3_s=seconds, runs=1)


def _collective(path: Path, link: str, kind: str, n: int, size: int, seconds: float, per_node: int = 1
                ) -> CollectiveMeasurement:
    return CollectiveMeasurement(link=link, kind=kind, group_size=n, bytes=size, timing=_timing(seconds),
                                 ranks_per_node=per_node if link == "ib" else 1, source=path.name)


def _from_busbw(kind: str, n: int, size: int, busbw_gb_per_s: float) -> float:
    """Seconds from nccl-tests bus bandwidth: size × factor / busbw (the README's convention)."""
    return size * float(algorithm_factor(kind, n)) / (busbw_gb_per_s * 1e9)


def _gemm(path: Path, precision: str, m: int, n: int, k: int, tflops: float, label: str) -> GemmMeasurement:
    return GemmMeasurement(precision=precision, m=m, n=n, k=k, timing=_timing(2.0 * m * n * k / (tflops * 1e12)),
                           label=label, source=path.name)


def _gemm_role(gpu: str, precision: str, m: int, n: int, k: int) -> tuple[str, str]:
    ideal_s = 2.0 * m * n * k / (PEAK_TFLOPS[precision][gpu] * 1e12)
    if ideal_s < MIN_GEMM_IDEAL_S:
        return "check", f"launch-bound (under {MIN_GEMM_IDEAL_S * 1e6:.0f} µs of math at the dense peak)"
    return "fit", ""


# ---- collectives ---------------------------------------------------------------------------------------------------

def read_vtrain(path: Path) -> Iterator[Row]:
    """A100 one node, all_reduce, n = 2..8, 1 MiB..1 GiB in 1 MiB steps; every 16th size (the curve is smooth)."""
    for row in _csv(path):
        size = int(row["size_bytes"])
        if (size // 1024**2 - 1) % 16 and size != 1024**3:
            continue
        yield Row(A100, _collective(path, "nvlink", "all_reduce", int(row["n_gpus"]), size, float(row["t2_ns"]) * 1e-9))


def read_ml_engineering_sweeps(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        config, n, nodes, size = row["config"], int(row["n_ranks"]), int(row["nodes"]), int(row["size_bytes"])
        seconds = (float(row["time_us"]) * 1e-6 if row["time_us"] else
                   _from_busbw("all_reduce", n, size, float(row["busbw_GBps"])))
        profiles = A100 if config.startswith("A100") else H200 if config.startswith("H200") else B200
        link = "ib" if nodes > 1 else "nvlink"
        yield Row(profiles, _collective(path, link, "all_reduce", n, size, seconds, n // nodes))


def read_nvls_points(path: Path) -> Iterator[Row]:
    """Single-size points: NCCL's default choice (NVLS or ring) on H200 / B200 nodes and 4 H200 nodes over EFA; the
    NCCL_NVLS_ENABLE=0 / forced-algorithm rows measure a non-default setting and are checked only."""
    for row in _csv(path):
        system, setting = row["system"], row["setting"]
        if not row["size_bytes"] or "MI300X" in system or not row["busbw_GBps"].replace(".", "").isdigit():
            continue
        profiles = H200 if "H200" in system else B200 if "B200" in system else ()
        if not profiles:
            continue
        n, size, kind = int(row["n_gpus"]), int(row["size_bytes"]), row["collective"]
        nodes = 4 if "4 nodes" in system else 1
        measurement = _collective(path, "ib" if nodes > 1 else "nvlink", kind, n, size,
                                  _from_busbw(kind, n, size, float(row["busbw_GBps"])), n // nodes)
        default = setting.startswith("default") or "-b 16G" in row["tool"] and "NVLS_ENABLE=1" in setting \
            or kind != "all_reduce"
        yield Row(profiles, measurement, "fit" if default else "check",
                  "" if default else f"non-default NCCL setting ({setting})")


def read_dgxc_h100(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        yield Row(H100, _collective(path, "nvlink", "all_reduce", 8, int(row["size_bytes"]),
                                    float(row["oop_time_us"]) * 1e-6))


def read_gcp_h100(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        yield Row(H100, _collective(path, "ib", "all_reduce", 16, int(row["size_bytes"]),
                                    float(row["oop_time_us"]) * 1e-6, 8), "check",
                  "GCP GPUDirect-TCPXO fabric, not the InfiniBand of the bundled profile")


GB200_RACK_GPUS = 72
"""GPUs of one GB200 NVL72 rack: one NVLink domain (the profile's nvlink_domain_size)."""


def read_coreweave(path: Path) -> Iterator[Row]:
    """IB + SHARP all-reduce on A100 (4 nodes) and H100 (12 nodes); GB200 NVL72: one rack (72 ranks) is an NVLink
    collective (MNNVL), 2 and 20 racks span NVLink domains over IB, so the 'node' of the hierarchical model is the
    rack's share of ranks (costmodels.comm): 72 per rack on 20 racks, 128 / 2 = 64 on 2 racks (ranks spread evenly
    over the racks, assumed: the file gives 32 trays, not their split)."""
    for row in _csv(path):
        config = row["config"]
        n = int(row["n_ranks"])
        if config.startswith("GB200"):
            racks = math.ceil(n / GB200_RACK_GPUS)
            if racks == 1:
                yield Row(GB200, _collective(path, "nvlink", "all_reduce", n, int(row["size_bytes"]),
                                             float(row["oop_time_us"]) * 1e-6))
            else:
                yield Row(GB200, _collective(path, "ib", "all_reduce", n, int(row["size_bytes"]),
                                             float(row["oop_time_us"]) * 1e-6, n // racks))
            continue
        profiles = A100 if config.startswith("A100") else H100 if config.startswith("H100") else ()
        if not profiles:
            continue
        per_node = int(row["gpus_per_node"])
        yield Row(profiles, _collective(path, "ib", "all_reduce", n, int(row["size_bytes"]),
                                        float(row["oop_time_us"]) * 1e-6, per_node))


def read_sendrecv_a100(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        yield Row(A100, _collective(path, "nvlink", "send_recv", 2, int(row["size_bytes"]),
                                    float(row["oop_time_us"]) * 1e-6))


DEEPEP_NOT_NIC_BOUND = ("2 nodes: half of DeepEP's counted RDMA rows stay on the node and the NIC carries ~22 GB/s "
                        "of its ~50, so the kernel is not NIC-bound there")


def read_deepep_internode(path: Path) -> Iterator[Row]:
    """DeepEP (V1) normal-kernel dispatch and combine across nodes, EP 16/32/64 = 2/4/8 nodes of 8 H800, one CX7
    400 Gb/s NIC per GPU: the same ConnectX-7 NIC as a DGX H100, so the NIC-bound rate carries to H100 as it is (the
    intranode rows run on H800's ~160 GB/s NVLink, not H100's 450: not fed). The README's 'bottleneck bandwidth' is
    DeepEP's RDMA byte count over the time (`deepep_rdma_counted_bytes`, the token's own node counted), so the time
    is those bytes / bw, and the row is an all-to-all of them: the cost model sends each rank's off-node share
    (N-1)/N over its own NIC (costmodels.comm), the rows DeepEP really puts on the wire, as its RDMA stage prices
    them (comm.deepep_all_to_all_time_s with deepep_off_node_share). The fitted points are thus the NIC rate DeepEP
    reached, ~43-44 GB/s of the NIC's ~50 on 4 and 8 nodes. On 2 nodes every token goes to both, half of the
    counted rows stay on the node and the NIC carries ~22 GB/s: the kernel is bounded elsewhere, so those rows do
    not measure the NIC and are checked only (DEEPEP_NOT_NIC_BOUND); a 2-node group takes the 4-node point. The roles
    are `_deepep_v1_rows`'."""
    return _deepep_v1_rows(path, H100, lambda row: row["kernel"] == "normal (high-throughput)"
                           and row["scope"] == "internode")


# ---- GEMMs ---------------------------------------------------------------------------------------------------------

MAMF_GPUS = {"NVIDIA A100 SXM": ("A100", A100), "NVIDIA H100 SXM": ("H100", H100), "NVIDIA H200 SXM": ("H200", H200),
             "NVIDIA B200 SXM": ("B200", B200), "NVIDIA GB200 SXM": ("GB200", GB200)}


MAMF_LABEL = "MAMF "
"""How a MAMF best-shape row's label begins (benchmarks/fit_microbench.py GEMM_DONORS reads them apart)."""


def read_mamf(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        if row["accelerator"] not in MAMF_GPUS or not row["mamf_tflops"]:
            continue
        gpu, profiles = MAMF_GPUS[row["accelerator"]]
        precision = "fp8" if row["dtype"].startswith("fp8") else "bf16"
        m, n, k = (int(x) for x in row["best_shape_MxNxK"].split("x"))
        tflops = float(row["mamf_tflops"])
        yield Row(profiles, _gemm(path, precision, m, n, k, tflops, f"{MAMF_LABEL}{row['accelerator']}"))
        same_die = f"{MAMF_LABEL}H100 SXM (same die)"
        if gpu == "H100" and precision == "bf16":  # the source: 'H200 is the same' (same GH100 compute die)
            yield Row(H200, _gemm(path, precision, m, n, k, tflops, same_die))
        if gpu == "H100":  # H800: the H100 SXM die and tensor-core rates, NVLink cut (microbench README 'H800 vs H100')
            yield Row(H800, _gemm(path, precision, m, n, k, tflops, same_die))


def read_cublas_sweep(path: Path) -> Iterator[Row]:
    """fp16 cuBLAS sweeps (fp16 and bf16 run at the same tensor-core rate): tutorial 03's square sizes (A100 #3551,
    H100 #3672) and tutorial 10's cuBLAS column at 2048 × N × N (H100 #2339). The sizes under FLOOR_GEMM_IDEAL_S fit
    the kernel floor (SMALL_GEMM_ROLE), those up to MIN_GEMM_IDEAL_S are checked, the others fit the curve.

    The H100 variant is not stated in either thread; both are taken as SXM: #2339's cuBLAS reaches 722 TFLOPS at
    2048×8192×8192, 95% of an H100 PCIe's 756 dense peak and so only possible on the SXM part (989), and #3672 agrees
    with it at the one size both ran (511 vs 515 TFLOPS at 2048³). These are the H100's only bf16/fp16 cuBLAS
    measurements at training-like shapes besides MAMF's single best shape (a maximum over a sweep, so an upper
    bound)."""
    for row in _csv(path):
        if not row["cublas_tflops"]:
            continue
        gpu = "A100" if row["gpu"].startswith("A100") else "H100"
        m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
        role, why = _gemm_role(gpu, "bf16", m, n, k)
        if 2.0 * m * n * k / (PEAK_TFLOPS["bf16"][gpu] * 1e12) < FLOOR_GEMM_IDEAL_S:
            role, why = SMALL_GEMM_ROLE, CUBLAS_SMALL_GEMM_WHY
        elif role == "check":
            why = BETWEEN_FLOOR_AND_CURVE_WHY
        measurement = _gemm(path, "bf16", m, n, k, float(row["cublas_tflops"]), f"cuBLAS fp16 {gpu} {m}x{n}x{k}")
        profiles = A100 if gpu == "A100" else (*H100, *H200, *H800)   # H800: the H100 SXM die
        yield Row(profiles, measurement, role, why)


def read_deepgemm(path: Path) -> Iterator[Row]:
    """FP8 DeepGEMM on H800 (same dense FP8 rate as H100 SXM): per group an m×k·k×n GEMM (grouped layouts: m is the
    rows per expert), the time of one group at the printed rate. Each grouped-layout row is read twice: as a GEMM of
    the dense curve (as before), and as a grouped expert GEMM (kind 'grouped_gemm') fitting the grouped roofline of
    costmodels.moe_kernels. The grouped rows all feed that fit: DeepGEMM times with kineto (kernel time only), so
    the host launch cost that makes short cuBLAS calls unrepresentative (MIN_GEMM_IDEAL_S) is not in them."""
    for row in _csv(path):
        m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
        role, why = _gemm_role("H100", "fp8", m * int(row["groups"]), n, k)
        label = f"DeepGEMM {row['layout']} g{row['groups']}"
        measurement = _gemm(path, "fp8", m, n, k, float(row["tflops"]), label)
        yield Row((*H100, *H200, *H800), measurement, role, why)
        if row["layout"].startswith("grouped"):
            # H100 (and H800, the GPU measured): the roofline's memory part is a fraction of HBM bandwidth, and
            # H800's HBM3 is H100's (3.35 TB/s), not H200's 4.8 TB/s; other GPUs take the fractions over
            # (fit_microbench)
            yield Row((*H100, *H800), dataclasses.replace(measurement, kind="grouped_gemm"))


HARNESS_MSE_PASSES = 5
"""torchao's fwd_bwd harness ends in F.mse_loss(out, ones_like(out)).backward(): the loss reads the output and the
labels, its backward reads both again and writes the output's gradient — five passes over total_M × N bf16 values,
priced at the spec HBM bandwidth (B200 8.0 TB/s, shared/reference/hardware.csv) and taken off the timed call."""
B200_HBM_BYTES_PER_S = 8.0e12


def read_torchao_grouped_mm(path: Path) -> Iterator[Row]:
    """bf16 torch._grouped_mm on B200 (torchao's autograd-function benchmark): one timed call is the forward, dA and dB
    grouped GEMMs of G groups over total_M rows — three GEMMs of equal FLOPs (2·total_M·N·K each) that each read and
    write the same three matrices per group (m×k, k×n, m×n with m = total_M / G), so it is 3·G group GEMMs of one
    roofline shape, once the harness's MSE loss (HARNESS_MSE_PASSES) is taken off. The only bf16 grouped GEMMs
    measured on any GPU: they feed B200's grouped_bf16_peak_fraction (GB200, the same die, takes it over); every
    group has thousands of rows, so the HBM fraction is not determined here (fit_grouped_gemm holds it)."""
    for row in _csv(path):
        total_m, n, k, groups = (int(row[key]) for key in ("total_M", "N", "K", "G"))
        loss_s = HARNESS_MSE_PASSES * total_m * n * 2.0 / B200_HBM_BYTES_PER_S
        per_group_gemm_s = (float(row["bf16_fwd_bwd_us"]) * 1e-6 - loss_s) / (3 * groups)
        measurement = GemmMeasurement(precision="bf16", m=total_m // groups, n=n, k=k, kind="grouped_gemm",
                                      timing=_timing(per_group_gemm_s), source=path.name,
                                      label=f"torch._grouped_mm bf16 fwd+bwd {row['shapes']} G={groups}")
        yield Row(B200, measurement)


def read_swiglu(path: Path) -> Iterator[Row]:
    for row in _csv(path):
        measurement = _gemm(path, "bf16", int(row["M"]), int(row["N"]), int(row["K"]), float(row["tflops"]),
                            f"fp16 bmm d_ff={row['K']} ({row['row_kind']})")
        yield Row(H100, measurement, "check", "shape-alignment penalty (d_ff not a multiple of 64): not in the curve")


def read_tilelang_h800(path: Path) -> Iterator[Row]:
    """TileLang autotuned GEMMs on one H800 SXM, M = N = 8192, K = 256..16384, fp16 (the bf16 tensor-core rate) and
    fp8: the only K sweep measured on H800. Not cuBLAS (what Megatron-Core calls), but within 4% of the H100 SXM MAMF
    (cuBLAS) at large K, so it feeds H800's curve; the H100/H200 curves keep their cuBLAS/DeepGEMM sources."""
    for row in _csv(path):
        precision = "fp8" if row["dtype"].startswith("fp8") else "bf16"
        m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
        role, why = _gemm_role("H800", precision, m, n, k)
        yield Row(H800, _gemm(path, precision, m, n, k, float(row["tflops"]), f"TileLang {row['dtype']} K={k}"),
                  role, why)


P2P_TIMED_BYTES = 5 * 10_000_000 * 4
"""cuda-samples p2pBandwidthLatencyTest `outputBandwidthMatrix`: numElems = 10,000,000 ints per cudaMemcpyPeerAsync,
repeat = 5 back to back in one stream between two events; bandwidth = 40 MB x 5 / elapsed, so the timed span moves
200 MB at the printed rate (one transfer's latency, not five)."""


def read_p2p_matrices(path: Path) -> Iterator[Row]:
    """Unidirectional P2P write between two GPUs (off-diagonal entries) as a 2-rank send_recv of the 200 MB timed.
    GB200 tray: fitted (no NCCL send/recv or all-to-all measured on GB200; NVLink 5 is the same inside the tray and
    across the rack). A100 / H100: checked only — their NVLink values are fitted to NCCL tables of the same nodes,
    and a copy-engine write is not an NCCL kernel. H200 nvbandwidth and EFA rows: no size per copy, not used."""
    for row in _csv(path):
        if "p2pBandwidthLatencyTest" not in row["tool"] or row["src_gpu"] == row["dst_gpu"]:
            continue
        system = row["system"]
        profiles = GB200 if system.startswith("GB200") else A100 if system.startswith("A100") else H100
        seconds = _from_busbw("send_recv", 2, P2P_TIMED_BYTES, float(row["value_GBps"]))
        measurement = _collective(path, "nvlink", "send_recv", 2, P2P_TIMED_BYTES, seconds)
        if profiles is GB200:
            yield Row(profiles, measurement)
        else:
            yield Row(profiles, measurement, "check", "copy-engine P2P write, not NCCL; this node's NVLink values "
                                                      "are fitted to its NCCL tables")


DEEPEP_COUNTED_BYTES = {"FP8": 1.0 + 4.0 / 128.0, "BF16": 2.0}
"""Bytes per hidden element DeepEP's benchmarks count for a token of the normal kernels: BF16 2; FP8 1 plus a 4-byte
fp32 scale per 128 channels (tests/legacy/test_intranode.py and test_internode.py `fp8_factor = (1 + 4 / 128) / 2`
of the BF16 bytes)."""
DEEPEP_TEST_EXPERTS = 256
"""Experts of DeepEP's benchmarks (tests/legacy/test_intranode.py, test_internode.py and tests/elastic/test_ep.py
`--num-experts` default 256, DeepSeek-V3's routed experts), each token's top-k drawn from uniform random scores."""


def deepep_low_latency_bytes(hidden: int, dtype: str) -> float:
    """Bytes per routed copy DeepEP's low-latency benchmark counts (tests/legacy/test_low_latency.py: `num_fp8_bytes`
    for the dispatch, the token with its scales and 16 bytes beside, `num_bf16_bytes` for the combine; every selection
    counted, no deduplication)."""
    return hidden + hidden / 128 * 4 + 16 if dtype == "FP8" else 2.0 * hidden


def deepep_counted_bytes(tokens: int, hidden: int, topk: int, ranks: int, dtype: str) -> float:
    """The bytes one rank receives in an intranode DeepEP dispatch as DeepEP's benchmarks count them (`recv_x`: one
    row per token and destination rank, its own included), with the tests' balanced routing: tokens x the expected
    number of destination ranks."""
    rows = tokens * float(expected_destinations(DEEPEP_TEST_EXPERTS, topk, ranks))
    return rows * hidden * DEEPEP_COUNTED_BYTES[dtype]


def deepep_rdma_counted_bytes(tokens: int, hidden: int, topk: int, nodes: int, topk_groups: int, dtype: str) -> float:
    """The RDMA bytes one rank's internode DeepEP dispatch sends as tests/legacy/test_internode.py counts them
    (`num_rdma_token_sent`: one row per token and destination node, the token's own node included, though nothing
    for it crosses the NIC: csrc/kernels/legacy/internode.cu only fences the local RDMA rank), with the test's
    routing: the nodes are the groups, the best min(N, topk_groups) of them by their best expert kept
    (`--num-topk-groups`), the top-k chosen among their experts."""
    chosen = min(nodes, topk_groups)
    reached = expected_destinations(DEEPEP_TEST_EXPERTS, topk, nodes, nodes, chosen, group_by_max=True)
    rows = tokens * float(reached)
    return rows * hidden * DEEPEP_COUNTED_BYTES[dtype]


def read_deepep_v1(path: Path) -> Iterator[Row]:
    """The H100 rows (read_deepep_internode) and the H800 rows (read_deepep_h800) of the DeepEP V1 table."""
    yield from read_deepep_internode(path)
    yield from read_deepep_h800(path)


def read_deepep_h800(path: Path) -> Iterator[Row]:
    """DeepEP V1 on H800 as all-to-all, each row read with DeepEP's own byte count, so t = counted bytes / printed
    bandwidth and the row is an all-to-all of those bytes: on NVLink (EP 8, one node) `deepep_counted_bytes` (one
    row per token and destination rank: the deduplicated copies costmodels.comm.deepep_all_to_all_time_s sends);
    over RDMA (EP 16/32/64 on N = 2/4/8 nodes of 8) `deepep_rdma_counted_bytes`, as read_deepep_internode reads
    them for H100; the low-latency kernels count every routed copy (`deepep_low_latency_bytes`). The buffer size
    only places the row in the bandwidth regime (alpha is not determined)."""
    return _deepep_v1_rows(path, H800, lambda row: True)


def _deepep_v1_rows(path: Path, profiles: tuple[str, ...], keep: Callable[[dict], bool]) -> Iterator[Row]:
    """The DeepEP V1 table's rows that `keep` selects, as all-to-alls of DeepEP's own byte count for `profiles`.
    Fitted: the current (docs/legacy.md) figures of the normal kernels; checked only: the initial README's
    (superseded kernels), the low-latency kernels (128-token inference decoding, not what a training step runs) and
    the 2-node rows (DEEPEP_NOT_NIC_BOUND)."""
    for row in _csv(path):
        if not keep(row):
            continue
        ep, tokens, hidden, topk = (int(row[key]) for key in ("ep_ranks", "tokens_per_rank", "hidden", "topk"))
        nodes = max(1, ep // 8)
        link = "nvlink" if nodes == 1 else "ib"
        low_latency = row["kernel"].startswith("low-latency")
        role, why = ("fit", "") if row["readme_version"].startswith("current") and not low_latency else (
            "check", "low-latency inference kernels (128 tokens)" if low_latency else
            "initial README figures, superseded by the current kernels")
        if role == "fit" and nodes == 2:
            role, why = "check", DEEPEP_NOT_NIC_BOUND
        for phase, dtype in (("dispatch", row["dispatch_dtype"]), ("combine", row["combine_dtype"])):
            if low_latency:
                counted = tokens * topk * deepep_low_latency_bytes(hidden, dtype)
            elif link == "nvlink":
                counted = deepep_counted_bytes(tokens, hidden, topk, ep, dtype)
            else:
                counted = deepep_rdma_counted_bytes(tokens, hidden, topk, nodes, int(row["topk_groups"]), dtype)
            seconds = counted / (float(row[f"{phase}_bw_GBps"]) * 1e9)
            yield Row(profiles, _collective(path, link, "all_to_all", ep, int(counted), seconds, 8), role, why)


def read_deepep_v2(path: Path) -> Iterator[Row]:
    """DeepEP v2 (ElasticBuffer, NCCL Gin) on one SM100 NVLink domain of 8 GPUs, checked against the B200 profile:
    its 'logical bandwidth' counts what a rank receives, its own tokens included (the README's caveat; tests/elastic/
    test_ep.py: received tokens x bytes per token), a token once per destination rank, so the row is an all-to-all
    of `deepep_counted_bytes` (the token's metadata, ~1% more, left out) -- what costmodels.comm prices DeepEP's
    dispatch as. A check, not a fit: the SKU is not stated (an 8-GPU B200 node or 8 GPUs of a GB200 rack), and
    B200's NVLink fit comes from all-reduce measurements, so the row tests the per-rank deduplication on a link
    fitted without it. The RDMA rows (EP 8 x 2, 8 x 4) state neither the GPU nor the NIC rate: not fed."""
    for row in _csv(path):
        if row["link"] != "NVLink" or row["arch"] != "SM100":
            continue
        ranks = int(row["topo"].split()[-1])
        tokens, hidden, topk = (int(row[key]) for key in ("tokens_per_rank", "hidden", "topk"))
        for phase, dtype in (("dispatch", row["dispatch_dtype"]), ("combine", row["combine_dtype"])):
            counted = deepep_counted_bytes(tokens, hidden, topk, ranks, dtype)
            seconds = counted / (float(row[f"{phase}_bw_GBps"]) * 1e9)
            yield Row(B200, _collective(path, "nvlink", "all_to_all", ranks, int(counted), seconds), "check",
                      f"SM100 SKU not stated; DeepEP v2 {phase} on {row['sms_used']} SMs")


# ---- fused attention ------------------------------------------------------------------------------------------------

ATTENTION_BACKWARD_FLOPS = 2.5
"""The sources count the fused backward at 2.5× the forward FLOPs (cuDNN frontend and FlashAttention benchmarks:
bwd = 2·(3·d_qk + 2·d_vo) per score element against fwd 2·(d_qk + d_vo); tritonbench the same), and causal attention
at the unmasked half of the score matrix (cudnn-frontend: 4·B·S²·H·d/2 on B200, the exact unmasked count on
H200/GB200, ≈ S²/2); the cost model counts the fused core the same way (costmodels.compute.attention_gemms: half the
matrix with a fused kernel; FLASH_CORE_BACKWARD_TO_FORWARD = 2.5), so a measured rate is a rate on our FLOPs."""

GPU_PROFILES = {"A100": A100, "H100": H100, "H200": H200, "H800": H800, "B200": B200, "GB200": GB200}


@functools.lru_cache(maxsize=None)
def native_bf16_flops_per_clock_per_sm(gpu: str) -> float:
    """Dense bf16 tensor-core FLOP per clock per SM with the generation's native MMA instruction, as the GPU's
    bundled profile states it (compute.bf16_flops_per_clock_per_sm: A100 2048 with mma.sync, Hopper 4096 with
    wgmma, Blackwell 8192 with tcgen05). With the datasheet dense peak it gives SMs × clock = peak / this (A100 108
    SMs × 1.41 GHz; H100 132 × 1.83; B200 148 × 1.86)."""
    return load_profile(GPU_PROFILES[gpu][0]).bf16_flops_per_clock_per_sm


FA2_RULE = ("FlashAttention-2 issues Ampere's mma.sync on every GPU (no wgmma/tcgen05; FA3 paper, arXiv 2407.08608: "
            "'FlashAttention-2 achieving only 35% utilization on the H100'), so its rate per SM per clock carries over: "
            "the measured B200 rate (flash_attn 2.7.4) scaled by SMs × clock (peak / native FLOP per clock per SM)")
FA2_SPEEDUP = {"fa1": {"fwd": 2.0, "bwd": 2.0}, "fa_triton": {"fwd": 1.4, "bwd": 2.0}}
"""FlashAttention-2's speed over the kernels it replaced, per pass, on A100 80GB SXM4 (FA2 paper, arXiv 2307.08691
§4.1, its benchmarks at 512-16K tokens, head dim 64/128, causal and not): 'around 2x faster than FlashAttention'
(1.7-3.0x, §4), and 'around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x faster
in the backward pass' (1.4: the middle of 1.3-1.5). FlashAttention in Triton is flash-attention's
flash_attn_triton.py, which llm-foundry copies as MPT's `attn_impl: triton` (llm_foundry/models/layers/
flash_attn_triton.py: 'Copied from .../flash_attn/flash_attn_triton.py'); its author: 'Triton forward is generally
faster than CUDA forward, while Triton backward is generally slower'."""
FA1_ERA_RULE = ("{kernel} on A100: the A100 FlashAttention-2 curve at 1/{speedup} of its {attention_pass} rate "
                "(FA2 paper arXiv 2307.08691 §4.1, A100: FlashAttention-2 {speedup}x faster in that pass)")
SAME_DIE_RULE = ("H100 SXM, H200 and H800 are the same GH100 die (132 SMs, the same clocks and dense peak; H800 cuts "
                 "NVLink only); a compute-bound kernel runs at the same rate on all three")


def sm_clock_ratio(target: str, source: str) -> float:
    """(SMs × clock) of `target` over `source`: peak / native FLOP per clock per SM
    (native_bf16_flops_per_clock_per_sm)."""
    def sm_clock(gpu: str) -> float:
        return PEAK_TFLOPS["bf16"][gpu] / native_bf16_flops_per_clock_per_sm(gpu)
    return sm_clock(target) / sm_clock(source)


def _attention(path: Path, profiles: tuple[str, ...], kernel: str, attention_pass: str, seq: int, head_dim: int,
               flops: float, seconds: float, label: str, role: str = "fit", why: str = "",
               extrapolated: str = "", dispatch_exposed: bool = False) -> Row:
    """One pass of a fused-attention measurement as the equivalent GEMM (m = n = seq, k = head_dim) timed at the
    kernel's measured rate in that pass: 2·seq²·head_dim FLOPs at `flops` / `seconds`. `dispatch_exposed`: the
    source timed one call of `flops` on an idle GPU, host dispatch included (GemmMeasurement.exposed_dispatches:
    one dispatch per call, so 2·seq²·head_dim / flops of one per equivalent GEMM)."""
    equivalent_flops = 2.0 * seq * seq * head_dim
    seconds_equivalent = equivalent_flops / (flops / seconds)
    return Row(profiles, GemmMeasurement(precision="bf16", m=seq, n=seq, k=head_dim, timing=_timing(seconds_equivalent),
                                         label=label, source=path.name, kind="attention", attention_kernel=kernel,
                                         attention_pass=attention_pass,
                                         exposed_dispatches=equivalent_flops / flops if dispatch_exposed else 0.0),
               role, why, extrapolated)


NON_CAUSAL_WHY = "non-causal (no mask): the cost model's core is causal; a full-matrix rate is not the causal one"


def read_cudnn_h200_gb200(path: Path) -> Iterator[Row]:
    """cuDNN SDPA, Llama-3.1-70B attention shape (d = 128), bf16, on one H200 (batch 1) and one GB200 GPU (batch 2):
    the causal rows fit the cudnn curve of H200 and GB200 (and, same die as H200, of H100 and H800), each pass on its
    own; the full-mask rows are checked; GB200's deterministic backward (another kernel; Transformer Engine's default
    is the non-deterministic one) is left out."""
    for row in _csv(path):
        gpu = {"NVIDIA H200": "H200", "NVIDIA GB200": "GB200"}.get(row["gpu"])
        if gpu is None or row["dtype"] != "bfloat16" or row["model_preset"] != "llama3.1" \
                or row["deterministic_bwd"] == "True":
            continue
        seconds, seq, causal = float(row["time_ms"]) * 1e-3, int(row["q_seqlen"]), row["attn_mask"] == "top_left"
        flops = float(row["tflops"]) * 1e12 * seconds
        label = f"cuDNN SDPA {gpu} {row['attn_mask']} {row['pass']} s={seq}"
        yield _attention(path, H200 if gpu == "H200" else GB200, "cudnn", row["pass"], seq, int(row["d_qk"]), flops,
                         seconds, label, *(("fit", "") if causal else ("check", NON_CAUSAL_WHY)))
        if causal and gpu == "H200":
            yield _attention(path, (*H100, *H800), "cudnn", row["pass"], seq, int(row["d_qk"]), flops, seconds,
                             label + " (as H100/H800)", extrapolated=SAME_DIE_RULE)


def read_fa3_h100(path: Path) -> Iterator[Row]:
    """FlashAttention-3 on H100, B=4, 48 heads, d=128: the causal rows (times) fit the fa3 curve of H100 and (same die)
    H200, each pass on its own; the non-causal rows (TFLOPS) are checked."""
    batch, heads, head_dim = 4, 48, 128
    for row in _csv(path):
        seq, attention_pass = int(row["q_seqlen"]), row["pass"]
        full_flops = 4.0 * batch * heads * seq * seq * head_dim                # 2·B·H·S²·(d + d), no mask
        multiple = ATTENTION_BACKWARD_FLOPS if attention_pass == "bwd" else 1.0
        if row["mask"] == "causal":
            flops, seconds = 0.5 * full_flops * multiple, float(row["time_us"]) * 1e-6
            label = f"FA3 H100 causal {attention_pass} s={seq}"
            yield _attention(path, H100, "fa3", attention_pass, seq, head_dim, flops, seconds, label)
            yield _attention(path, (*H200, *H800), "fa3", attention_pass, seq, head_dim, flops, seconds,
                             label + " (as H200/H800)", extrapolated=SAME_DIE_RULE)
        else:
            flops = full_flops * multiple
            yield _attention(path, H100, "fa3", attention_pass, seq, head_dim, flops,
                             flops / (float(row["tflops"]) * 1e12), f"FA3 H100 full {attention_pass} s={seq}",
                             "check", NON_CAUSAL_WHY)


B200_BACKENDS = {"cudnn (cudnn-frontend graph)": ("cudnn", "fit", ""),
                 "flash_attention": ("fa2", "fit", ""),
                 "pyt_cudnn": ("cudnn", "check", "PyTorch SDPA's cuDNN backend (framework overhead at short "
                                                 "sequences); Transformer Engine calls the cuDNN graph directly"),
                 "pyt_flash_attention": ("fa2", "check", "PyTorch SDPA's bundled FlashAttention-2 build; the fa2 "
                                                         "curve is fitted to flash_attn 2.7.4")}
"""B200 backends -> (kernel curve, role, why); pyt_math (unfused, runs out of memory from 16K) is not a fused kernel."""


SDPA_HARNESS_DISPATCH = ("cudnn-frontend's SDPA training benchmark times every call with its host dispatch in it "
                         "(benchmark_bf16_sdpa.py, benchmark_fp8_sdpa.py)")
"""Why the B200 rows carry one host dispatch per call (benchmark_bf16_sdpa.py for the PyTorch and flash_attn
backends, benchmark_fp8_sdpa.py for the cuDNN graph rows, at the file's commit 0b1577c). Forward:
`torch.cuda.synchronize()` and a `time.sleep` end the previous pass, then `start_event.record()`, the call
(`sdpa_function(...)` under `torch.autograd.profiler.emit_nvtx()`, or `graph_fwd.execute(...)`) and
`end_event.record()`: the GPU sits idle between the start event and the kernel while the host dispatches it (the
flash_attn rows show ~80 µs of it at 512 tokens, where the kernel runs ~25 µs). Backward: the same, except that
`grad_output = torch.randn_like(output)`, queued just before the start event, keeps the GPU busy for the first few
µs of the dispatch; the fit finds how much of it shows (none for flash_attn's backward, whose rows fit best
without). A training step queues each kernel behind the previous ones, so the cost model prices the kernel alone;
the fit takes the dispatch out (autopar.calibrate.fit.fit_attention_efficiency)."""


def read_sdpa_b200(path: Path) -> Iterator[Row]:
    """One B200, bf16, causal GQA d=128: the cuDNN graph rows fit B200's cudnn curve, flash_attn 2.7.4 its fa2 curve
    and, scaled by FA2_RULE, the fa2 curve of A100, H100 and H200, and on A100 by FA2_SPEEDUP the fa1 and fa_triton
    curves; the PyTorch SDPA backends are checked. Every row carries the harness's host dispatch
    (SDPA_HARNESS_DISPATCH), scaled with the rest of the time where a row is carried to another GPU: the fit gives
    each curve its own dispatch time, which no step prices."""
    for row in _csv(path):
        if row["dtype"] != "bf16" or row["backend"] not in B200_BACKENDS:
            continue
        kernel, role, why = B200_BACKENDS[row["backend"]]
        seq, head_dim = int(row["q_seqlen"]), int(row["head_dim"])
        for attention_pass in ("fwd", "bwd"):
            seconds = float(row[f"{attention_pass}_time_ms"]) * 1e-3
            flops = float(row[f"{attention_pass}_tflops"]) * 1e12 * seconds
            label = f"{row['backend']} B200 causal {attention_pass} s={seq}"
            yield _attention(path, B200, kernel, attention_pass, seq, head_dim, flops, seconds, label, role, why,
                             dispatch_exposed=True)
            if row["backend"] != "flash_attention":
                continue
            for gpu, profiles in (("A100", A100), ("H100", H100), ("H200", H200), ("H800", H800), ("GB200", GB200)):
                ratio = sm_clock_ratio(gpu, "B200")
                yield _attention(path, profiles, kernel, attention_pass, seq, head_dim, flops, seconds / ratio,
                                 f"{label} (as {gpu}, x{ratio:.3f})",
                                 extrapolated=f"{FA2_RULE}: x{ratio:.3f} for {gpu}", dispatch_exposed=True)
            ratio = sm_clock_ratio("A100", "B200")
            for older, speedups in FA2_SPEEDUP.items():   # the kernels FlashAttention-2 replaced, measured on A100
                speedup = speedups[attention_pass]
                yield _attention(path, A100, older, attention_pass, seq, head_dim, flops,
                                 seconds / ratio * speedup, f"{label} (as A100 {older}, x{ratio:.3f} / {speedup:g})",
                                 extrapolated=f"{FA2_RULE}: x{ratio:.3f} for A100; " + FA1_ERA_RULE.format(
                                     kernel=older, speedup=f"{speedup:g}", attention_pass=attention_pass),
                                 dispatch_exposed=True)



# ---- host launch costs (costmodels.host): one set for every profile -------------------------------------------------

X86_HOST_PROFILES = (*A100, *H100, *H200, *B200, *H800)
"""Profiles of GPUs in x86 servers (HGX / DGX): a host cost is the CPU's, Python's, PyTorch's and the driver's, not
the GPU's, so the rows measured on A100 and H100 hosts (and a laptop's raw launches) price them alike."""
GRACE_HOST_PROFILES = GB200
"""Profiles of GPUs driven by a Grace CPU (GB200 superchips)."""
GRACE_HOST_FACTOR = 37.08 / 13.48
"""Host time per op on Grace over x86 for the same PyTorch code: a torch.nn.Linear bf16 forward takes 37.08 µs of CPU
on GB200 and 13.48 µs on an H100 DGX's Xeon 8480C (TransformerEngine issue #2053, benchmarks/microbench/
host_cpu_linear_te_issue2053.csv; 33.17 µs on GH200)."""
GRACE_RULE = (f"the x86 host's measurement x {GRACE_HOST_FACTOR:.2f}, Grace's host time per op over x86's for the same "
              "torch linear (TransformerEngine issue #2053: 37.08 vs 13.48 µs)")


def _host_rows(measurement: HostMeasurement) -> Iterator[Row]:
    """A host row measured on an x86 server, for the x86 profiles, and scaled by GRACE_HOST_FACTOR for the Grace ones."""
    yield Row(X86_HOST_PROFILES, measurement)
    scaled = dataclasses.replace(measurement, timing=_timing(measurement.timing.median_s * GRACE_HOST_FACTOR))
    yield Row(GRACE_HOST_PROFILES, scaled, extrapolated=GRACE_RULE)

HOST_SMALL_SHAPES = {"(1, 4096)", "(16, 4096)", "512x512"}
"""The FlagGems / Torch-FL shapes whose kernel is far shorter than its launch (the threads say so: 7.1 µs for 4K and
64K elements alike); the 4096² and larger adds time the GPU kernel, not the host."""


def _host(path: Path, kind: str, microseconds: float, label: str, kernels: int = 1) -> HostMeasurement:
    return HostMeasurement(path=kind, timing=_timing(microseconds * 1e-6), kernels=kernels, label=label,
                           source=path.name)


def read_host_threads(path: Path) -> Iterator[Row]:
    """host_dispatch_launch_overhead_issue_threads.csv, by launch path:
    - aten_op: eager torch.add on tiny tensors (FlagGems #4558), the ATen CUDA op submitted back to back (Torch-FL #27,
      512×512), a C++ custom op called from Python (vLLM's, helion #3009): one dispatch and one launch each;
    - triton_launch: helion #3009's raw Triton launcher; compiled_call: its torch.compile'd op (one Triton kernel);
    - launch: a raw cudaLaunchKernel enqueue (ocannl #488, async, one sync outside the timed region);
    - cuda_graph_replay: ocannl's graphs of N no-op nodes, replay + sync (the author's fit: 15 µs + 0.58 µs a node);
    - sync: Torch-FL's synchronised time per op less its back-to-back time per op, for the same 512×512 op.
    Not used: FlagGems' and Helion's own Python wrappers (launchers no training engine here uses), the eager
    multi-op reference (its op count is not stated), and autoparallel's fitted constant (not a measurement)."""
    rows = _csv(path)
    submitted: dict[tuple[str, str], float] = {}
    for r in rows:
        if r["timing"] == "fit stated by the author":   # the graph sweep's summary ('15 + 0.58*N'): its rows are read
            continue
        value, variant, size = float(r["value"]), r["variant"], r["size"]
        label = f"{r['workload']} {size} {variant}"
        if variant.startswith("torch.add (eager") and size in HOST_SMALL_SHAPES:
            yield from _host_rows(_host(path, "aten_op", value, label))
        elif variant.startswith("vendor C++ dispatch") and size in HOST_SMALL_SHAPES:
            if r["metric"].startswith("submit"):
                submitted[("kCuda", size)] = value
                yield from _host_rows(_host(path, "aten_op", value, label))
            elif ("kCuda", size) in submitted:
                yield from _host_rows(_host(path, "sync", value - submitted[("kCuda", size)],
                                          f"{label}: synchronised less submitted"))
        elif variant.startswith("vllm (CUDA C++ custom op)"):
            yield from _host_rows(_host(path, "aten_op", value, label))
        elif variant == "triton":
            yield from _host_rows(_host(path, "triton_launch", value, label))
        elif variant == "torch.compile":
            yield from _host_rows(_host(path, "compiled_call", value, label))
        elif variant.startswith("async enqueue"):
            yield from _host_rows(_host(path, "launch", value, label))
        elif variant.startswith("same chain stream-captured"):
            nodes = int(size.removeprefix("N="))
            yield from _host_rows(_host(path, "cuda_graph_replay", value, label, kernels=nodes))


def read_dgxc_launch(path: Path) -> Iterator[Row]:
    """launch_overhead_small_gemm_dgxc_sample.csv: back-to-back torch.matmul on tiny fp32 matrices, no sync in the
    loop (NVIDIA dgxc-benchmarking cpu_overhead): the eager GEMM's host dispatch and launch (GPU not stated; the
    host is what is timed)."""
    for r in _csv(path):
        label = f"torch.matmul {r['M']}x{r['N']}x{r['K']} {r['dtype']}"
        yield from _host_rows(_host(path, "aten_gemm", float(r["avg_time_per_op_us"]), label))


def read_te_linear_cpu(path: Path) -> Iterator[Row]:
    """benchmarks/microbench/host_cpu_linear_te_issue2053.csv: the CPU time of one torch.nn.Linear bf16 forward, an
    eager GEMM from Python (host path aten_gemm), on an H100 DGX's Xeon (the x86 profiles) and on GB200's Grace (the
    Grace profiles, measured there). GH200 has no profile; the TE Linear rows give costmodels.engines'
    TE_MODULE_TO_TORCH_LINEAR (checked against them by tests/test_host.py)."""
    for r in _csv(path):
        if r["module"] != "torch.nn.Linear":
            continue
        label = f"torch.nn.Linear bf16 forward, {r['system']} ({r['cpu']})"
        measurement = HostMeasurement(path="aten_gemm", timing=_timing(float(r["cpu_us_per_call"]) * 1e-6),
                                      label=label, source=path.name)
        if r["system"] == "H100 DGX":
            yield Row(X86_HOST_PROFILES, measurement)
        elif r["system"] == "GB200":
            yield Row(GRACE_HOST_PROFILES, measurement)

TABLES = (
    Table("nccl_allreduce_a100_vtrain_lut.csv", read_vtrain, "collectives.nvlink.all_reduce (A100, n=2..8)"),
    Table("nccl_allreduce_sweeps_ml_engineering.csv", read_ml_engineering_sweeps,
          "collectives.nvlink.all_reduce (A100/H200/B200 n=8), collectives.ib.all_reduce (B200, 4 nodes)"),
    Table("nccl_points_nvls_vs_ring_ml_engineering.csv", read_nvls_points,
          "collectives.nvlink.all_reduce/all_gather/reduce_scatter (H200/B200 n=4..8), collectives.ib.all_reduce "
          "(H200, 4 nodes)"),
    Table("nccl_allreduce_h100_dgx_8gpu_dgxc.csv", read_dgxc_h100, "collectives.nvlink.all_reduce (H100 n=8)"),
    Table("nccl_allreduce_h100_gcp_a3mega_2node_ztan.csv", read_gcp_h100, "check only (TCPXO fabric)"),
    Table("nccl_allreduce_coreweave_gb200_h100_a100.csv", read_coreweave,
          "collectives.ib.all_reduce (A100 4 nodes, H100 12 nodes; IB + SHARP; GB200 2 and 20 racks), "
          "collectives.nvlink.all_reduce (GB200 NVL72 rack, 72 GPUs)"),
    Table("nccl_sendrecv_a100_8gpu_liplus.csv", read_sendrecv_a100, "collectives.nvlink.send_recv (A100)"),
    Table("moe_deepep_v1_dispatch_combine_h800.csv", read_deepep_v1,
          "collectives.ib.all_to_all (H100: same CX7 400 Gb/s NIC; internode normal kernels only); H800: "
          "collectives.nvlink.all_to_all (EP 8), collectives.ib.all_to_all (EP 16/32/64)"),
    Table("moe_deepep_v2_dispatch_combine.csv", read_deepep_v2,
          "check only (SM100 NVLink EP 8 against B200: DeepEP's per-rank deduplication)"),
    Table("gemm_mamf_max_achievable_matmul_ml_engineering.csv", read_mamf,
          "compute.gemm_efficiency peak_fraction / fp8_peak_fraction (A100, H100, H200, H800, B200, GB200)"),
    Table("gemm_cublas_fp16_vs_size_triton_tutorial_issues.csv", read_cublas_sweep,
          "compute.gemm_efficiency peak_fraction, half_saturation_dim, kernel_floor_us (A100, H100 SXM)"),
    Table("gemm_fp8_deepgemm_h800.csv", read_deepgemm, "compute.gemm_efficiency fp8_peak_fraction, fp8_half_saturation_dim, "
          "grouped_peak_fraction, grouped_hbm_efficiency (H100, H200; H800 too)"),
    Table("gemm_tilelang_h800_8192x8192xK.csv", read_tilelang_h800, "compute.gemm_efficiency (H800, bf16 and fp8)"),
    Table("grouped_mm_bf16_b200_torchao.csv", read_torchao_grouped_mm,
          "compute.gemm_efficiency grouped_bf16_peak_fraction (B200; GB200 extrapolated, same die)", in_repository=True),
    Table("gemm_fp16_swiglu_dff_alignment_h100_ml_engineering.csv", read_swiglu, "check only (alignment penalty)"),
    Table("attention_cudnn_sdpa_training_h200_gb200.csv", read_cudnn_h200_gb200,
          "compute.gemm_efficiency attention_cudnn_fwd/bwd_* (H200, GB200; H100 and H800 extrapolated, same die)"),
    Table("attention_fa3_h100_tritonbench_prs.csv", read_fa3_h100,
          "compute.gemm_efficiency attention_fa3_fwd/bwd_* (H100; H200 and H800 extrapolated, same die)"),
    Table("attention_sdpa_backends_b200_cudnn_frontend.csv", read_sdpa_b200,
          "compute.gemm_efficiency attention_cudnn_*, attention_fa2_* (B200; fa2 of A100/H100/H200/H800/GB200 "
          "extrapolated), attention_fa1_*, attention_fa_triton_* (A100, extrapolated)"),
    Table("p2p_bandwidth_matrices_ml_engineering.csv", read_p2p_matrices,
          "collectives.nvlink.send_recv (GB200 tray; A100/H100 checked only)"),
    Table("host_dispatch_launch_overhead_issue_threads.csv", read_host_threads,
          "host.aten_op_us, triton_launch_us, compiled_call_us, launch_us, cuda_graph_replay_us, cuda_graph_node_us, "
          "sync_us (every profile: a host cost)"),
    Table("launch_overhead_small_gemm_dgxc_sample.csv", read_dgxc_launch, "host.aten_gemm_us (every profile)"),
    Table("host_cpu_linear_te_issue2053.csv", read_te_linear_cpu,
          "host.aten_gemm_us (x86 profiles: H100 DGX's Xeon; gb200-186gb: Grace)", in_repository=True),
)

UNUSED = {
    "cuda_graphs_training_speedup_pytorch_blog.csv": (
        "end-to-end speedups only (GPU, batch and kernel counts not stated): no per-launch cost follows from them; "
        "benchmarks/microbatch_sweep.py prints the graphed-backbone ratio beside what the fitted costs imply"),
}


def microbench_dir() -> Path:
    from benchmarks.reference import reference_dir

    return reference_dir() / "microbench"


REPOSITORY_TABLES_DIR = Path(__file__).resolve().parent / "microbench"
"""The microbenchmark tables the repository carries itself (Table.in_repository)."""


def table_path(table: Table, folder: Path | None = None) -> Path:
    """Where `table`'s file is: benchmarks/microbench/ for one in the repository, else `folder` (shared/reference/microbench)."""
    return REPOSITORY_TABLES_DIR / table.file if table.in_repository else (folder or microbench_dir()) / table.file


def all_rows(folder: Path | None = None) -> dict[str, list[Row]]:
    """file -> its rows."""
    return {table.file: list(table.read(table_path(table, folder))) for table in TABLES}


def measurements_for(profile: str, rows_by_file: dict[str, list[Row]], role: str = "fit",
                     exclude: str | None = None) -> Measurements:
    """The rows of one profile (and one role), every file but `exclude`, as one calibration's measurements."""
    rows = [row.measurement for file, rows in rows_by_file.items() if file != exclude
            for row in rows if profile in row.profiles and row.role == role]
    return Measurements(gemm=tuple(r for r in rows if isinstance(r, GemmMeasurement)),
                        collectives=tuple(r for r in rows if isinstance(r, CollectiveMeasurement)),
                        host=tuple(r for r in rows if isinstance(r, HostMeasurement)))


def relative_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if measured > 0 and math.isfinite(predicted) else math.inf
