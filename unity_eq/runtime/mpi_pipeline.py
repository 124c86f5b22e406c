"""A lowered pipeline plan under ``mpiexec``: one process per global rank, each running its stage's device file.

Rank ``g`` is tensor rank ``k`` of replica ``r`` of stage ``s`` (plan.json's ``stages[s].replicas[r][k]``). It
loads ``stage<s>/device_<k>.onnx``; the stage's collectives run on sub-communicators of its replica's tensor
group (the stage plan's groups, in its own ranks 0…t-1, mapped to the global ranks). Microbatch by
microbatch, in order: stage 0 takes its slice of the replica's inputs, every later stage receives the
activation from the same tensor rank of the previous stage (point to point, tagged by microbatch: the
activation is replicated on a stage's tensor group), runs, and sends it on. Side tensors (an attention mask
every layer reads) go from stage 0 straight to the same tensor rank of every later stage that reads them,
without stage 0 waiting for them to arrive. The last stage's tensor rank 0 of each replica sends its outputs
to rank 0, which puts the replicas' microbatches back along dimension 0. The
forward pass only, as the local backend runs it; failures are reported once, as for SPMD plans
(:mod:`~unity_eq.runtime.mpi_status`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.errors import RuntimeBackendError
from unity_eq.runtime.execute import RankTimes, execute_rank
from unity_eq.runtime.mpi_communicator import MPICommunicator
from unity_eq.runtime.pipeline import PipelinePlan
from unity_eq.runtime.segments import RankProgram, build_rank_program

__all__ = ["PipelineRank", "pipeline_groupings", "pipeline_rank", "run_pipeline_rank"]

Feeds = dict[str, np.ndarray]
OUTPUT_TAG = 1 << 20  # tags of the outputs sent to rank 0 (microbatch tags stay below it)
SIDE_TAG = 1 << 21  # tags of the side tensors stage 0 sends: SIDE_TAG + microbatch · count + the tensor's index


@dataclass
class PipelineRank:
    """What one global rank runs: its place in the pipeline, its stage's program, its replica's microbatches."""

    plan: PipelinePlan
    stage: int
    replica: int
    tensor: int
    program: RankProgram

    def place(self, stage: int, replica: int, tensor: int) -> int:
        """The global rank of (stage, replica, tensor rank)."""
        return self.plan.record.stages[stage].replicas[replica][tensor]


def pipeline_rank(plan: PipelinePlan, rank: int, size: int, providers: list[str], threads: int) -> PipelineRank:
    """This rank's part; a RuntimeBackendError when mpiexec started another number of processes."""
    needed = plan.world_size
    if size != needed:
        raise RuntimeBackendError(
            f"world size: mpiexec started {size} process(es), the pipeline plan in {plan.path} has {needed} ranks "
            f"({plan.describe()}). Run `mpiexec -n {needed} unity-eq run {plan.path} --backend mpi`."
        )
    stage, replica, tensor = plan.place_of(rank)
    program = build_rank_program(plan.stages[stage], tensor, providers, threads)
    return PipelineRank(plan, stage, replica, tensor, program)


def pipeline_groupings(plan: PipelinePlan) -> list[list[list[int]]]:
    """Every collective grouping of every stage and replica in global ranks, in the same order on every rank
    (``MPICommunicator.prepare`` is collective over the world)."""
    found: list[list[list[int]]] = []
    for stage, directory in zip(plan.record.stages, plan.stages, strict=True):
        for collective in directory.record.collectives:
            for ranks in stage.replicas:
                found.append([[ranks[k] for k in group] for group in collective.groups])
    return found


class _GroupComm:
    """The stage plan's collectives, whose groups name its own ranks 0…t-1, on the global communicator."""

    def __init__(self, inner: MPICommunicator, ranks: Sequence[int]) -> None:
        self.inner, self.ranks = inner, list(ranks)
        self.rank = self.ranks.index(inner.rank)  # this process's rank in the stage plan

    def _global(self, group: Sequence[int]) -> list[int]:
        return [self.ranks[k] for k in group]

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return self.inner.all_gather(array, self._global(group), dim)

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray:
        return self.inner.all_reduce(array, self._global(group))

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return self.inner.reduce_scatter(array, self._global(group), dim)

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray:
        return self.inner.all_to_all(array, self._global(group), split_dim, concat_dim)

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        self.inner.send(array, self.ranks[dest], tag)

    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        return self.inner.recv(self.ranks[source], tag)


