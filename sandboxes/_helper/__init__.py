"""The exec helper that runs INSIDE a sandbox: one long-lived process answering many commands and
file ops over one byte stream (`_server`). Stdlib only, Python 3.6-compatible, and importing
nothing of the host's side; shipped as its modules' sources behind a one-line bootstrap
(`sandboxes._mux._shipped`, `_boot`), each module compiled when first imported.
"""
