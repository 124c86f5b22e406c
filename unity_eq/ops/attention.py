"""Attention: ``softmax(Q·Kᵀ·scale + mask) · V`` as one op, priced and kept as a fused (flash) kernel runs it.

An exported transformer spells attention as five to seven ops (two MatMuls, the scale, the mask's Add, Softmax,
and torch's ``Where(IsNaN(p), 0, p)`` that zeroes fully masked rows). Unfused, a plan pays for the ``s × s``
scores twice in memory traffic and keeps them for the backward pass; a fused kernel (FlashAttention,
PyTorch's ``scaled_dot_product_attention``) streams them through on-chip memory and keeps only its inputs, its
output and one statistic per row. The rules of ``rules/algebra/attention.egg`` and ``attention_exports.egg``
rewrite the exported spellings into this op; its semantics are the unfused composition exactly (:func:`evaluate`
calls the MatMul, elementwise and Softmax families' own semantics, so the verifier compares the same terms), so
every rewrite is proven.

The constructor, ``(Attention Q KT V mask fill scale causal)``:

* ``Q`` ``(…, s_q, d)``; ``KT`` ``(…, d, s_kv)``: the keys *transposed*, as the exported graphs hold them (the
  scores' MatMul reads them so; the exporters pre-scale Q and Kᵀ by ``sqrt(scale)`` each, so the fused op's
  inputs are those scaled tensors and ``scale`` is 1.0); ``V`` ``(…, s_kv, d_v)``; batch dims broadcast as
  MatMul's do (a K/V with one head is read by every query head);
* ``mask`` (optional): added to the scores, broadcast to them (padding and causal masks as exported);
* ``fill`` (optional): the value that replaces a NaN probability (``Where(IsNaN(p), fill, p)``: torch's
  exporter writes it with fill 0, which is what ``scaled_dot_product_attention`` does for a row whose every
  score is -inf);
* ``scale`` (float): multiplies ``Q·Kᵀ`` before the mask; ``causal`` (0/1): key ``j`` is seen by query ``i``
  only when ``j <= i`` (PyTorch's ``is_causal``, top-left aligned).

The torch backend maps it to ``scaled_dot_product_attention(Q, KTᵀ, V, attn_mask=mask, is_causal=causal,
scale=scale)``; lowering writes ONNX's ``Attention`` (opset 23: a plan that uses the op is written at
that opset) or, where that computes something else, the composition (:func:`lower`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.attention_costs import (
    attention_flops,
    attention_saved_bytes,
    backward_work,
    flops,
    fused_lowering_fits,
    lowered_work,
)
from unity_eq.ops.attention_torch import torch_semantics
from unity_eq.ops.elementwise import ELEMENTWISE
from unity_eq.ops.family import Instance, InstanceRanges, LowerContext, OpFamily, Saved, ShapeError
from unity_eq.ops.matmul import MATMUL
from unity_eq.ops.normalization import NORMALIZATION
from unity_eq.ops.spec import Family, OpSpec, float_attr, int_attr, tensor
from unity_eq.ops.tensors import bcast, need, reduce_elements

__all__ = ["ATTENTION", "attention_flops", "attention_saved_bytes"]

SPECS = (
    OpSpec(
        "Attention",
        Family.PLUGIN,
        (
            tensor("Q"),
            tensor("KT"),
            tensor("V"),
            tensor("mask", optional=True),
            tensor("fill", optional=True),
            float_attr("scale", 1.0),
            int_attr("causal", 0),
        ),
    ),
)


def _scores_shape(q: tuple[int, ...], kt: tuple[int, ...]) -> tuple[int, ...]:
    """``Q·Kᵀ``'s shape: MatMul's rule on operands of rank >= 2 (a rank-1 query is no attention)."""
    if len(q) < 2 or len(kt) < 2:
        raise ShapeError(f"Attention needs Q and KT of rank >= 2, got {list(q)} and {list(kt)}")
    return MATMUL.infer_shape("MatMul", [q, kt])


def infer_shape(op: str, args: Sequence[Any]) -> tuple[int, ...]:
    """The composition's shape: the scores ``Q·Kᵀ`` broadcast with the mask (Add) and the fill (Where), then
    MatMul with V; ``(…, s_q, d_v)`` for the usual shapes."""
    q, kt, v, mask, fill, _scale, causal = args
    scores = _scores_shape(need(q), need(kt))
    for operand, what in ((mask, "mask"), (fill, "fill")):
        if operand is not None:
            try:
                scores = bcast(scores, tuple(operand))
            except ShapeError as exc:
                raise ShapeError(f"Attention: {what} {list(operand)} does not broadcast to the scores") from exc
    if causal not in (0, 1):
        raise ShapeError(f"Attention: causal must be 0 or 1, got {causal}")
    v = need(v)
    if len(v) < 2:
        raise ShapeError(f"Attention needs V of rank >= 2, got {list(v)}")
    return MATMUL.infer_shape("MatMul", [scores, v])


def _causal_softmax(scores: Any, bk: Any) -> Any:
    """Softmax over the last axis in which query ``i`` sees keys ``j <= i`` only: the others' exponentials are
    left out of the row's sum and their probabilities are 0 (what an additive -inf mask does, without an
    infinity the verifier's reals lack)."""
    e = bk.apply("exp", scores)
    s_q, s_kv = scores.shape[-2], scores.shape[-1]
    hidden = np.triu(np.ones((s_q, s_kv), dtype=bool), k=1)
    kept = e.copy()
    kept[..., hidden] = bk.zero
    total = reduce_elements(bk, kept, [kept.ndim - 1], True, bk.total)
    return bk.div(kept, total)


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """The unfused composition, through the MatMul, elementwise and Softmax families' own semantics: the terms
    are those of the exported spelling, so a fusion rule's two sides are the same terms (z3 hash-conses
    them) and the numeric back-up compares the same arithmetic."""
    q, kt, v, mask, fill, scale, causal = args
    scores = MATMUL.evaluate("MatMul", [q, kt], bk)
    if not (isinstance(scale, int | float) and float(scale) == 1.0):
        scores = bk.mul(scores, scale)
    if mask is not None:
        scores = ELEMENTWISE.evaluate("Add", [scores, mask], bk)
    last = scores.ndim - 1
    probs = _causal_softmax(scores, bk) if causal else NORMALIZATION.evaluate("Softmax", [scores, last], bk)
    if fill is not None:
        nan = ELEMENTWISE.evaluate("IsNaN", [probs], bk)
        probs = ELEMENTWISE.evaluate("Where", [nan, fill, probs], bk)
    return MATMUL.evaluate("MatMul", [probs, v], bk)


