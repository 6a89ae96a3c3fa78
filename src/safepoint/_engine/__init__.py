"""The engine: runs carried out against a store.

Each piece of logic that talks to a store is written once, as a generator "flow" that yields
requests (``flow.py``), and carried out by a sync driver and an async driver. In reading order:
``core.py`` holds a claimed run's state, its ledger writes and the step flow; ``dispatch.py``
carries an effect through the dispatch protocol; ``run.py`` is what a workflow calls (``Run`` /
``AsyncRun``); ``workflow.py`` registers workflows; ``lifecycle.py`` starts, claims, resumes and
ends runs; ``worker.py`` polls for runnable ones; ``verbs.py`` holds the operator's verbs.
"""
