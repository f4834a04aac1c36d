"""Calls sys.exit() at import, as a plugin might when its runtime is missing."""

import sys

sys.exit(3)
