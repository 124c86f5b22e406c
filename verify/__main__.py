"""``python -m unity_eq.verify [PATHS...] [--rule NAME]``: see :func:`unity_eq.verify.main`."""

from __future__ import annotations

from unity_eq.verify._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
