# The command and the pytest plugin are public in their modules.
__all__: list[str] = []
