"""``python -m unity_eq.egraph JOB``: the saturation worker (unity_eq.egraph.saturate starts it)."""

from __future__ import annotations

import sys

from unity_eq.egraph.saturate import worker_main

raise SystemExit(worker_main(sys.argv[1]))
