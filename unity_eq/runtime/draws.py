"""The random inputs of ``check`` (and of ``run`` without inputs, and ``check --training``): how float inputs
are drawn (:class:`InputDraw`, :func:`default_draws`) and one set of inputs for a plan's input records
(:func:`random_inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.dtypes import is_float
from unity_eq.errors import OptionError, RuntimeBackendError
from unity_eq.planfile import InputRecord


@dataclass(frozen=True)
class InputDraw:
    """One set of random inputs for ``check``: how float inputs are drawn, and the seed.

    ``normal``: N(0, scale²); ``uniform``: U(−scale, scale); ``integers``: whole numbers in [−scale, scale]
    (exact in float, so a plan that loses or adds a term shows as an exact error). Integer inputs always take
    values in the ranges that keep the model valid (:mod:`unity_eq.runtime.input_ranges`); booleans are fair coins.
    """

    kind: str
    scale: float
    seed: int

    def describe(self) -> str:
        what = {"normal": f"normal σ={self.scale:g}", "uniform": f"uniform ±{self.scale:g}"}
        return f"{what.get(self.kind, f'integers ±{self.scale:g}')}, seed {self.seed}"


def default_draws(seed: int = 0) -> list[InputDraw]:
    """What ``check`` tries by default: several seeds at unit scale, large scales (a rank that clips or
    saturates large values fails), a wide uniform and integer values."""
    return [
        InputDraw("normal", 1.0, seed),
        InputDraw("normal", 1.0, seed + 1),
        InputDraw("normal", 10.0, seed + 2),
        InputDraw("normal", 1000.0, seed + 3),
        InputDraw("uniform", 100.0, seed + 4),
        InputDraw("integers", 8.0, seed + 5),
    ]


def random_inputs(
    specs: Mapping[str, InputRecord] | Mapping[str, Mapping[str, Any]],
    seed: int = 0,
    int_bounds: Mapping[str, int] | None = None,
    draw: InputDraw | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """Deterministic random inputs: floats as ``draw`` says (default N(0, 1) with ``seed``), integers in
    ``int_ranges`` (inclusive) or [0, ``int_bounds``) or [0, 10), booleans.

    ``draw``'s seed replaces ``seed`` when given."""
    draw = draw or InputDraw("normal", 1.0, seed)
    rng = np.random.default_rng(draw.seed)
    out = {}
    for name, spec in specs.items():
        shape, dtype = _shape_and_dtype(spec)
        if is_float(dtype):  # numpy's floats and ml_dtypes' (bfloat16), which numpy calls kind "V"
            out[name] = _floats(rng, draw, shape).astype(dtype)
        elif dtype.kind in "iu":
            low, high = (int_ranges or {}).get(name, (0, max((int_bounds or {}).get(name, 10), 1) - 1))
            out[name] = rng.integers(low, high, size=shape, endpoint=True).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            raise RuntimeBackendError(
                f"inputs: cannot make random values of dtype {dtype} for {name!r}; pass `--inputs`"
            )
    return out


def _shape_and_dtype(spec: InputRecord | Mapping[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """An input's shape and dtype from plan.json's record, or from a ``{"shape", "dtype"}`` mapping (the API)."""
    if isinstance(spec, InputRecord):
        return spec.shape, np.dtype(spec.dtype)
    return tuple(spec["shape"]), np.dtype(spec["dtype"])


def _floats(rng: np.random.Generator, draw: InputDraw, shape: tuple[int, ...]) -> np.ndarray:
    if draw.kind == "normal":
        return rng.standard_normal(shape) * draw.scale
    if draw.kind == "uniform":
        return rng.uniform(-draw.scale, draw.scale, shape)
    if draw.kind == "integers":
        return rng.integers(-int(draw.scale), int(draw.scale), size=shape, endpoint=True).astype(np.float64)
    raise OptionError(f"input draw: expected normal, uniform or integers, got {draw.kind!r}")
