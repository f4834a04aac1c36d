"""``python -m accel``: the same as the ``accel`` command."""

from accel.cli import main

raise SystemExit(main())
