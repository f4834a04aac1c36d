"""Test fixture: accel plugins that misbehave, one module per fault."""
