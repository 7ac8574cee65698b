"""A long-lived exec helper inside a sandbox, multiplexing many commands over one stream."""

from sandboxes._mux._capable import AwaitedCommand, AwaitsOnHelper, HoldsHelper
from sandboxes._mux._channel import Channel, open_channel
from sandboxes._mux._command import Command, CommandDefaults, GivenDefaults
from sandboxes._mux._driver import HelperDriver, HelperTransport, Refusal, TransportWords
from sandboxes._mux._held import DrivenSandbox
from sandboxes._mux._oom import OOM_COUNT_SH, OomCount
from sandboxes._mux._resend import run_command_once, run_native_once, run_on
from sandboxes._mux._spooled import SpooledOutput
from sandboxes._mux._starts import HAS_PYTHON_SH, HelperStarts, has_python_sh, python_missing
from sandboxes._mux._stream import ByteStream, MuxBroken, TimedByteStream
from sandboxes._mux._watched import watch_spec
from sandboxes._mux.client import PYTHON_FLAGS, SERVER_SOURCE, MuxClient, command_marker, kill_tagged

__all__ = [
    "HAS_PYTHON_SH",
    "OOM_COUNT_SH",
    "PYTHON_FLAGS",
    "SERVER_SOURCE",
    "AwaitedCommand",
    "AwaitsOnHelper",
    "ByteStream",
    "Channel",
    "Command",
    "CommandDefaults",
    "DrivenSandbox",
    "GivenDefaults",
    "HelperDriver",
    "HelperStarts",
    "HelperTransport",
    "HoldsHelper",
    "MuxBroken",
    "MuxClient",
    "OomCount",
    "Refusal",
    "SpooledOutput",
    "TimedByteStream",
    "TransportWords",
    "command_marker",
    "has_python_sh",
    "kill_tagged",
    "open_channel",
    "python_missing",
    "run_command_once",
    "run_native_once",
    "run_on",
    "watch_spec",
]
