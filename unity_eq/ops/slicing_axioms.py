"""The slicing family's axioms for the shape-generic prover (verify/_generic.py's vocabulary): Concat, Split,
Slice and Gather commute with chunks of the dims they do not cut or join. Only the prover calls :func:`axioms`
(through ``SLICING.axioms``); the engine never imports z3.
"""

from __future__ import annotations

from typing import Any

__all__ = ["axioms"]


def axioms(v: Any) -> None:
    """Concat, Split and Slice commute with chunks of a dim they do not cut or join (a list's chunk is the list
    of its items' chunks); Gather with chunks of the indices and of the data's dims other than ``axis``."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, idx, d, i, n, k, axis, s, s2, axes, lst, ch, rel, FA = v.symbols("x idx d i n k axis s s2 axes lst ch rel FA")
    # a negative axis counts from the end (ONNX): dim d is not the axis iff d != axis and d != axis + rank
    # (issue 21: `d != axis` alone let a rule split the dim that axis -1 cuts); a list has no rank here, so
    # Concat's axiom holds for axes written non-negative (the bounded cases spell them negative too)
    rank = v.vlen(v.shape(x))

    def commutes(op: str, bound: list[Any], guard: Any, *args: Any, to: Any = d) -> None:
        """``op`` (its axioms' group) on the chunk along ``d`` of ``x`` is the chunk along ``to`` (where its
        result holds that dim: ``d`` unless said) of ``op`` on ``x`` where ``guard`` holds, for every ``bound``
        value; the chunked side is the trigger. Split, Slice and Gather's data each state it."""
        fn = v.op(op)
        chunked = fn(ch(x, d, i, n), *args)
        v.add(op, FA(bound, z3.Implies(guard, chunked == ch(fn(x, *args), to, i, n)), patterns=[chunked]))

    cc = v.op("Concat")
    v.add(
        "Concat",
        FA(
            [lst, d, axis, i, n],
            z3.Implies(
                z3.And(axis >= 0, d != axis, v.list_div(lst, d, n)),
                cc(v.chunkl(lst, d, i, n), axis) == ch(cc(lst, axis), d, i, n),
            ),
            patterns=[cc(v.chunkl(lst, d, i, n), axis)],
        ),
    )
    v.add(
        "lists",
        FA(
            [x, lst, d, i, n],
            v.chunkl(v.cons(x, lst), d, i, n) == v.cons(ch(x, d, i, n), v.chunkl(lst, d, i, n)),
            patterns=[v.chunkl(v.cons(x, lst), d, i, n)],
        ),
    )
    v.add(
        "lists",
        FA(
            [d, i, n],
            v.chunkl(v.nil, d, i, n) == v.nil,
            patterns=[v.chunkl(v.nil, d, i, n)],
        ),
    )
    v.add(
        "lists",
        FA(
            [x, lst, d, n],
            v.list_div(v.cons(x, lst), d, n) == z3.And(v.div(x, d, n), v.list_div(lst, d, n)),
            patterns=[v.list_div(v.cons(x, lst), d, n)],
        ),
    )
    commutes("Split", [x, s, axis, k, d, i, n], z3.And(d >= 0, d != axis, d != axis + rank), s, axis, k)
    s3 = z3.Const("s3", v.V)
    # axes given: without them ONNX slices dims 0 .. len(starts) − 1, which "d not in axes" misses
    not_sliced = z3.And(
        d >= 0, v.vlen(axes) > 0, z3.Not(rel["vec-contains"](axes, d)), z3.Not(rel["vec-contains"](axes, d - rank))
    )
    commutes("Slice", [x, s, s2, axes, s3, d, i, n], not_sliced, s, s2, axes, s3)
    ga = v.op("Gather")
    v.add(
        "Gather",
        FA(
            [x, idx, axis, d, i, n],
            z3.Implies(axis >= 0, ga(x, ch(idx, d, i, n), axis) == ch(ga(x, idx, axis), axis + d, i, n)),
            patterns=[ga(x, ch(idx, d, i, n), axis)],
        ),
    )
    gathered = z3.If(axis < 0, axis + rank, axis)  # the data's dim the indices replace
    commutes("Gather", [x, idx, axis, d, i, n], z3.And(d >= 0, d < gathered), idx, axis)
    beyond = z3.And(d < rank, d > gathered)  # a later dim: after the indices' dims
    commutes("Gather", [x, idx, axis, d, i, n], beyond, idx, axis, to=d + v.vlen(v.shape(idx)) - 1)
