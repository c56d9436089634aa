"""RegistryError: what the benchmark and method registries raise when they cannot be read."""


class RegistryError(ValueError):
    """The registry cannot be read: one line, naming where it came from."""
