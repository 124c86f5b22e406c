"""Signatures a rule may use: the schema's constructors, the analyses' functions and relations, and egglog's
primitives. Rule files may use everything the shipped schema and analyses declare without declaring it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PRIMITIVES", "Env", "Signature"]


@dataclass(frozen=True)
class Signature:
    """``kind`` is ``constructor``, ``function``, ``relation`` or ``primitive``. ``args`` are sorts; ``None``
    means "any sort, the same for every such argument" (``=``); ``variadic`` repeats the last sort."""

    name: str
    kind: str
    args: tuple[str | None, ...]
    result: str | None
    variadic: bool = False
    where: str = "built in"


def _prim(name: str, args: tuple[str | None, ...], result: str | None, variadic: bool = False) -> Signature:
    return Signature(name, "primitive", args, result, variadic)


#: egglog primitives that rules use, over the sorts rules use (i64 arithmetic and comparisons, vectors).
PRIMITIVES: dict[str, Signature] = {
    s.name: s
    for s in [
        *(_prim(op, ("i64", "i64"), "i64") for op in ("+", "-", "*", "/", "%", "min", "max")),
        *(_prim(op, ("i64", "i64"), "bool") for op in ("<", ">", "<=", ">=")),
        _prim("=", (None, None), "bool"),
        _prim("!=", (None, None), "bool"),
        _prim("vec-get", ("IVec", "i64"), "i64"),
        _prim("vec-length", ("IVec",), "i64"),
        _prim("vec-contains", ("IVec", "i64"), "bool"),
        _prim("vec-not-contains", ("IVec", "i64"), "bool"),
        _prim("vec-of", ("i64",), "IVec", variadic=True),
        _prim("vec-set", ("IVec", "i64", "i64"), "IVec"),
        _prim("vec-empty", (), "IVec"),
    ]
}


@dataclass
class Env:
    """Everything declared so far: sorts, signatures by name, rulesets."""

    sorts: set[str] = field(default_factory=lambda: {"i64", "f64", "String", "bool"})
    signatures: dict[str, Signature] = field(default_factory=lambda: dict(PRIMITIVES))
    rulesets: set[str] = field(default_factory=set)

    def copy(self) -> Env:
        return Env(set(self.sorts), dict(self.signatures), set(self.rulesets))

    def declare(self, sig: Signature) -> None:
        self.signatures[sig.name] = sig

    def get(self, name: str) -> Signature | None:
        return self.signatures.get(name)
