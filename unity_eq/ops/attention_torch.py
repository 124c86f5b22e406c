"""Attention in PyTorch, for the torch training backend (unity_eq/train): the term runs torch's
``scaled_dot_product_attention`` wherever that kernel gives the composition's answer and gradients, which is
what the flash price of unity_eq/ops/attention_costs.py assumes (apart from unity_eq/ops/attention.py, which
has the term's shapes, semantics, rules and lowering, and never imports torch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["torch_semantics"]


def torch_semantics(op: str, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """The op in PyTorch for the torch training backend (unity_eq/train): the composition :func:`evaluate`
    defines, on ``Q``, ``KT`` (keys already transposed), ``V`` and the optional mask and fill, run as torch's
    ``scaled_dot_product_attention`` (the flash/memory-efficient kernel where the device has one; its ``scale``
    is the op's, 1 unless a rule moved a factor into it): what the cost model prices, forward, backward and
    memory (no ``s × s`` tensor kept). A row whose every key is hidden is where the kernel and the composition
    part (:func:`_kernel_mask`); the composition runs where the kernel cannot give its answer."""
    import torch

    q, kt, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if len(inputs) > 3 else None
    fill = inputs[4] if len(inputs) > 4 else None
    scale = float(attrs.get("scale", 1.0))
    attn_mask = mask
    if int(attrs.get("causal", 0)):
        s_q, s_kv = q.shape[-2], kt.shape[-1]
        hidden = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).triu(1)
        blocked = torch.zeros(s_q, s_kv, dtype=q.dtype, device=q.device).masked_fill(hidden, float("-inf"))
        attn_mask = blocked if mask is None else mask + blocked
    scores_rank = max(q.dim(), kt.dim())
    wider = any(t is not None and t.dim() > scores_rank for t in (attn_mask, fill))
    kernel = None if wider else _kernel_mask(attn_mask, fill)
    if kernel is None:  # a mask or fill adding leading dims broadcasts the output too: the kernel's does not
        return [_composition(q, kt, v, attn_mask, fill, scale)]
    attn_mask, filled = kernel
    # the keys made contiguous: the flash and memory-efficient kernels need a unit stride in the last dim, and
    # the transpose of KT has none (a copy of K, against the math kernel's s × s scores: H200, bf16, 30×)
    with _cpu_math(q):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, kt.transpose(-2, -1).contiguous(), v, attn_mask=attn_mask, scale=scale
        )
    if filled is not None:
        out = torch.where(filled, _filled_rows(fill, v, kt.shape[-1]), out)
    return [out]


def _cpu_math(q: Any) -> Any:
    """On the CPU, torch's math kernel (the composition's own operations, so ``check --training`` compares
    gradients with the one-device model's to float32 rounding of the same sums: the CPU flash kernel's
    accumulation order gave BERT's embedding gradient 3.9e-5 against 1e-5 required); on a GPU, whichever fused
    kernel torch picks, as the flash price assumes. A CPU run checks a plan, it is not what the plan prices."""
    import contextlib

    if q.is_cuda:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


#: A mask value at or below this hides its key in every exporter's spelling (BERT's -10000, -1e9, the dtype's
#: lowest, -inf). A row hidden at such values may have its scores lost to rounding (-1e30 absorbs them in
#: float32 as the lowest does), which the fused kernels' backward gets wrong; sending such a row to the
#: composition costs speed on left-padded rows only, never correctness (the composition is the definition).
HIDDEN = -1e4


def _kernel_mask(attn_mask: Any, fill: Any) -> tuple[Any, Any] | None:
    """The mask to give the kernel and the rows to fill after it, or None where only the composition gives the
    model's answer. The rows that matter are those whose every key is hidden (a left-padded sequence under a
    causal mask):

    * hidden by -inf: the composition's probabilities are NaN, replaced by the fill (the exporters' NaN guard,
      what every dynamo export of a masked transformer carries); the kernel gets a finite row and the output
      row is the fill's (:func:`_filled_rows`), so neither it nor its gradient is NaN. Without a fill the row
      is NaN in the model: the composition.
    * hidden by a large finite value (at or below :data:`HIDDEN`; HF masks use the dtype's lowest): the scores
      may be lost to rounding and the row is then the mean of V, but the kernel's backward recomputes the
      probabilities from a log-sum-exp that rounded the same way (each key's probability 1, not 1/s_kv: measured
      with PyTorch 2.13's CPU flash kernel, a gradient 5× the composition's on 5 keys): the composition.

    The kernel's gradient of a row hidden by -inf is finite where the composition's (softmax of a NaN row) is
    NaN: deliberate, the output is the same.
    """
    import torch

    if attn_mask is None or not attn_mask.is_floating_point():
        return attn_mask, None
    row_max = attn_mask.amax(dim=-1, keepdim=True)
    unseen = row_max <= HIDDEN  # rows whose every key is hidden
    if not bool(unseen.any()):
        return attn_mask, None  # every row sees a key: the kernel computes the composition
    hidden = torch.isneginf(row_max)
    if fill is None or bool((unseen & ~hidden).any()):
        return None
    return attn_mask.masked_fill(hidden, 0.0), hidden


def _filled_rows(fill: Any, v: Any, s_kv: int) -> Any:
    """A row whose probabilities are all NaN, each replaced by the fill: ``fill · V`` (``fill`` broadcast to
    the row's ``s_kv`` keys; the exporters' scalar 0 gives zeros)."""
    import torch

    rows = fill.to(v.dtype)
    while rows.dim() < 2:
        rows = rows.unsqueeze(0)
    return torch.matmul(rows.expand(*rows.shape[:-1], s_kv), v)


def _composition(q: Any, kt: Any, v: Any, attn_mask: Any, fill: Any, scale: float) -> Any:
    """:func:`evaluate`'s arithmetic in torch, op by op (the causal mask already in ``attn_mask``)."""
    import torch

    scores = torch.matmul(q, kt)
    if scale != 1.0:
        scores = scores * scale
    if attn_mask is not None:
        scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    if fill is not None:
        probs = torch.where(torch.isnan(probs), fill.to(probs.dtype), probs)
    return torch.matmul(probs, v)
