"""The ``unity-eq`` command line: one verb per job.

Every verb turns a :class:`~unity_eq.errors.UnityEqError` into one line on stderr and a non-zero exit code;
only a bug in unity-eq itself shows a traceback. Progress goes to stderr, results to stdout.

The package, one module per command group:

==========  =================================================================================================
module      what it holds
==========  =================================================================================================
dispatch    the Typer app, its verbs in ``--help`` order, :func:`main` and :func:`entry` (errors, interrupts)
shared      the consoles, progress messages and displays, options several verbs parse
optimize    ``optimize`` and its plan summary
run         ``run`` (local or MPI backend) and ``check``
profile     ``profile``
explain     ``explain`` (text, JSON, or a picture)
rules       ``verify`` and ``generate-rules``: the only modules that call the verifier
==========  =================================================================================================

``python -m unity_eq.cli`` runs it as the ``unity-eq`` console script does (``unity_eq.cli:entry``).
"""

from __future__ import annotations

from unity_eq.cli.dispatch import app, entry, main

__all__ = ["app", "entry", "main"]