# ----------------------------------------------------------------------------------------------------------
# Instances


def _mask_shapes(b: int, h: int, sq: int, skv: int) -> list[tuple[int, ...] | None]:
    """Absent, or any rank-4 shape that broadcasts to the scores' ``(b, h, s_q, s_kv)``: every dim full or 1
    (a padding mask ``(b, 1, 1, s_kv)``, a causal one ``(1, 1, s_q, s_kv)``, a per-head bias ``(1, h, s_q,
    s_kv)``...). A rule that reads one of the mask's dims (a shared-mask split) is wrong only on the patterns
    where that dim and another differ, so every pattern is a case."""
    full = (b, h, sq, skv)
    shapes = [tuple(1 if keep else n for keep, n in zip(ones, full, strict=True))
              for ones in itertools.product((False, True), repeat=4)]  # fmt: skip
    return [None, *dict.fromkeys(shapes)]


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Rank-4 attention ``(b, h, s, d)``: batch and heads over ``rank4_dims`` (the dims the sharding rules
    split: 4 splits over axes of 2 and 4, 2 over 2, 1 nowhere), query and key lengths 1-2 (square and not, so
    causal masking shows) and three keys for one or two queries (unmasked, head dims 1), head dims (d, d_v) 1-2, K/V
    with every head or one (read by all), the masks of :func:`_mask_shapes`, fill absent or a scalar, causal 0
    and 1, scale free. Head dims 1 and 2: at 1 a per-feature factor is one number per row and scales KT's
    rows and columns alike, so a rule that moves it without transposing it passes; at 2 it does not. ``wide``
    (the size sweep): lengths over ``dims``, head dims over its first three, batch and heads over the first
    three of ``rank4_dims``, four masks (none, full, causal-shaped, padding)."""
    wide = ranges.wide
    seq, heads = (ranges.dims, ranges.dims[:3]) if wide else ((1, 2), (1, 2))
    for b, h in itertools.product(ranges.rank4_dims[:3] if wide else ranges.rank4_dims, repeat=2):
        for sq, skv, d, dv in itertools.product(seq, seq, heads, heads):
            for hkv in dict.fromkeys((h, 1)):
                masks = (
                    [None, (b, h, sq, skv), (1, 1, sq, skv), (b, 1, 1, skv)] if wide else _mask_shapes(b, h, sq, skv)
                )
                for mask in masks:
                    for fill in (None, ()):
                        for causal in (0, 1):
                            if ranges.sample and (causal or hkv != h):
                                continue
                            yield (
                                {"Q": (b, h, sq, d), "KT": (b, hkv, d, skv), "V": (b, hkv, skv, dv), "mask": mask,
                                 "fill": fill},
                                {"causal": causal},
                            )  # fmt: skip
        # more keys than queries (a KV cache): where causal masking cuts a row short of the last key, which at
        # s_kv <= 2 only the first of two queries shows (issue 21's fourth adversary)
        for sq, causal in itertools.product((1, 2), (0, 1)):
            yield (
                {"Q": (b, h, sq, 1), "KT": (b, h, 1, 3), "V": (b, h, 3, 1), "mask": None, "fill": None},
                {"causal": causal},
            )


def axioms(v: Any) -> None:
    """The definition, for the shape-generic prover: an Attention term is its composition (one axiom per
    absent or present mask and fill), where the softmax's axis is the scores' last (Q and KT of one rank
    ``r >= 2``, a mask of rank at most ``r``). Each is an identity of :func:`evaluate` on real tensors, checked
    against it by the fusion rules' bounded cases. (With a NoneT argument where the other axiom has a tensor,
    an instance equates terms such as ``Add(x, none)`` that no real term has: harmless, as a model of real
    tensors may give them any value.) Two more say what a scalar factor does: ``Mul(q, c)`` with ``c`` of rank 0
    has ``q``'s shape, and ``MatMul(Mul(q, c), k) = Mul(MatMul(q, k), c)``."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    q, kt, w, m, f, FA = v.symbols("a b c p q FA")
    att, mm, softmax = v.op("Attention"), v.op("MatMul"), v.op("Softmax")
    add, isnan, where = v.fn("Add", ()), v.fn("IsNaN", ()), v.fn("Where", ())
    rank = v.vlen(v.shape(q))
    one, zero = z3.RealVal(1), z3.IntVal(0)
    for mask in (m, v.none):
        for fill in (f, v.none):
            scores = mm(q, kt) if mask is v.none else v.ew[2](add, mm(q, kt), mask)
            probs = softmax(scores, rank - 1)
            if fill is not v.none:
                probs = v.ew[3](where, v.ew[1](isnan, probs), fill, probs)
            premise = [rank >= 2, v.vlen(v.shape(kt)) == rank]
            if mask is not v.none:
                premise.append(v.vlen(v.shape(mask)) <= rank)
            bound = [t for t in (q, kt, w, mask, fill) if t is not v.none]
            term = att(q, kt, w, mask, fill, one, zero)
            v.add("Attention", FA(bound, z3.Implies(z3.And(*premise), term == mm(probs, w)), patterns=[term]))
    # a scalar (rank-0) factor: Mul by it keeps its operand's shape and commutes with MatMul (the eager
    # exports scale the scores, the fused op scales Q)
    c, mul = v.symbols("x")[0], v.fn("Mul", ())
    scalar = v.vlen(v.shape(c)) == 0
    scaled = v.ew[2](mul, q, c)
    v.add("Attention", FA([q, c], z3.Implies(scalar, v.shape(scaled) == v.shape(q)), patterns=[scaled]))
    two = z3.And(scalar, v.vlen(v.shape(q)) >= 2, v.vlen(v.shape(kt)) >= 2)
    moved = mm(scaled, kt)
    v.add("Attention", FA([q, kt, c], z3.Implies(two, moved == v.ew[2](mul, mm(q, kt), c)), patterns=[moved]))
    # and a scalar divisor with no zero, as the exports that divide the scores by sqrt(d) write it: over the
    # reals (those rules are for float tensors only; on integers Div truncates and the identity fails)
    div = v.fn("Div", ())
    divided = v.ew[2](div, q, c)
    v.add("Attention", FA([q, c], z3.Implies(scalar, v.shape(divided) == v.shape(q)), patterns=[divided]))
    moved = mm(divided, kt)
    nonzero = z3.And(two, v.rel["nonzero-values"](c))
    # group ``.reals``: an integer proof leaves it out (int64 [[3]] / 2 · [[2]] is 2, [[6]] / 2 is 3)
    v.add(
        "Attention.reals",
        FA([q, kt, c], z3.Implies(nonzero, moved == v.ew[2](div, mm(q, kt), c)), patterns=[moved]),
    )


