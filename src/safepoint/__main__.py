"""``python -m safepoint``: the same as the ``safepoint`` command."""

from .ops.cli import main

if __name__ == "__main__":
    main()
