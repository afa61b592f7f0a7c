"""The host side of a step (costmodels/host.py, host_timeline.py, engines.py): launch costs fitted to the
microbenchmarks, the timeline algebra against a kernel-by-kernel simulation of one in-order queue, the engines'
counts and synchronisations, and what the `host` term does to a step."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels import engines, host_timeline, steptime
from costmodels.hardware import load_profile
from costmodels.host import DEFAULT_HOST_COSTS_US, HOST_FIELDS, Segment, host_costs_from_us
from costmodels.params import stage_params_per_gpu
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ClusterSpec, Engine, LaunchPath, ModelSpec, MoEDispatcher, TrainingSpec

H100 = load_profile("h100-80gb")
SMALL = ModelSpec(name="small", hidden_size=1024, num_layers=12, num_attention_heads=16, ffn_hidden_size=4096,
                  vocab_size=32000)


def steps(model, gpu, training, plans, num_gpus=8):
    cluster = ClusterSpec(profile=load_profile(gpu), num_gpus=num_gpus)
    return steptime.step_time_terms_s(model, cluster, training, PlanArrays.from_plans(plans))


# ---- launch costs ------------------------------------------------------------------------------------------------

def test_bundled_host_costs_are_the_microbenchmark_fit(microbench_tables):
    """Every x86 profile carries the fit of the host rows (benchmarks/fit_microbench.py through autopar profile
    fit's path), the defaults for a profile without a host: section are the same numbers, and GB200's Grace host is
    slower by TE issue #2053's torch-linear ratio. (The fixture skips where shared/reference/microbench is not next
    to the checkout: the rows are read from there.)"""
    from autopar.calibrate.fit import fit_host_costs

    tables = microbench_tables
    rows = tables.all_rows()
    x86 = [row.measurement for file_rows in rows.values() for row in file_rows
           if "h100-80gb" in row.profiles and type(row.measurement).__name__ == "HostMeasurement"]
    fitted = fit_host_costs(x86, H100).params
    for key in HOST_FIELDS:
        assert fitted[key] == pytest.approx(DEFAULT_HOST_COSTS_US[key], rel=2e-3), key
        assert getattr(H100.host_costs, key[:-3] + "_s") == pytest.approx(fitted[key] * 1e-6, rel=2e-3), key
    grace = load_profile("gb200").host_costs
    assert grace.aten_op_s / H100.host_costs.aten_op_s == pytest.approx(tables.GRACE_HOST_FACTOR, rel=0.05)


def test_te_module_ratio_is_the_issues_table():
    path = __import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks" / "microbench" / \
        "host_cpu_linear_te_issue2053.csv"
    with open(path, encoding="utf-8") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    cpu = {(r["system"], r["module"]): float(r["cpu_us_per_call"]) for r in rows}
    assert engines.TE_MODULE_TO_TORCH_LINEAR == pytest.approx(
        cpu[("GB200", "transformer_engine.pytorch.Linear")] / cpu[("GB200", "torch.nn.Linear")])


def test_a_bad_host_section_is_refused_naming_the_key():
    from costmodels.errors import InputError
    from costmodels.host import parse_host_section

    with pytest.raises(InputError, match="host.launch_ms is not a host cost"):
        parse_host_section({"launch_ms": 3}, "p.yaml")
    with pytest.raises(InputError, match=r"host.sync_us must be a number of µs in \(0, 100,000\]"):
        parse_host_section({"sync_us": -1}, "p.yaml")
    assert parse_host_section({"sync_us": 20}, "p.yaml").sync_s == pytest.approx(20e-6)


# ---- the timeline algebra ------------------------------------------------------------------------------------------

def simulate(kernels: list[tuple[float, float]], syncs: frozenset = frozenset(), wake_s: float = 0.0) -> float:
    """One in-order stream, kernel by kernel: the host enqueues kernel i in host_i after the previous enqueue;
    it starts at max(its enqueue, the previous kernel's end); before a kernel index in `syncs` the host waits for
    the GPU to drain and then wakes up (wake_s)."""
    host = gpu = 0.0
    for i, (host_s, gpu_s) in enumerate(kernels):
        if i in syncs:
            host = max(host, gpu) + wake_s
        host += host_s
        gpu = max(gpu, host) + gpu_s
    return gpu


kernel_lists = st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 50.0)), min_size=1, max_size=30)


@given(kernel_lists)
@settings(max_examples=200, deadline=None)
def test_segments_compose_like_the_queue(kernels):
    """Each kernel its own segment (its host time is its first launch), chained with `then`: the chain's drained
    time is the queue's end, exactly."""
    chain = Segment.empty(1)
    for host_s, gpu_s in kernels:
        chain = chain.then(Segment.of(host_s, gpu_s, host_s, gpu_s))
    assert chain.drained_s[0] == pytest.approx(simulate(kernels), abs=1e-9)
    assert chain.gpu_s[0] == pytest.approx(sum(g for _, g in kernels))


@given(kernel_lists, st.integers(1, 6))
@settings(max_examples=100, deadline=None)
def test_repeat_is_copies_back_to_back(kernels, count):
    one = Segment.empty(1)
    for host_s, gpu_s in kernels:
        one = one.then(Segment.of(host_s, gpu_s, host_s, gpu_s))
    assert one.repeat(count).drained_s[0] == pytest.approx(simulate(kernels * count), abs=1e-6)


def test_a_synchronisation_closes_the_chain_and_exposes_the_next_launches():
    """Chains.units: a unit of (before, sync, after) repeated; against the queue with a sync before each unit's
    second part. Host-bound after the sync (4 µs launches of 1 µs kernels), GPU-bound before it."""
    before = [(1.0, 20.0)] * 3
    after = [(4.0, 1.0)] * 5
    wake = 2.0
    units = 3
    kernels, syncs = [], set()
    for _ in range(units):
        kernels += before
        syncs.add(len(kernels))
        kernels += after
    expected = simulate(kernels, frozenset(syncs), wake)
    chains = host_timeline.Chains.start(1, wake)
    seg_before = Segment.of(3.0, 60.0, 1.0, 20.0)
    seg_after = Segment.of(20.0, 5.0, 4.0, 1.0)
    chains.units(seg_before, seg_after, 1.0, float(units))
    total_gpu = units * (60.0 + 5.0)
    # the unit's own pieces are uniform, so the closed form is exact: what the chains expose plus the GPU's work
    assert chains.exposed_s[0] + chains.open.exposed_s[0] + total_gpu == pytest.approx(expected)


# ---- the engines' counts -------------------------------------------------------------------------------------------

def test_te_grouped_linear_launches_a_gemm_per_expert():
    """TE 2.17's GroupedLinear: a cuBLAS call per local expert, 2n forward and 4n backward per MoE layer (fc1 and
    fc2), one TE module call each way per linear; a grouped kernel (torchtitan) launches one per GEMM."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(ep=8), Plan(ep=2)])
    for experts, plan_index in ((16, 0), (64, 1)):
        fwd, bwd = engines._grouped_gemm_launches(TrainingSpec(), engines.local_experts(model, plans))
        assert np.asarray(fwd.cublas)[plan_index] + np.asarray(fwd.te_module) == 2 * experts
        assert np.asarray(bwd.cublas)[plan_index] + np.asarray(bwd.te_module) == 4 * experts
    grouped = engines._grouped_gemm_launches(TrainingSpec(expert_gemm="grouped"), engines.local_experts(model, plans))
    assert grouped[0].kernels == 2


def test_megatron_dispatcher_syncs_once_per_moe_layer_unless_padded():
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(ep=8)])
    assert engines.layer_launches(model, TrainingSpec(), plans).dispatch_syncs[0] == 1
    padded = TrainingSpec(moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    assert engines.layer_launches(model, padded, plans).dispatch_syncs[0] == 0
    deepep = TrainingSpec(moe_dispatcher=MoEDispatcher.DEEPEP)
    assert engines.layer_launches(model, deepep, plans).dispatch_syncs[0] == 4


def test_torchtitan_deepep_syncs_four_times_and_its_sac_reruns_the_permutation():
    """torchtitan's DeepEP path (distributed/deepep/deepep.py at v0.2.2): the dispatch's CPU wait, then
    _permute_tokens' two boolean-mask indexings and a repeat_interleave without an output size; per-op SAC re-runs
    the three (the dispatch's outputs are on its save list) and nothing on the all-to-all path (the split sizes'
    CPU copy is saved)."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(ep=8, recompute="selective", zero=3), Plan(ep=8, recompute="full", zero=3)])
    titan = TrainingSpec(engine="torchtitan", moe_dispatcher=MoEDispatcher.DEEPEP)
    launches = engines.layer_launches(model, titan, plans)
    assert list(launches.dispatch_syncs) == [4, 4]
    assert list(launches.moe_recompute_syncs) == [3, 0]          # full recompute: host_timeline re-runs all 4
    no_save = dataclasses.replace(titan, sac_saves_all_to_all=False)     # DeepEP's outputs are saved whatever
    assert engines.layer_launches(model, no_save, plans).moe_recompute_syncs[0] == 3
    alltoall = dataclasses.replace(titan, moe_dispatcher=MoEDispatcher.ALLTOALL)
    assert list(engines.layer_launches(model, alltoall, plans).moe_recompute_syncs) == [0, 0]


def test_cuda_graphs_replace_a_layers_launches_by_replays():
    plans = PlanArrays.from_plans([Plan(tp=2, sp=True)])
    eager = engines.layer_launches(SMALL, TrainingSpec(), plans)
    graphed = engines.layer_launches(SMALL, TrainingSpec(launch=LaunchPath.CUDA_GRAPH), plans)
    assert np.asarray(graphed.dense_fwd.graph_replay) == 2      # attn and mlp, whole layer
    assert np.asarray(graphed.dense_fwd.kernels) == pytest.approx(np.asarray(eager.dense_fwd.kernels))
    assert graphed.dense_fwd.host_s(H100.host_costs) < 0.2 * eager.dense_fwd.host_s(H100.host_costs)


def test_moe_whole_layer_graphs_need_drop_and_pad():
    from costmodels.errors import InputError

    model = __import__("autopar.models", fromlist=["load_model"]).load_model("mixtral-8x7b")
    with pytest.raises(InputError, match="drop-and-pad"):
        engines.layer_launches(model, TrainingSpec(launch=LaunchPath.CUDA_GRAPH), PlanArrays.from_plans([Plan()]))


def test_eager_engines_move_more_elementwise_bytes_and_fused_kernels_as_many_as_megatron():
    llama = __import__("autopar.models", fromlist=["load_model"]).load_model("llama-3.1-8b")
    megatron = engines.elementwise_bytes_per_token(llama, TrainingSpec())
    hugging_face = engines.elementwise_bytes_per_token(llama, TrainingSpec(engine=Engine.DEEPSPEED))
    compiled = engines.elementwise_bytes_per_token(llama, TrainingSpec(engine=Engine.TORCHTITAN,
                                                                      launch=LaunchPath.COMPILE))
    assert hugging_face > 2 * megatron > 2 * compiled * 0.9
    fused = TrainingSpec(engine=Engine.DEEPSPEED, fused_kernels=True)
    assert engines.elementwise_traffic_scale(llama, fused) == 1.0


# ---- the host term -------------------------------------------------------------------------------------------------

def test_small_micro_batches_of_a_small_model_pay_the_host_and_large_ones_do_not():
    training = TrainingSpec(seq_len=512, global_batch_size=64)
    one, eight = Plan(tp=8, mbs=1, sp=True), Plan(tp=8, mbs=8, sp=True)
    terms = steps(SMALL, "b200-180gb", training, [one, eight])
    step = sum(terms.values())
    assert terms["host"][0] > 0.05 * step[0]          # host-bound at micro-batch 1
    assert terms["host"][1] < 0.5 * terms["host"][0]  # eight times the work per launch hides most of it
    assert step[0] > 1.1 * step[1]


def test_a_large_model_stays_gpu_bound_at_micro_batch_one():
    llama = __import__("autopar.models", fromlist=["load_model"]).load_model("llama-3.1-70b")
    terms = steps(llama, "h100-80gb", TrainingSpec(seq_len=4096, global_batch_size=64),
                  [Plan(tp=8, pp=4, vpp=5, mbs=1, sp=True, zero=1)], num_gpus=64)
    assert terms["host"][0] < 0.01 * sum(terms.values())[0]


def test_the_same_plan_is_more_host_bound_on_a_faster_gpu_and_a_slower_host():
    training = TrainingSpec(seq_len=1024, global_batch_size=64)
    plan = [Plan(tp=4, mbs=1, sp=True)]
    share = {gpu: (lambda t: t["host"][0] / sum(t.values())[0])(steps(SMALL, gpu, training, plan))
             for gpu in ("a100-80gb", "h100-80gb", "b200-180gb")}
    assert share["a100-80gb"] < share["h100-80gb"] < share["b200-180gb"]
    slow_host = dataclasses.replace(H100, host_costs=host_costs_from_us(
        {key: 3.0 * value for key, value in DEFAULT_HOST_COSTS_US.items()}))
    cluster = ClusterSpec(profile=slow_host, num_gpus=8)
    slow = steptime.step_time_terms_s(SMALL, cluster, training, PlanArrays.from_plans(plan))["host"][0]
    assert slow > steps(SMALL, "h100-80gb", training, plan)["host"][0]


def test_a_dispatch_sync_per_moe_layer_costs_the_host_more_than_drop_and_pad():
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = [Plan(ep=8, mbs=1, zero=1)]
    dropless = steps(model, "b200-180gb", TrainingSpec(seq_len=1024, global_batch_size=64), plans)
    padded = steps(model, "b200-180gb", TrainingSpec(seq_len=1024, global_batch_size=64, moe_capacity_factor=1.0,
                                                     moe_pad_to_capacity=True), plans)
    assert dropless["host"][0] > padded["host"][0]


def test_deepspeed_2021_zero3_exposes_every_gather():
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("gpt-1.7b")
    modern = TrainingSpec(seq_len=2048, global_batch_size=512, engine=Engine.DEEPSPEED)
    legacy = dataclasses.replace(modern, zero3_serial_fetch=True)
    plan = [Plan(zero=3, mbs=1)]
    assert steps(model, "a100-80gb", legacy, plan, 256)["dp_comm"][0] > \
        2 * steps(model, "a100-80gb", modern, plan, 256)["dp_comm"][0]


def test_deepspeed_zero3_fetches_a_moe_block_at_once_as_a_leaf_module():
    """Frameworks register a Hugging Face MoE block as a ZeRO-3 leaf module (ranks that route differently would
    otherwise fetch different experts and hang): one coalesced all-gather for all of its experts a pass, a copy-out
    per expert weight; DeepSpeed before 0.6 (no leaf modules) gathers every weight on its own."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(zero=3, mbs=1), Plan(zero=1, mbs=1)])
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED, expert_gemm="loop")
    launches = engines.layer_launches(model, training, plans)
    weights = 3.0 * model.moe.num_experts
    dense = engines.layer_launches(dataclasses.replace(model, moe=None), training, plans)
    assert launches.moe_post_fwd.collective[0] == 1.0 and launches.moe_post_fwd.collective[1] == 0.0
    # a copy-in, the router's weight and the experts', each copied out
    assert launches.moe_post_fwd.aten_op[0] - launches.moe_post_fwd.aten_op[1] == 1.0 + 1.0 + weights
    # the layer's linears only: norms stay whole on every rank (the persistence threshold)
    assert dense.dense_fwd.collective[0] == 7.0
    assert launches.moe_pre_fwd.collective[0] == 4.0          # a MoE layer's attention side
    legacy = dataclasses.replace(training, zero3_serial_fetch=True)
    assert steptime.zero3_collectives_per_layer(model, training) == (4.0, 1.0)
    assert steptime.zero3_collectives_per_layer(model, legacy)[1] == weights
    # without the leaf module (transformers' loop over every expert, before the frameworks registered it): hooks on
    # every expert linear, an all-gather each, and the step pays their latency
    hooked = dataclasses.replace(training, zero3_moe_leaf=False)
    per_linear = engines.layer_launches(model, hooked, plans).moe_post_fwd
    assert per_linear.collective[0] == 1.0 + weights
    assert per_linear.aten_op[0] - per_linear.aten_op[1] == 2.0 * (1.0 + weights)
    assert steptime.zero3_collectives_per_layer(model, hooked)[1] == 1.0 + weights
    plan = [Plan(zero=3, mbs=1)]
    assert steps(model, "a800-80gb", hooked, plan, 16)["dp_comm"][0] > \
        steps(model, "a800-80gb", training, plan, 16)["dp_comm"][0]


def test_deepspeed_zero3_hooks_cost_the_host_per_module_and_parameter():
    """ZeRO-3 hooks every submodule (benchmarks/deepspeed_zero3_host.py): their Python is host time per hooked module
    and fetched parameter in each pass, none below stage 3, and none of it a GPU kernel."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("llama-2-7b")
    plans = PlanArrays.from_plans([Plan(zero=3, mbs=1), Plan(zero=2, mbs=1)])
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED)
    launches = engines.layer_launches(model, training, plans)
    hooked = engines.zero3_hooked_modules_per_layer(model)
    assert hooked == 13      # q k v o gate up down, two norms; the layer, its attention, MLP and activation
    fetched = 7.0       # the linears' weights; the norms' stay whole on every rank (the persistence threshold)
    for direction, pieces in (("fwd", launches.dense_fwd), ("bwd", launches.dense_bwd)):
        per_module, per_param = engines.ZERO3_HOOK_TO_ATEN_OP[direction]
        assert pieces.zero3_hook[0] == pytest.approx(per_module * hooked + per_param * fetched)
        assert pieces.zero3_hook[1] == 0.0
    costs = host_costs_from_us(DEFAULT_HOST_COSTS_US)
    hook_only = engines.Launches(zero3_hook=10.0)
    assert hook_only.kernels == 0.0 and hook_only.host_s(costs) == pytest.approx(10.0 * costs.aten_op_s)


