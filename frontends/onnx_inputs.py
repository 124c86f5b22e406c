"""The model inputs' static shapes (step 3 of :mod:`unity_eq.frontends.onnx`): ``--input-shape`` parsed,
overrides checked against the declared dims, and a dynamic dim without one refused with what to pass.

Separate because these are the frontend's user-facing option errors (:class:`~unity_eq.errors.OptionError`,
:class:`~unity_eq.errors.DynamicShapeError`), apart from the model's own problems.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from unity_eq.errors import DynamicShapeError, ModelError, OptionError

__all__ = ["fix_input_shapes", "parse_input_shape"]


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse the CLI option ``--input-shape name=2x16`` into ``("name", (2, 16))``.

    The name is everything before the last ``=``, so tensor names with ``/`` or ``:`` work as they are.
    """
    name, sep, dims_text = text.rpartition("=")
    usage = f"`--input-shape {text}`: expected NAME=DIMS with positive DIMS joined by x, e.g. `x=2x16`"
    if not sep:
        raise OptionError(f"{usage}, got no '='.")
    if not name.strip():
        raise OptionError(f"{usage}, got no input name.")
    try:
        dims = tuple(int(d) for d in dims_text.strip().split("x"))
    except ValueError:
        raise OptionError(f"{usage}, got dims {dims_text!r}.") from None
    if any(d <= 0 for d in dims):
        raise OptionError(f"{usage}, got non-positive dims {dims_text!r}.")
    return name.strip(), dims


# ------------------------------------------------------------------------------------------ input shapes


def fix_input_shapes(
    inputs: list[onnx.ValueInfoProto], overrides: Mapping[str, Sequence[int]], where: str
) -> list[onnx.ValueInfoProto]:
    """Give every model input a static shape: apply ``overrides``, refuse dimensions left dynamic."""
    by_name = {i.name: i for i in inputs}
    valid = ", ".join(repr(n) for n in by_name) or "none"
    unknown = [n for n in overrides if n not in by_name]
    if unknown:
        raise OptionError(
            f"`--input-shape {unknown[0]}=...`: the model has no input {unknown[0]!r}; its inputs are {valid}."
        )
    fixed = []
    for value in inputs:
        if not value.type.HasField("tensor_type"):
            raise ModelError(f"{where}: input {value.name!r} is not a tensor; only tensor inputs are supported.")
        declared = _declared_dims(value)
        if value.name in overrides:
            dims = tuple(overrides[value.name])
            _check_override(value.name, declared, dims)
        else:
            dims = _static_dims(value.name, declared, where)
        fixed.append(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, dims))
    return fixed


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | str] | None:
    """The declared dims (int, or the dim_param / ``"?"`` of a dynamic one); None when the rank is unknown."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]


def _format_dims(dims: Sequence[int | str]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def _check_override(name: str, declared: list[int | str] | None, dims: tuple[int, ...]) -> None:
    option = f"`--input-shape {name}={'x'.join(map(str, dims))}`"
    if declared is not None and len(dims) != len(declared):
        raise OptionError(
            f"{option}: input {name!r} has rank {len(declared)} (shape {_format_dims(declared)}), "
            f"got {len(dims)} dims. Give {len(declared)} dims."
        )
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in dims):
        raise OptionError(f"{option}: every dimension must be a positive integer, got {list(dims)}.")
    for axis, (old, new) in enumerate(zip(declared or [], dims, strict=False)):
        if isinstance(old, int) and old != new:  # the model's weights and reshapes were built for `old`
            raise OptionError(
                f"{option}: input {name!r} dim {axis} is static ({old}) in the model (shape "
                f"{_format_dims(declared or [])}), got {new}. Only dynamic dims can be set; give {old} there."
            )


def _static_dims(name: str, declared: list[int | str] | None, where: str) -> tuple[int, ...]:
    """The declared dims of an input without an override, or a DynamicShapeError that says what to pass."""
    if declared is None:
        raise DynamicShapeError(
            f"{where}: input {name!r} has no declared shape. Pass `--input-shape {name}=<dims>`, "
            f"e.g. `--input-shape {name}=1x16`."
        )
    for d in declared:
        if not isinstance(d, int) or d <= 0:
            example = "x".join(str(e) if isinstance(e, int) and e > 0 else "1" for e in declared)
            problem = f"dynamic dimension {d!r}" if isinstance(d, str) else f"non-positive dimension {d}"
            raise DynamicShapeError(
                f"{where}: input {name!r} has {problem} (shape {_format_dims(declared)}). "
                f"Pass `--input-shape {name}=<dims>`, e.g. `--input-shape {name}={example}`."
            )
    return tuple(int(d) for d in declared)
