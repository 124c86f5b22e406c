"""Loading rule files the one way both `optimize --rules` and `verify` do: the shipped schema, analyses and
manifest first, then the chosen files, through one parser (:mod:`unity_eq.rulefile.parse`) with one set of
load-time checks, then egglog itself loading the same text (:mod:`unity_eq.rulefile.engine`).

Every problem is one ``file:line:col: …`` line (``Program.errors``, or a :class:`~unity_eq.errors.RuleError`
for a file that cannot be read or parsed at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from unity_eq.errors import RuleError
from unity_eq.rulefile.engine import engine_load_error
from unity_eq.rulefile.manifest import BASE_FILES, DEFAULT_RULE_FILES, GENERATED_RULE_FILES, rules_dir
from unity_eq.rulefile.parse import Program, RuleSource, parse_program

__all__ = ["display_path", "load_program", "read_source", "shipped_rule_files"]


def shipped_rule_files() -> list[Path]:
    """Every shipped file with rules: analysis.egg (its rewrites), the manifest and every generated file (those
    `optimize` does not load by default too)."""
    root = rules_dir()
    names = dict.fromkeys([*DEFAULT_RULE_FILES, *GENERATED_RULE_FILES])
    return [root / "analysis.egg", *(root / name for name in names if (root / name).exists())]


def display_path(path: Path) -> str:
    root = rules_dir().parent
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        try:
            return str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(path)


def read_source(path: Path) -> RuleSource:
    try:
        return RuleSource(display_path(path), path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuleError(f"{path}: rule file not found. Check the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read rule file ({exc}).") from None


def load_program(paths: Sequence[Path] | None = None, engine: bool = True) -> tuple[Program, set[str]]:
    """Parse the shipped files (schema, analyses and the manifest, as ``optimize`` loads them), then
    ``paths``; the rules to verify are those of ``paths`` (default: every shipped rule file).

    A new rule file therefore sees everything the shipped files declare (constructors, relations, the
    ``bcast-operand`` facts of elementwise.egg), and its rule names must not clash with shipped ones.
    When our parser finds no error and ``engine`` is set, egglog itself then loads the schema, the analyses
    and the chosen files (as ``optimize --rules`` would); its first error joins ``Program.errors`` as one
    ``file:line:col`` line. Returns the program and the display names of the files whose rules are to be
    verified.
    """
    root = rules_dir()
    names = [name for name in (*BASE_FILES, *DEFAULT_RULE_FILES) if (root / name).exists()]
    base = [read_source(root / name) for name in names]
    chosen = shipped_rule_files() if paths is None else [Path(p) for p in paths]
    sources: list[RuleSource] = []
    targets: set[str] = set()
    seen: set[Path] = set()
    base_paths = {(root / name).resolve(): src for name, src in zip(names, base, strict=True)}
    for path in chosen:
        resolved = path.resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        if resolved in base_paths:
            targets.add(base_paths[resolved].display)
            continue
        src = read_source(path)
        sources.append(src)
        targets.add(src.display)
    program = parse_program(sources, base)
    if engine and not program.errors:
        loaded = [base_paths[(root / name).resolve()] for name in BASE_FILES if (root / name).exists()]
        loaded += [
            base_paths.get(p.resolve()) or read_source(p)
            for p in unique_paths(chosen)
            if p.resolve() not in {(root / name).resolve() for name in BASE_FILES}
        ]
        error = engine_load_error([(src.display, src.text) for src in loaded])
        if error:
            program.errors.append(error)
    return program, targets


def unique_paths(paths: Sequence[Path]) -> list[Path]:
    seen: set[Path] = set()
    out = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            out.append(path)
    return out
