"""A throwaway PostgreSQL server for the tests, from the server binaries the machine has installed.

PostgreSQL refuses to run as root, so ``initdb`` and ``pg_ctl`` run as the ``postgres`` user (tests run as
root in CI). The server listens on 127.0.0.1 and a private socket directory, and is removed afterwards.
Set ``TOPO_TUNE_TEST_POSTGRES_URL`` to use an existing server instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from tests.support.processes import free_port


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql")


@dataclass
class PostgresServer:
    admin_url: str
    _data: Path | None = None
    _bindir: Path | None = None
    _port: int = 0
    _run_as: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, *, root: Path | None = None, wal_dir: Path | None = None) -> PostgresServer:
        """A new server whose data directory is ``root``/data (``root``: a fresh temporary directory when None,
        else one the caller made, e.g. on a small disk, and removes); its WAL in ``wal_dir`` when given."""
        existing = os.environ.get("TOPO_TUNE_TEST_POSTGRES_URL")
        if existing and root is None:
            return cls(admin_url=existing)
        bindir = _bindir()
        root = root or Path(tempfile.mkdtemp(prefix="topo-tune-pg-"))
        data = root / "data"
        shutil.chown(root, "postgres", "postgres")
        port = free_port()
        run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        initdb = [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]
        if wal_dir is not None:
            shutil.chown(wal_dir, "postgres", "postgres")
            initdb += ["--waldir", str(wal_dir / "pg_wal")]
        subprocess.run([*run_as, *initdb], check=True, capture_output=True)
        server = cls(
            admin_url=f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
            _data=data,
            _bindir=bindir,
            _port=port,
            _run_as=run_as,
        )
        server._pg_ctl("start")
        return server

    def _pg_ctl(self, action: str) -> None:
        assert self._bindir is not None and self._data is not None
        options = f"-p {self._port} -k {self._data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        args = [*self._run_as, str(self._bindir / "pg_ctl"), "-D", str(self._data), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-o", options, "-l", str(self._data / "server.log")]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        subprocess.run([*args, action], check=True, capture_output=True)

    def restart(self) -> None:
        """Restart the server: every open connection breaks."""
        self._pg_ctl("restart")

    def halt(self) -> None:
        """Stop the server but keep its data (``resume`` starts it again)."""
        self._pg_ctl("stop")

    def resume(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        if self._data is None:
            return
        try:
            self._pg_ctl("stop")
        finally:
            shutil.rmtree(self._data.parent, ignore_errors=True)

    def unix_socket_url(self, url: str) -> str:
        """``url`` (from ``new_database``) through the server's Unix socket instead of 127.0.0.1: a file
        path, so a process in another network namespace reaches it too."""
        if self._data is None:
            raise RuntimeError("an external server (TOPO_TUNE_TEST_POSTGRES_URL) has no socket this test knows")
        return f"{url.replace('@127.0.0.1:' + str(self._port), '@')}?host={self._data}&port={self._port}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"
