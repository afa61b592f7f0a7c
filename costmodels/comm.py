"""Communication: where each parallel group sits on the nodes, and what its collectives cost on the links it uses.

Placement follows Megatron-Core's rank order (`megatron/core/parallel_state.py`, order "tp-cp-ep-dp-pp"): ranks are
numbered innermost first, tp, then cp, then dp, then pp for the dense layers; etp, ep, edp, pp for the expert layers.
A group of `size` ranks spaced `stride` apart on nodes of G GPUs has min(size, G // stride) members on each node
(1 when stride ≥ G). Nothing here says "TP inside a node": a group stays on NVLink only because of where its ranks
fall, and is priced on InfiniBand when it spans nodes. "Node" here is an NVLink domain: one server on HGX/DGX
systems, the job's share of a rack on GB200 NVL72 (72 GPUs on compute trays of 4 joined by NVLink switch trays;
NCCL's MNNVL, `NCCL_MNNVL_ENABLE`), so G is `ClusterSpec.nvlink_domain_gpus`, and the `ib` group size of a
profile's collectives counts domains.

Link model (alpha–beta, DESIGN.md §4; Thakur et al. 2005 "Optimization of collective communication operations in
MPICH" for the ring factors): time = alpha + bytes × factor / bandwidth, factor 2(n-1)/n for all-reduce,
(n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv. `bytes` is the full buffer: the all-reduced
tensor, the gathered output, the reduce-scattered input, or the data one rank sends in an all-to-all.

Per collective (`link_stage_s`): NCCL picks an algorithm (ring, tree, NVLS — the NVSwitch reduces — CollNet/SHARP)
and a protocol (LL, LL128, Simple) per collective, size and group, so one link has no single alpha and bandwidth:
measured all-reduce on 8 A100 takes ~45 µs at 32 KiB, ~100 µs from 1 to 4 MiB and runs at ~230 GB/s bus bandwidth
from 256 MiB; NVLS all-reduce on H100/H200 reaches ~480 GB/s where all-gather stays near 360 GB/s
(shared/reference/microbench/README.md). A profile's `collectives:` section therefore holds, per link and
collective, (alpha, bus bandwidth) regimes by group size, fitted to nccl-tests measurements (`autopar profile fit`);
a size is priced with its fastest regime, as NCCL's tuner does. A collective the section does not name uses the
link's alpha and bandwidth (`links:`), which is all a link-level profile has.

A group spanning N nodes with k members on each runs hierarchically, as NCCL does (its tree/ring crosses each node
boundary once per channel and drives every NIC): the intra-node part on NVLink among the k local members, the
inter-node part on InfiniBand among N nodes with the buffer split over the k local members, each driving its own NIC
(one NIC per GPU, the profiles' ib bandwidth is per GPU). NCCL moves the buffer in chunks through both stages at
once (a chunk crosses the NIC while the next one moves on NVLink; NCCL ring/tree "pipelining", doc
`docs/.../env.html#nccl-algo` and Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019), so
the time is both latencies plus the slower stage's transfer, not the sum of the two transfers: with the sum, the
measured 12-node H100 all-reduce (nccl_allreduce_coreweave_gb200_h100_a100.csv) would need 280 GB/s per NIC. All-to-all: each rank's (n-k)/n off-node share goes over
its own NIC while the (k-1)/n on-node share goes over NVLink at the same time.

A multi-node all-gather or reduce-scatter is one ring over every rank of the group (NCCL has no tree for them), so
each node's NICs carry (n - 1)/n of the buffer between them, not the (N - 1)/N of a hierarchical exchange among the
N nodes (`ring_nic_share`); each of its n - 1 steps waits for the one before, so its latency grows with the ring
(`ring_growth_latency_s`), a per-step cost the profile's measured points, taken at one or a few node counts, do
not carry to other sizes; each NCCL protocol has its own step latency and bandwidth (LL, LL128, Simple), and with one
GPU per node NCCL (2.23 on) may run PAT instead, logarithmic in the nodes (`pat_growth_latency_s`). The fastest is
taken, as NCCL's tuner does (`ring_across_nodes_s`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from costmodels.hardware import HardwareProfile, LinkSpec

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def algorithm_factor(kind: str, group_size: "np.ndarray | float") -> np.ndarray:
    """Bytes each rank moves per byte of buffer, ring algorithms (Thakur et al. 2005)."""
    n = np.maximum(np.asarray(group_size, dtype=float), 1.0)
    if kind == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    if kind == "send_recv":
        return np.ones_like(n)
    raise ValueError(f"unknown collective kind {kind!r}; expected one of {COLLECTIVE_KINDS}")


def link_stage_s(profile: HardwareProfile, link: str, kind: str, bytes_: "np.ndarray | float",
                 group_size: "np.ndarray | float") -> tuple[np.ndarray, np.ndarray]:
    """(latency_s, transfer_s) of one collective of `bytes_` on `link` among `group_size` ranks on that link (GPUs of
    a node for nvlink, nodes for ib).

    With the profile's points for (link, kind): at each measured group size, the fastest of its regimes (NCCL's
    tuner picks the (algorithm, protocol) of least latency + size/bandwidth, `src/graph/tuning.cc`), its alpha the
    latency and the rest the transfer; between two measured group sizes both are interpolated linearly in
    log2(group size), outside them the nearest size holds. Without points: the link's alpha and bandwidth."""
    n, b = np.broadcast_arrays(np.asarray(group_size, dtype=float), np.asarray(bytes_, dtype=float))
    wire_bytes = b * algorithm_factor(kind, n)
    points = profile.collectives.get(link, {}).get(kind, ())
    if not points:
        spec = profile.links[link]
        return np.full(n.shape, spec.alpha_s), wire_bytes / spec.bandwidth_bytes_per_s
    measured_x, alpha_table, inverse_bandwidth = _regime_tables(points)
    wire = wire_bytes.ravel()

    def fastest_at(size_index: int, at: "np.ndarray | slice") -> tuple[np.ndarray, np.ndarray]:
        """(alpha, transfer) of the fastest regime of measured size `size_index` for the elements `at`."""
        chosen_alpha, chosen_s = None, None
        for alpha_s, inverse in zip(alpha_table[size_index], inverse_bandwidth[size_index]):
            if not np.isfinite(alpha_s):
                break                                                    # padding: no further regime here
            regime_s = alpha_s + wire[at] * inverse
            if chosen_s is None:
                chosen_alpha, chosen_s = np.full(regime_s.shape, alpha_s), regime_s
            else:
                faster = regime_s < chosen_s
                chosen_alpha, chosen_s = np.where(faster, alpha_s, chosen_alpha), np.minimum(regime_s, chosen_s)
        return chosen_alpha, chosen_s - chosen_alpha

    if measured_x.size == 1:
        latency, transfer = fastest_at(0, slice(None))
        return latency.reshape(n.shape), transfer.reshape(n.shape)
    # piecewise-linear in log2(group size) between the measured sizes low and low + 1; the ends hold outside
    x = np.log2(np.maximum(n, 2.0)).ravel()
    low = np.clip(np.searchsorted(measured_x, x, side="right") - 1, 0, measured_x.size - 2)
    upper = np.clip((x - measured_x[low]) / (measured_x[low + 1] - measured_x[low]), 0.0, 1.0)
    latency, transfer = np.zeros(wire.shape), np.zeros(wire.shape)
    present = np.flatnonzero(np.bincount(low, minlength=measured_x.size)
                             + np.bincount(low + 1, weights=upper > 0, minlength=measured_x.size))
    for size_index in present:
        weight = np.where(low == size_index, 1.0 - upper, 0.0) + np.where(low + 1 == size_index, upper, 0.0)
        at = np.flatnonzero(weight)
        if at.size == 0:
            continue
        alpha_s, transfer_s = fastest_at(size_index, at)
        latency[at] += weight[at] * alpha_s
        transfer[at] += weight[at] * transfer_s
    return latency.reshape(n.shape), transfer.reshape(n.shape)


