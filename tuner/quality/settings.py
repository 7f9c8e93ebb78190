"""Moved: QualityConfig lives in tuner.config."""

from tuner.config import QualityConfig

__all__ = ["QualityConfig"]
