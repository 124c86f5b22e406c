"""The op registry: every op family, built-in or added later, in one place.

Adding a family is one module in this package (an :class:`~unity_eq.ops.family.OpFamily`), its rule file under
``rules/``, and one entry in :data:`PLUGINS` below (:data:`BUILTINS` for the families that ship). Everything
else reads the registry: the schema (``rules/schema.egg``), the encoder, the cost model, ``explain`` and the
verifier.
"""

from __future__ import annotations

from collections.abc import Iterable

from unity_eq.ops.attention import ATTENTION
from unity_eq.ops.channel_norm import CHANNEL_NORM
from unity_eq.ops.conv import CONV
from unity_eq.ops.elementwise import ELEMENTWISE
from unity_eq.ops.family import OpFamily
from unity_eq.ops.matmul import MATMUL
from unity_eq.ops.normalization import NORMALIZATION
from unity_eq.ops.pooling import POOLING
from unity_eq.ops.reduce import REDUCE
from unity_eq.ops.reshape import RESHAPE
from unity_eq.ops.slicing import SLICING
from unity_eq.ops.space_to_depth import SPACE_TO_DEPTH
from unity_eq.ops.spec import Family, OpSpec

__all__ = [
    "FAMILIES",
    "ONNX_NAMESAKES",
    "OPS",
    "PLUGINS",
    "check_plugin_kinds",
    "family_for",
    "plugin_for",
    "rule_file_for",
    "spec_for",
]

#: Terms that share their name, not their meaning, with an ONNX op: ``Attention`` is the attention family's
#: (keys transposed, scale 1) in the e-graph and a plan's steps, and ONNX's (keys ``(b, h, s, d)``, scale
#: ``1/sqrt(d)``) in a model file. The frontend rewrites ONNX's into the term (frontends/onnx_attention.py); the
#: torch interpreter of a model file runs ONNX's (unity_eq.train.torch_ops.run_op ``onnx=True``); profile builds
#: no one-node ONNX model of the term (unity_eq.profile.models).
ONNX_NAMESAKES = frozenset({"Attention"})

#: The families that ship with unity-eq (their rule files are in rulefile.manifest.CORE_RULE_FILES).
BUILTINS: tuple[OpFamily, ...] = (
    ELEMENTWISE,
    MATMUL,
    NORMALIZATION,
    CONV,
    POOLING,
    CHANNEL_NORM,
    RESHAPE,
    SLICING,
    REDUCE,
)

#: The families added as plug-ins, in load order of their rule files.
PLUGINS: tuple[OpFamily, ...] = (SPACE_TO_DEPTH, ATTENTION)

FAMILIES: tuple[OpFamily, ...] = BUILTINS + PLUGINS

_KIND_ORDER = {kind: index for index, kind in enumerate(Family)}


def _language(families: Iterable[OpFamily]) -> tuple[dict[str, OpSpec], dict[str, OpFamily]]:
    """Every op's spec, ordered by kind (the order of ``Family``, then of each family's specs: the order in
    which ``rules/schema.egg`` declares them), and the family of each."""
    specs: list[OpSpec] = []
    family_of: dict[str, OpFamily] = {}
    for family in families:
        for spec in family.specs:
            if spec.name in family_of:
                raise ValueError(f"op family {family.name}: {spec.name} is already in the language")
            specs.append(spec)
            family_of[spec.name] = family
    specs.sort(key=lambda spec: _KIND_ORDER[spec.family])  # stable: each family keeps its own order
    return {spec.name: spec for spec in specs}, family_of


def check_plugin_kinds(plugins: Iterable[OpFamily]) -> None:
    """A plug-in's ops are of kind ``Family.PLUGIN``: the verifier gives ops of the built-in kinds the built-in
    families' assumptions (an elementwise op is an uninterpreted function that commutes with every slicing, a
    proof about one stands for all), which a plug-in's own semantics need not satisfy."""
    for family in plugins:
        for spec in family.specs:
            if spec.family is not Family.PLUGIN:
                raise ValueError(
                    f"op family {family.name}: {spec.name} has kind Family.{spec.family.name}; a plug-in family's"
                    " ops must have kind Family.PLUGIN (the verifier assumes the built-in kinds' semantics)"
                )


check_plugin_kinds(PLUGINS)
OPS, _FAMILY_OF = _language(FAMILIES)


def spec_for(op_type: str, domain: str = "") -> OpSpec | None:
    """The typed spec of an ONNX op, or None when it is carried opaquely."""
    if domain not in ("", "ai.onnx"):
        return None
    return OPS.get(op_type)


def family_for(op_type: str) -> OpFamily | None:
    """The family of a typed op (None for an opaque op)."""
    return _FAMILY_OF.get(op_type)


def plugin_for(op_type: str) -> OpFamily | None:
    """The family of an op added as a plug-in, or None."""
    family = _FAMILY_OF.get(op_type)
    return family if family in PLUGINS else None


def rule_file_for(op_type: str) -> str:
    """The rule file that shards ``op_type`` (what ``explain`` tells a user to extend)."""
    family = family_for(op_type)
    # an op without a family has no constructor yet: a new family (docs/architecture.md) or layout.egg
    return f"rules/{family.rule_file}" if family is not None else "rules/parallel/layout.egg"
