class RegistryError(ValueError):
    """The benchmark or method registry cannot be read: one line, naming where it came from."""
