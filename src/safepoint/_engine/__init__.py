"""The engine: runs carried out against a store.

Each piece of logic that talks to a store is written once, as a generator "flow" that yields
requests (``flow.py``), and carried out by a sync driver and an async driver. The run core
records steps; ``dispatch.py`` carries an effect through the dispatch protocol; ``workflow.py``
starts, claims, resumes and ends runs; ``worker.py`` polls for runnable ones.
"""
