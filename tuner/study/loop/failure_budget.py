"""The failure budget: stop a study whose trials fail systematically, naming the top reason.

Single failures are outcomes the sampler learns from; a run of them (``max_consecutive_failures``)
or a high share (``max_failure_rate``, once 3 have failed) means the fixed args or the space are
wrong, and every further launch would waste minutes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tuner.config import StudyConfig
from tuner.errors import StudyFailedError


@dataclass
class FailureBudget:
    """Counts the launches of one run (``tuner run``), ok and failed."""

    config: StudyConfig
    failures: list[str] = field(default_factory=list)  # reasons, in order
    consecutive: int = 0
    ok: int = 0

    def count(self, ok: bool, reason: str) -> None:
        """Record one launch; StudyFailedError when the budget is spent."""
        if ok:
            self.consecutive, self.ok = 0, self.ok + 1
            return
        self.failures.append(reason)
        self.consecutive += 1
        share = len(self.failures) / (len(self.failures) + self.ok)
        if self.consecutive >= self.config.max_consecutive_failures or (
            len(self.failures) >= 3 and share > self.config.max_failure_rate
        ):
            top, times = Counter(self.failures).most_common(1)[0]
            raise StudyFailedError(
                f"stopping: {len(self.failures)} trials failed, most often {top} ({times}x)",
                hint="narrow the search space or fix the fixed args; the study can be resumed",
            )
