"""The rules: every decision safepoint makes, as small functions of records and values.

Nothing here touches a store, a socket, a file or a clock of its own: each function is given
what it decides on (a run record, an operation's state, the time) and returns the decision.
The engine (``safepoint._engine``) and the stores (``safepoint.storage``) carry decisions out.
"""
