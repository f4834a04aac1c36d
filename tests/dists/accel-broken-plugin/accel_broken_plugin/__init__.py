"""Test fixture: fails on import, like a plugin whose native library is missing."""

raise ImportError("libfancyaccel.so.3: cannot open shared object file")
