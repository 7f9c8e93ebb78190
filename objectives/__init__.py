"""Pluggable objectives and constraints.

Every module in this package is imported when the study resolves its objectives; each registers
its classes with ``@register_objective`` / ``@register_constraint``. Modules here import only
tuner's public API (``from tuner import ...``), as a plugin of your own would. See README.md.
"""
