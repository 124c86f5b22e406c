"""A PyTorch model on the meta device to ONNX with shapes and dtypes but no weight bytes: the shape-only path to
planning a model too large to materialize (``optimize --plan-only`` or ``--pipeline`` read it).

The model is exported with ``torch.onnx.export(..., dynamo=True, optimize=False)`` (the exporter's optimizer
folds constants, which a meta tensor cannot give), then every initializer is written as *external data*
in a file that does not exist, at consecutive offsets: exactly the form of a model whose weight file has not
been downloaded, which the frontend plans from dtypes and shapes (docs/plan-format.md, "Plan-only plans").
Lowering such a model refuses with one line naming the absent weights, so stand-in zeros never run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from unity_eq.errors import ModelError

__all__ = ["ABSENT_SUFFIX", "export_meta"]

ABSENT_SUFFIX = ".absent"  # the external data file named by the model, never written


def export_meta(module: Any, args: Sequence[Any], path: str | Path, kwargs: Mapping[str, Any] | None = None) -> Path:
    """Export ``module`` called on ``args`` (tensors on the meta device, or anywhere: their values are never
    read) to ``path``; its weights become absent external data. Returns the path written."""
    import onnx
    import onnx_ir as ir
    import torch

    target = Path(path)
    try:
        program = torch.onnx.export(module, tuple(args), kwargs=dict(kwargs or {}), dynamo=True, optimize=False)
    except Exception as exc:  # the exporter raises many types; all mean "this module did not export"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"torch.onnx.export failed for {type(module).__name__}: {first}") from exc
    assert program is not None
    location = target.name + ABSENT_SUFFIX
    offset = 0
    for name, value in program.model.graph.initializers.items():
        if value.dtype is None or value.shape is None:
            raise ModelError(f"{target}: weight {name!r} has no dtype or shape after export; cannot plan it.")
        nbytes = math.ceil(value.dtype.itemsize * math.prod(value.shape.numpy()))
        value.const_value = ir.ExternalTensor(
            location, offset, nbytes, value.dtype, shape=value.shape, name=name, base_dir=str(target.parent)
        )
        offset += nbytes
    proto = ir.serde.serialize_model(program.model)
    onnx.save(proto, target)
    return target
