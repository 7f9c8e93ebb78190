"""One driver per study, wherever it runs: a lease held in the study's own database.

A file lock only sees drivers in one working folder on one host; two `tuner run` on two hosts
against one PostgreSQL study would both proceed and mark each other's trials failed. The lease
is a row of the study's database: taken with a conditional update (atomic on SQLite and
PostgreSQL alike), renewed by a thread while the driver lives, released when it ends. A driver
that dies without releasing it leaves a row that expires ``ttl_s`` after its last renewal; on
the same host, a holder whose process is gone is taken over at once, since the process table
says more than a clock. Expiry times are the holders' wall clocks: hosts that share a database
are expected to keep time with NTP, and the default TTL is far above any skew that matters.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from tuner.errors import ConfigError
from tuner.study.state.storage import storage_error

LEASE_S = 60.0  # how long a silent driver keeps its study
_META = MetaData()
LEASES = Table(
    "tuner_run_leases",
    _META,
    Column("study", String(512), primary_key=True),
    Column("token", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started", Float, nullable=False),  # the holder process's create time
    Column("folder", String(1024), nullable=False),
    Column("expires", Float, nullable=False),
)


@dataclass(frozen=True)
class Holder:
    """Who drives a study: a process on a host, in a working folder."""

    host: str
    pid: int
    started: float
    folder: str
    token: str

    @classmethod
    def this_process(cls, folder: Path) -> Holder:
        me = psutil.Process()
        return cls(socket.gethostname(), me.pid, me.create_time(), str(folder), uuid.uuid4().hex)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, studies in {self.folder}"

    def is_gone(self) -> bool:
        """True only when this holder runs on this host and its process no longer exists
        (a reused pid is told apart by the process's start time)."""
        if self.host != socket.gethostname():
            return False
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) > 1e-3
        except psutil.NoSuchProcess:
            return True


class RunLease:
    """The lease of ``study`` in the database at ``url``, held by ``holder`` once taken."""

    def __init__(self, url: str, study: str, holder: Holder, ttl_s: float = LEASE_S) -> None:
        self.url, self.study, self.holder, self.ttl_s = url, study, holder, ttl_s
        self._engine: Engine | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    # -- the database ----------------------------------------------------------------
    def _db(self) -> Engine:
        if self._engine is None:
            try:
                self._engine = create_engine(self.url, pool_pre_ping=True)
                _META.create_all(self._engine, checkfirst=True)
            except (SQLAlchemyError, ImportError, ValueError) as exc:
                raise storage_error(
                    "hold the run lease in the study storage", self.url, exc
                ) from exc
        return self._engine

    def _row(self) -> dict[str, object]:
        h = self.holder
        return {
            "token": h.token,
            "host": h.host,
            "pid": h.pid,
            "started": h.started,
            "folder": h.folder,
            "expires": time.time() + self.ttl_s,
        }

    def current(self) -> tuple[Holder, float] | None:
        """The study's holder and the wall-clock time its lease expires, if any row is kept."""
        with self._db().connect() as conn:
            row = conn.execute(select(LEASES).where(LEASES.c.study == self.study)).first()
        if row is None:
            return None
        holder = Holder(row.host, row.pid, row.started, row.folder, row.token)
        return holder, row.expires

    # -- take, renew, release --------------------------------------------------------
    def take(self, on_lost: Callable[[str], None] | None = None) -> None:
        """Hold the study's lease, or raise ConfigError naming the driver that holds it."""
        try:
            if not self._acquire():
                raise self._refusal()
        except SQLAlchemyError as exc:
            raise storage_error("hold the run lease in the study storage", self.url, exc) from exc
        self._thread = threading.Thread(
            target=self._renew, args=(on_lost,), name="run-lease", daemon=True
        )
        self._thread.start()

    def _acquire(self) -> bool:
        with contextlib.suppress(IntegrityError), self._db().begin() as conn:
            conn.execute(insert(LEASES).values(study=self.study, **self._row()))
            return True
        held = self.current()
        if held is None:
            return self._acquire()  # released between the insert and the read
        if held[1] >= time.time() and not held[0].is_gone():
            return False
        # Conditional on the row still being the stale one: of two drivers taking over at
        # once, the database lets exactly one update win.
        with self._db().begin() as conn:
            taken = conn.execute(
                update(LEASES)
                .where(LEASES.c.study == self.study, LEASES.c.token == held[0].token)
                .values(**self._row())
            )
        return taken.rowcount == 1

    def _refusal(self) -> ConfigError:
        held = self.current()
        who = held[0].describe() if held else "another driver"
        left = max(0.0, held[1] - time.time()) if held else 0.0
        return ConfigError(
            f"study {self.study!r} is already being run by another tuner process ({who}); "
            f"its lease expires in {left:.0f} s unless that process renews it",
            hint="wait for it to finish, or use another name=",
        )

    def _renew(self, on_lost: Callable[[str], None] | None) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                with self._db().begin() as conn:
                    kept = conn.execute(
                        update(LEASES)
                        .where(LEASES.c.study == self.study, LEASES.c.token == self.holder.token)
                        .values(expires=time.time() + self.ttl_s)
                    )
            except SQLAlchemyError:
                continue  # a database blip: the next renewal tries again, well before expiry
            if kept.rowcount != 1 and not self.lost:
                self.lost = True
                if on_lost is not None:
                    on_lost(
                        f"the lease of study {self.study!r} was taken over by another driver "
                        "(this one stopped renewing it for longer than its lease)"
                    )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._engine is None:
            return
        with contextlib.suppress(SQLAlchemyError), self._engine.begin() as conn:
            conn.execute(
                delete(LEASES).where(
                    LEASES.c.study == self.study, LEASES.c.token == self.holder.token
                )
            )
        self._engine.dispose()


def take_lease(
    url: str,
    study: str,
    folder: Path,
    ttl_s: float = LEASE_S,
    on_lost: Callable[[str], None] | None = None,
) -> RunLease:
    """The study's lease for this process (see RunLease.take)."""
    lease = RunLease(url, study, Holder.this_process(folder), ttl_s)
    lease.take(on_lost)
    return lease
