"""Integrations with agent SDKs, written on safepoint's public API alone: ``tools`` (a registry
that declares each tool as a pure, read or effect step, offers its definitions to a model and
runs the model's tool calls through the ledger), and one module per SDK that makes its model
calls recorded steps of a run — replayed on a resume, never generated again.
"""
