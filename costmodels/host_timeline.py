"""The host's share of a training step: what enqueueing a stage's kernels adds to its GPU work, per micro-batch.

A stage's micro-batch is a program of pieces in the order the engine runs them (costmodels.engines counts each
piece's launches, costmodels.compute and costmodels.steptime its GPU seconds):

    forward   [embedding]  dense layers  MoE layers (before the dispatch | SYNC x k | after)  [output layer + loss]
              [SYNC x loss checks]  [SYNC at the stage-to-stage transfer]
    backward  [loss + output layer]  MoE layers (a recomputed forward with its syncs, then the backward)
              dense layers (a recomputed forward, then the backward)  [embedding]  [SYNC at the backward's end]
              [SYNC at the transfer]

Between two synchronisations the pieces form one chain (costmodels.host.Segment algebra): the GPU idles while the
host enqueues the chain's first kernel after a drained queue, and wherever the host falls behind. The exposed
time of a micro-batch is what its chains add beyond their GPU work, counted in the steady state of a step (the
chain that crosses from one micro-batch into the next once); a program with no synchronisation at all is one
chain over the whole step. The `host` step-time term is that, micro-batch after micro-batch, on the worst stage.

GPU seconds of a piece: the stage's forward (backward, recompute) seconds with its exposed collectives
(StageMicrobatch), shared among its layers in proportion to each layer's own forward (LayerTimes), a MoE layer's
split before and after the dispatch by moe_pre_dispatch_fwd_s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels import compute as compute_model
from costmodels.engines import LayerLaunches, Launches
from costmodels.host import HostCosts, Segment
from costmodels.params import moe_layers_on_stage
from costmodels.plan import PlanArrays, Recompute, layers_on_stage


def pick(mask, a: Segment, b: Segment) -> Segment:
    """Per plan: `a` where `mask`, `b` elsewhere."""
    return Segment(*(np.where(mask, getattr(a, name), getattr(b, name))
                     for name in ("host_s", "gpu_s", "drained_s", "first_host_s", "last_gpu_s")))


def piece(launches: Launches, gpu_s, costs: HostCosts) -> Segment:
    """A piece of work: its launches' host time and its GPU seconds, spread evenly over its kernels (the GPU idles
    for one kernel's share of the host time after a drained queue, and the last kernel takes one kernel's share of
    the GPU time)."""
    host_s = np.asarray(launches.host_s(costs), dtype=float)
    kernels = np.maximum(np.asarray(launches.kernels, dtype=float), 1.0)
    return Segment.of(host_s, gpu_s, host_s / kernels, np.asarray(gpu_s, dtype=float) / kernels)


@dataclass
class Chains:
    """The running state of a program: the open chain and what the closed ones exposed (per plan)."""

    open: Segment
    exposed_s: np.ndarray
    closed: np.ndarray
    """Whether any synchronisation has closed a chain (per plan)."""
    wake_s: float
    """The host's wake-up after a synchronisation (HostCosts.sync_s)."""
    first_chain: Segment
    """The chain the first synchronisation closed (per plan; empty where none has): in a step's steady state it
    runs on from the previous micro-batch's open chain instead of from a drained queue (`steady_exposed_s`)."""

    @staticmethod
    def start(n: int, wake_s: float, open_chain: "Segment | None" = None) -> "Chains":
        empty = Segment.empty(n)
        return Chains(open_chain if open_chain is not None else empty, np.zeros(n), np.zeros(n, dtype=bool), wake_s,
                      empty)

    def _closing(self, happens: np.ndarray, chain: Segment) -> None:
        """Record `chain` as the first closed one where a synchronisation `happens` for the first time."""
        self.first_chain = pick(happens & ~self.closed, chain, self.first_chain)
        self.closed = self.closed | happens

    def steady_exposed_s(self) -> np.ndarray:
        """What this program exposes when the same program ran just before it (a micro-batch in the steady state of
        a step): its first chain starts on the open chain the previous run left, not on a drained queue; the
        other chains are closed on both ends and expose the same."""
        carried = self.open.then(self.first_chain).exposed_s
        return self.exposed_s - self.first_chain.exposed_s + carried

    def run(self, segment: Segment, count=1.0) -> None:
        """`count` copies of `segment` (per plan), no synchronisation."""
        self.open = self.open.then(segment.repeat(count))

    def sync(self, count) -> None:
        """`count` back-to-back synchronisations (per plan; 0 = none): the open chain closes and the host pays a
        wake-up for each before it enqueues again."""
        count = np.broadcast_to(np.asarray(count, dtype=float), self.exposed_s.shape)
        happens = count > 0
        self.exposed_s = self.exposed_s + np.where(happens, self.open.exposed_s, 0.0)
        self._closing(happens, self.open)
        self.open = pick(happens, Segment.wait(count * self.wake_s, len(count)), self.open)

    def units(self, before: Segment, after: Segment, syncs, count) -> None:
        """`count` units (per plan) each of `before`, then `syncs` synchronisations with `after` split evenly after
        each (a MoE layer's dispatch; a layer its engine synchronises inside); with no sync, `count` copies of
        before + after."""
        n = len(self.exposed_s)
        syncs = np.broadcast_to(np.asarray(syncs, dtype=float), (n,))
        count = np.broadcast_to(np.asarray(count, dtype=float), (n,))
        k = np.maximum(syncs, 1.0)
        part = after.split(k)
        inside = Segment.wait(self.wake_s, n).then(part)              # between two syncs of one unit
        across = inside.then(before)                                  # from a unit's last sync into the next one's
        has = (syncs > 0) & (count > 0)
        closing = self.open.then(before)                              # the chain the unit's first sync closes
        exposed = closing.exposed_s + count * (k - 1.0) * inside.exposed_s \
            + np.maximum(count - 1.0, 0.0) * across.exposed_s
        plain = self.open.then(before.then(after).repeat(count))
        self.exposed_s = self.exposed_s + np.where(has, exposed, 0.0)
        self._closing(has, closing)
        self.open = pick(has, inside, plain)