def test_deepspeed_zero3_hooks_every_expert_unless_the_block_is_a_leaf():
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(zero=3, mbs=1)])
    leaf = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED, expert_gemm="loop")
    hooked = dataclasses.replace(leaf, zero3_moe_leaf=False)
    experts = model.moe.num_experts
    per_module, per_param = engines.ZERO3_HOOK_TO_ATEN_OP["fwd"]
    leaf_hook = engines.layer_launches(model, leaf, plans).moe_post_fwd.zero3_hook[0]
    every_hook = engines.layer_launches(model, hooked, plans).moe_post_fwd.zero3_hook[0]
    # the router's weight and every expert's three are fetched either way; not a leaf, the router and every expert's
    # module, activation and three linears are hooked too (the block's own hook is the layer's)
    assert leaf_hook == pytest.approx(per_param * (1 + 3 * experts))
    assert every_hook == pytest.approx(per_module * (1 + 5 * experts) + per_param * (1 + 3 * experts))
    moe_side = engines.layer_launches(model, leaf, plans).moe_pre_fwd.zero3_hook[0]
    assert moe_side == pytest.approx(per_module * (2 + 4 + 4 + 1) + per_param * 4)   # q k v o; 2 + 2 norms; block
    plan = [Plan(zero=3, mbs=1)]
    assert steps(model, "a800-80gb", hooked, plan, 16)["host"][0] > steps(model, "a800-80gb", leaf, plan, 16)["host"][0]