def _regime_tables(points) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log2 of the measured group sizes, and per size its regimes' alphas and 1/bandwidths (rows padded with
    never-fastest entries: infinite alpha)."""
    sizes = sorted({p.group_size for p in points})
    regimes = [[p for p in points if p.group_size == size] for size in sizes]
    width = max(len(r) for r in regimes)
    alpha = np.full((len(sizes), width), np.inf)
    inverse_bandwidth = np.zeros((len(sizes), width))
    for i, row in enumerate(regimes):
        alpha[i, :len(row)] = [p.alpha_s for p in row]
        inverse_bandwidth[i, :len(row)] = [1.0 / p.bus_bandwidth_bytes_per_s for p in row]
    return np.log2(np.array(sizes, dtype=float)), alpha, inverse_bandwidth


def link_collective_time_s(profile: HardwareProfile, link: str, kind: str, bytes_: "np.ndarray | float",
                           group_size: "np.ndarray | float") -> np.ndarray:
    """One collective on one link with the profile's per-collective regimes (link values without); 0 for one rank."""
    n = np.asarray(group_size, dtype=float)
    latency_s, transfer_s = link_stage_s(profile, link, kind, bytes_, n)
    return np.where(n > 1, latency_s + transfer_s, 0.0)


def collective_time_s(link: LinkSpec, kind: str, bytes_: "np.ndarray | float",
                      group_size: "np.ndarray | float") -> np.ndarray:
    """Alpha–beta time of one collective on one link: alpha + bytes·factor/bandwidth; 0 for a group of one."""
    n = np.asarray(group_size, dtype=float)
    time = link.alpha_s + np.asarray(bytes_, dtype=float) * algorithm_factor(kind, n) / link.bandwidth_bytes_per_s
    return np.where(n > 1, time, 0.0)


