"""Checkpoints of the whole model in the source model's parameter names: safetensors when the package is
installed, else torch's format; written atomically (a temporary file renamed over the target), so an interrupt
never leaves half a checkpoint under the user's name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from unity_eq.errors import OptionError
from unity_eq.train.torch_ops import array_of, tensor_of

__all__ = ["read_checkpoint", "write_checkpoint"]


def _safetensors() -> bool:
    try:
        import safetensors  # noqa: F401
    except ImportError:
        return False
    return True


def write_checkpoint(path: Path, weights: Mapping[str, np.ndarray]) -> Path:
    """Write ``weights`` to ``path`` (``.safetensors`` in safetensors' format when it is installed; any other
    name, or without it, ``torch.save``'s)."""
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tensors = {name: tensor_of(value) for name, value in weights.items()}
    try:
        if path.suffix == ".safetensors" and _safetensors():
            from safetensors.torch import save_file

            save_file(tensors, str(partial))
        else:
            torch.save(tensors, partial)
        partial.replace(path)
    except OSError as exc:
        raise OptionError(f"`--save` {path}: cannot write ({exc.strerror or exc}).") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint written by :func:`write_checkpoint` (or by torch: a dict of tensors)."""
    if not path.is_file():
        raise OptionError(f"`--load` {path}: no such file.")
    try:
        if path.suffix == ".safetensors":
            if not _safetensors():
                raise OptionError(f"`--load` {path}: reading safetensors needs `pip install safetensors`.")
            from safetensors.torch import load_file

            loaded = load_file(str(path))
        else:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except OptionError:
        raise
    except Exception as exc:  # a damaged or foreign file: torch and safetensors raise many kinds
        raise OptionError(f"`--load` {path}: not a readable checkpoint ({type(exc).__name__}: {exc}).") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise OptionError(f"`--load` {path}: expected a dict of tensors by parameter name.")
    return {str(name): array_of(value) for name, value in loaded.items()}
