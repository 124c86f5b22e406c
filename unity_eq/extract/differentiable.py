"""Differentiable extraction: the DARTS idea applied to choosing the plan (in the spirit of SmoothE, ASPLOS'25).

Every e-class gets a softmax over its e-nodes (logits are torch tensors). The probability that a class is
*reached* flows from the roots through the chosen nodes' children, ``r[c] = 1 − Π_(n → c) (1 − r[class n]·p[n])``
(a class needed by two likely consumers is reached about once, not twice: a shared sub-term is priced once, the
DAG cost and not the tree cost). The relaxed objective is the price of the expected plan,
``Σ_c r[c] Σ_(n ∈ c) p[n]·cost[n]`` under the same per-node prices every extractor uses (compute and
collectives, with the search's memory penalty when it set one), plus a penalty on the expected per-device
memory (the extractor's node-memory proxy) over a budget, whose weight grows while the expected plan does not
fit. Several random starts (one of them from the start choice) descend together, as the rows of one tensor,
with Adam while the softmax temperature is annealed towards zero; each start is rounded to its most likely
node per class every ``round_every`` steps and at the end, and the descent stops early when a rounding
repeats the previous one. Rounded plans are acyclic by construction (unity_eq.extract.relax cuts the e-graph
to a DAG that keeps the start plan), priced all at once (relaxed_cost.exact_prices), the best two priced
again one by one exactly (``dag_cost`` over the same totals), and the best one is returned only when it is
cheaper than the start: the chooser is never worse than greedy.

Time: the search is sized to greedy's own extraction. The number of steps comes from a cost model of
greedy's time and of a step's (``steps_for``, ``effort`` times greedy's time, default 1), a deterministic
count rather than a clock; the cut, the pricing and the multi-output adoption are one pass each, over integer
lists kept per e-graph (relax.Layout, built at the e-graph's first search and shared by the later ones), and
the steps run in inference mode (no autograd bookkeeping).

Determinism: a seeded generator, float32, and deterministic algorithms (on CUDA too) for the duration of a
run; CPU runs in one thread, with subnormal floats flushed to zero.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unity_eq.egraph import EGraphData, ENode
from unity_eq.errors import ExtractionError
from unity_eq.extract.chooser import Chosen, RelaxReport
from unity_eq.extract.greedy import adopt_groups, chosen_closure, dag_cost, multi_output_groups, priced_groups
from unity_eq.extract.pricing import INF
from unity_eq.extract.relax import Layout, Relaxed, relax
from unity_eq.extract.relaxed_cost import RelaxedCost, exact_prices  # no torch at import: a first search loads nothing

__all__ = ["DifferentiableChooser", "RelaxReport"]

#: The cost model behind DifferentiableChooser.steps_for (CPU seconds, measured 2026-11-26 on the 2-core
#: development machine over the Megatron-sized layer's meshes: greedy 4-96 ms, a step of 8 rows 0.7-4.9 ms).
GREEDY_S_PER_NODE = 15e-6
STEP_S = 0.4e-3
STEP_S_PER_ELEMENT = 0.07e-6


@dataclass
class DifferentiableChooser:
    """Gradient descent over per-class softmaxes (module docstring), seeded from ``start`` (greedy's choice).

    ``memory``: bytes per e-node (the extractor's node-memory proxy); ``budget``: bytes the expected plan may
    use (the start's own proxy when larger: the chooser never asks for less memory than greedy's plan uses).
    ``device``: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda"``.
    """

    seed: int = 0
    starts: int = 8
    steps: int = 100  # at most; ``effort`` sets how many (see steps_for)
    learning_rate: float = 0.3
    temperature: tuple[float, float] = (1.0, 0.02)
    memory: Mapping[str, float] | None = None
    budget: float | None = None
    device: str = "auto"
    bias: float = 4.0  # added to the start choice's logits: row 0 starts at it, the last row unbiased
    round_every: int = 10
    elements: int = 1 << 16  # starts × e-nodes at most (see rows)
    effort: float | None = 1.0  # the descent's time as a multiple of greedy's (steps_for); None: ``steps`` steps
    floor_s: float = 0.008  # the modelled descent time every search may take, however fast greedy was
    sweeps: int = 3  # Jacobi sweeps per step of the reach and of its adjoint (relaxed_cost)
    layout: Layout | None = None  # relax.layout_of(the e-graph), shared by the searches of one e-graph
    name: str = "differentiable"
    reports: list[RelaxReport] = field(default_factory=list)

    def choose(
        self, data: EGraphData, totals: Mapping[str, float], roots: list[str], start: dict[str, ENode] | None
    ) -> Chosen:
        if start is None:
            raise ExtractionError("the differentiable chooser starts from a choice: run a greedy chooser before it")
        began = time.perf_counter()
        closure = chosen_closure(start, roots)  # found once: for the cut, the start's cost and its memory
        needed = closure or set()
        problem = relax(data, totals, roots, start, self.memory, self.layout, needed)
        start_cost = INF if closure is None else math.fsum(totals[start[c].id] for c in needed)  # = dag_cost
        budget = self._budget(start, needed)
        best, best_cost, device, steps = start, start_cost, "cpu", 0
        relaxed_best = math.inf
        if len(problem.nodes) > len(problem.classes):  # otherwise there is nothing to choose
            with _deterministic(self.device) as device:
                candidates, steps = self._descend(problem, start_cost, budget, device)
            picked = self._best(problem, candidates, budget)  # adopting multi-output nodes is slow: two
            groups = (
                (priced_groups(self.layout.multi_output, totals) if self.layout else multi_output_groups(data, totals))
                if picked
                else []
            )
            for choice in picked:
                choice = adopt_groups(groups, choice, totals, roots)
                if not self._fits(choice, roots, budget):
                    continue
                cost = dag_cost(choice, roots, totals)
                relaxed_best = min(relaxed_best, cost)
                if cost < best_cost * (1 - 1e-9):
                    best, best_cost = choice, cost
        report = RelaxReport(
            start_objective=start_cost,
            objective=best_cost,
            relaxed_best=relaxed_best,
            kept=best is not start,
            starts=self.rows(len(problem.nodes)),
            steps=steps,
            seconds=time.perf_counter() - began,
            device=device,
            classes=len(problem.classes),
            nodes=len(problem.nodes),
            dropped_nodes=problem.finite - len(problem.nodes),
        )
        self.reports.append(report)
        return Chosen(best, relaxed=[report])

    def steps_for(self, problem: Relaxed) -> int:
        """Steps of descent: ``steps`` without an ``effort``; else as many as take about ``effort`` times greedy's
        own extraction time, by a cost model measured on this project's machines (CPU, one thread): greedy spends
        ~15 µs per finite e-node (GREEDY_S_PER_NODE); a step ~0.4 ms plus ~0.07 µs per row and e-node or edge
        (STEP_S, STEP_S_PER_ELEMENT). At least ``floor_s`` of modelled time (a tiny e-graph's steps cost next to
        nothing, and a search of a few steps finds nothing), at most ``steps``. A count, not a clock, so a run is
        deterministic whatever the machine's load."""
        if self.effort is None:
            return self.steps
        rows = self.rows(len(problem.nodes))
        greedy = GREEDY_S_PER_NODE * problem.finite
        step = STEP_S + STEP_S_PER_ELEMENT * rows * (len(problem.nodes) + len(problem.edge_node))
        return min(self.steps, max(1, int(max(self.effort * greedy, self.floor_s) / step)))

    def rows(self, nodes: int) -> int:
        """Starts to run on an e-graph of ``nodes`` e-nodes: ``starts``, fewer (at least 4) when starts × nodes
        would pass ``elements``, so that a step's cost stays bounded on a large e-graph."""
        return max(min(self.starts, self.elements // max(nodes, 1)), min(4, self.starts))

    def _fits(self, choice: dict[str, ENode], roots: list[str], budget: float) -> bool:
        return self.memory is None or self._proxy(choice, roots) <= budget * (1 + 1e-9)

    def _proxy(self, choice: dict[str, ENode], roots: list[str], needed: set[str] | None = None) -> float:
        """The memory proxy of ``choice``'s plan (``needed``: its closure, when the caller has it)."""
        assert self.memory is not None
        needed = needed if needed is not None else chosen_closure(choice, roots) or set()
        return math.fsum(self.memory.get(choice[c].id, 0.0) for c in needed)

    def _budget(self, start: dict[str, ENode], needed: set[str]) -> float:
        if self.memory is None:
            return math.inf
        own = self._proxy(start, [], needed)
        return max(own, self.budget) if self.budget is not None else own

    def _best(self, problem: Relaxed, candidates: np.ndarray, budget: float) -> list[dict[str, ENode]]:
        """The two cheapest distinct rounded choices within the memory budget (first seen wins a tie), priced
        all at once (relaxed_cost.exact_prices); the caller prices them again exactly, one by one."""
        if not len(candidates):
            return []
        cost, memory = exact_prices(problem, candidates)
        fitting = np.flatnonzero(memory <= budget * (1 + 1e-6))  # the caller's _fits is the exact check
        ranked = fitting[np.lexsort((fitting, cost[fitting]))][:2]
        return [
            {problem.classes[problem.node_class[i]]: problem.nodes[i] for i in candidates[k].tolist()} for k in ranked
        ]

    def _descend(self, problem: Relaxed, scale: float, budget: float, device: str) -> tuple[np.ndarray, int]:
        """Adam on the logits of all starts at once, annealed; the distinct rounded choices seen on the way (one
        row of node indices per class each) and the steps taken. Stops early when a rounding finds every row
        where the previous one did (the annealing has settled)."""
        import torch

        dtype = torch.float32  # half the memory traffic of float64; the rounding is priced exactly

        generator = torch.Generator().manual_seed(self.seed)
        starts = self.rows(len(problem.nodes))
        objective = RelaxedCost(problem, starts, device, scale, budget, self.sweeps)
        logits = torch.randn(starts, len(problem.nodes), generator=generator, dtype=dtype)
        has_start = problem.start >= 0
        favourite = torch.as_tensor(problem.start[has_start])
        logits[0].zero_()
        logits[:, favourite] += torch.linspace(self.bias, 0.0, starts, dtype=dtype)[:, None]
        logits = logits.to(device)
        adam = _Adam(logits, self.learning_rate)
        hot, cold = self.temperature
        weight = torch.ones(starts, dtype=dtype, device=device)
        seen: dict[bytes, np.ndarray] = {}
        previous: np.ndarray | None = None
        step = 0
        steps = self.steps_for(problem)
        while step < steps:
            tau = hot * (cold / hot) ** (step / max(steps - 1, 1))
            grad, excess = objective.gradient(logits, tau, weight)
            adam.step(grad)
            if bool(excess.any()):
                weight = torch.where(excess > 0, weight * 1.1, weight)  # grows until the expected plan fits
            step += 1
            if step % self.round_every == 0 or step == steps:
                if not bool(torch.isfinite(logits).all()):
                    raise ExtractionError("internal error: the differentiable extractor's logits are not finite")
                rounded = objective.round(logits)
                for row in rounded:
                    seen.setdefault(row.tobytes(), row)
                if previous is not None and np.array_equal(rounded, previous):
                    break
                previous = rounded
        return (np.stack(list(seen.values())) if seen else np.zeros((0, len(problem.classes)), np.int64)), step


class _Adam:
    """Adam on one tensor, given its gradient (torch.optim imports torch's compiler on first use, ~7 s; this is
    the same update)."""

    def __init__(self, param: Any, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        import torch

        self.param, self.lr, self.betas, self.eps, self.t = param, lr, betas, eps, 0
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)

    def step(self, grad: Any) -> None:
        b1, b2 = self.betas
        self.t += 1
        self.m.mul_(b1).add_(grad, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (self.v / (1 - b2**self.t)).sqrt_().add_(self.eps)
        self.param.addcdiv_(self.m, denom, value=-self.lr / (1 - b1**self.t))


@contextlib.contextmanager
def _deterministic(wanted: str) -> Iterator[str]:
    """Run on the wanted device with deterministic algorithms, one CPU thread, in inference mode (the gradient is
    in closed form); restore torch's settings."""
    import torch

    device = "cuda" if wanted == "auto" and torch.cuda.is_available() else ("cpu" if wanted == "auto" else wanted)
    if device == "cuda" and not torch.cuda.is_available():
        raise ExtractionError("the differentiable extractor was asked for CUDA, and torch sees no GPU")
    threads = torch.get_num_threads()
    was = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    # an annealed softmax underflows: subnormal floats make CPU exp/log1p ~10x slower, and are noise here
    flushing = device == "cpu" and torch.set_flush_denormal(True)
    if device != "cpu":  # CPU kernels are deterministic already (and the switch imports torch's compiler, ~10 s)
        torch.use_deterministic_algorithms(True)
    try:
        with torch.inference_mode():  # no autograd bookkeeping on any operation: ~8% of a step
            yield device
    finally:
        if device != "cpu":
            torch.use_deterministic_algorithms(was)
        if flushing:
            torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
