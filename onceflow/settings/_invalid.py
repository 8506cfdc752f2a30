"""``InvalidSettings``: every settings problem, one line each."""


class InvalidSettings(ValueError):
    """A setting (environment variable or configuration file) onceflow cannot use.

    ``problems`` holds one line per problem; the message is those lines.
    """

    def __init__(self, *problems: str) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))
