"""``python -m specref``: the readiness report (see specref.doctor)."""

from .doctor import main

raise SystemExit(main())
