"""Pipeline schedules: how long a step of ``m`` microbatches takes over ``p`` stages, and how many
microbatches' activations each stage holds at once.

=========  ==============================================================================================
schedule   what it does
=========  ==============================================================================================
gpipe      every microbatch's forward, then every backward (Huang et al., 2019): stage ``s`` keeps all ``m``
           microbatches' activations until their backward
1f1b       after a warm-up of ``p - s - 1`` forwards, stage ``s`` alternates one forward and one backward
           (PipeDream-Flush, Narayanan et al., 2021): it keeps at most ``p - s`` microbatches
=========  ==============================================================================================

Both take the same time: the first microbatch crosses every stage (the fill), then the slowest stage sets
the pace for the other ``m - 1``, then the last crosses back (the drain). With stage times ``τ_s`` (forward
and backward of one microbatch): ``Σ τ_s + (m - 1) · max τ_s``; with equal stages that is ``(m + p - 1) · τ``
and the bubble — the time a stage idles — is ``(p - 1) / (m + p - 1)`` of the step. Inference runs the
forward alone and keeps one microbatch per stage.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SCHEDULES", "bubble_fraction", "in_flight", "pipeline_seconds"]

SCHEDULES = ("1f1b", "gpipe")


def pipeline_seconds(stage_seconds: Sequence[float], microbatches: int) -> float:
    """The step's pipelined time: the fill and drain through every stage plus the bottleneck's other turns."""
    return sum(stage_seconds) + (microbatches - 1) * max(stage_seconds)


def bubble_fraction(stage_seconds: Sequence[float], microbatches: int) -> float:
    """The fraction of the step the average stage idles (0 without a pipeline)."""
    total = pipeline_seconds(stage_seconds, microbatches)
    busy = microbatches * sum(stage_seconds) / len(stage_seconds)
    return 0.0 if total <= 0 else max(0.0, 1.0 - busy / total)


def in_flight(schedule: str, stage: int, stages: int, microbatches: int, training: bool) -> int:
    """Microbatches whose activations stage ``stage`` (0-based) holds at its peak."""
    if not training:
        return 1
    if schedule == "gpipe":
        return microbatches
    if schedule == "1f1b":
        return min(stages - stage, microbatches)
    raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
