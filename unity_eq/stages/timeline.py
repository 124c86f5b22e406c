"""The schedule of a pipeline plan, op by op: when each stage runs each microbatch's forward and backward.

A list-scheduling simulation of the schedule's order on each stage (:mod:`.schedule`): a forward waits for the
same microbatch's forward on the stage before, a backward for its backward on the stage after (and its own
forward). A microbatch's work on a stage is split 1 : 2 between forward and backward in training (the cost
model's backward factor), all forward in inference. ``explain`` draws it as text and as a picture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Slot", "simulate"]


@dataclass(frozen=True)
class Slot:
    stage: int
    microbatch: int
    backward: bool
    start: float
    end: float


def _order(schedule: str, stage: int, stages: int, microbatches: int, training: bool) -> list[tuple[int, bool]]:
    """The (microbatch, backward?) sequence a stage runs."""
    forwards = [(i, False) for i in range(microbatches)]
    if not training:
        return forwards
    backwards = [(i, True) for i in range(microbatches)]
    if schedule == "gpipe":
        return forwards + backwards
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for k in range(microbatches - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[microbatches - warmup :]


def simulate(
    stage_seconds: Sequence[float], microbatches: int, schedule: str, training: bool, backward_share: float = 2 / 3
) -> list[Slot]:
    """Every (stage, microbatch, forward or backward) with its start and end, in seconds from the step's start."""
    stages = len(stage_seconds)
    orders = [_order(schedule, s, stages, microbatches, training) for s in range(stages)]
    done: dict[tuple[int, int, bool], float] = {}
    clock = [0.0] * stages
    position = [0] * stages
    slots: list[Slot] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                micro, backward = orders[s][position[s]]
                needs = [(s, micro, False)] if backward else []
                if backward and s + 1 < stages:
                    needs.append((s + 1, micro, True))
                if not backward and s > 0:
                    needs.append((s - 1, micro, False))
                if any(n not in done for n in needs):
                    break
                share = (backward_share if backward else 1 - backward_share) if training else 1.0
                start = max([clock[s], *(done[n] for n in needs)])
                end = start + stage_seconds[s] * share
                done[(s, micro, backward)] = end
                clock[s] = end
                slots.append(Slot(s, micro, backward, start, end))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug in _order, never the user's input
    return slots
