"""A throwaway PostgreSQL cluster from the machine's own binaries (Debian's `postgresql-15`), for tests,
benches and `agent-driver controlplane gateways --postgres`.

PostgreSQL refuses to run as root, so under root the cluster belongs to the `postgres` user: its folder is
a fresh `mktemp -d` chowned to that user (never inside a checkout, which may be a 0700 clone it cannot
enter). It listens on 127.0.0.1 only, on a free port, with trust authentication for loopback (a private
cluster that lives as long as the process that started it) and `synchronous_commit = on`, fsync on.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries on this machine (or they cannot start): the message says what to install."""


def bin_dir() -> Path:
    """The folder of `initdb` and `pg_ctl`: PATH first, then Debian's /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if versions:
        return Path(versions[-1]).parent
    raise PostgresUnavailable("PostgreSQL is not installed: `make setup` installs Debian's postgresql-15")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """`with Cluster() as pg:` a running cluster; `pg.url` is a `postgresql://` URL of its database."""

    def __init__(self, database: str = "cp") -> None:
        self.database = database
        self.port = 0
        self.folder: Path | None = None
        self._user: pwd.struct_passwd | None = None
        self._bin = bin_dir()

    @property
    def url(self) -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        user = self._user
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
            cwd=self.folder,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"},
            check=False,
        )
        if done.returncode != 0:
            raise PostgresUnavailable(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-400:]}")

    def start(self) -> Cluster:
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(f"running as root needs a {SERVER_USER!r} user to run PostgreSQL") from None
        self.folder = Path(tempfile.mkdtemp(prefix="cp-pg-"))
        if self._user is not None:
            os.chown(self.folder, self._user.pw_uid, self._user.pw_gid)
        data = self.folder / "data"
        self._run(
            str(self._bin / "initdb"), "-D", str(data), "-U", SERVER_USER, "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        self.port = _free_port()
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c synchronous_commit=on "
            "-c fsync=on -c max_connections=200 -c shared_buffers=64MB"
        )
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )
        self.createdb(self.database)
        return self

    def createdb(self, name: str) -> None:
        self._run(str(self._bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SERVER_USER, name)

    def stop(self) -> None:
        if self.folder is None:
            return
        with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
            self._run(str(self._bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def cluster(database: str = "cp") -> Iterator[Cluster]:
    with Cluster(database) as pg:
        yield pg


def new_database(pg: Cluster) -> str:
    """A fresh, empty database in the cluster (a new name each call); its `postgresql://` URL."""
    global _databases
    _databases += 1
    name = f"t{os.getpid()}_{_databases}"
    pg.createdb(name)
    return f"postgresql://{SERVER_USER}@127.0.0.1:{pg.port}/{name}"


_databases = 0
