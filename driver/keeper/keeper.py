"""The keeper (PROTOCOL §8.2): the provider's parent, which outlives a driver process by at most a grace.

Standard library only, run as `python -I keeper.py` as pid 1 of the provider's PID namespace (bwrap
without --die-with-parent: the namespace lives as long as the keeper). Not dumpable, so a process of
the same uid (the agent) can read neither its memory nor its environment.

Its configuration (JSON, with the driver's secret) arrives on stdin, which is then closed: never argv
or the environment, which the agent could read. Three descriptors are inherited, opened by the driver
(the paths may be hidden from this mount namespace), their numbers in the configuration: the listening
Unix socket, the output log and the input log.

- Everything the provider writes on stdout is appended to the output log (offset = byte position) and
  forwarded to the connected driver. Everything a driver writes to the provider's stdin is appended to
  the input log before it is written. Each log is bounded (`log_max_bytes`); past the bound nothing
  more is logged (never a later, smaller write: a log has no holes), the connected driver is told (`W`),
  and `hello` says so (`full`, `in_full`) to the next one, which does not reattach from it.
  No fsync: a driver crash leaves the page cache intact, which is the failure this serves.
- One driver at a time: a connection authenticates with the secret in its first frame; a new driver
  replaces the old one (the handover). With no driver, the provider's output is still drained and
  logged; after `grace_ms` with none, the provider's group is ended (TERM, then KILL after 3 s) and the
  keeper exits, which ends every process left in the namespace.

Frames: 1 byte type, 4 bytes big-endian length, payload.
Driver to keeper: A secret | R offset, split (8 bytes each): stream output from offset, no chunk
crossing split | I data | E stdin EOF |
S signal number (4 bytes): to the provider's group | T: end the provider tree and exit.
Keeper to driver: H JSON {pid, out_size, in_size, exited} | O data (in order from R's offset) |
X stderr data | Z JSON {status} | W JSON {log, limit} (a log filled up) | F reason (refused; the
connection is closed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time

HEADER = struct.Struct(">BI")
MAX_FRAME = 16 * 1024 * 1024
AUTH_TIMEOUT_S = 5.0
KILL_GRACE_S = 3.0
STDERR_TAIL = 16 * 1024
SEND_TIMEOUT_S = 30.0
# After the provider exits, how long its streams may stay open. A process it left (setsid, so outside
# its group) may hold them for good; what it writes there is not the provider's output, and the driver
# must hear of the exit as a driver without a keeper does: at once, not at the end of the streams.
EXIT_DRAIN_S = 1.0


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind[0], len(payload)) + payload


class Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.authed = False
        self.streaming = False
        self.since = time.monotonic()

    def frames(self) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while len(self.buf) >= HEADER.size:
            kind, size = HEADER.unpack_from(self.buf)
            if size > MAX_FRAME:
                raise ValueError("frame too large")
            if len(self.buf) < HEADER.size + size:
                break
            out.append((kind, bytes(self.buf[HEADER.size : HEADER.size + size])))
            del self.buf[: HEADER.size + size]
        return out


class Keeper:
    def __init__(self, config: dict) -> None:  # type: ignore[type-arg]
        self.secret = bytes.fromhex(config["secret"])
        self.grace = max(0.0, float(config["grace_ms"]) / 1000.0)
        self.log_max = int(config.get("log_max_bytes", 512 * 1024 * 1024))
        self.listener = socket.socket(fileno=int(config["listen_fd"]))
        self.out_log = int(config["out_fd"])
        self.in_log = int(config["in_fd"])
        self.out_size = os.fstat(self.out_log).st_size
        self.in_size = os.fstat(self.in_log).st_size
        self.out_full = False
        self.in_full = False
        self.sel = selectors.DefaultSelector()
        self.client: Client | None = None
        self.pending: list[Client] = []
        self.no_driver_since: float | None = time.monotonic()
        self.status: int | None = None
        self.exited_at: float | None = None
        self.stderr_tail = bytearray()
        self.to_stdin = bytearray()
        self.stdin_eof = False
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        r_in, w_in = os.pipe()
        pid = os.fork()
        if pid == 0:  # the provider: its own session, stdio on the pipes, nothing else inherited
            os.setsid()
            os.dup2(r_in, 0)
            os.dup2(w_out, 1)
            os.dup2(w_err, 2)
            os.closerange(3, 65536)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            try:
                os.chdir(config["cwd"])
                os.execvpe(config["argv"][0], config["argv"], config["env"])
            finally:
                os._exit(127)
        for fd in (r_in, w_out, w_err):
            os.close(fd)
        self.pid = pid
        self.stdout, self.stderr, self.stdin = r_out, r_err, w_in
        for fd in (r_out, r_err, w_in):
            os.set_blocking(fd, False)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self.stdout, selectors.EVENT_READ, "stdout")
        self.sel.register(self.stderr, selectors.EVENT_READ, "stderr")

    # -- the provider's streams ---------------------------------------------------------------------

    def on_stdout(self) -> None:
        try:
            data = os.read(self.stdout, 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(self.stdout)
            self.stdout = -1
            return
        if not self.out_full and self.out_size + len(data) <= self.log_max:
            os.write(self.out_log, data)
            self.out_size += len(data)
            if self.client is not None and self.client.streaming:
                self.send(frame(b"O", data))
        else:
            # Past the bound: a driver now streaming keeps receiving, but no new one can replay.
            if not self.out_full:
                self.out_full = True
                self.say_full("out")
            if self.client is not None and self.client.streaming:
                self.send(frame(b"O", data))

    def on_stderr(self) -> None:
        try:
            data = os.read(self.stderr, 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(self.stderr)
            self.stderr = -1
            return
        self.stderr_tail += data
        del self.stderr_tail[:-STDERR_TAIL]
        if self.client is not None and self.client.authed:
            self.send(frame(b"X", data))

    def write_stdin(self, data: bytes) -> None:
        if self.stdin < 0:
            return
        if not self.in_full and self.in_size + len(data) <= self.log_max:
            os.write(self.in_log, data)
            self.in_size += len(data)
        elif not self.in_full:
            # Never a later, smaller write: what a successor reads must be every byte, or it knows.
            self.in_full = True
            self.say_full("in")
        self.to_stdin += data
        self.flush_stdin()

    def say_full(self, log: str) -> None:
        if self.client is not None and self.client.authed:
            self.send(frame(b"W", json.dumps({"log": log, "limit": self.log_max}).encode()))

    def flush_stdin(self) -> None:
        while self.to_stdin and self.stdin >= 0:
            try:
                n = os.write(self.stdin, self.to_stdin)
            except BlockingIOError:
                break
            except OSError:
                self.to_stdin.clear()
                self.close_stdin()
                return
            del self.to_stdin[:n]
        want = selectors.EVENT_WRITE if self.to_stdin else 0
        if self.stdin >= 0:
            registered = self.stdin in self.sel.get_map()
            if want and not registered:
                self.sel.register(self.stdin, want, "stdin")
            elif not want and registered:
                self.sel.unregister(self.stdin)
        if not self.to_stdin and self.stdin_eof:
            self.close_stdin()

    def close_stdin(self) -> None:
        if self.stdin >= 0:
            if self.stdin in self.sel.get_map():
                self.sel.unregister(self.stdin)
            os.close(self.stdin)
            self.stdin = -1

    # -- drivers -----------------------------------------------------------------------------------

    def accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        client = Client(sock)
        self.pending.append(client)
        self.sel.register(sock, selectors.EVENT_READ, client)

    def drop(self, client: Client, reason: bytes | None = None) -> None:
        if reason is not None:
            try:
                client.sock.setblocking(True)
                client.sock.settimeout(1.0)
                client.sock.sendall(frame(b"F", reason))
            except OSError:
                pass
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(client.sock)
        client.sock.close()
        if client in self.pending:
            self.pending.remove(client)
        if self.client is client:
            self.client = None
            self.no_driver_since = time.monotonic()

    def send(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        try:
            client.sock.setblocking(True)
            client.sock.settimeout(SEND_TIMEOUT_S)
            client.sock.sendall(data)
            client.sock.setblocking(False)
        except OSError:
            self.drop(client)

    def on_client(self, client: Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(client)
            return
        client.buf += data
        try:
            frames = client.frames()
        except ValueError:
            self.drop(client, b"frame too large")
            return
        for kind, payload in frames:
            if client.sock.fileno() < 0:
                return
            try:
                self.on_frame(client, kind, payload)
            except (struct.error, ValueError, OverflowError):
                # A malformed frame ends that connection, never the keeper (and so the provider).
                self.drop(client, b"malformed frame")
                return

    def on_frame(self, client: Client, kind: int, payload: bytes) -> None:
        if not client.authed:
            import hmac

            if kind != ord("A") or not hmac.compare_digest(payload, self.secret):
                self.drop(client, b"not authenticated")
                return
            client.authed = True
            self.pending.remove(client)
            if self.client is not None:
                self.drop(self.client, b"replaced by another driver")
            self.client = client
            self.no_driver_since = None
            hello = {
                "pid": self.pid,
                "out_size": self.out_size,
                "in_size": self.in_size,
                "full": self.out_full,
                "in_full": self.in_full,
                "limit": self.log_max,
            }
            self.send(frame(b"H", json.dumps(hello).encode()))
            if self.stderr_tail:
                self.send(frame(b"X", bytes(self.stderr_tail)))
            return
        if client is not self.client:
            self.drop(client)
            return
        if kind == ord("R"):
            # offset, and where a chunk must end (the log's size the driver was told at hello): the
            # driver tells what it re-reads from what is new by that boundary.
            offset, split = struct.unpack(">QQ", payload) if len(payload) == 16 else (*struct.unpack(">Q", payload), 0)
            if self.out_full or offset > self.out_size:
                self.drop(client, b"offset not in the log")
                return
            while offset < self.out_size and self.client is client:
                end = split if offset < split else self.out_size
                chunk = os.pread(self.out_log, min(65536, end - offset), offset)
                if not chunk:
                    break
                self.send(frame(b"O", chunk))
                offset += len(chunk)
            client.streaming = True
            if self.status is not None and self.stdout < 0:
                self.send(frame(b"Z", json.dumps({"status": self.status}).encode()))
        elif kind == ord("I"):
            self.write_stdin(payload)
        elif kind == ord("E"):
            self.stdin_eof = True
            self.flush_stdin()
        elif kind == ord("S"):
            (signum,) = struct.unpack(">i", payload)
            self.signal_group(signum)
        elif kind == ord("T"):
            self.end_tree()

    # -- the provider's life -----------------------------------------------------------------------

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def reap(self) -> None:
        # pid 1 of the namespace: every orphan is ours to reap.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = os.waitstatus_to_exitcode(status)
                self.exited_at = time.monotonic()

    def close_streams(self) -> None:
        """Stop reading the exited provider's stdout and stderr, held open by a process it left, once
        what the pipes hold is read (a send to a slow driver may have kept us past EXIT_DRAIN_S)."""
        for _ in range(1024):  # a pipe holds 64 KiB unless resized; a writer that never stops is cut
            ready = [fd for fd in (self.stdout, self.stderr) if fd >= 0 and select.select([fd], [], [], 0)[0]]
            if not ready:
                break
            for fd in ready:
                if fd == self.stdout:
                    self.on_stdout()
                elif fd == self.stderr:
                    self.on_stderr()
        for name in ("stdout", "stderr"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(fd)
                os.close(fd)
                setattr(self, name, -1)

    def end_tree(self) -> None:
        self.close_stdin()
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while self.status is None and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        self.signal_group(signal.SIGKILL)
        self.finish()

    def finish(self) -> None:
        while self.status is None:
            self.reap()
            if self.status is None:
                time.sleep(0.01)
        self.send(frame(b"Z", json.dumps({"status": self.status}).encode()))
        # pid 1 exiting: the kernel kills whatever is left in the namespace.
        os._exit(0)

    def serve(self) -> None:
        while True:
            now = time.monotonic()
            if self.client is None and self.no_driver_since is not None and now - self.no_driver_since >= self.grace:
                self.end_tree()
            for client in list(self.pending):
                if now - client.since > AUTH_TIMEOUT_S:
                    self.drop(client)
            for key, _mask in self.sel.select(timeout=0.2):
                what = key.data
                if what == "listen":
                    self.accept()
                elif what == "stdout":
                    self.on_stdout()
                elif what == "stderr":
                    self.on_stderr()
                elif what == "stdin":
                    self.flush_stdin()
                elif isinstance(what, Client):
                    self.on_client(what)
            self.reap()
            if self.exited_at is not None and time.monotonic() - self.exited_at > EXIT_DRAIN_S:
                self.close_streams()
            # Exited: tell the driver streaming now; with none, keep the status for the next one.
            streaming = self.client is not None and self.client.streaming
            if self.status is not None and self.stdout < 0 and self.stderr < 0 and streaming:
                self.finish()


def _undumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> None:
    _undumpable()
    raw = sys.stdin.buffer.read()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    config = json.loads(raw)
    # As pid 1, a signal without a handler is ignored; TERM from the driver's group must not end us.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        keeper = Keeper(config)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            os._exit(127)
        raise
    keeper.serve()


if __name__ == "__main__":
    main()