def test_the_zero3_hook_benchmark_fits_what_it_measures():
    """The benchmark's fit recovers known per-module and per-parameter costs (its measurement needs DeepSpeed, the
    conformance extra; the fit does not)."""
    from benchmarks.deepspeed_zero3_host import MODELS, fit_pass

    module_s, param_s = 70e-6, 30e-6
    rows = []
    for containers, modules, weights in MODELS:
        hooked, params = 1 + containers * (1 + modules), containers * modules * weights   # the modules that run
        rows.append((hooked, params, hooked * module_s + params * param_s))
    module_us, param_us, pass_us, rms = fit_pass([(h, n, seconds + 500e-6) for h, n, seconds in rows])
    assert module_us == pytest.approx(70.0) and param_us == pytest.approx(30.0) and pass_us == pytest.approx(500.0)
    assert rms < 1e-9
    # a constant the free fit makes negative is held at zero
    module_us, param_us, pass_us, _ = fit_pass([(h, n, seconds - 200e-6) for h, n, seconds in rows])
    assert pass_us == 0.0 and module_us < 70.0


def test_the_zero3_hook_benchmark_counts_the_modules_whose_forward_runs():
    """ModuleLists carry ZeRO-3's hooks but are never called: the benchmark counts the root, each container and
    each linear."""
    torch = pytest.importorskip("torch")
    from benchmarks.deepspeed_zero3_host import HIDDEN, build_model, modules_run

    assert modules_run(build_model(2, 3, 4), torch.randn(1, HIDDEN)) == 1 + 2 * (1 + 3)
    assert sum(1 for _ in build_model(2, 3, 4).parameters()) == 2 * 3 * 4


