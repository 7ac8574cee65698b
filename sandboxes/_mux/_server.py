# ruff: noqa
# mypy: ignore-errors
"""The exec helper that runs INSIDE a sandbox (shipped as source with ``python3 -c``).

One long-lived process per sandbox answers many concurrent commands over one byte stream, so a
command costs a fork instead of a ``docker exec`` (~70 ms) or an SSH channel setup. Stdlib only
and Python 3.6-compatible: it runs on whatever python3 the image has.

Frames both ways: 1 byte type, 4 bytes command id, 4 bytes length (big endian), payload.
  client -> helper: P ping, R run (JSON spec), I stdin bytes, C close stdin, K kill
  helper -> client: H hello (JSON), A accepted (sent BEFORE the command is started, so a client
                    that never saw it knows the command never ran), O output bytes,
                    X exit (JSON {code, timed_out}), E error text
Every command runs in its own session with a marker in its environment; a timeout or a kill
takes down its process group and every process still carrying the marker, which catches
descendants that called setsid or double-forked.

The helper never speaks first (it answers P with H): a transport that reads the stream through
a buffered HTTP response (docker's attach) cannot lose bytes sent before it took the socket.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import threading

HEADER = struct.Struct(">cII")
MAX_FRAME = 64 << 20
DRAIN_GRACE = 0.2
_out = sys.stdout.buffer
_in = sys.stdin.buffer
_write_lock = threading.Lock()
_commands = {}
_commands_lock = threading.Lock()
_session = os.urandom(8).hex()


def send(kind, ident, payload=b""):
    frame = HEADER.pack(kind, ident, len(payload)) + payload
    with _write_lock:
        _out.write(frame)
        _out.flush()


def recv_exact(n):
    data = b""
    while len(data) < n:
        chunk = _in.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def marked_pids(marker):
    needle = ("SANDBOXES_EXEC_ID=" + marker).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            pass
    return found


class Command(object):
    def __init__(self, ident, spec):
        self.ident = ident
        self.marker = "%s-%d" % (_session, ident)
        self.timed_out = False
        self.finished = False
        self.stdin_queue = []
        self.stdin_cond = threading.Condition()
        env = dict(os.environ)
        env.update(spec.get("env") or {})
        env["SANDBOXES_EXEC_ID"] = self.marker
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", spec["command"]],
            stdin=subprocess.PIPE if spec.get("stdin") else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=spec.get("cwd") or None,
            env=env,
            start_new_session=True,
        )
        self.timeout = spec.get("timeout")
        self.reap_lock = threading.Lock()
        self.reaped = False

    def start(self):
        self.reader = threading.Thread(target=self.pump_output)
        self.reader.daemon = True
        self.reader.start()
        if self.proc.stdin is not None:
            writer = threading.Thread(target=self.pump_input)
            writer.daemon = True
            writer.start()
        waiter = threading.Thread(target=self.wait)
        waiter.daemon = True
        waiter.start()

    def pump_output(self):
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk or self.finished:
                break
            send(b"O", self.ident, chunk)

    def feed(self, data):
        with self.stdin_cond:
            self.stdin_queue.append(data)
            self.stdin_cond.notify()

    def pump_input(self):
        while True:
            with self.stdin_cond:
                while not self.stdin_queue:
                    self.stdin_cond.wait()
                data = self.stdin_queue.pop(0)
            if data is None:
                break
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (OSError, ValueError):
                break
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass

    def kill(self):
        """Kill the command's process group (only while unreaped: after that its id may already
        belong to another command's group) and every process carrying its marker."""
        with self.reap_lock:
            if not self.reaped:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        self.kill_marked()

    def kill_marked(self):
        for _ in range(20):  # repeat: a process may fork while /proc is being scanned
            pids = marked_pids(self.marker)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def expire(self):
        self.timed_out = True
        self.kill()

    def wait(self):
        # Block in wait() and enforce the timeout with a timer: wait(timeout=...) polls with
        # sleeps of up to 50 ms, which would delay every answer.
        timer = None
        if self.timeout:
            timer = threading.Timer(self.timeout, self.expire)
            timer.daemon = True
            timer.start()
        # Wait for the exit WITHOUT reaping, so the pid (and the group id) stays ours while the
        # group's leftovers are killed; only then reap.
        os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        if timer is not None:
            timer.cancel()
        with self.reap_lock:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            self.reaped = True
        self.reader.join(DRAIN_GRACE if not self.timed_out else 2.0)
        self.finished = True
        code = self.proc.returncode
        if code is not None and code < 0:
            code = 128 - code
        with _commands_lock:
            _commands.pop(self.ident, None)
        send(
            b"X",
            self.ident,
            json.dumps({"code": None if self.timed_out else code, "timed_out": self.timed_out}).encode(),
        )
        # Then whatever left its group (setsid, double forks) ends too; after the answer, so
        # that scanning /proc does not delay it.
        self.kill_marked()


def main():
    while True:
        header = recv_exact(HEADER.size)
        if header is None:
            break
        kind, ident, length = HEADER.unpack(header)
        if kind not in b"PRICK" or length > MAX_FRAME:
            sys.stderr.write("sandboxes exec helper: corrupt frame %r, exiting\n" % (header,))
            break  # a corrupt stream: end it (the client sees EOF) rather than wait for a bogus length
        payload = recv_exact(length) if length else b""
        if payload is None:
            break
        if kind == b"P":
            send(b"H", 0, json.dumps({"pid": os.getpid(), "python": sys.version.split()[0]}).encode())
            continue
        if kind == b"R":
            send(b"A", ident)
            command = None
            try:
                command = Command(ident, json.loads(payload.decode("utf-8")))
                with _commands_lock:
                    _commands[ident] = command
                command.start()
            except Exception as exc:  # bad cwd, no pid left for a fork or a thread: report, keep serving
                if command is not None:
                    command.kill()
                    with _commands_lock:
                        _commands.pop(ident, None)
                send(b"E", ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"))
            continue
        with _commands_lock:
            command = _commands.get(ident)
        if command is None:
            continue
        if kind == b"I":
            command.feed(payload)
        elif kind == b"C":
            command.feed(None)
        elif kind == b"K":
            command.kill()
    with _commands_lock:
        running = list(_commands.values())
    for command in running:  # the client is gone: nobody can collect these results
        command.kill()


if __name__ == "__main__":
    main()
