"""The ``onceflow`` command line: the dev stack, workers, calls and operator decisions."""
