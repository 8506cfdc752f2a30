"""``python -m cli``: the same as the ``onceflow`` command."""

from cli import run

if __name__ == "__main__":
    run()
