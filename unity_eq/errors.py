"""Error types a user can hit.

Every failure caused by input (a model, a machine file, a rule file, a plan directory, an option) raises a
subclass of :class:`UnityEqError`. The CLI prints ``str(error)`` as one line and exits non-zero; anything else
that escapes is a bug in unity-eq and keeps its traceback.

Our own bugs raise :class:`InternalError`, which is deliberately *not* a UnityEqError: the CLI lets it
escape with its traceback, since a one-line ``error:`` would hide where the bug is.

Messages follow one form: what is wrong, the values found, and what to do about it, e.g.
``model.onnx: input 'x' has a dynamic dimension 'batch'. Pass `--input-shape x=2x16`.``
"""

from __future__ import annotations


class UnityEqError(Exception):
    """Base of every error caused by user input."""

    exit_code = 2


class ModelError(UnityEqError):
    """The model file is missing, unreadable, not ONNX, or fails the ONNX checker."""


class DynamicShapeError(ModelError):
    """A model input has a dimension that is not a fixed number."""


class OptionError(UnityEqError):
    """A command-line option or API argument has an invalid value."""


class MachineError(UnityEqError):
    """A machine description (TOML file or preset) is invalid."""


class RuleError(UnityEqError):
    """A rule file does not parse or is inconsistent with the schema."""


class SaturationError(UnityEqError):
    """The e-graph engine failed (crashed, ran out of memory, or was killed)."""


class ExtractionError(UnityEqError):
    """No valid plan could be extracted from the e-graph."""


class InfeasiblePlanError(ExtractionError):
    """Every plan found needs more memory per device than the machine has."""


class PlanError(UnityEqError):
    """A plan directory is missing, incomplete or inconsistent."""


class RuntimeBackendError(UnityEqError):
    """Running a plan failed (a backend is unavailable, a rank failed, inputs do not match)."""


class CheckFailed(UnityEqError):
    """The plan's outputs differ from the original model's."""

    exit_code = 1


class InternalError(Exception):
    """A bug in unity-eq (an invariant of our own broke), never the user's input: not a UnityEqError, so the CLI
    keeps its traceback instead of printing one ``error:`` line."""
