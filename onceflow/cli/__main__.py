"""``python -m cli``: the same as the ``onceflow`` command."""

from onceflow.cli import main

if __name__ == "__main__":
    main()
