"""The Locust processes of one client (``workload.processes``): what they share and how they
split the work, so that their merged records read as one process's run.

Plain files and arithmetic, no gevent or Locust: each process calls these from the locustfile.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def shared_t0(records_prefix: str) -> float:
    """The client's t0 (wall clock): the first process to start sets it, the others read it
    (``os.link`` creates the file whole, or fails because it exists)."""
    path = Path(f"{records_prefix}-t0.json")
    mine = path.with_name(f"{path.name}.{os.getpid()}")
    mine.write_text(json.dumps(time.time()))
    try:
        os.link(mine, path)
    except FileExistsError:
        pass
    finally:
        mine.unlink()
    return float(json.loads(path.read_text()))


def closed_loop_quota(index: int, limit: int | None, share: int, mode: str) -> int | None:
    """A closed loop's share of ``max_requests`` (``limit``) for process ``index`` of
    ``share``: the shares add up to it exactly. None without a limit, or in an open loop (its
    schedule counts them all)."""
    if not limit or mode != "closed":
        return None
    return limit // share + (1 if index < limit % share else 0)


def plan_start(index: int, plan_len: int, share: int, turns: int) -> int:
    """Where process ``index`` of ``share`` starts in a closed loop's plan: an even part each,
    at a conversation's first turn (``turns`` requests to a conversation)."""
    return index * (plan_len // (share * turns)) * turns
