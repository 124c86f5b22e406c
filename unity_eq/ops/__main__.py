"""``python -m unity_eq.ops``: regenerate rules/schema.egg and the generated elementwise rules."""

from unity_eq.ops.schema import main

raise SystemExit(main())
