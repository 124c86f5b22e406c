"""Element types as numpy spells them, ml_dtypes' included (bfloat16, float8, int4), told apart by what they hold.

numpy gives ml_dtypes' types the kind ``V`` (raw bytes), so ``dtype.kind == "f"`` misses bfloat16: whoever
asks "is this a float", "how precise is it" or "may these values become that type" asks here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_dtype", "is_float", "is_integral", "lowest", "relative_precision"]


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, also for ml_dtypes' names (``bfloat16``), which numpy knows only once ml_dtypes is
    imported."""
    try:
        return np.dtype(dtype)
    except TypeError:
        import ml_dtypes  # onnx's own dependency; importing it registers its names with numpy

        kind = getattr(ml_dtypes, dtype, None) if isinstance(dtype, str) else None
        if isinstance(kind, type) and issubclass(kind, np.generic):  # its element types, not `finfo` and the like
            return np.dtype(kind)
        raise


def is_float(dtype: Any) -> bool:
    """Floating point, numpy's own (float16/32/64) or ml_dtypes' (bfloat16, float8, float4); a dtype or its name."""
    dtype = as_dtype(dtype)
    return dtype.kind == "f" or (dtype.type.__module__ == "ml_dtypes" and "float" in dtype.name)


def is_integral(dtype: np.dtype) -> bool:
    """Integers and booleans, numpy's own or ml_dtypes' (int4, uint4): values a float cannot stand for."""
    dtype = np.dtype(dtype)
    return dtype.kind in "iub" or (dtype.type.__module__ == "ml_dtypes" and "int" in dtype.name)


def relative_precision(dtype: np.dtype) -> float:
    """The machine epsilon of a float type (the spacing of values at 1): 2⁻²³ for float32, 2⁻¹⁰ for float16,
    2⁻⁷ for bfloat16. A result in that type is off by at least this much relative to its magnitude."""
    import ml_dtypes

    return float(ml_dtypes.finfo(np.dtype(dtype)).eps)


def lowest(dtype: Any) -> Any:
    """The most negative finite value of a float type, bfloat16 and the float8s included (numpy's ``finfo``
    refuses ml_dtypes' types)."""
    import ml_dtypes

    return ml_dtypes.finfo(np.dtype(as_dtype(dtype))).min
