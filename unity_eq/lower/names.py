"""The names of a device graph's tensors and nodes, taken from the source model so that a user finds them in
Netron (``attn.q.matmul``), and made for the tensors the rewrites created (``uq.35``), which have none."""

from __future__ import annotations

from collections.abc import Iterable

from unity_eq.ops.registry import spec_for
from unity_eq.plan import Compute, Plan, step_inputs, step_outputs


class Names:
    """Unique names in one graph: the first request for a base gets it, later ones ``base.1``, ``base.2``…"""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        base = base or "unnamed"
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}.{k}"
        self.taken.add(name)
        return name


def derived_names(plan: Plan) -> dict[str, str]:
    """Names from the source model for the tensors the rewrites made, which have none (``uq.35``), so that a
    user finds them in Netron: a tensor made of named pieces alone is named after them, ``+``-joined (the q, k
    and v weights concatenated: ``attn.q.weight+attn.k.weight+attn.v.weight``); one that feeds named values is
    named after those (the one MatMul for q, k and v, whose result is split into them:
    ``attn.q.matmul+attn.k.matmul+attn.v.matmul``). Chosen from the plan alone, so every rank agrees."""
    names = {tid: name for tid, t in plan.tensors.items() if (name := t.value or t.source)}
    made: dict[str, str] = {}
    for step in plan.steps:  # forward, through data movement only: pieces -> what they make
        if isinstance(step, Compute) and not _moves_data(step.op_type):
            continue
        ins = [names.get(i) or made.get(i) for i in step_inputs(step)]
        if ins and all(ins):
            for out in step_outputs(step):
                if out not in names:
                    made[out] = _joined(n for n in ins if n)
    feeds: dict[str, str] = {}
    for step in reversed(plan.steps):  # backward: what a nameless tensor becomes
        known = _joined(n for n in (names.get(o) or feeds.get(o) for o in step_outputs(step)) if n)
        for tid in step_inputs(step):
            if known and tid not in names and tid not in made and tid not in feeds:
                feeds[tid] = known
    return {**feeds, **made}


def _moves_data(op_type: str) -> bool:
    """A pure data-layout op (lowering folds it over weights): its outputs are named after its inputs."""
    spec = spec_for(op_type)
    return spec is not None and spec.foldable


def _joined(names: Iterable[str], most: int = 4) -> str:
    """``a+b+c``, each name once; past ``most`` names, ``a+b+c+5 more`` (a name is for finding, not listing)."""
    unique = list(dict.fromkeys(part for name in names for part in name.split("+")))
    if len(unique) > most:
        return "+".join(unique[: most - 1]) + f"+{len(unique) - most + 1} more"
    return "+".join(unique)
