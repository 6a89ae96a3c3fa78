"""``python -m safepoint``: the same as the ``safepoint`` command."""

from .cli import main

if __name__ == "__main__":
    main()
