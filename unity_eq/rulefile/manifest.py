"""Where the rule files are, and which of them `optimize` loads.

The manifest below is the single list of rule files loaded by default, in load order; nothing registers rules
as a side effect of an import. ``schema.egg`` and ``analysis.egg`` always come first; the other files add
rewrites to the ``algebra`` and ``parallel`` rulesets declared in ``analysis.egg``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from unity_eq.errors import RuleError
from unity_eq.ops.registry import PLUGINS

__all__ = [
    "BASE_FILES",
    "CORE_RULE_FILES",
    "DEFAULT_RULE_FILES",
    "EXPORT_SPELLING_FILES",
    "GENERATED_DEFAULT_FILES",
    "GENERATED_RULE_FILES",
    "HAND_WRITTEN_RULE_FILES",
    "SPEC_GENERATED_RULE_FILES",
    "RuleFile",
    "default_rule_files",
    "load_rule_files",
    "rules_dir",
]

#: Loaded before any rule file: the language and the analyses the guards use.
BASE_FILES = ("schema.egg", "analysis.egg")

#: Rule files generated from the op registry by `python -m unity_eq.ops` (as rules/schema.egg is): the split
#: rules of every elementwise op, one template each. Core rules, always loaded; regenerated, never edited.
SPEC_GENERATED_RULE_FILES = ("parallel/elementwise.egg",)

#: Rule files that make a plug-in family's op from what exporters write, beside the family's own file (which
#: declares the op's analyses): loaded after every family's file.
EXPORT_SPELLING_FILES = ("algebra/attention_exports.egg",)

#: The core rule files (paths relative to rules/), in load order: the hand-written ones with the spec-generated
#: ones among them, then each plug-in op family's own file (unity_eq/ops/registry.py), so a new family is
#: loaded and verified without editing this list, then the export spellings. `--no-generated-rules` loads
#: these alone.
CORE_RULE_FILES = (
    "algebra/split.egg",
    "parallel/redistribute.egg",
    *SPEC_GENERATED_RULE_FILES,
    "parallel/matmul.egg",
    "parallel/conv.egg",
    "parallel/layout.egg",
    *(family.rule_file for family in PLUGINS),
    *EXPORT_SPELLING_FILES,
)

#: The core rule files a person writes (the others are regenerated from the op registry).
HAND_WRITTEN_RULE_FILES = tuple(name for name in CORE_RULE_FILES if name not in SPEC_GENERATED_RULE_FILES)

#: Generated rule files (`unity-eq generate-rules`, docs/generate.md) that `optimize` loads by default: the
#: algebraic rules whose right-hand side has fewer operators (they cannot loop) and the multi-output merges
#: (they concatenate weights in initializer order only, so they cannot loop either). `--no-generated-rules`
#: drops them.
GENERATED_DEFAULT_FILES = ("generated/shrinking.egg", "generated/merge.egg")

#: Every generated rule file: all are verified by `unity-eq verify`; only GENERATED_DEFAULT_FILES are loaded.
GENERATED_RULE_FILES = (
    "generated/shrinking.egg",
    "generated/algebra.egg",
    "generated/parallel.egg",
    "generated/merge.egg",
    "generated/core-equivalent.egg",
    "generated/growing.egg",
)

#: The rule files `optimize` loads unless told otherwise (paths relative to rules/).
DEFAULT_RULE_FILES = CORE_RULE_FILES + GENERATED_DEFAULT_FILES


@dataclass(frozen=True)
class RuleFile:
    """A rule file's text and where it came from (for error messages)."""

    path: Path
    text: str

    @property
    def display(self) -> str:
        try:
            return str(self.path.relative_to(rules_dir().parent))
        except ValueError:
            return str(self.path)


def rules_dir() -> Path:
    """The shipped rules/ directory (inside the installed package, or the checkout in editable installs)."""
    return Path(str(resources.files("unity_eq.rules")))


def _read(path: Path) -> RuleFile:
    try:
        return RuleFile(path, path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuleError(f"{path}: rule file not found. Check the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read rule file ({exc}).") from None


def base_files() -> list[RuleFile]:
    return [_read(rules_dir() / name) for name in BASE_FILES]


def default_rule_files(generated: bool = True) -> list[Path]:
    """The manifest as paths; ``generated=False`` leaves out the generated rules (`--no-generated-rules`)."""
    names = DEFAULT_RULE_FILES if generated else CORE_RULE_FILES
    return [rules_dir() / name for name in names if (rules_dir() / name).exists()]


#: Warning lines already printed by this process (each once, however often the files are loaded).
_WARNED: set[str] = set()


def load_rule_files(paths: list[Path] | None = None) -> list[RuleFile]:
    """Read the base files and the given rule files (default: the manifest), rejecting duplicates, each rule
    limited to what its proof certificate covers (unity_eq/rulefile/certificate.py): a rule proven for every
    shape as written, one proven on bounded cases guarded by its domain, one with no current certificate
    left out with one warning line on stderr."""
    from unity_eq.rulefile.certificate import DOMAIN_PRELUDE, RULESET_DECLARATION, guard_files, warn

    chosen = default_rule_files() if paths is None else paths
    seen: set[Path] = set()
    base = base_files()
    # analysis.egg's own rewrites (plist-cons) are rules with certificates too; the domain analysis follows it
    files = [base[0], RuleFile(base[1].path, RULESET_DECLARATION + base[1].text + "\n" + DOMAIN_PRELUDE)]
    for path in chosen:
        resolved = Path(path).resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        files.append(_read(Path(path)))
    texts, warnings = guard_files(((f.path, f.display, f.text) for f in files[1:]), rules_dir())
    warn([w for w in warnings if w not in _WARNED])
    _WARNED.update(warnings)
    return [files[0], *(RuleFile(f.path, text) for f, text in zip(files[1:], texts, strict=True))]
