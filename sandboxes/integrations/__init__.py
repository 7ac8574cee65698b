"""Adapters to agent frameworks. Each lives in its own module so that importing this package
does not import any framework: ``from sandboxes.integrations.deepagents import to_deepagents``."""
