"""``InvalidSettings``: every settings problem, one line each."""

from onceflow.errors import OnceflowError


class InvalidSettings(OnceflowError, ValueError):
    """A setting (environment variable or configuration file) onceflow cannot use.

    ``problems`` holds one line per problem; the message is those lines.
    """

    code = "invalid-settings"
    title = "Invalid settings"

    def __init__(self, *problems: str) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))
