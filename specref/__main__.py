"""``python -m specref``: the readiness report (see specref.course.doctor)."""

from .course.doctor import main

raise SystemExit(main())
