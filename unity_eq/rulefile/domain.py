"""What a rule's bounded proof domain is made of (:func:`domain_components`, :func:`component_value`), in words
(:func:`describe_domain`), and what a domain leaves unbounded (:func:`size_readers`). The verifier records a
domain in the certificate (:mod:`unity_eq.rulefile.certificate`), whose guards make the engine fire the rule
only inside it; both read the components from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["FINITE_I64", "component_value", "describe_domain", "domain_components", "size_readers"]

#: i64 attributes whose values form a small finite set the bounded check enumerates entirely (axes relative
#: to the rank, flags, the output index of a multi-output op): their values are part of a domain. Other i64
#: attributes (Conv's group, LRN's size, SpaceToDepth's blocksize) are sizes, covered like dims.
FINITE_I64 = frozenset(
    {
        "axis",
        "allowzero",
        "ceil_mode",
        "count_include_pad",
        "keepdims",
        "noop_with_empty_axes",
        "saturate",
        "stash_type",
        "storage_order",
        "to",
        "training_mode",
        "transA",
        "transB",
        "<output index>",
    }
)


def domain_components(rule: Any) -> list[tuple[str, str]]:
    """The components of ``rule``'s domain, as (variable, kind): every tensor variable of the left-hand side
    (``tensor``: rank and dtype class), every ``TList`` variable (``tensors``: its elements' class, which a
    rule proven at rank 4 would otherwise not carry to rank 5: issue 21's sixth adversary), every ``IVec``
    variable (``length``), and every variable in an
    attribute position that :data:`FINITE_I64` names or a string attribute (``i64``/``String``: its value).
    Variables the guards bind (dims, axes) are not components: the engine evaluates the same guards, and for
    every instance the bounded check takes every solution of them."""
    from unity_eq.ops.registry import OPS
    from unity_eq.rulefile.terms import App, Var, walk

    sorts = rule.var_sorts
    out: dict[str, str] = {}
    for term in walk(rule.lhs):
        if isinstance(term, Var) and sorts.get(term.name) == "T":
            out.setdefault(term.name, "tensor")
        elif isinstance(term, Var) and sorts.get(term.name) == "IVec":
            out.setdefault(term.name, "length")
        elif isinstance(term, Var) and sorts.get(term.name) == "TList":
            out.setdefault(term.name, "tensors")
        elif isinstance(term, App) and term.head in OPS:
            spec = OPS[term.head]
            names = [a.name for a in spec.args] + (["<output index>"] if spec.multi_output else [])
            kinds = [a.sort for a in spec.args] + (["i64"] if spec.multi_output else [])
            for arg, name, sort in zip(term.args, names, kinds, strict=False):
                if not isinstance(arg, Var):
                    continue
                if sort == "i64" and name in FINITE_I64 and sorts.get(arg.name) == "i64":
                    out.setdefault(arg.name, "i64")
                elif sort == "String" and sorts.get(arg.name) == "String":
                    out.setdefault(arg.name, "String")
    return sorted(out.items())


def component_value(kind: str, value: Any) -> int | str:
    """A variable's value in a domain row (see :func:`domain_components`). A ``TList`` (``tensors``) takes its
    elements' class when they share one (the engine's ``tlkind``, unity_eq/rulefile/certificate.py), -2 when
    they do not, -1 when it is empty."""
    if kind == "tensor":
        if value is None:
            return -1
        return len(value.shape) + (100 if getattr(value, "integer", False) else 0)
    if kind == "tensors":
        classes = {int(component_value("tensor", v)) for v in value}
        return -1 if not classes else classes.pop() if len(classes) == 1 else -2
    if kind == "length":
        return len(value)
    return value if isinstance(value, str) else int(value)


def _ranges(values: Iterable[int]) -> str:
    vs = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ",".join(parts)


def describe_domain(entry: dict[str, Any]) -> str:
    """One line: what each component took, and how many of the combinations of those values were checked."""
    comps, rows = entry.get("components", []), entry.get("rows", [])
    if not comps:
        return "every term (no rank or attribute varies)"
    parts = []
    product = 1
    for i, (var, kind) in enumerate(comps):
        col = {row[i] for row in rows}
        product *= len(col)
        if kind == "tensor":
            real = [v for v in col if isinstance(v, int) and 0 <= v < 100]
            index = [v - 100 for v in col if isinstance(v, int) and v >= 100]
            # the dtype class is part of the domain: a rule proven on float tensors does not fire on integer ones
            bits = ([f"float rank {_ranges(real)}"] if real else []) + (
                [f"signed-integer rank {_ranges(index)}"] if index else []
            )
            bits += ["absent"] if -1 in col else []
            parts.append(f"{var}: {', '.join(bits)}")
        elif kind == "length":
            parts.append(f"len {var}: {_ranges(int(v) for v in col)}")
        elif kind == "tensors":
            ranks = [int(v) for v in col if isinstance(v, int) and 0 <= v < 100]
            bits = [f"elements of float rank {_ranges(ranks)}"] if ranks else []
            index = [int(v) - 100 for v in col if isinstance(v, int) and v >= 100]
            bits += [f"elements of signed-integer rank {_ranges(index)}"] if index else []
            bits += ["mixed ranks"] if -2 in col else []
            parts.append(f"{var}: {', '.join(bits) or 'empty'}")
        else:
            parts.append(f"{var} in {{{', '.join(sorted(map(str, col)))}}}")
    combos = "" if len(rows) == product else f" ({len(rows)} of the {product} combinations)"
    return "; ".join(parts) + combos


#: IVec attributes whose values are sizes (not part of a domain: only their length is).
_SIZE_VECTORS = frozenset({"shape", "split", "starts", "ends", "steps", "pads", "strides", "kernel_shape", "dilations"})


def size_readers(rule: Any) -> list[str]:
    """What in ``rule`` reads dim sizes or mesh sizes, which a domain does not bound (docs/verify.md, "Dims
    and mesh sizes"): its guards reading a dim (``vec-get`` of a shape) or a mesh axis size, and attributes
    whose values are sizes. Empty when the rule sees sizes only through the shipped guard relations."""
    from unity_eq.ops.registry import OPS
    from unity_eq.rulefile.terms import App, Var, walk

    out: dict[str, None] = {}
    for guard in rule.guards:
        for t in walk(guard):
            if (
                isinstance(t, App)
                and t.head == "vec-get"
                and any(isinstance(s, App) and s.head == "shape" for s in walk(t.args[0]))
            ):
                out.setdefault("a guard reads a dim size", None)
            elif isinstance(t, App) and t.head == "mesh-axis" and len(t.args) > 1 and isinstance(t.args[1], Var):
                out.setdefault("a guard reads a mesh axis size", None)
    for t in walk(rule.lhs):
        if isinstance(t, App) and t.head in OPS:
            for arg, spec in zip(t.args, OPS[t.head].args, strict=False):
                if not isinstance(arg, Var):
                    continue
                if (spec.sort == "IVec" and spec.name in _SIZE_VECTORS) or (
                    spec.sort == "i64" and spec.name not in FINITE_I64
                ):
                    out.setdefault(f"{t.head}'s {spec.name}", None)
    return list(out)
