"""Running the meshes: saturation in worker processes (two at a time), extraction of each, memory penalties."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from unity_eq.blocks import BlockSaturation, saturate_pieces
from unity_eq.cost import CostModel, Objective
from unity_eq.egraph import EGraphData, Encoding, Limits, SaturationResult, encode, parse_serialized, saturate
from unity_eq.extract import Extraction, Extractor, Restriction, candidate_restrictions, extract_variants
from unity_eq.extract.blocks import BlockExtractor
from unity_eq.files import raise_if_stopped
from unity_eq.ir import Graph
from unity_eq.machine import Machine
from unity_eq.memory import MemoryUsage, gib, plan_memory
from unity_eq.profile_table import ProfileTable
from unity_eq.progress import Tracker
from unity_eq.rulefile.manifest import RuleFile
from unity_eq.search.trial import MeshTrial, Say, TrialStatus, trial_row
from unity_eq.split import BlockSplit

PENALTY_ROUNDS = 6


PENALTY_GROWTH = 4.0


THREE_AXIS_NODE_BUDGET = 60_000


class MeshRunner:
    """Saturates meshes (two at a time: the engine runs in worker processes) and extracts their plans."""

    def __init__(
        self,
        graph: Graph,
        machine: Machine,
        objective: Objective,
        rules: list[RuleFile],
        limits: Limits,
        say: Say,
        tracker: Tracker,
        workers: int,
        profile: ProfileTable | None = None,
        split: BlockSplit | None = None,
    ) -> None:
        self.graph = graph
        self.machine = machine
        self.profile = profile
        self.split = split
        self.blocks: dict[str, BlockSaturation] = {}
        self.objective = objective
        self.rules = rules
        self.limits = limits
        self.say = say
        self.tracker = tracker
        self.workers = max(1, workers)
        self.extractors: dict[str, Extractor | BlockExtractor] = {}
        self.data: dict[str, EGraphData] = {}

    def run(self, trials: Sequence[MeshTrial]) -> None:
        if not trials:
            return
        for trial in trials:
            self.tracker.queue(trial_row(trial))
        with ThreadPoolExecutor(max_workers=min(self.workers, len(trials))) as pool:
            futures: list[tuple[MeshTrial, Future[tuple[Encoding, SaturationResult, float]]]] = [
                (t, pool.submit(self._saturate, t)) for t in trials
            ]
            for trial, future in futures:
                try:
                    encoding, saturation, seconds = future.result()
                except Exception as exc:  # a mesh whose saturation fails is reported, the others go on
                    from unity_eq.errors import UnityEqError

                    if not isinstance(exc, UnityEqError):
                        raise
                    trial.status, trial.reason = TrialStatus.FAILED, str(exc)
                    self.tracker.finish(trial_row(trial), f"failed: {exc}")
                    continue
                trial.encoding, trial.saturation, trial.saturate_s = encoding, saturation, seconds
                trial.enodes, trial.stop_reason = saturation.enodes, saturation.stop_reason.value
                self._extract(trial)

    def _saturate(self, trial: MeshTrial) -> tuple[Encoding, SaturationResult, float]:
        raise_if_stopped()  # SIGTERM/SIGINT: the meshes still queued are not started
        start = time.perf_counter()
        row = trial_row(trial)
        if self.split is not None:
            self.tracker.start(row, f"saturating {len(self.split.distinct)} distinct pieces")
            pieces = len(self.split.distinct)
            done = iter(range(1, pieces + 1))

            def piece_done(message: str) -> None:
                self.tracker.update(row, f"saturated {next(done)} of {pieces} pieces ({message})")

            blocks = saturate_pieces(self.split, trial.mesh, self.rules, self.limits, piece_done)
            self.blocks[trial.label] = blocks
            return blocks.solutions[next(iter(blocks.solutions))].encoding, blocks.total, time.perf_counter() - start
        encoding = encode(self.graph, trial.mesh)
        self.tracker.start(row, "saturating")

        def iteration(phase: str, number: int, enodes: int, _seconds: float) -> None:
            self.tracker.update(row, f"saturating: {phase} iteration {number}, {enodes} e-nodes")

        result = saturate(self.rules, encoding, self.limits, iteration)
        return encoding, result, time.perf_counter() - start

    def _extract(self, trial: MeshTrial) -> None:
        assert trial.encoding is not None and trial.saturation is not None
        start = time.perf_counter()
        model = CostModel(self.machine, trial.mesh, self.objective, profile=self.profile)
        extractor: Extractor | BlockExtractor
        if trial.label in self.blocks:
            extractor = BlockExtractor(self.blocks[trial.label], self.graph, model)
        else:
            data = parse_serialized(trial.saturation.serialized)
            extractor = Extractor(data, trial.encoding, self.graph, model)
            self.data[trial.label] = data
        self.extractors[trial.label] = extractor

        def progress(restriction: Restriction) -> None:
            self.tracker.update(trial_row(trial), f"extracting ({restriction.name}), {trial.enodes} e-nodes")

        for extraction in extract_variants(extractor, candidate_restrictions(trial.mesh.axes), progress):
            trial.extractions.append((extraction, plan_memory(extraction.plan)))
        cheapest = min(trial.extractions, key=lambda em: em[0].plan.cost.total)
        if not cheapest[1].fits and trial.candidate:
            self._penalize(trial, extractor, cheapest)
        fitting = [(e, m) for e, m in trial.extractions if m.fits]
        if fitting:
            extraction, memory = min(fitting, key=lambda em: em[0].plan.cost.total)
            trial.status = TrialStatus.OK
            trial.plan, trial.memory = extraction.plan, memory
            trial.extraction, trial.penalty = extraction.restriction.name, extraction.penalty
        else:
            trial.status = TrialStatus.INFEASIBLE
            trial.reason = "no extraction fits in device memory"
        everything = [m for _, m in trial.extractions]
        trial.min_memory = min(everything, key=lambda m: m.total) if everything else None
        trial.extract_s = time.perf_counter() - start
        cost = f"{trial.plan.cost.total * 1e3:.3f} ms" if trial.plan else "does not fit"
        self.tracker.finish(
            trial_row(trial), f"{trial.enodes} e-nodes, {cost} ({trial.saturate_s + trial.extract_s:.1f} s)"
        )

    def _penalize(
        self, trial: MeshTrial, extractor: Extractor | BlockExtractor, cheapest: tuple[Extraction, MemoryUsage]
    ) -> None:
        """The cheapest extraction does not fit: re-extract with a growing penalty on per-device bytes until
        one fits (or the rounds run out). The extractions join the mesh's candidates."""
        base, memory = cheapest
        penalty = base.plan.cost.total / max(memory.total, 1.0)
        previous, stalled = memory.total, 0
        for round_ in range(1, PENALTY_ROUNDS + 1):
            extraction = extractor.extract(Restriction(), penalty)
            usage = plan_memory(extraction.plan)
            trial.extractions.append((extraction, usage))
            trial.penalty_rounds = round_
            self.say(
                f"mesh {trial.label}: memory penalty round {round_}: needs {gib(usage.total)} per device "
                f"of {gib(usage.capacity)}"
            )
            if usage.fits:
                return
            if usage.total >= previous * (1 - 1e-9):
                stalled += 1
                if stalled == 2:
                    return  # the penalty no longer changes the plan: no plan of this mesh fits
            else:
                stalled = 0
            previous = usage.total
            penalty *= PENALTY_GROWTH
