"""Stand-ins with known behaviour for tests: a stored study, a stand-in GPU server, a queueing
server. The streaming OpenAI-compatible server and the tiny tokenizer, which the benchmarks use
too, live in tuner.testing; they are named here as well, where the integration and fault tests
import them."""

from __future__ import annotations

from tuner.testing.tiny_tokenizer import make_tiny_tokenizer

__all__ = ["make_tiny_tokenizer"]
