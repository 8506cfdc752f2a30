"""``python -m cli``: the same as the ``onceflow`` command."""

from cli import main

if __name__ == "__main__":
    main()
