"""Operator tools on top of the library: the ``safepoint`` command, its renderers, the
dashboard and the demo. Nothing in the library imports from here."""
