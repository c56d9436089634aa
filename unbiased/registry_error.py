"""RegistryError: what the benchmark and method registries raise when they cannot be read."""


class RegistryError(ValueError):
    """The registry cannot be read: a malformed UNBIASED_BENCHMARKS, a name given twice, a
    module that does not import or holds no SPEC, an entry point that names no MethodEntry.
    One line, naming where it came from."""
