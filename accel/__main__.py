"""``python -m accel``: the same as the ``accel`` command."""

from accel.tools.cli import main

raise SystemExit(main())
