"""The optimize request (unity_eq.driver.request): every option checked once, into one frozen value; the
extraction methods as one enum; our own bugs as InternalError, not a user's error. Fast: no saturation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from unity_eq.driver import OptimizeRequest, Planner, build_request
from unity_eq.errors import InternalError, OptionError, UnityEqError
from unity_eq.extract import DifferentiableChooser, ExtractionMethod
from unity_eq.extract.chooser import chooser_chain
from unity_eq.ir import Mesh, divisors
from unity_eq.memory import resident_bytes


def test_a_request_is_frozen_and_holds_checked_values(tmp_path: Path) -> None:
    request = build_request(machine="h100x8", objective="training", extractor="ilp", output_dir=tmp_path / "p")
    assert isinstance(request, OptimizeRequest)
    assert request.planner is Planner.TRAINING and request.objective.training
    assert request.extractor is ExtractionMethod.ILP and request.machine.device_count == 8
    assert request.lowers and request.output_dir == tmp_path / "p"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.max_axes = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "planner"),
    [
        ({"pipeline": True}, Planner.PIPELINE),
        ({"objective": "training"}, Planner.TRAINING),
        ({"objective": "training", "mesh": "2x4"}, Planner.SPMD),  # one SPMD plan of the model as it is
        ({}, Planner.SPMD),
        ({"planner": Planner.SPMD, "objective": "training"}, Planner.SPMD),  # the API's optimize()
    ],
)
def test_the_planner_follows_the_options(options: dict[str, object], planner: Planner) -> None:
    assert build_request(machine="h100x8", **options).planner is planner  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"extractor": "fast"}, r"`--extractor`: expected greedy, differentiable or ilp, got 'fast'\."),
        ({"pipeline": True, "mesh": "2x4", "blocks": "on"}, r"`--mesh`, `--blocks` do not apply to `--pipeline`"),
        ({"stages": 2}, r"`--stages` restricts the stage search: pass it with `--pipeline`"),
        ({"batch": 4}, r"`--batch` sets the samples per step of training or of a pipeline"),
        ({"objective": "training", "mesh": "8", "batch": 4}, r"`--mesh` plans one SPMD plan"),
        ({"max_axes": 4}, r"`--max-axes`: expected 1, 2 or 3, got 4"),
        ({"blocks": "maybe"}, r"`--blocks`: expected auto, on or off, got 'maybe'"),
        ({"objective": "speed"}, r"`--objective`: expected inference or training, got 'speed'"),
        ({"mesh": Mesh(("x",), (4,), (0, 1, 2, 3))}, r"`--mesh` x=4 has 4 devices, the machine has 8"),
        ({"pipeline": True, "microbatches": 0}, r"`--microbatches` must be at least 1, got 0"),
    ],
)
def test_bad_options_are_refused_before_any_work(options: dict[str, object], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        build_request(machine="h100x8", **options)  # type: ignore[arg-type]


def test_the_stage_search_does_not_check_options_it_ignores() -> None:
    """``--max-axes`` and ``--ilp-time-limit`` mean nothing to the stage search: refused only where they apply."""
    assert build_request(machine="h100x8", pipeline=True, max_axes=7, ilp_time_limit=0).planner is Planner.PIPELINE
    with pytest.raises(OptionError, match="ilp-time-limit"):
        build_request(machine="h100x8", ilp_time_limit=0)


def test_every_extraction_method_has_a_chooser_chain() -> None:
    """A new member of ExtractionMethod must come with its chain (the option's check and message follow)."""
    for method in ExtractionMethod:
        chain = chooser_chain(method, None, 1.0, DifferentiableChooser())
        assert chain and chain[0].name == "greedy"
        assert ExtractionMethod.parse(method.value) is method


def test_an_unknown_method_from_our_own_code_is_an_internal_error() -> None:
    """Past the request, a method the enum lacks is our bug (it used to be an ExtractionError, a user's error,
    which the CLI prints as one line without the traceback that shows where the bug is)."""
    with pytest.raises(InternalError, match="unknown extraction method 'fast'"):
        chooser_chain("fast", None, 1.0)
    assert not issubclass(InternalError, UnityEqError)


def test_divisors_ascend_and_are_complete() -> None:
    for n in range(1, 200):
        assert divisors(n) == [k for k in range(1, n + 1) if n % k == 0]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_resident_bytes_follows_the_zero_table(zero: int) -> None:
    """memory.py's ZeRO table, with weights W, gradient G (the state's first W bytes) and optimizer state O:
    W + G + O, W + G + O/d, W + (G + O)/d, (W + G + O)/d for ZeRO levels 0 to 3."""
    w, g, o, d = 10.0, 10.0, 50.0, 4
    table = {0: w + g + o, 1: w + g + o / d, 2: w + (g + o) / d, 3: (w + g + o) / d}
    assert resident_bytes(w, g + o, zero, d) == pytest.approx(table[zero])
