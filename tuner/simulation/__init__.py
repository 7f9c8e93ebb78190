"""A simulated GPU host: vLLM's API served by AIConfigurator's estimates, for rehearsals.

``python -m tuner.simulation [vLLM flags]`` is started by the ``simulated_gpu`` server backend
(tuner.server.simulated) like vLLM; :mod:`~tuner.simulation.engine` is its continuous batching,
:mod:`~tuner.simulation.physics` its estimates, :mod:`~tuner.simulation.fake_nvml` its GPUs.
Nothing it serves is a measurement, and everything made on it says so.
"""