# ---- placement -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupPlacement:
    """A process group's size and how its ranks fall on nodes."""

    size: np.ndarray
    members_per_node: np.ndarray
    domains: "np.ndarray | None" = None
    """NVLink domains (nodes) a group touches where its members are not spread evenly (place_group); None: size /
    members_per_node."""

    @property
    def nodes(self) -> np.ndarray:
        return self.size / self.members_per_node if self.domains is None else self.domains

    @property
    def crosses_nodes(self) -> np.ndarray:
        return self.nodes > 1


def place_group(size: "np.ndarray | int", stride: "np.ndarray | int", domain_gpus: int) -> GroupPlacement:
    """Group of `size` ranks spaced `stride` apart on NVLink domains of G = `domain_gpus` GPUs (a node, or the job's
    share of a multi-node NVLink domain, ClusterSpec.nvlink_domain_gpus): min(size, G // stride) members per domain,
    at least 1, where the groups tile the domains; where they do not (a span size·stride that neither divides G nor
    is a multiple of it, as 16 consecutive ranks on a 72-GPU NVL72 rack: ranks 64..79 straddle two racks), the
    fewest members any group has on one domain and the most domains one touches (`uneven_group_placement`): every
    group of a kind runs its collective at once, so the most split one sets the pace."""
    size = np.asarray(size, dtype=float)
    stride = np.maximum(np.asarray(stride, dtype=float), 1.0)
    per_node = np.clip(np.floor(domain_gpus / stride), 1.0, np.maximum(size, 1.0))
    span = np.broadcast_to(size * stride, per_node.shape)
    strides = np.broadcast_to(stride, per_node.shape)
    sizes = np.broadcast_to(size, per_node.shape).astype(float)
    with np.errstate(invalid="ignore"):
        tiles = ((np.mod(domain_gpus, span) == 0) | (np.mod(span, domain_gpus) == 0)) \
            & ((np.mod(domain_gpus, strides) == 0) | (np.mod(strides, domain_gpus) == 0))
    # a size that is no whole number of ranks (an invalid plan's, which a rule refuses) keeps the formula above
    tiles |= ~np.isfinite(span) | (sizes != np.round(sizes)) | (strides != np.round(strides))
    if np.all(tiles):
        return GroupPlacement(size=sizes, members_per_node=per_node)
    keys, where = np.unique(sizes[~tiles].astype(np.int64) * 2**32 + strides[~tiles].astype(np.int64),
                            return_inverse=True)
    uneven = np.array([uneven_group_placement(int(key) >> 32, int(key) & (2**32 - 1), domain_gpus) for key in keys])
    members, domains = np.array(per_node, dtype=float), np.array(sizes / per_node, dtype=float)
    members[~tiles], domains[~tiles] = uneven[where.ravel(), 0], uneven[where.ravel(), 1]
    return GroupPlacement(size=sizes, members_per_node=members, domains=domains)