def test_deepspeed_zero3_step_walks_every_parameter_on_the_host():
    """ZeRO-3's optimizer step walks every parameter's partition (ZERO3_STEP_TO_ATEN_OP): host time per parameter
    tensor of the whole model, once a step, under DeepSpeed at stage 3 only."""
    load = __import__("autopar.models", fromlist=["load_model"]).load_model
    llama, qwen = load("llama-2-7b"), load("qwen3-30b-a3b")
    # 32 layers of 9 tensors (q k v o gate up down, two norms), the embedding, the final norm and the output layer
    assert engines.model_param_tensors(llama) == 32 * 9 + 3
    # Qwen3's q/k norms; a MoE layer's router and 3 x 128 experts in place of the MLP's three linears
    assert engines.model_param_tensors(qwen) == 48 * (11 - 3 + 1 + 384) + 3
    plans = PlanArrays.from_plans([Plan(zero=3), Plan(zero=1)])
    costs = host_costs_from_us(DEFAULT_HOST_COSTS_US)
    deepspeed = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED)
    host_s = engines.step_host_s(qwen, deepspeed, plans, costs, 8, 0)
    per_step, per_tensor = engines.ZERO3_STEP_TO_ATEN_OP
    assert host_s[0] - host_s[1] == pytest.approx((per_step + per_tensor * (48 * 393 + 3)) * costs.aten_op_s)
    plain = TrainingSpec(seq_len=1024, global_batch_size=64)
    megatron = engines.step_host_s(qwen, plain, plans, costs, 8, 0)
    # no walk under Megatron; only the distributed optimizer's DDP buckets are checked for NaN (not Megatron-FSDP's)
    assert megatron[1] - megatron[0] == pytest.approx(
        engines.megatron_bucket_checks(qwen, plain, plans, 8, 0)[1] * costs.sync_s)


