# The training helpers are public in their modules (accel.training.step, ...).
__all__: list[str] = []
