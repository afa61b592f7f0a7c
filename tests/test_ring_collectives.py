"""Multi-node ring all-gather / reduce-scatter latency (costmodels/comm.py, NCCL's tuner model) and the number of
data-parallel collectives a step issues (costmodels/steptime.py, Megatron-Core DDP buckets and FSDP units)."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels import comm, steptime
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ClusterSpec, MlpKind, ModelSpec, MoESpec

H100 = load_profile("h100-80gb")
US = 1e-6


def _time_s(kind: str, nodes: int, per_node: int, bytes_: float) -> float:
    placement = comm.place_group(nodes * per_node, 8 // per_node, 8)
    assert float(placement.nodes[()]) == nodes and float(placement.members_per_node[()]) == per_node
    return float(comm.group_collective_time_s(H100, placement, kind, bytes_))


def test_ring_growth_hand_computed_per_protocol():
    # H100 has no measured IB reduce-scatter: its link alpha stands for a 2-node ring; 64 nodes of 8 add 62 nodes,
    # each one inter-node step and 7 intra-node steps (tuning.cc hwLatencies, Ring)
    assert comm.ring_reference_nodes(H100, "reduce_scatter") == 2
    for protocol, per_node_us in (("simple", 14.0 + 7 * 3.4), ("ll128", 4.0 + 7 * 1.9), ("ll", 2.7 + 7 * 1.0)):
        chosen = next(p for p in comm.RING_PROTOCOLS if p.name == protocol)
        got = comm.ring_growth_latency_s(H100, "reduce_scatter", np.array(64.0), np.array(8.0), chosen)
        assert float(got) == pytest.approx(62 * per_node_us * US)
    # one GPU per node: NCCL charges the NET Tree step
    simple = comm.RING_PROTOCOLS[0]
    assert float(comm.ring_growth_latency_s(H100, "all_gather", np.array(10.0), np.array(1.0), simple)) == \
        pytest.approx(8 * 14.0 * US)


def test_a_small_ring_collective_grows_by_the_fastest_protocols_step_per_node():
    tiny = 8.0 * 1024   # latency-bound: LL's steps are the cheapest
    growth = _time_s("all_gather", 64, 8, tiny) - _time_s("all_gather", 32, 8, tiny)
    assert growth == pytest.approx(32 * (2.7 + 7 * 1.0) * US, rel=0.02)   # 8 KiB moves in ~no time
    # a large one is bandwidth-bound: the measured Simple regime, its steps on top (at 2 GiB LL128's cheaper steps
    # still outweigh its 8% less bandwidth)
    large = 2.0**34
    growth = _time_s("reduce_scatter", 64, 8, large) - _time_s("reduce_scatter", 32, 8, large)
    # every NIC carries 1/8 of (n-1)/n of the buffer, n the ring's 512 or 256 ranks (ring_nic_share)
    transfer_growth = large / 8 * (511 / 512 - 255 / 256) / H100.links["ib"].bandwidth_bytes_per_s
    assert growth == pytest.approx(32 * (14.0 + 7 * 3.4) * US + transfer_growth, rel=0.02)


@pytest.mark.parametrize("nodes, per_node", [(2, 8), (2, 4), (2, 2), (4, 8), (8, 1)])
def test_a_large_ring_all_gather_drives_each_nic_at_the_link_rate_over_all_ranks(nodes, per_node):
    """One ring over all n ranks: each node's NICs carry (n-1)/n of the buffer (nccl-tests' all-gather busbw over
    all ranks), so a bandwidth-bound all-gather's per-NIC rate comes out at the IB link's, never above it; priced
    over the N nodes alone it came out up to 1.75x above (2 nodes of 4)."""
    n, size = nodes * per_node, 2.0**32
    seconds = _time_s("all_gather", nodes, per_node, size)
    per_nic = size / per_node * (n - 1) / n / seconds
    assert per_nic == pytest.approx(H100.links["ib"].bandwidth_bytes_per_s, rel=0.05)
    assert float(comm.ring_nic_share(np.array(float(n)), np.array(float(nodes)))) == pytest.approx(
        ((n - 1) / n) / ((nodes - 1) / nodes))


def test_at_the_reference_size_the_ring_adds_no_latency_and_other_collectives_keep_their_regimes():
    placement = comm.place_group(16, 1, 8)             # 2 nodes of 8: the reference ring
    on = comm.link_stage_s(H100, "nvlink", "reduce_scatter", 1e6, 8.0)
    off = comm.link_stage_s(H100, "ib", "reduce_scatter", 1e6 / 8 * comm.ring_nic_share(16.0, 2.0), 2.0)
    want = float(on[0] + off[0] + max(on[1], off[1]))
    assert float(comm.group_collective_time_s(H100, placement, "reduce_scatter", 1e6)) == pytest.approx(want)
    # all-reduce (NCCL's tree at scale) and all-to-all keep their measured regimes at any node count
    for kind in ("all_reduce", "all_to_all"):
        assert _time_s(kind, 256, 8, 1e6) == pytest.approx(_time_s(kind, 32, 8, 1e6), rel=0.05)


def test_one_gpu_per_node_takes_pat_where_its_log_latency_beats_the_ring():
    nodes = 512
    tiny = 1024.0
    ring_only = min(float(comm.ring_growth_latency_s(H100, "all_gather", np.array(float(nodes)), np.array(1.0), p))
                    for p in comm.RING_PROTOCOLS)
    pat = float(comm.pat_growth_latency_s(H100, "all_gather", np.array(float(nodes))))
    assert pat < ring_only                              # 512 nodes: ~1.5 ms against ~2.6 ms
    assert pat == pytest.approx((np.log2(512) - 1) * 4.0 * US + 510 * 2.8 * US)
    base = _time_s("all_gather", 2, 1, tiny)
    assert _time_s("all_gather", nodes, 1, tiny) - base == pytest.approx(pat, rel=0.02)


SMALL = ModelSpec(name="small", hidden_size=2048, num_layers=24, num_attention_heads=16, ffn_hidden_size=8192,
                  vocab_size=50000, mlp=MlpKind.GATED)


def test_megatron_buckets_only_with_overlap_and_fsdp_issues_one_collective_per_unit():
    plans = PlanArrays.from_plans([Plan(tp=1, zero=1), Plan(tp=1, zero=3)])
    stage = np.zeros(2, dtype=int)
    params = np.array([1.0e9, 1.0e9])
    bucket = np.array([64e6, 64e6])
    overlapped = steptime.dp_collective_counts(SMALL, plans, stage, params, bucket, overlap_grad_reduce=True)
    assert list(overlapped) == [16.0, 26.0]       # ceil(1e9 / 64e6); 24 layers + embedding + output layer
    plain = steptime.dp_collective_counts(SMALL, plans, stage, params, bucket, overlap_grad_reduce=False)
    assert list(plain) == [1.0, 26.0]             # 'bucket_size = None' without overlap_grad_reduce
    # an FSDP unit holds experts only in a MoE layer: 3 dense layers first leave 21
    moe = ModelSpec(name="moe", hidden_size=2048, num_layers=24, num_attention_heads=16, ffn_hidden_size=8192,
                    vocab_size=50000, mlp=MlpKind.GATED,
                    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, first_dense_layers=3))
    experts = steptime.dp_collective_counts(moe, plans, stage, params, bucket, True, experts=True)
    assert list(experts) == [16.0, 21.0]


def test_each_dp_collective_pays_its_latency_so_the_step_sum_grows_with_the_ring():
    # ZeRO-3 over 64 nodes: 26 units, each a reduce-scatter and an all-gather priced at its own size
    cluster = ClusterSpec(profile=H100, num_gpus=512)
    plans = PlanArrays.from_plans([Plan(tp=1, zero=3)])
    stage = np.zeros(1, dtype=int)
    reduce_s, gather_s, unit_reduce_s, unit_gather_s = steptime.dp_traffic_s(SMALL, cluster, plans, stage)
    assert float(reduce_s[0]) == pytest.approx(26 * float(unit_reduce_s[0]))
    assert float(gather_s[0]) == pytest.approx(26 * float(unit_gather_s[0]))
    smaller = steptime.dp_traffic_s(SMALL, ClusterSpec(profile=H100, num_gpus=64), plans, stage)
    growth_s = float(reduce_s[0] - smaller[0][0])
    assert growth_s > 26 * 56 * 9.0 * US         # 56 more nodes' steps per unit, at least LL's ~9.7 µs each


def test_groups_that_straddle_an_nvlink_domain_are_priced_by_the_most_split_one():
    """16 consecutive ranks on 72-GPU NVL72 racks (144 GPUs, Megatron's rank order): ranks 64..79 sit 8 + 8 on two
    racks, so an EP 16 all-to-all crosses racks though 16 < 72; groups that tile the domain stay on it."""
    gb200 = load_profile("gb200-186gb")
    ep16 = comm.place_group(np.array([16.0, 8.0, 72.0]), 1, 72)
    assert list(ep16.members_per_node) == [8.0, 8.0, 72.0] and list(ep16.nodes) == [2.0, 1.0, 1.0]
    assert comm.uneven_group_placement(32, 1, 72) == (8.0, 2.0)        # 64..95: 8 + 24 on two racks
    assert comm.uneven_group_placement(16, 2, 72) == (4.0, 2.0)        # CP 16 at stride 2: 64..94 step 2
    split = comm.GroupPlacement(size=np.array([16.0]), members_per_node=np.array([8.0]))
    assert comm.group_collective_time_s(gb200, ep16, "all_to_all", 256e6)[0] == pytest.approx(
        float(comm.group_collective_time_s(gb200, split, "all_to_all", 256e6)[0]))
    on_one_rack = comm.group_collective_time_s(gb200, comm.place_group(16, 1, 144), "all_to_all", 256e6)
    assert float(on_one_rack) < comm.group_collective_time_s(gb200, ep16, "all_to_all", 256e6)[0] / 5


def test_a_stride_that_does_not_divide_the_domain_is_placed_by_enumeration():
    """Expert data parallel of EP 16 on 144 GB200s (9 ranks 16 apart) and a 3-stage pipeline (ranks 48 apart): their
    spans are multiples of the 72-GPU rack, but the strides do not divide it, so the members fall unevenly (4 + 5
    and 2 + 1 on two racks); an invalid plan's fractional size keeps the closed form."""
    edp = comm.place_group(9, 16, 72)
    assert (float(edp.members_per_node), float(edp.nodes)) == (4.0, 2.0)
    assert float(comm.place_group(3, 48, 72).nodes) == 2.0
    assert float(comm.place_group(2.5, 1, 72).members_per_node) == 2.5


def test_the_profile_fit_reads_a_multi_node_ring_row_with_the_ring_share():
    """autopar calibrate's regime guesses and pruning read each row's bus bytes as the model prices the link's stage:
    an ib all-gather over 2 nodes of 8 carries bytes/8 × 15/16 on each NIC (ring_nic_share), an all-reduce the
    hierarchical share."""
    from autopar.calibrate.fit import _link_stage_bytes
    from autopar.calibrate.measurements import CollectiveMeasurement, Timing

    timing = Timing(median_s=1e-3, q1_s=1e-3, q3_s=1e-3, runs=5)
    gather = CollectiveMeasurement("ib", "all_gather", 16, 2**30, timing, ranks_per_node=8)
    assert _link_stage_bytes(gather, "all_gather") == pytest.approx(2**30 / 8 * 15 / 16)
    reduce = CollectiveMeasurement("ib", "all_reduce", 16, 2**30, timing, ranks_per_node=8)
    assert _link_stage_bytes(reduce, "all_reduce") == pytest.approx(
        2**30 / 8 * float(comm.algorithm_factor("all_reduce", 2)))