def test_megatron_checks_every_ddp_bucket_for_nan_on_the_host():
    """--check-for-nan-in-loss-and-grad (on by default) checks each DDP bucket's grad norm against isnan and isinf,
    a host read each (param_and_grad_buffer.py check_grads). Without --overlap-grad-reduce a chunk's dense and expert
    buffers are one bucket each; with it pipeline rank 0's first chunk is cut into buckets of max(40M, 1M x dp)
    parameters, the other ranks and chunks staying whole (distributed_data_parallel.py)."""
    load = __import__("autopar.models", fromlist=["load_model"]).load_model
    llama, qwen = load("llama-2-7b"), load("qwen3-30b-a3b")
    plans = PlanArrays.from_plans([Plan(zero=1), Plan(pp=2, zero=1), Plan(pp=2, vpp=2, zero=1)])
    plain = TrainingSpec(seq_len=1024, global_batch_size=64)
    overlap = dataclasses.replace(plain, overlap_grad_reduce=True)
    assert list(engines.megatron_bucket_checks(llama, plain, plans, 8, 0)) == [2, 2, 4]
    assert list(engines.megatron_bucket_checks(qwen, plain, plans, 8, 0)) == [4, 4, 8]
    # 6.74B parameters on one rank of dp 8: buckets of 40M; on pp 2 rank 1 stays unbucketed
    one = PlanArrays.from_plans([Plan(zero=1)])
    buckets = engines.megatron_bucket_checks(llama, overlap, one, 8, 0)[0] / 2
    dense, _ = stage_params_per_gpu(llama, one, 0)
    assert buckets == np.ceil(dense[0] / 40e6) and buckets > 100
    assert engines.megatron_bucket_checks(llama, overlap, plans, 8, 1)[1] == 2
    fsdp = PlanArrays.from_plans([Plan(zero=2), Plan(zero=3)])     # Megatron-FSDP: the overlapped path checks none
    assert not engines.megatron_bucket_checks(llama, overlap, fsdp, 8, 0).any()
    costs = host_costs_from_us(DEFAULT_HOST_COSTS_US)
    more = engines.step_host_s(llama, overlap, plans, costs, 8, 0) - engines.step_host_s(llama, plain, plans, costs, 8, 0)
    assert more[0] == pytest.approx((2 * buckets - 2) * costs.sync_s)


