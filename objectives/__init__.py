"""Pluggable objectives and constraints.

Every module in this package is imported by :func:`tuner.objective.load_plugins`; each registers
its classes with ``@register_objective`` / ``@register_constraint``. Modules here import only
tuner's public API (``tuner.objective``, ``tuner.measure``, ``tuner.config``). See README.md.
"""
