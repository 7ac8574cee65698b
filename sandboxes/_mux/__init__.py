"""A long-lived exec helper inside a sandbox, multiplexing many commands over one stream."""

from sandboxes._mux.client import SERVER_SOURCE, ByteStream, MuxBroken, MuxClient, kill_tagged, run_replacing_once

__all__ = ["SERVER_SOURCE", "ByteStream", "MuxBroken", "MuxClient", "kill_tagged", "run_replacing_once"]