def test_deepspeed_zero3_counts_a_gpt2_layer_and_the_model_around_the_layers():
    """GPT-2 under ZeRO-3: a fused QKV and the projections (four linears fetched; biases and LayerNorms stay whole),
    its two dropout modules hooked, its position embedding fetched with the token embedding."""
    gpt = __import__("autopar.models", fromlist=["load_model"]).load_model("gpt-1.7b")
    assert gpt.dropout and gpt.linear_bias
    assert engines.zero3_fetched_linears_per_layer(gpt) == 4.0
    # layer, attention, c_attn, c_proj, two LayerNorms, two dropouts, MLP, c_fc, c_proj, activation
    assert engines.zero3_hooked_modules_per_layer(gpt) == 12.0
    # 24 layers of 4 weights, 4 biases, 4 LayerNorm tensors; wte, wpe, the final LayerNorm's two (tied output)
    assert engines.model_param_tensors(gpt) == 24 * 12 + 2 + 2 + (0 if gpt.tied_embeddings else 1)
    plans = PlanArrays.from_plans([Plan(zero=3, mbs=1), Plan(zero=1, mbs=1)])
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED)
    launches = engines.layer_launches(gpt, training, plans)
    assert launches.head_fwd.collective[0] == 2.0 and launches.head_fwd.collective[1] == 0.0
    assert launches.tail_fwd.zero3_hook[0] > 0.0 and launches.tail_fwd.zero3_hook[1] == 0.0


