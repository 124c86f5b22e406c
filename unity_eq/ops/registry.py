"""The op registry: the built-in families and the plug-in families, in one place.

Adding a family is one module in this package (an :class:`~unity_eq.ops.family.OpFamily`), its rule file under
``rules/``, and one entry in :data:`PLUGINS` below. Everything else reads the registry.
"""

from __future__ import annotations

from unity_eq.ops.builtin import BUILTIN_RULE_FILES, builtin_specs
from unity_eq.ops.family import OpFamily
from unity_eq.ops.space_to_depth import SPACE_TO_DEPTH
from unity_eq.ops.spec import OpSpec

__all__ = ["OPS", "PLUGINS", "plugin_for", "rule_file_for", "spec_for"]

#: The families added as plug-ins, in load order of their rule files.
PLUGINS: tuple[OpFamily, ...] = (SPACE_TO_DEPTH,)

OPS: dict[str, OpSpec] = {s.name: s for s in builtin_specs()}
_PLUGIN_OF: dict[str, OpFamily] = {}
for _family in PLUGINS:
    for _spec in _family.specs:
        if _spec.name in OPS:
            raise ValueError(f"op family {_family.name}: {_spec.name} is already in the language")
        OPS[_spec.name] = _spec
        _PLUGIN_OF[_spec.name] = _family


def spec_for(op_type: str, domain: str = "") -> OpSpec | None:
    """The typed spec of an ONNX op, or None when it is carried opaquely."""
    if domain not in ("", "ai.onnx"):
        return None
    return OPS.get(op_type)


def plugin_for(op_type: str) -> OpFamily | None:
    """The plug-in family of an op, or None for a built-in (or opaque) op."""
    return _PLUGIN_OF.get(op_type)


def rule_file_for(op_type: str) -> str:
    """The rule file that shards ``op_type`` (what ``explain`` tells a user to extend)."""
    plugin = plugin_for(op_type)
    if plugin is not None:
        return f"rules/{plugin.rule_file}"
    spec = OPS.get(op_type)
    return BUILTIN_RULE_FILES.get(spec.family, "rules/parallel/layout.egg") if spec else "rules/parallel/layout.egg"
