"""Hangs at import, like a plugin waiting on a device that never answers."""

import sys
import time

print("hangs plugin: importing", file=sys.stderr, flush=True)  # the test waits for this
time.sleep(120)