@functools.lru_cache(maxsize=None)
def uneven_group_placement(size: int, stride: int, domain_gpus: int) -> tuple[float, float]:
    """(fewest members any group has on one NVLink domain it touches, most domains a group touches) for groups of
    `size` ranks `stride` apart in Megatron's rank order (a group: a + stride·i + stride·size·b, a < stride,
    i < size), over one period of the pattern, lcm(stride·size, G) ranks. The group split most unevenly sets the
    pace: its smallest share of a domain drives that domain's NICs with the largest part of the buffer."""
    span = size * stride
    period = math.lcm(span, domain_gpus)
    starts = (np.arange(stride)[:, None] + span * np.arange(period // span)[None, :]).ravel()
    domains = (starts[:, None] + stride * np.arange(size)[None, :]) // domain_gpus
    fewest, touched = size, 1
    for row in domains:
        counts = np.unique(row, return_counts=True)[1]
        fewest, touched = min(fewest, int(counts.min())), max(touched, len(counts))
    return float(fewest), float(touched)


@dataclass(frozen=True)
class RingProtocol:
    """One NCCL protocol's per-step ring latencies and its bandwidth relative to Simple (src/graph/tuning.cc, NVIDIA/nccl
    master 5067397 of 2026-06: `hwLatencies` Ring, the NET Tree value with one GPU per node, intra-node steps at least
    the 1 µs network post overhead, x3 for Simple; `busBw *= .5` for LL, `* 0.92` for LL128)."""

    name: str
    nvlink_step_s: float
    net_step_s: float
    net_step_one_per_node_s: float
    bandwidth_share: float


RING_PROTOCOLS = (RingProtocol("simple", 3.4e-6, 14.0e-6, 14.0e-6, 1.0),
                  RingProtocol("ll128", 1.9e-6, 4.0e-6, 8.5e-6, 0.92),
                  RingProtocol("ll", 1.0e-6, 2.7e-6, 5.0e-6, 0.5))
"""NCCL's ring all-gather / reduce-scatter latency is base + (nRanks - nNodes) intra-node steps + (nNodes - 1)
inter-node steps, per protocol; the tuner takes the (algorithm, protocol) of least latency + bytes / bandwidth."""
PAT_NET_STEP_S = 14.0e-6 / 3.5
"""PAT (Parallel Aggregated Trees, NCCL 2.23+, all-gather / reduce-scatter with one GPU per node, Simple only), same
source: base + log2(nNodes) x NET latency / 3.5 + nRanks x PAT_RANK_STEP_S ('still a linear part'), at 0.75 of the
bandwidth (`if (a == NCCL_ALGO_PAT) busBw *= .75`)."""
PAT_RANK_STEP_S = 2.8e-6
PAT_BANDWIDTH_SHARE = 0.75
RING_KINDS = ("all_gather", "reduce_scatter")


def ring_nic_share(n: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """A ring all-gather / reduce-scatter over all n ranks of N nodes, over the same buffer's (N-1)/N that the IB
    stage's bus-bandwidth convention counts (link_stage_s, algorithm_factor over the N nodes): ((n-1)/n) / ((N-1)/N).
    The ring passes every rank's piece through every node (NCCL runs these collectives as one ring, or PAT with one
    GPU per node, or NVLS inside one NVLink domain: src/graph/tuning.cc), so each node's k NICs carry (n-1)/n of
    the buffer between them, as nccl-tests counts it (doc/PERFORMANCE.md: all-gather busbw = algbw·(n-1)/n over all
    ranks); 1 with one GPU per node (n = N), 1 on one node."""
    n = np.asarray(n, dtype=float)
    nodes = np.asarray(nodes, dtype=float)
    multi = nodes > 1
    return np.where(multi, ((n - 1.0) / np.maximum(n, 1.0)) / np.where(multi, (nodes - 1.0) / nodes, 1.0), 1.0)


def ring_reference_nodes(profile: HardwareProfile, kind: str) -> float:
    """The node count the profile's InfiniBand latency of `kind` stands for: its largest measured group size, or a
    two-node ring where it has no points (the link's alpha)."""
    return float(max((p.group_size for p in profile.collectives.get("ib", {}).get(kind, ())), default=2))


def ring_growth_latency_s(profile: HardwareProfile, kind: str, nodes: np.ndarray, members_per_node: np.ndarray,
                          protocol: RingProtocol) -> np.ndarray:
    """Latency a multi-node ring all-gather / reduce-scatter adds beyond `ring_reference_nodes` in `protocol`: every
    further node puts one inter-node step and k - 1 intra-node steps (its k members) into the ring."""
    k = np.asarray(members_per_node, dtype=float)
    extra_nodes = np.maximum(np.asarray(nodes, dtype=float) - ring_reference_nodes(profile, kind), 0.0)
    net_step_s = np.where(k == 1, protocol.net_step_one_per_node_s, protocol.net_step_s)
    return extra_nodes * (net_step_s + (k - 1.0) * protocol.nvlink_step_s)


def pat_growth_latency_s(profile: HardwareProfile, kind: str, nodes: np.ndarray) -> np.ndarray:
    """PAT's latency beyond `ring_reference_nodes` for a group of one GPU per node (0 at or below the reference,
    where the measured latency holds)."""
    def pat_s(n):
        return np.log2(np.maximum(n, 1.0)) * PAT_NET_STEP_S + n * PAT_RANK_STEP_S
    nodes = np.asarray(nodes, dtype=float)
    return np.maximum(pat_s(nodes) - pat_s(ring_reference_nodes(profile, kind)), 0.0)


def ring_across_nodes_s(profile: HardwareProfile, kind: str, nodes: np.ndarray, k: np.ndarray,
                        latency_s: np.ndarray, transfer_s: np.ndarray) -> np.ndarray:
    """A multi-node all-gather / reduce-scatter: the two stages' latencies and the slower transfer as measured, plus
    the ring's growth beyond the measured size in the fastest NCCL protocol for it (RING_PROTOCOLS), or PAT with
    one GPU per node where that is faster."""
    best = None
    for protocol in RING_PROTOCOLS:
        candidate = latency_s + ring_growth_latency_s(profile, kind, nodes, k, protocol) \
            + transfer_s / protocol.bandwidth_share
        best = candidate if best is None else np.minimum(best, candidate)
    pat = latency_s + pat_growth_latency_s(profile, kind, nodes) + transfer_s / PAT_BANDWIDTH_SHARE
    return np.where(k == 1, np.minimum(best, pat), best)


def group_collective_time_s(profile: HardwareProfile, placement: GroupPlacement, kind: str,
                            bytes_: "np.ndarray | float") -> np.ndarray:
    """One collective of `kind` on a placed group: NVLink inside a node, hierarchical NVLink + IB across nodes."""
    n, k, nodes = placement.size, placement.members_per_node, placement.nodes
    bytes_ = np.asarray(bytes_, dtype=float)
    inside = link_collective_time_s(profile, "nvlink", kind, bytes_, n)
    if kind == "send_recv":
        across = link_collective_time_s(profile, "ib", kind, bytes_, nodes)
    else:
        if kind == "all_to_all":  # each rank's (k-1)/n share among its k node-mates, (n-k)/n to the other nodes
            on_bytes, off_bytes = bytes_ * k / n, bytes_
        else:                     # the k local ranks each drive the inter-node stage with 1/k of the buffer
            on_bytes, off_bytes = bytes_, bytes_ / k
            if kind in RING_KINDS:  # one ring over all n ranks: each NIC carries (n-1)/n of its 1/k, not (N-1)/N
                off_bytes = off_bytes * ring_nic_share(n, nodes)
        on_latency_s, on_transfer_s = link_stage_s(profile, "nvlink", kind, on_bytes, k)
        off_latency_s, off_transfer_s = link_stage_s(profile, "ib", kind, off_bytes, nodes)
        on_latency_s, on_transfer_s = np.where(k > 1, on_latency_s, 0.0), np.where(k > 1, on_transfer_s, 0.0)
        if kind == "all_to_all":  # the two shares travel at the same time, each on its own link
            across = np.maximum(on_latency_s + on_transfer_s, off_latency_s + off_transfer_s)
        else:                     # the two stages pipeline chunk by chunk: both latencies, the slower transfer
            latency_s, transfer_s = on_latency_s + off_latency_s, np.maximum(on_transfer_s, off_transfer_s)
            across = ring_across_nodes_s(profile, kind, nodes, k, latency_s, transfer_s) if kind in RING_KINDS \
                else latency_s + transfer_s
    return np.where(n > 1, np.where(nodes > 1, across, inside), 0.0)


def _avoid_fraction(pool: float, block: float, draws: int) -> float:
    """C(pool - block, draws) / C(pool, draws): the chance that `draws` distinct experts drawn evenly from `pool`
    avoid `block` of them (a product of ratios)."""
    missed = 1.0
    for i in range(draws):
        missed *= max((pool - block - i) / (pool - i), 0.0)
    return missed


def _ungrouped_destinations(num_experts: int, top_k: int, destinations: int) -> float:
    """Every expert set equally likely: destinations × (1 - C(E - E/D, k) / C(E, k))."""
    return destinations * (1.0 - _avoid_fraction(num_experts, num_experts / destinations, top_k))


ROUTING_SAMPLE_TOKENS = 8192
"""Tokens of the simulated group-limited router (`_group_limited_experts`); the count's standard error is under
0.3% at this size."""


@functools.lru_cache(maxsize=64)
def _group_limited_experts(num_experts: int, top_k: int, num_groups: int, group_topk: int,
                           group_by_max: bool) -> np.ndarray:
    """The experts group-limited routing gives ROUTING_SAMPLE_TOKENS tokens of independent uniform scores (balanced
    routing), by the router's own rule (Megatron-Core moe_utils.group_limited_topk: a group scores the sum of its best
    top_k // group_topk experts, or its best one with group_by_max as DeepSeek-V2 and DeepEP's benchmark do; the best
    group_topk groups are kept and the top_k experts chosen among them). The count has no closed form: whether the
    kept groups each hold a chosen expert depends on the order of scores across groups; a fixed seed keeps it
    reproducible."""
    rng = np.random.default_rng(0)
    scores = rng.random((ROUTING_SAMPLE_TOKENS, num_groups, num_experts // num_groups))
    best = 1 if group_by_max else max(top_k // group_topk, 1)
    group_scores = np.sort(scores, axis=2)[:, :, -best:].sum(axis=2)
    kept = np.argpartition(-group_scores, group_topk - 1, axis=1)[:, :group_topk]
    mask = np.full(group_scores.shape, -np.inf)
    np.put_along_axis(mask, kept, 0.0, axis=1)
    flat = (scores + mask[:, :, None]).reshape(ROUTING_SAMPLE_TOKENS, num_experts)
    return np.argpartition(-flat, top_k - 1, axis=1)[:, :top_k]


@functools.lru_cache(maxsize=1024)
def _expected_destinations_one(num_experts: int, top_k: int, destinations: int, num_groups: int, group_topk: int,
                               group_by_max: bool) -> float:
    """`expected_destinations` for one whole destination count."""
    if not num_groups or group_topk >= num_groups:          # no group limit, or every group kept
        return _ungrouped_destinations(num_experts, top_k, destinations)
    experts = _group_limited_experts(num_experts, top_k, num_groups, group_topk, group_by_max)
    reached = np.sort(experts * destinations // num_experts, axis=1)
    return float(np.mean(1 + (np.diff(reached, axis=1) > 0).sum(axis=1)))


def expected_destinations(num_experts: int, top_k: int, destinations: "np.ndarray | float", num_groups: int = 0,
                          group_topk: int = 0, group_by_max: bool = False) -> np.ndarray:
    """How many of `destinations` (ranks or nodes, each holding num_experts / destinations consecutive experts, as
    expert parallelism lays them out) a token's top_k distinct experts live on, on average, with routing balanced
    (load balancing aims for it). Without a group limit every expert set is equally likely: destinations × (1 -
    C(E - E/D, k) / C(E, k)). Group-limited routing (MoESpec.router num_groups / group_topk / group_by_max:
    DeepSeek-V3's n_group 8, topk_group 4) is counted on the router's own rule applied to balanced scores
    (`_group_limited_experts`). A fractional count (nodes of a group that does not fill its last node) is
    interpolated between the whole counts around it."""
    values = np.maximum(np.asarray(destinations, dtype=float), 1.0)
    unique, index = np.unique(values, return_inverse=True)

    def whole(count: float) -> float:
        return _expected_destinations_one(num_experts, top_k, int(count), num_groups, group_topk, group_by_max)

    per_unique = np.array([whole(np.floor(v)) + (v - np.floor(v)) * (whole(np.ceil(v)) - whole(np.floor(v)))
                           for v in unique])
    return per_unique[index].reshape(values.shape)


def deepep_on_rank_share(placement: GroupPlacement, num_experts: int, top_k: int, num_groups: int = 0,
                         group_topk: int = 0, group_by_max: bool = False) -> np.ndarray:
    """Bytes a DeepEP dispatch (or combine) moves between GPUs over those of the all-to-all on the same EP group: the
    all-to-all sends a token once per routed expert (top_k copies), DeepEP once per destination rank, the rank
    fanning it out to its local experts (csrc/kernels/legacy/intranode.cu and internode.cu send by `is_token_in_rank`;
    tests/legacy/test_intranode.py counts its NVLink bytes as `recv_x.numel()`, one row per token and rank):
    `expected_destinations` over the group's ranks / top_k. 1 for top-1 routing."""
    return expected_destinations(num_experts, top_k, placement.size, num_groups, group_topk, group_by_max) \
        / float(top_k)


def deepep_off_node_share(placement: GroupPlacement, num_experts: int, top_k: int, num_groups: int = 0,
                          group_topk: int = 0, group_by_max: bool = False) -> np.ndarray:
    """Off-node bytes of a DeepEP dispatch (or combine) over those of the all-to-all on the same EP group.

    The all-to-all sends one copy of a token per routed expert, top_k·(N-1)/N of them to other nodes on average (N
    nodes in the group). DeepEP's normal kernels send a token once per destination node over RDMA and fan it out to
    that node's experts over NVLink (DeepEP README: 'forwarding data from NVLink domain to RDMA domain'; its
    benchmark's 'RDMA bandwidth' counts those deduplicated bytes): a token reaches `expected_destinations` of the N
    nodes, the token's own among them as often as any other, so R = (N-1)/N of them are other nodes, and the share
    is R / (top_k·(N-1)/N). Node-limited routing (DeepSeek-V3: at most 4 nodes per token) is group-limited routing
    whose groups are the nodes; other group layouts count as `expected_destinations` places them. 1 inside a node."""
    nodes = np.asarray(placement.nodes, dtype=float)
    reached = expected_destinations(num_experts, top_k, nodes, num_groups, group_topk, group_by_max)
    remote_nodes = reached * (nodes - 1.0) / np.maximum(nodes, 1.0)
    naive_remote_copies = top_k * (nodes - 1.0) / np.maximum(nodes, 1.0)
    return np.where(nodes > 1, remote_nodes / np.where(nodes > 1, naive_remote_copies, 1.0), 1.0)


def deepep_all_to_all_time_s(profile: HardwareProfile, placement: GroupPlacement, bytes_: "np.ndarray | float",
                             num_experts: int, top_k: int, num_groups: int = 0, group_topk: int = 0,
                             group_by_max: bool = False) -> np.ndarray:
    """One DeepEP normal-kernel dispatch or combine of `bytes_` (the all-to-all's buffer: top_k copies of each
    token) on a placed EP group. Inside a node it is an all-to-all of the copies DeepEP sends, one per destination
    rank (`deepep_on_rank_share`). Across nodes the RDMA stage carries `deepep_off_node_share` of the all-to-all's
    off-node bytes at the profile's InfiniBand all-to-all rate (fitted to DeepEP's own internode benchmark,
    microbench/moe_deepep_v1_dispatch_combine_h800.csv), while NVLink delivers each token once to every rank on
    the node that needs it, the forwarded ones included; the two run at the same time."""
    n, k, nodes = placement.size, placement.members_per_node, placement.nodes
    routing = (num_experts, top_k, num_groups, group_topk, group_by_max)
    delivered = np.asarray(bytes_, dtype=float) * deepep_on_rank_share(placement, *routing)
    inside = link_collective_time_s(profile, "nvlink", "all_to_all", delivered, n)
    on_latency_s, on_transfer_s = link_stage_s(profile, "nvlink", "all_to_all", delivered, k)
    off_latency_s, off_transfer_s = link_stage_s(profile, "ib", "all_to_all",
                                                 np.asarray(bytes_, dtype=float)
                                                 * deepep_off_node_share(placement, *routing), nodes)
    on_s = np.where(k > 1, on_latency_s + on_transfer_s, 0.0)
    across = np.maximum(on_s, off_latency_s + off_transfer_s)
    return np.where(n > 1, np.where(nodes > 1, across, inside), 0.0)


# ---- the groups of a plan (Megatron rank order) ------------------------------------------------------------------

def tp_group(plans, domain_gpus: int) -> GroupPlacement:
    """Tensor parallel: innermost, consecutive ranks."""
    return place_group(plans.tp, 1, domain_gpus)


def cp_group(plans, domain_gpus: int) -> GroupPlacement:
    """Context parallel: stride tp."""
    return place_group(plans.cp, plans.tp, domain_gpus)


def dp_cp_group(plans, num_gpus: int, domain_gpus: int) -> GroupPlacement:
    """Gradient reduction of dense parameters: data parallel × context parallel (Megatron reduces over both),
    stride tp, size dp·cp = num_gpus / (tp·pp)."""
    return place_group(num_gpus / (plans.tp * plans.pp), plans.tp, domain_gpus)


def stage_group(plans, num_gpus: int, domain_gpus: int) -> GroupPlacement:
    """Every rank of one pipeline stage, tp·cp·dp = num_gpus / pp consecutive ranks (Megatron-Core's amax reduction
    group, parallel_state get_amax_reduction_group(with_context_parallel=True))."""
    return place_group(num_gpus / plans.pp, 1, domain_gpus)


def etp_group(plans, domain_gpus: int) -> GroupPlacement:
    """Expert tensor parallel: innermost of the expert-layer order."""
    return place_group(plans.etp, 1, domain_gpus)


def ep_group(plans, domain_gpus: int) -> GroupPlacement:
    """Expert parallel: stride etp."""
    return place_group(plans.ep, plans.etp, domain_gpus)


def edp_group(plans, num_gpus: int, domain_gpus: int) -> GroupPlacement:
    """Expert data parallel: stride etp·ep, size num_gpus / (etp·ep·pp)."""
    return place_group(num_gpus / (plans.etp * plans.ep * plans.pp), plans.etp * plans.ep, domain_gpus)


def pp_group(plans, num_gpus: int, domain_gpus: int) -> GroupPlacement:
    """Pipeline: outermost, stride num_gpus / pp."""
    return place_group(plans.pp, num_gpus / plans.pp, domain_gpus)
