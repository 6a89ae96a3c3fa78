"""safepoint against DBOS and LangGraph, side by side, in one run: ``make bench``."""