@dataclass(frozen=True)
class StagePieces:
    """A stage's per-micro-batch program (module docstring): GPU seconds and launches of each piece, per plan."""

    dense_layers: np.ndarray
    moe_layers: np.ndarray
    first: np.ndarray
    last: np.ndarray
    dense_fwd: Segment
    dense_bwd: Segment
    moe_pre: Segment
    moe_post: Segment
    moe_bwd: Segment
    dense_recompute: Segment
    moe_recompute_pre: Segment
    moe_recompute_post: Segment
    moe_recompute_syncs: np.ndarray
    head_fwd: Segment
    head_bwd: Segment
    tail_fwd: Segment
    tail_bwd: Segment


def stage_pieces(model, training, plans: PlanArrays, times: compute_model.LayerTimes, launches: LayerLaunches,
                 costs: HostCosts, stage: np.ndarray, forward_s: np.ndarray, backward_s: np.ndarray,
                 recompute_s: np.ndarray, comm_fwd_s: np.ndarray, comm_bwd_s: np.ndarray) -> StagePieces:
    """The pieces of `stage`'s micro-batch: the stage's GPU seconds per pass (forward_s, backward_s with
    recompute_s, and the exposed collectives comm_*_s) shared among its layers by their forward seconds."""
    n = len(plans)
    layers = np.asarray(layers_on_stage(model.num_layers, plans, stage), dtype=float)
    moe_layers = np.asarray(moe_layers_on_stage(model, plans, stage), dtype=float)
    dense_layers = layers - moe_layers
    first = np.broadcast_to(np.asarray(stage) == 0, (n,))
    last = np.broadcast_to(np.asarray(stage) == plans.pp - 1, (n,))
    tail_fwd_gpu = np.where(last, times.logits_fwd_s + times.loss_fwd_s + times.mtp_fwd_s, 0.0)
    tail_bwd_gpu = np.where(last, compute_model.BACKWARD_TO_FORWARD * (times.logits_fwd_s + times.mtp_fwd_s)
                            + times.loss_bwd_s, 0.0)
    dense_share, moe_share = times.dense_layer_fwd_s, times.moe_layer_fwd_s
    layer_total = np.maximum(dense_layers * dense_share + moe_layers * moe_share, 1e-12)

    def per_layer(total_s, share):              # the pass's layer seconds shared by forward seconds
        return np.maximum(total_s, 0.0) * share / layer_total

    fwd_layers_s = forward_s + comm_fwd_s - tail_fwd_gpu
    bwd_layers_s = backward_s + comm_bwd_s - tail_bwd_gpu
    pre_fraction = np.where(moe_share > 0, np.clip(times.moe_pre_dispatch_fwd_s / np.maximum(moe_share, 1e-12),
                                                   0.0, 1.0), 0.0)
    moe_fwd_s = per_layer(fwd_layers_s, moe_share)
    full = plans.recompute == Recompute.FULL
    recomputed = compute_model.recomputed_layer_fraction(plans, layers)
    # the recomputed seconds per layer: full recompute re-runs a recomputed layer's forward, selective the modules
    dense_rc_s = np.where(full, recomputed * per_layer(fwd_layers_s, dense_share),
                          times.selective_dense_fwd_s if times.selective_dense_fwd_s is not None else 0.0)
    moe_rc_s = np.where(full, recomputed * moe_fwd_s,
                        times.selective_moe_fwd_s if times.selective_moe_fwd_s is not None else 0.0)
    rc_scale = np.where(dense_layers * dense_rc_s + moe_layers * moe_rc_s > 0,
                        recompute_s / np.maximum(dense_layers * dense_rc_s + moe_layers * moe_rc_s, 1e-12), 0.0)

    def seg(name: str, gpu_s):
        return piece(getattr(launches, name), gpu_s, costs)

    moe_rc_launch_pre = launches.moe_pre_fwd.where(full, Launches())
    moe_rc_launch_post = launches.moe_post_fwd.where(full, launches.moe_recompute)
    return StagePieces(
        dense_layers=dense_layers, moe_layers=moe_layers, first=first, last=last,
        dense_fwd=seg("dense_fwd", per_layer(fwd_layers_s, dense_share)),
        dense_bwd=seg("dense_bwd", per_layer(bwd_layers_s, dense_share)),
        moe_pre=seg("moe_pre_fwd", pre_fraction * moe_fwd_s),
        moe_post=seg("moe_post_fwd", (1.0 - pre_fraction) * moe_fwd_s),
        moe_bwd=seg("moe_bwd", per_layer(bwd_layers_s, moe_share)),
        dense_recompute=piece(launches.dense_fwd.times(recomputed).where(full, launches.dense_recompute),
                              rc_scale * dense_rc_s, costs),
        moe_recompute_pre=piece(moe_rc_launch_pre.times(recomputed), rc_scale * pre_fraction * moe_rc_s * full,
                                costs),
        moe_recompute_post=piece(moe_rc_launch_post.times(np.where(full, recomputed, 1.0)),
                                 rc_scale * moe_rc_s * np.where(full, 1.0 - pre_fraction, 1.0), costs),
        moe_recompute_syncs=np.where(full, launches.dispatch_syncs * (recomputed > 0), launches.moe_recompute_syncs),
        head_fwd=pick(first, seg("head_fwd", 0.0), Segment.empty(n)),
        head_bwd=pick(first, seg("head_bwd", 0.0), Segment.empty(n)),
        tail_fwd=pick(last, seg("tail_fwd", tail_fwd_gpu), Segment.empty(n)),
        tail_bwd=pick(last, seg("tail_bwd", tail_bwd_gpu), Segment.empty(n)),
    )


