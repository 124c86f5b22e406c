"""Recomputation (activation checkpointing) as the stage search prices it: a recomputing stage keeps its
input only and runs its forward again in the backward pass (unity_eq.stages.evaluate, ``redo``), the forward's
collectives included (unity_eq.stages.pieces prices a recomputed forward as its compute plus its forward
collectives).

:func:`checkpointed` runs a function under ``torch.utils.checkpoint`` (non-reentrant, so parameters need no
``requires_grad`` input, and with early stopping off, so the whole forward runs again: every collective of it
is issued again, as priced). The collectives the recomputation issues are counted in the ledger under phase
``recompute`` (the forward's are ``forward``). Gradients equal those without recomputation: the same ops run
on the same values (the model is deterministic: the exported graphs have no dropout; torch's checkpoint keeps
the RNG state anyway).

:class:`Recomputed` wraps a module (a plan's rank, a pipeline stage's module) so that its forward is
checkpointed; ``segments`` splits it further where the caller can name the pieces (a stage's pieces keep
their inputs only, :func:`checkpointed_sequence`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from unity_eq.collectives.torch_autograd import Ledger

__all__ = ["RECOMPUTE", "Recomputed", "checkpointed", "checkpointed_sequence"]

RECOMPUTE = "recompute"  # the ledger's phase of a recomputed forward's collectives


def checkpointed(function: Callable[..., Any], *args: Any, ledger: Ledger | None = None) -> Any:
    """``function(*args)``, keeping only its inputs for the backward, which runs it again first. A call the
    backward makes (the recomputation) counts its collectives under phase ``recompute`` in ``ledger``."""
    calls = 0

    def run(*a: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1 or ledger is None:
            return function(*a)
        before = ledger.relabel
        ledger.relabel = RECOMPUTE
        try:
            return function(*a)
        finally:
            ledger.relabel = before

    with set_checkpoint_early_stop(False):
        return checkpoint(run, *args, use_reentrant=False)


def checkpointed_sequence(functions: Sequence[Callable[[Any], Any]], value: Any, ledger: Ledger | None = None) -> Any:
    """``functions`` applied in turn to ``value``, each checkpointed: only each one's input is kept (a stage
    that recomputes keeps its pieces' inputs), and each runs again when the backward reaches it."""
    for function in functions:
        value = checkpointed(function, value, ledger=ledger)
    return value


class Recomputed(torch.nn.Module):
    """``module`` whose forward is checkpointed (its parameters stay ``module``'s: it is a submodule)."""

    def __init__(self, module: torch.nn.Module, ledger: Ledger | None = None) -> None:
        super().__init__()
        self.inner = module
        self.ledger = ledger

    def forward(self, *args: Any) -> Any:
        return checkpointed(self.inner, *args, ledger=self.ledger)
