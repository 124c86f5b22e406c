"""``python -m unity_eq``: the ``unity-eq`` command (for an environment whose scripts folder is not on PATH)."""

from __future__ import annotations

import sys

from unity_eq.cli import entry

sys.exit(entry())