def _forward_layers(chains: Chains, p: StagePieces, launches: LayerLaunches, share) -> None:
    chains.run(p.dense_fwd, p.dense_layers * share)
    chains.units(p.moe_pre, p.moe_post, launches.dispatch_syncs, p.moe_layers * share)


def _backward_layers(chains: Chains, p: StagePieces, share) -> None:
    chains.units(p.moe_recompute_pre, p.moe_recompute_post.then(p.moe_bwd), p.moe_recompute_syncs,
                 p.moe_layers * share)
    chains.run(p.dense_recompute.then(p.dense_bwd), p.dense_layers * share)


def run_microbatch(chains: Chains, pieces: StagePieces, launches: LayerLaunches, plans: PlanArrays) -> None:
    """One micro-batch's program on the stage (module docstring). Where every stage-to-stage transfer
    synchronises, each way is `vpp` chunk passes of 1/vpp of the layers, each a chain closed by its transfer: the
    first and the last run here, the ones between are added as closed chains of their own (`_closed_chunks`)."""
    p, n = pieces, len(plans)
    chunks = np.where(launches.transfer_syncs, plans.vpp.astype(float), 1.0)
    share = 1.0 / chunks
    transfer = np.where(launches.transfer_syncs, 1.0, 0.0)
    # non-interleaved 1F1B: the last stage's send_forward_recv_backward and the first stage's
    # send_backward_recv_forward call no _communicate (nothing to send or receive there), so no synchronize
    # (Megatron-Core pipeline_parallel/p2p_communication.py)
    plain = plans.vpp == 1
    after_forward = np.where(p.last & plain, 0.0, transfer)
    after_backward = np.where(p.first & plain, 0.0, transfer)
    more = chunks > 1
    middle = np.maximum(chunks - 2.0, 0.0)
    chains.run(p.head_fwd)
    _forward_layers(chains, p, launches, share)
    chains.sync(np.where(more, 1.0, 0.0))
    chains.exposed_s = chains.exposed_s + middle * _closed_chunks(p, launches, share, chains.wake_s, n, False)
    _forward_layers(chains, p, launches, np.where(more, share, 0.0))
    chains.run(p.tail_fwd)
    chains.sync(np.where(p.last, launches.loss_syncs, 0.0))
    chains.sync(after_forward)
    chains.run(p.tail_bwd)
    _backward_layers(chains, p, share)
    chains.sync(np.where(more, 1.0, 0.0))
    chains.exposed_s = chains.exposed_s + middle * _closed_chunks(p, launches, share, chains.wake_s, n, True)
    _backward_layers(chains, p, np.where(more, share, 0.0))
    chains.run(p.head_bwd)
    chains.sync(launches.backward_end_syncs)
    chains.sync(after_backward)


def _closed_chunks(p: StagePieces, launches: LayerLaunches, share, wake_s: float, n: int, backward: bool
                   ) -> np.ndarray:
    """What one chunk pass between two synchronising transfers exposes."""
    chunk = Chains.start(n, wake_s, Segment.wait(wake_s, n))
    if backward:
        _backward_layers(chunk, p, share)
    else:
        _forward_layers(chunk, p, launches, share)
    chunk.sync(1.0)
    return chunk.exposed_s


def host_exposed_per_microbatch_s(pieces: StagePieces, launches: LayerLaunches, plans: PlanArrays, costs: HostCosts,
                                  microbatches: np.ndarray) -> np.ndarray:
    """Seconds the host adds to one micro-batch on the stage, in a step of `microbatches` (module docstring)."""
    n = len(plans)
    first = Chains.start(n, costs.sync_s)
    run_microbatch(first, pieces, launches, plans)
    m = np.maximum(np.asarray(microbatches, dtype=float), 1.0)
    one_chain = first.open.repeat(m).exposed_s / m            # no synchronisation: the step is one chain
    return np.where(first.closed, first.steady_exposed_s(), one_chain)