def _microbatches(plan: PipelinePlan, feeds: Mapping[str, np.ndarray], replica: int) -> list[Feeds]:
    b, m = plan.microbatch, plan.microbatches
    first = replica * m
    return [{n: v[(first + i) * b : (first + i + 1) * b] for n, v in feeds.items()} for i in range(m)]


def _send_side(part: PipelineRank, outputs: Feeds, comm: MPICommunicator, microbatch: int) -> list[Any]:
    """Stage 0: each side tensor (an attention mask) to the same tensor rank of every later stage that reads it,
    without waiting (stage 0 goes on to its next microbatch while the later stages are busy); the caller waits
    for the returned sends at the end."""
    record = part.plan.record
    side = record.stages[0].side_sends
    sends = []
    for stage in record.stages[1:]:
        for name in stage.side_receives:
            tag = SIDE_TAG + microbatch * len(side) + side.index(name)
            place = part.place(stage.index, part.replica, part.tensor)
            sends.append(comm.start_send(outputs[name], place, tag=tag))
    return sends


def run_pipeline_rank(
    part: PipelineRank,
    feeds: Mapping[str, np.ndarray],
    comm: MPICommunicator,
    times: RankTimes | None = None,
    on_microbatch: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray] | None:
    """Run this rank's stage on every microbatch of its replica; rank 0 returns the model's outputs (the whole
    batch), every other rank None."""
    plan = part.plan
    record = plan.record
    stage, replica, tensor = part.stage, part.replica, part.tensor
    last = len(record.stages) - 1
    group = _GroupComm(comm, record.stages[stage].replicas[replica])
    directory = plan.stages[stage]
    inputs = _microbatches(plan, feeds, replica) if stage == 0 else []
    results: list[Feeds] = []
    side = record.stages[0].side_sends
    pending: list[Any] = []  # stage 0's side tensor sends, waited for after the last microbatch
    for i in range(plan.microbatches):
        if stage == 0:
            values = {name: inputs[i][name] for name in directory.input_specs}
        else:
            received = record.stages[stage].receives
            assert received is not None
            values = {received: comm.recv(part.place(stage - 1, replica, tensor), tag=i)}
            for name in record.stages[stage].side_receives:  # from stage 0, after the stream (stage 0's order)
                tag = SIDE_TAG + i * len(side) + side.index(name)
                values[name] = comm.recv(part.place(0, replica, tensor), tag=tag)
        outputs = execute_rank(part.program, values, group, times)
        if stage < last:
            sent = record.stages[stage].sends
            assert sent is not None
            comm.send(outputs[sent], part.place(stage + 1, replica, tensor), tag=i)
        if stage == 0:
            pending.extend(_send_side(part, outputs, comm, i))
        else:
            results.append(outputs)
        if on_microbatch is not None:
            on_microbatch(i + 1, plan.microbatches)
    comm.finish_sends(pending)
    names = plan.whole.output_names
    joined: Feeds = {}
    if stage == last and tensor == 0:
        joined = {n: np.concatenate([r[n] for r in results], axis=0) for n in names}
        if comm.rank != 0:
            for k, name in enumerate(names):
                comm.send(joined[name], 0, tag=OUTPUT_TAG + k)
    if comm.rank != 0:
        return None
    replicas: list[Feeds] = []
    for r in range(plan.replicas):
        source = part.place(last, r, 0)
        if source == 0:
            replicas.append(joined)
        else:
            replicas.append({name: comm.recv(source, tag=OUTPUT_TAG + k) for k, name in enumerate(names)})
    return {n: np.concatenate([r[n] for r in replicas], axis=0) for n in names}
