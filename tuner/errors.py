"""The one exception tree of tuner.

Every error a user can cause or meet derives from :class:`TunerError`. Third-party errors
(Hydra, OmegaConf, Optuna, SQLAlchemy, subprocess, HTTP) are translated into this tree at the
boundary where they happen, so the CLI can print one line and pick the exit code.

::

    TunerError
    ├── ConfigError          bad config, override, search space or CLI use   (exit 2)
    │   └── PreflightError   a trial config rejected before any process starts (exit 2)
    ├── ServerError          the inference server could not be run
    │   ├── ServerStartError  exited or timed out during start-up (has .failure)
    │   └── ServerDiedError   died while serving load
    ├── LoadGenError         the load generator failed (not the server)
    ├── TelemetryError       a telemetry source could not be read (recorded, rarely raised)
    │   └── ScrapeError      the server's /metrics could not be fetched or parsed
    ├── StorageError         the study database could not be opened or written
    ├── ArtifactError        a trial artifact could not be written or read
    └── StudyFailedError     the study cannot go on (its baseline failed, its failure budget
                             ran out)

A tool's own errors derive from this tree where it lives (e.g. the dashboard's).

A trial turns ServerError/LoadGenError into a *failed trial outcome*; only errors that make the
whole run meaningless (config, storage) stop a study.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base of every tuner error. ``exit_code`` is what the CLI returns for it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message a user sees: what happened, and what to do."""
        text = " ".join(self.message.split())
        return f"{text} ({self.hint})" if self.hint else text


class ConfigError(TunerError):
    """Bad configuration, override, search space or command-line use."""

    exit_code = 2


class PreflightError(ConfigError):
    """A trial configuration that was rejected before any process was started."""


class ServerError(TunerError):
    """The inference server could not be run as asked."""

    def __init__(self, message: str, *, reason: str, log_tail: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason
        self.log_tail = log_tail


class ServerStartError(ServerError):
    """The server exited or timed out before it became ready."""


class ServerDiedError(ServerError):
    """The server died while it was serving load."""


class LoadGenError(TunerError):
    """The load generator itself failed (a client-side problem, not a server failure)."""


class TelemetryError(TunerError):
    """A telemetry source could not be read."""


class ScrapeError(TelemetryError):
    """The server's /metrics could not be fetched or parsed."""


class StorageError(TunerError):
    """The study storage could not be opened or written."""


class ArtifactError(TunerError):
    """A trial artifact could not be written or read."""


class StudyFailedError(TunerError):
    """The study stopped because trials fail systematically (or its baseline failed)."""