def test_deepspeed_zero3_fetches_shared_experts_with_the_block():
    """A shared expert is an MLP module of the block (DeepSeek's, Qwen2-MoE's): fetched with it (a leaf) or hooked
    with its activation and three linears like a routed expert."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("qwen1.5-moe-a2.7b")
    plans = PlanArrays.from_plans([Plan(zero=3, mbs=1)])
    leaf = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED, expert_gemm="loop")
    shared, experts = model.moe.num_shared_experts, model.moe.num_experts
    fetch = engines.layer_launches(model, leaf, plans).moe_post_fwd
    assert fetch.collective[0] == 1.0 and fetch.aten_op[0] >= 1.0 + 1.0 + 3 * (experts + shared)
    hooked = engines.layer_launches(model, dataclasses.replace(leaf, zero3_moe_leaf=False), plans).moe_post_fwd
    assert hooked.collective[0] == 1.0 + 3 * (experts + shared)


def test_plain_1f1b_syncs_at_the_transfers_a_stage_makes(monkeypatch):
    """Non-interleaved 1F1B ends every _communicate in torch.cuda.synchronize(); the last stage sends nothing after
    its forward (send_forward_recv_backward skips _communicate there) and the first nothing after its backward
    (send_backward_recv_forward), so they synchronise once a micro-batch, the stages between twice
    (Megatron-Core pipeline_parallel/p2p_communication.py)."""
    plans = PlanArrays.from_plans([Plan(pp=3)])
    cluster = ClusterSpec(profile=H100, num_gpus=3)
    training = TrainingSpec(seq_len=1024, global_batch_size=8)
    times = steptime.compute_model.layer_times_s(SMALL, H100, training, plans)
    launches = engines.layer_launches(SMALL, training, plans)
    assert launches.transfer_syncs[0] and launches.loss_syncs == 2.0
    counted = []
    original = host_timeline.Chains.sync

    def counting(self, count):
        counted.append(float(np.asarray(count, dtype=float).ravel()[0]))
        original(self, count)

    monkeypatch.setattr(host_timeline.Chains, "sync", counting)
    # the interleaved schedule's chunk passes between transfers (none here: vpp 1) run chains of their own
    monkeypatch.setattr(host_timeline, "_closed_chunks", lambda *args: np.zeros(1))
    zero = np.zeros(1)
    per_stage = []
    for stage in range(3):
        counted.clear()
        steptime.stage_host_s(SMALL, cluster, training, plans, times, stage, zero + 1e-3, zero + 2e-3, zero, zero,
                              launches)
        per_stage.append(sum(counted))
    assert per_stage == [1.0, 2.0, 1.0 + 2.0]          # the last stage adds the loss's two NaN checks


def test_deepspeed_zero3_host_waits_at_the_end_of_every_backward():
    """DeepSpeed's ZeRO-3 ends every micro-batch's backward in independent_gradient_partition_epilogue, whose
    reduce_and_partition_stream.synchronize() the host waits on: a dense model's step is no longer one chain, and
    the host pays for it at every micro-batch; at ZeRO-1 nothing syncs there."""
    plans = PlanArrays.from_plans([Plan(zero=3), Plan(zero=1)])
    deepspeed = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.DEEPSPEED)
    launches = engines.layer_launches(SMALL, deepspeed, plans)
    assert list(launches.backward_end_syncs) == [1.0, 0.0]
    assert not np.any(engines.layer_launches(SMALL, TrainingSpec(), plans).backward_end_syncs)


def test_torchtitan_pipeline_launches_no_per_microbatch_reduce_scatter():
    """Under a pipeline schedule FSDP2 neither reduces nor reshards in a micro-batch's backward: its reduce-scatter
    launches once a step, and at ZeRO-2 the forward finds the unit still gathered."""
    plans = PlanArrays.from_plans([Plan(pp=1, zero=2), Plan(pp=2, zero=2), Plan(pp=2, zero=3)])
    titan = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.TORCHTITAN, launch=LaunchPath.EAGER)
    launches = engines.layer_launches(SMALL, titan, plans)
    forward = np.asarray(launches.dense_fwd.collective)
    backward = np.asarray(launches.dense_bwd.collective)
    assert forward[0] - forward[1] == 1 and backward[0] - backward[1] == 1      # the gather, the reduce-scatter
    assert backward[2] - backward[1] == 1                                          # ZeRO-3: the backward's gather


# ---- an eager model's own Python ---------------------------------------------------------------------------------

def _eager_launches(engine, launch=LaunchPath.EAGER, model_name="llama-2-7b", **training_fields):
    model = __import__("autopar.models", fromlist=["load_model"]).load_model(model_name)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=engine, launch=launch, **training_fields)
    return engines.layer_launches(model, training, PlanArrays.from_plans([Plan(mbs=1)]))


@pytest.mark.parametrize("engine", [Engine.PYTORCH, Engine.DEEPSPEED, Engine.TORCHTITAN])
def test_an_eager_model_adds_its_python_to_every_kernel_it_launches(engine):
    """benchmarks/eager_model_host.py: inside a model each ATen kernel costs the host its module's Python, the views
    around it and the autograd graph (forward) or the autograd engine's node (backward) beyond the bare operator the
    host profile was fitted to; host time only, per kernel of the pass."""
    launches = _eager_launches(engine)
    for direction, pieces in (("fwd", launches.dense_fwd), ("bwd", launches.dense_bwd)):
        kernels = np.asarray(pieces.aten_op) + np.asarray(pieces.aten_gemm)
        assert np.asarray(pieces.model_python)[0] == pytest.approx(
            kernels[0] * engines.EAGER_MODEL_PYTHON_TO_ATEN_OP[direction])
    costs = host_costs_from_us(DEFAULT_HOST_COSTS_US)
    python_only = engines.Launches(model_python=4.0)
    assert python_only.kernels == 0.0 and python_only.host_s(costs) == pytest.approx(4.0 * costs.aten_op_s)


def test_compiled_models_and_megatron_pay_no_eager_model_python():
    """A compiled block runs as one graph call (its Python ran once, at trace); Megatron-Core's TE modules carry
    their own measured Python (TE_MODULE_TO_TORCH_LINEAR)."""
    for launches in (_eager_launches(Engine.TORCHTITAN, LaunchPath.COMPILE),
                     _eager_launches(Engine.PYTORCH, LaunchPath.COMPILE), _eager_launches(Engine.MEGATRON)):
        assert np.all(np.asarray(launches.dense_fwd.model_python) == 0.0)
        assert np.all(np.asarray(launches.dense_bwd.model_python) == 0.0)


def test_an_eager_expert_loop_pays_the_python_of_every_expert():
    """Hugging Face's loop over the local experts (ExpertGemm.LOOP) runs each expert's module forward: its kernels
    carry the model's Python like the layer's."""
    launches = _eager_launches(Engine.DEEPSPEED, model_name="qwen3-30b-a3b", expert_gemm="loop")
    post = launches.moe_post_fwd
    kernels = np.asarray(post.aten_op) + np.asarray(post.aten_gemm)
    assert np.asarray(post.model_python)[0] == pytest.approx(kernels[0] * engines.EAGER_MODEL_PYTHON_TO_ATEN_OP["fwd"])
    assert kernels[0] >= 8 * 128      # three linears, the activation, multiply, weighting and index_add_ per expert


def test_the_eager_model_benchmark_counts_nanogpt_blocks_kernels():
    """The benchmark's op counter on nanoGPT's Block (views and allocations left out): 16 kernels forward -- two
    norms, four linears, two bmm, the scale, the mask's comparison and fill, softmax, the head merge copy, GELU, two
    residual adds -- and 38 backward, among them an accumulation into each of its twelve parameters' gradients."""
    pytest.importorskip("torch", reason="torch is not installed (the CPU build: pip install torch==2.13.0)")
    from benchmarks.eager_model_host import PassCost, kernels_per_layer, nanogpt

    assert kernels_per_layer(nanogpt) == (16.0, 38.0)
    assert PassCost(kernels=10.0, layer_us=150.0, bare_us=50.0).extra_us == pytest.approx(10.0)
