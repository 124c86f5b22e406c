"""The layout family's axioms for the shape-generic prover (verify/_generic.py's vocabulary): Reshape, Flatten,
Squeeze, Unsqueeze, Transpose and Expand map a chunk of their input to a chunk of their output. Only the
prover calls :func:`axioms` (through ``RESHAPE.axioms``); the engine never imports z3.
"""

from __future__ import annotations

from typing import Any

__all__ = ["axioms"]


def axioms(v: Any) -> None:
    """A chunk of the input is a chunk of the output along the dim ``reshape-map`` or ``perm-map`` pairs it
    with; Expand of a chunk of a kept dim to the chunk's shape is a chunk of the Expand; a Reshape or Expand to
    the shape it has is the value itself."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, d, d2, da, i, n, axis, s, axes, ch, rel, FA, P = v.symbols("x d d2 da i n axis s axes ch rel FA P")
    rs, zz = v.op("Reshape"), z3.Int("zz")
    out = rs(x, s, zz)
    v.add(
        "Reshape",
        FA(
            [x, s, zz, d, d2, i, n],
            z3.Implies(
                z3.And(
                    rel["reshape-map"](v.shape(x), v.shape(out), d, d2),
                    v.div(x, d, n),
                    v.vget(v.shape(out), d2) % n == 0,
                ),
                rs(ch(x, d, i, n), v.lshape(out, d2, n), zz) == ch(out, d2, i, n),
            ),
            patterns=[rs(ch(x, d, i, n), v.lshape(out, d2, n), zz)],
        ),
    )
    v.add(
        "Reshape",
        FA([x, s, zz], rs(x, v.shape(out), zz) == out, patterns=[rs(x, v.shape(out), zz)]),
    )
    for name, build in (
        ("Flatten", lambda t: v.op("Flatten")(t, axis)),
        ("Squeeze", lambda t: v.op("Squeeze")(t, axes)),
        ("Unsqueeze", lambda t: v.op("Unsqueeze")(t, axes)),
    ):
        o = build(x)
        bound = [x, d, d2, i, n, axis if name == "Flatten" else axes]
        # Squeeze with no axes squeezes every size-1 dim (ONNX): of the chunk too, whose dim d is 1 where x's is
        # n, so without axes the chunk's dim d must not be 1 (a [2, 3] cut in 2 along dim 0: [1, 3] → [3])
        whole = z3.Or(v.vlen(axes) > 0, v.vget(v.shape(x), d) != n) if name == "Squeeze" else z3.BoolVal(True)
        v.add(
            name,
            FA(
                bound,
                z3.Implies(
                    z3.And(
                        rel["reshape-map"](v.shape(x), v.shape(o), d, d2),
                        v.div(x, d, n),
                        v.vget(v.shape(o), d2) % n == 0,
                        whole,
                    ),
                    build(ch(x, d, i, n)) == ch(o, d2, i, n),
                ),
                patterns=[P(build(ch(x, d, i, n)), rel["reshape-map"](v.shape(x), v.shape(o), d, d2))],
            ),
        )
    tr = v.op("Transpose")
    v.add(
        "Transpose",
        FA(
            [x, s, d, d2, i, n],
            z3.Implies(rel["perm-map"](s, d, d2), tr(ch(x, d, i, n), s) == ch(tr(x, s), d2, i, n)),
            patterns=[P(tr(ch(x, d, i, n), s), rel["perm-map"](s, d, d2))],
        ),
    )
    ex = v.op("Expand")
    eo = ex(x, s)
    v.add(
        "Expand",
        FA(
            [x, s, d, da, i, n],
            z3.Implies(
                z3.And(rel["bc-dim"](x, eo, d, da), v.div(x, da, n)),
                ex(ch(x, da, i, n), v.lshape(eo, d, n)) == ch(eo, d, i, n),
            ),
            patterns=[P(ex(ch(x, da, i, n), v.lshape(eo, d, n)), rel["bc-dim"](x, eo, d, da))],
        ),
    )
    v.add("Expand", FA([x, s], ex(x, v.shape(eo)) == eo, patterns=[ex(x, v.shape(eo))]))
