"""Test doubles and replay-harness pieces shared by tuner's tests and its benchmarks.

Like ``optuna.testing``, this package is shipped with the product so that ``tests/`` and
``benchmarks/`` both import it and neither imports the other. Nothing here touches hardware:
every measurement is looked up in a table or computed from a stated model, and every server is
a local stand-in.

- :mod:`~tuner.testing.landscape`: a measured landscape (a grid table of repeats) and its truth;
- :mod:`~tuner.testing.gpu_landscape`: a GPU landscape (one truth per configuration, noise
  drawn per launch) and the GPU study a replay of it runs;
- :mod:`~tuner.testing.lookup`: a real :class:`~tuner.study.loop.runner.StudyRunner` whose trial
  function looks each launch up in a landscape, and the run's trace
  (:mod:`~tuner.testing.run_trace`);
- :mod:`~tuner.testing.grid_table`: a small synthetic grid table with known answers;
- :mod:`~tuner.testing.sse_server`: a streaming OpenAI-compatible server with known delays;
- :mod:`~tuner.testing.tiny_tokenizer`: a tokenizer trained on the spot (no download).

Submodules are imported by name (``from tuner.testing.lookup import StudyStrategy``): this
package imports none of them, so that loading one stand-in does not load the study machinery.
"""
