"""``python -m unity_eq.cli``: the ``unity-eq`` console script (:func:`unity_eq.cli.entry`)."""

from __future__ import annotations

import sys

from unity_eq.cli import entry

sys.exit(entry())
