"""Sandbox lifecycles: creating, attaching, pooling and sweeping sandboxes of one backend.

Kept apart from the backends themselves, which only know how to reach a sandbox that exists."""
