"""Stand-ins with known behaviour for tests: a stored study, a stand-in GPU server, a queueing
server. The streaming OpenAI-compatible server and the tiny tokenizer, which the benchmarks use
too, live in tuner.testing."""