def saved(op: str) -> Saved:
    """Q, Kᵀ, V and the output (its backward recomputes the scores block by block from them); the mask is an
    input that the backward reads too. The row statistics (:func:`attention_saved_bytes`, b·h·s floats) are not
    a tensor of the graph: the memory model counts the output, which is larger, and they are left out."""
    return Saved(inputs=("Q", "KT", "V", "mask"), output=True)


#: The default-domain opset of ONNX's ``Attention`` (what :func:`lower` writes where it can).
ONNX_ATTENTION_OPSET = 23


def lower(
    op: str, inputs: Sequence[str], outputs: Sequence[str], attrs: Mapping[str, Any], ctx: LowerContext
) -> list[Any]:
    """ONNX's ``Attention`` (opset 23; onnxruntime's CPU kernel runs it, K/V with fewer heads included) where
    it computes the same thing: rank-4 float32/float16 operands and no mask (:func:`_fused_lowering_fits`).
    Otherwise the composition itself. A plan step leaves
    out trailing absent inputs: they are ``""`` here."""
    inputs = [*inputs, *[""] * (len(SPECS[0].tensor_args) - len(inputs))]
    if _fused_lowering_fits(inputs, ctx):
        return _lower_fused(inputs, outputs, attrs, ctx)
    return _lower_composition(inputs, outputs, attrs, ctx)


