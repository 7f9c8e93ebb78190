"""What a study keeps in its storage: the RDB storage and its heartbeats (``storage``), opening a
study new or resumed (``resume``), the run's lease (``lease``), the baseline's fingerprint
(``fingerprint``), a stage read back from its trials (``stored_stage``), the quality gate's
reference outputs (``reference``) and a launch's params as the server runs them
(``params_as_run``), which decides whether a stored measurement may be reused."""
