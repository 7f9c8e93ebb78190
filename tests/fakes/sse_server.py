"""The known-delay streaming server, kept under this name for the tests that import it or run
``python -m tests.fakes.sse_server``: it lives in :mod:`tuner.testing.sse_server`, where the
benchmarks reach it too."""

from __future__ import annotations

from tuner.testing.sse_server import FakeConfig, FakeServer, Timing, _Handler, main

__all__ = ["FakeConfig", "FakeServer", "Timing", "_Handler", "main"]

if __name__ == "__main__":
    main()