def _fused_lowering_fits(inputs: Sequence[str], ctx: LowerContext) -> bool:
    """ONNX's Attention (``attention_costs.fused_lowering_fits``, which the price asks too) takes (b, h, s, d)
    operands whose heads divide (grouped-query attention), and no mask:
    onnxruntime's kernel gives a row whose every key is masked zeros, where the composition (and the model it
    came from) gives the mean of V's rows when the mask is finite (the dynamo exports mask with float32's
    lowest value, so a left-padded sequence under a causal mask has such rows) and NaN when it is −inf. A
    mask is a runtime input, so whether a row is fully masked is not known here: with a mask the composition
    is written (issue 26's audit: `run` gave those rows zeros, exit 0). Without a mask no row is fully masked
    (a causal one keeps key 0 for every query), so a fill changes nothing there."""
    q, kt, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if ctx.opset() < ONNX_ATTENTION_OPSET or q is None or kt is None:
        return False
    return fused_lowering_fits(np.dtype(ctx.dtype(0)).name, q, kt, v, bool(inputs[3]))


def _lower_fused(
    inputs: Sequence[str], outputs: Sequence[str], attrs: Mapping[str, Any], ctx: LowerContext
) -> list[Any]:
    from onnx import helper  # lowering only: the engine's op modules do not need onnx otherwise

    q, kt, v, mask, _fill = inputs
    k = ctx.fresh(f"{outputs[0]}.keys")
    perm = helper.make_node("Transpose", [kt], [k], name=ctx.fresh(f"{outputs[0]}/Transpose"), perm=[0, 1, 3, 2])
    q_shape, kt_shape = ctx.shape(0), ctx.shape(1)
    assert q_shape is not None and kt_shape is not None
    nodes: list[Any] = [perm]
    mask_shape = ctx.shape(3) if mask else None
    if mask and mask_shape is not None:
        # onnxruntime's kernel reads the mask's last two dims as (s_q, s_kv) without broadcasting them (a
        # key-padding mask (b, 1, 1, s_kv) is refused), so they are expanded; its leading dims broadcast
        full = (*mask_shape[:-2], int(q_shape[2]), int(kt_shape[3]))
        if tuple(mask_shape) != full:
            shape = ctx.constant(np.asarray(full, dtype=np.int64), f"{outputs[0]}.mask_shape")
            expanded = ctx.fresh(f"{outputs[0]}.mask")
            nodes.append(helper.make_node("Expand", [mask, shape], [expanded], name=ctx.fresh(f"{outputs[0]}/Expand")))
            mask = expanded
    fused = helper.make_node(
        "Attention", [q, k, v, mask] if mask else [q, k, v], [outputs[0]], name=ctx.fresh(f"{outputs[0]}/Attention"),
        scale=float(attrs.get("scale", 1.0)), is_causal=int(attrs.get("causal", 0)),
        q_num_heads=int(q_shape[1]), kv_num_heads=int(kt_shape[1]),
    )  # fmt: skip
    return [*nodes, fused]


