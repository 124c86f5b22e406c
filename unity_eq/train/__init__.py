"""Training with a plan on torch.distributed (docs/training.md): each rank's steps as PyTorch ops, the plan's
collectives as autograd functions, checked against one-device training.

Importing this package imports torch: the engine (optimize, run, check) never does.
"""

from __future__ import annotations

from unity_eq.train.load import load_rank
from unity_eq.train.session import RankTrainer, loss_of

__all__ = ["RankTrainer", "load_rank", "loss_of"]
