"""The MoE token dispatcher (TrainingSpec.moe_dispatcher): DeepEP's per-node deduplication of the off-node traffic,
its pricing against the NCCL all-to-all, and the flags that carry it to and from Megatron-LM."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from autopar.export import emit
from autopar.megatron_args import parse_megatron_args
from costmodels.comm import (deepep_all_to_all_time_s, deepep_off_node_share, deepep_on_rank_share,
                             expected_destinations, group_collective_time_s, place_group)
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import MoEDispatcher, TrainingSpec
from costmodels.steptime import DEEPEP_NUM_SMS, ep_all_to_all_one_s, ep_comm_sms
from test_report_support import cluster, dense_model, moe_model, synthetic_estimate


def remote_nodes_by_enumeration(num_experts: int, top_k: int, nodes: int) -> float:
    """Average number of other nodes a token's top_k distinct experts live on, over every expert set (experts
    split evenly over the nodes in order; the token sits on node 0)."""
    per_node = num_experts // nodes
    sets = list(itertools.combinations(range(num_experts), top_k))
    hit = sum(len({expert // per_node for expert in chosen} - {0}) for chosen in sets)
    return hit / len(sets)


def destinations_by_enumeration(num_experts: int, top_k: int, destinations: int) -> float:
    """Average number of destinations (E / D consecutive experts each) a token's top_k distinct experts live on,
    over every expert set (each equally likely: balanced routing without group limits)."""
    per_destination = num_experts // destinations
    sets = list(itertools.combinations(range(num_experts), top_k))
    return sum(len({expert // per_destination for expert in chosen}) for chosen in sets) / len(sets)


def destinations_over_every_score_order(num_experts: int, top_k: int, destinations: int, num_groups: int,
                                        group_topk: int, group_by_max: bool) -> float:
    """The exact average under the router's rule on independent scores: only the order of the experts' scores
    matters, and every order is equally likely, so the average over all E! orders (Megatron-Core's
    group_limited_topk: a group scores the sum of its best top_k // group_topk experts, or its best one)."""
    group_size, best = num_experts // num_groups, 1 if group_by_max else max(top_k // group_topk, 1)
    total = count = 0
    for order in itertools.permutations(range(num_experts)):
        groups = [sorted(order[g * group_size:(g + 1) * group_size], reverse=True) for g in range(num_groups)]
        kept = sorted(range(num_groups), key=lambda g: -sum(groups[g][:best]))[:group_topk]
        pool = sorted(((order[e], e) for g in kept for e in range(g * group_size, (g + 1) * group_size)),
                      reverse=True)[:top_k]
        total += len({e * destinations // num_experts for _, e in pool})
        count += 1
    return total / count


@pytest.mark.parametrize("num_experts, top_k, destinations, num_groups, group_topk, group_by_max", [
    (8, 4, 4, 4, 2, False),   # two experts a group, the kept groups scored by their best two
    (8, 2, 2, 4, 2, True),    # scored by their best one; a destination holds two groups
    (8, 3, 8, 4, 2, False),   # top_k // group_topk = 1: a kept group may hold no chosen expert
    (8, 2, 4, 4, 2, False),
    (8, 4, 2, 2, 1, False)])  # node-limited to one of two nodes
def test_group_limited_destinations_follow_the_routers_rule(num_experts, top_k, destinations, num_groups,
                                                            group_topk, group_by_max):
    """expected_destinations on group-limited routing against the exact average over every score order of 8
    experts: within the simulation's sampling error."""
    found = float(expected_destinations(num_experts, top_k, destinations, num_groups, group_topk, group_by_max))
    exact = destinations_over_every_score_order(num_experts, top_k, destinations, num_groups, group_topk,
                                                group_by_max)
    assert found == pytest.approx(exact, rel=0.02)


def test_keeping_every_group_is_routing_without_groups():
    assert float(expected_destinations(256, 8, 8, 8, 8)) == pytest.approx(float(expected_destinations(256, 8, 8)))


def test_group_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3 (256 experts, top-8 of the 4 best of 8 groups) on 8 nodes of 32 experts: at most 4 nodes, nearly
    always 4 (a kept group scored by its best two experts almost always holds one of the token's 8); unrestricted
    top-8 routing reaches 8·(1 - C(224, 8) / C(256, 8)) = 5.29."""
    limited = float(expected_destinations(256, 8, 8, 8, 4))
    assert 3.9 < limited < 4.0
    assert float(expected_destinations(256, 8, 8)) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))


def test_a_group_that_does_not_fill_its_last_node_is_interpolated():
    """EP 20 on nodes of 8: 2.5 nodes, between the counts for 2 and 3."""
    two, half, three = (float(expected_destinations(160, 6, n, 8, 3)) for n in (2.0, 2.5, 3.0))
    assert half == pytest.approx((two + three) / 2)


@pytest.mark.parametrize("num_experts, top_k, nodes", [(8, 2, 2), (8, 2, 4), (16, 4, 4), (12, 3, 3), (8, 8, 2)])
def test_off_node_share_is_the_expected_count_of_destination_nodes(num_experts, top_k, nodes):
    placement = place_group(nodes * 4, 1, 4)                     # 4 EP ranks to a node, `nodes` nodes
    share = float(deepep_off_node_share(placement, num_experts, top_k))
    naive_remote_copies = top_k * (nodes - 1) / nodes
    assert share * naive_remote_copies == pytest.approx(remote_nodes_by_enumeration(num_experts, top_k, nodes))


def test_top_1_routing_sends_the_same_bytes_as_the_all_to_all():
    assert float(deepep_off_node_share(place_group(32, 1, 8), 64, 1)) == pytest.approx(1.0)


def test_inside_a_node_deepep_sends_a_token_once_per_destination_rank():
    """No RDMA stage inside a node (off-node share 1); DeepEP's intranode dispatch sends a token once to every rank
    that holds one of its experts, the all-to-all once per expert: 64 experts on 8 ranks, top-8, reach
    8·(1 - C(56, 8) / C(64, 8)) ranks."""
    profile = load_profile("h100-80gb")
    placement = place_group(8, 1, 8)
    assert float(deepep_off_node_share(placement, 64, 8)) == 1.0
    share = float(deepep_on_rank_share(placement, 64, 8))
    assert share == pytest.approx(8 * (1 - math.comb(56, 8) / math.comb(64, 8)) / 8)
    bytes_ = 64e6
    assert float(deepep_all_to_all_time_s(profile, placement, bytes_, 64, 8)) == pytest.approx(
        float(group_collective_time_s(profile, placement, "all_to_all", bytes_ * share)))
    assert float(deepep_on_rank_share(placement, 64, 1)) == pytest.approx(1.0)    # top-1: one copy either way
    # Qwen3-30B-A3B at EP 8 (128 experts, top-8), the figure docs/cost-model.md quotes
    assert float(deepep_on_rank_share(placement, 128, 8)) == pytest.approx(0.67, abs=0.005)


def test_across_nodes_deepep_sends_fewer_infiniband_bytes_and_is_faster():
    profile = load_profile("h100-80gb")
    placement = place_group(32, 1, 8)                            # EP 32 over 4 nodes
    share = float(deepep_off_node_share(placement, 128, 8))
    # 128 experts, 32 to a node, top-8: a node is missed with probability C(96, 8) / C(128, 8)
    missed = math.comb(96, 8) / math.comb(128, 8)
    assert share == pytest.approx(3 * (1 - missed) / (8 * 3 / 4))
    assert 0.3 < share < 0.5
    bytes_ = 134e6
    deepep = float(deepep_all_to_all_time_s(profile, placement, bytes_, 128, 8))
    nccl = float(group_collective_time_s(profile, placement, "all_to_all", bytes_))
    assert deepep < 0.6 * nccl


def test_the_step_prices_the_dispatcher_the_training_names():
    model, gpus = moe_model(), cluster(64)
    plans = PlanArrays.from_plans([Plan(tp=1, ep=8, etp=1, mbs=1), Plan(tp=2, ep=8, etp=2, mbs=1, sp=True)])
    nccl = ep_all_to_all_one_s(model, gpus, TrainingSpec(), plans)
    deepep = ep_all_to_all_one_s(model, gpus, TrainingSpec(moe_dispatcher="deepep"), plans)
    # EP 8 at stride 1 stays in the node; one expert to a rank, so the token's copies go to distinct ranks either way
    assert deepep[0] == pytest.approx(nccl[0])
    assert deepep[1] < nccl[1]                                   # EP 8 at stride etp 2 spans 2 nodes
    assert ep_comm_sms(TrainingSpec(moe_dispatcher="deepep", nccl_ctas=4)) == DEEPEP_NUM_SMS
    assert ep_comm_sms(TrainingSpec(nccl_ctas=4)) == 4


def test_an_unknown_dispatcher_is_an_input_error():
    with pytest.raises(InputError, match="moe_dispatcher"):
        TrainingSpec(moe_dispatcher="nccl")
    assert TrainingSpec(moe_dispatcher="DeepEP").moe_dispatcher is MoEDispatcher.DEEPEP


@pytest.mark.parametrize("dispatcher, flags", [("alltoall", ["--moe-token-dispatcher-type alltoall"]),
                                               ("deepep", ["--moe-token-dispatcher-type flex",
                                                           "--moe-flex-dispatcher-backend deepep"])])
def test_megatron_launch_carries_the_dispatcher_and_reads_back(dispatcher, flags):
    estimate = synthetic_estimate(moe_model(), cluster(64), TrainingSpec(moe_dispatcher=dispatcher),
                                  Plan(tp=2, pp=2, ep=8, etp=1, mbs=1, sp=True))
    text = emit(estimate, "megatron")
    for flag in flags:
        assert flag in text
    assert parse_megatron_args(text).training["moe_dispatcher"] == dispatcher


def test_deepep_without_an_expert_exchange_is_written_as_alltoall():
    # Megatron-Core's MoEFlexTokenDispatcher asserts 'DeepEP dispatcher requires TPxEP > 1' (expert TP × EP): with
    # ep·etp = 1 no token leaves the GPU, so the launch names the alltoall dispatcher instead
    estimate = synthetic_estimate(moe_model(), cluster(8), TrainingSpec(moe_dispatcher="deepep"),
                                  Plan(tp=1, pp=1, ep=1, etp=1, mbs=1))
    words = emit(estimate, "megatron").split()
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in words
    folded = synthetic_estimate(moe_model(), cluster(8), TrainingSpec(moe_dispatcher="deepep"),
                                Plan(tp=2, pp=1, ep=1, etp=2, mbs=1, sp=True))
    assert "--moe-flex-dispatcher-backend" in emit(folded, "megatron").split()


def test_a_launch_without_a_dispatcher_is_read_with_a_note():
    run = parse_megatron_args("python pretrain_gpt.py --num-experts 8 --tensor-model-parallel-size 1")
    assert "moe_dispatcher" not in run.training
    assert any("default allgather" in note for note in run.notes)
    dense = parse_megatron_args("python pretrain_gpt.py --tensor-model-parallel-size 1")
    assert not any("dispatcher" in note for note in dense.notes)


def test_a_dense_launch_names_no_dispatcher():
    estimate = synthetic_estimate(dense_model(), cluster(64), TrainingSpec(moe_dispatcher="deepep"),
                                  Plan(tp=2, pp=2, mbs=1, sp=True))
    assert "dispatcher" not in emit(estimate, "megatron")


def test_nemo_config_names_the_flex_dispatcher():
    estimate = synthetic_estimate(moe_model(), cluster(64), TrainingSpec(moe_dispatcher="deepep"),
                                  Plan(tp=2, pp=2, ep=8, etp=1, mbs=1, sp=True))
    text = emit(estimate, "nemo")
    assert "moe_token_dispatcher_type=flex" in text.replace('"', "").replace("'", "")
    assert "moe_flex_dispatcher_backend=deepep" in text.replace('"', "").replace("'", "")


@pytest.mark.parametrize("line, expected", [
    ("--moe-token-dispatcher-type alltoall", "alltoall"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep"),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "deepep"),
    ("--moe-token-dispatcher-type allgather", "alltoall"),
])
def test_megatron_dispatcher_flags_are_read(line, expected):
    run = parse_megatron_args(f"python pretrain_gpt.py --tensor-model-parallel-size 1 {line}")
    assert run.training["moe_dispatcher"] == expected


@pytest.mark.parametrize("line", ["--moe-token-dispatcher-type nccl",
                                  "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ucx"])
def test_unknown_megatron_dispatcher_values_are_refused(line):
    with pytest.raises(InputError, match="dispatcher"):
        parse_megatron_args(f"python pretrain_gpt.py {line}")


def test_deepep_share_is_vectorised_over_plans():
    placement = place_group(np.array([8.0, 16.0, 64.0]), np.array([1.0, 1.0, 1.0]), 8)
    share = deepep_off_node_share(placement, 64, 6)
    assert share.shape == (3,)
    assert share[0] == 1.0 and share[1] < 1.0 and share[2] < 1.0


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_an_overlapped_exchange_names_a_dispatcher_megatron_core_accepts(dispatcher):
    """TransformerConfig.__post_init__ (megatron-core 0.19.2): 'overlap_moe_expert_parallel_comm is supported with
    alltoall/flex token dispatcher'; Megatron-Core's default dispatcher, allgather, is refused with it."""
    training = TrainingSpec(moe_a2a_overlap=True, moe_dispatcher=dispatcher)
    estimate = synthetic_estimate(moe_model(), cluster(64), training, Plan(tp=1, pp=4, vpp=2, ep=8, etp=1, mbs=1))
    words = emit(estimate, "megatron").split()
    assert "--overlap-moe-expert-parallel-comm" in words
    assert words[words.index("--moe-token-dispatcher-type") + 1] in ("alltoall", "flex")


# ---- the experts' GEMM kernel (TrainingSpec.expert_gemm) ------------------------------------------------------------

def test_megatron_core_exports_say_when_the_estimate_priced_another_expert_gemm():
    plan = Plan(tp=2, pp=2, ep=8, etp=1, mbs=1, sp=True)
    grouped = synthetic_estimate(moe_model(), cluster(64), TrainingSpec(expert_gemm="grouped"), plan)
    cublas = synthetic_estimate(moe_model(), cluster(64), TrainingSpec(), plan)
    for framework in ("megatron", "nemo", "bridge", "verl"):
        assert "expert_gemm grouped: Megatron-Core runs a cuBLAS GEMM per expert" in emit(grouped, framework)
        assert "expert_gemm" not in emit(cublas, framework)
    dense = synthetic_estimate(dense_model(), cluster(64), TrainingSpec(expert_gemm="grouped"),
                               Plan(tp=2, pp=2, mbs=1, sp=True))
    assert "expert_gemm" not in emit(dense, "megatron")


def test_the_torchtitan_export_says_when_the_estimate_priced_per_expert_cublas_gemms():
    plan = Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=3)
    cublas = synthetic_estimate(moe_model(), cluster(8), TrainingSpec(), plan)
    grouped = synthetic_estimate(moe_model(), cluster(8), TrainingSpec(expert_gemm="grouped"), plan)
    assert "expert_gemm cublas: torchtitan's GroupedExperts runs one torch._grouped_mm kernel" in \
        emit(cublas, "torchtitan")
    assert "expert_gemm" not in emit(grouped, "torchtitan")


def test_a_megatron_moe_launch_reads_back_as_per_expert_cublas_gemms():
    run = parse_megatron_args("python pretrain_gpt.py --num-experts 8 --moe-grouped-gemm "
                              "--moe-token-dispatcher-type alltoall --tensor-model-parallel-size 1")
    assert run.training["expert_gemm"] == "cublas"
    assert "expert_gemm" not in parse_megatron_args("python pretrain_gpt.py --tensor-model-parallel-size 1").training


def test_the_expert_gemm_flag_reaches_the_header_and_the_json_and_bad_values_exit_2():
    from test_cli import LLAMA_8B, assert_one_line_bad_input, autopar
    argv = ("estimate", "mixtral-8x7b", "--gpu", "h100", "--gpus", "16", "--tp", "2", "--ep", "8", "--mbs", "1",
            "--global-batch", "64")
    result = autopar(*argv, "--expert-gemm", "grouped", "--json")
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["inputs"]["training"]["expert_gemm"] == "grouped"
    assert "expert GEMMs cublas" in autopar(*argv).stdout
    assert_one_line_bad_input(autopar(*argv, "--expert-gemm", "fused"), ["expert_gemm", "fused", "cublas"])
    dense = autopar("estimate", LLAMA_8B, "--gpus", "8", "--expert-gemm", "grouped")
    assert "--expert-gemm grouped has no effect" in dense.stderr


def test_deepep_v2_on_sm100_is_priced_on_the_copies_deepep_sends(microbench_tables):
    """DeepEP v2's EP 8 NVLink dispatch and combine on SM100 (moe_deepep_v2_dispatch_combine.csv, 8192 tokens,
    hidden 7168, top-8), checked against the B200 profile, whose NVLink fit comes from all-reduce measurements:
    priced as DeepEP sends them (once per destination rank) they agree within 10%; priced as the all-to-all's
    top-8 copies they would take about 1.3-1.5x as long."""
    rows = [row for row in microbench_tables.all_rows()["moe_deepep_v2_dispatch_combine.csv"]]
    assert len(rows) == 4                                    # max-performance and min-SM rows, dispatch and combine
    b200 = load_profile("b200-180gb")
    for row in rows:
        m = row.measurement
        assert (row.role, row.profiles, m.link, m.kind, m.group_size) == ("check", ("b200-180gb",), "nvlink",
                                                                          "all_to_all", 8)
        bytes_per_element = m.bytes / (8192 * 7168 * expected_destinations(256, 8, 8))
        top_k_buffer = 8192 * 8 * 7168 * bytes_per_element   # what the dispatcher's all-to-all would send
        deepep = float(deepep_all_to_all_time_s(b200, place_group(8, 1, 8), top_k_buffer, 256, 8))
        all_to_all = float(group_collective_time_s(b200, place_group(8, 1, 8), "all_to_all", top_k_buffer))
        assert deepep == pytest.approx(m.timing.median_s, rel=0.10 if "64" in row.why else 0.25)
        assert all_to_all > 1.25 * m.timing.median_s


def test_a_router_that_chooses_fewer_experts_than_top_k_is_an_input_error():
    """Group-limited routing picks top_k experts among the chosen groups' experts: 2 groups of 2 cannot give 6."""
    from costmodels.specs import MoESpec, RouterSpec

    with pytest.raises(InputError, match="router_group_topk"):
        MoESpec(num_experts=16, top_k=6, expert_ffn_hidden_size=64, router=RouterSpec(num_groups=8, group_topk=2))
    MoESpec(num_experts=16, top_k=4, expert_ffn_hidden_size=64, router=RouterSpec(num_groups=8, group_topk=2))