def _lower_composition(
    inputs: Sequence[str], outputs: Sequence[str], attrs: Mapping[str, Any], ctx: LowerContext
) -> list[Any]:
    """The composition as ONNX nodes (MatMul, Mul by the scale, Add of the mask and of a causal -inf mask,
    Softmax, the NaN fill, MatMul): exactly what :func:`evaluate` computes, at any opset."""
    from onnx import helper, numpy_helper

    q, kt, v, mask, fill = inputs
    scale, causal = float(attrs.get("scale", 1.0)), int(attrs.get("causal", 0))
    dtype = ctx.dtype(0)
    nodes: list[Any] = []

    def step(op_type: str, args: list[str], what: str, **kw: Any) -> str:
        out = ctx.fresh(f"{outputs[0]}.{what}")
        nodes.append(helper.make_node(op_type, args, [out], name=ctx.fresh(f"{outputs[0]}/{op_type}"), **kw))
        return out

    def literal(value: np.ndarray, what: str) -> str:
        # a Constant node, as the fused op's scale is an attribute: `check` compares initializers with the
        # model's weights, and these are the term's attributes, not weights
        return step("Constant", [], what, value=numpy_helper.from_array(value))

    scores = step("MatMul", [q, kt], "scores")
    if scale != 1.0:
        scores = step("Mul", [scores, literal(np.asarray(scale, dtype=dtype), "scale")], "scaled")
    if mask:
        scores = step("Add", [scores, mask], "masked")
    if causal:
        q_shape, kt_shape = ctx.shape(0), ctx.shape(1)
        assert q_shape is not None and kt_shape is not None
        hidden = np.triu(np.ones((q_shape[-2], kt_shape[-1]), dtype=bool), k=1)
        tri = literal(np.where(hidden, -np.inf, 0).astype(dtype), "causal_bias")
        scores = step("Add", [scores, tri], "causal")
    probs = step("Softmax", [scores], "probs", axis=-1)
    if fill:
        nan = step("IsNaN", [probs], "nan")
        probs = step("Where", [nan, fill, probs], "filled")
    nodes.append(helper.make_node("MatMul", [probs, v], [outputs[0]], name=ctx.fresh(f"{outputs[0]}/MatMul")))
    return nodes


ATTENTION = OpFamily(
    name="attention",
    specs=SPECS,
    rule_file="algebra/attention.egg",
    infer_shape=infer_shape,
    evaluate=evaluate,
    instances=instances,
    flops=flops,
    lowered_work=lowered_work,
    priced_attrs=("scale", "causal"),
    backward_work=backward_work,
    compute_class="attention",
    ranges=(
        "rank-4 Q (b, h, s_q, d), KT (b, h or 1, d, s_kv), V (b, h or 1, s_kv, d_v): b and h over {1, 2, 4},"
        " s_q, s_kv, d and d_v 1-2, and s_kv 3 for s_q 1-2 (head dims 1, no mask); mask absent or any rank-4"
        " shape broadcasting to (b, h, s_q, s_kv) (each dim full or 1); fill absent or a scalar; causal 0 and 1;"
        " scale a free real"
    ),
    axioms=axioms,
    saved=saved,
    lower=lower,
    opset=ONNX_ATTENTION_OPSET,
    torch=torch_semantics,
)
