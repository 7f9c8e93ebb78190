"""The loop of ``tuner run``: everything before the first launch (``session``), the runner over
the stages (``runner``), one stage's search (``stage_search``), the trials on the executor
(``flights``), confirmations and extra repeats (``confirmation``), the launch and failure
budgets, the stage order and the pre-screen from the plan, and the plan's promise the summary
holds the result against (``promise``)."""
