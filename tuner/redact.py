"""Secrets never leave the tuner: redaction of text and data before anything is written.

Everything `tuner report`, `tuner export` and `tuner dashboard` write (files, notes, artifacts,
terminal lines) passes through a :class:`Redactor`. It removes, in this order:

1. known secret *values* (API keys, tokens, database passwords) that it was given or found in
   the environment under a secret-looking name, wherever they occur;
2. the password part of URLs (``scheme://user:password@host``);
3. values assigned to secret-looking names (``HF_TOKEN=...``, ``"api_key": "..."``,
   ``--api-key ...``), so a secret it was not told about is still caught in the usual spellings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

MASK = "***"
MIN_SECRET_LEN = 4  # shorter "secrets" ("1", "on") would mask half a report
# Names whose value is a secret: env style (HF_TOKEN) and key/flag style (api_key, --api-key).
_SECRET_SUFFIX = r"(?:TOKEN|API[_-]?KEY|SECRET|SECRET[_-]KEY|PASSWORD|PASSWD|ACCESS[_-]?KEY)"
SECRET_NAME_RE = re.compile(rf"(?:^|[_-]){_SECRET_SUFFIX}$|^{_SECRET_SUFFIX}$", re.IGNORECASE)
_URL_PASSWORD_RE = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^\s:/@]+:)([^\s@/]+)(@)")
_VALUE = r"([^\s\"',;}\]]+)"
_ENV_ASSIGN_RE = re.compile(
    rf"\b([A-Z][A-Z0-9_]*_{_SECRET_SUFFIX}|HF_TOKEN|PASSWORD)\b([\"']?[ \t]*[=:][ \t]*[\"']?)"
    + _VALUE
)
_KEY_ASSIGN_RE = re.compile(
    r"\b(api_key|api-key|hf_token|password|passwd)\b([\"']?[ \t]*[=:][ \t]*[\"']?)" + _VALUE
)
_FLAG_RE = re.compile(r"(--(?:api-key|hf-token|password))([ \t]+|=)" + _VALUE)


def is_secret_name(name: str) -> bool:
    """True for names like HF_TOKEN, VLLM_API_KEY, api_key, db-password."""
    return bool(SECRET_NAME_RE.search(name.strip()))


def url_password(url: str) -> str | None:
    """The password of a SQLAlchemy-style URL, or None."""
    try:
        password = make_url(url).password
    except (ArgumentError, ValueError):
        return None
    return str(password) if password else None


def secret_values(env: Mapping[str, Any] | None = None, urls: Iterable[str] = ()) -> set[str]:
    """Values of secret-named variables in ``env`` plus the passwords of ``urls``."""
    found = {str(v) for k, v in (env or {}).items() if is_secret_name(k) and v}
    found.update(p for p in (url_password(u) for u in urls) if p)
    return {s for s in found if len(s) >= MIN_SECRET_LEN and s != MASK}


class Redactor:
    """Masks secrets in text and in JSON-like data (dicts, lists, strings)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len)[::-1]

    @classmethod
    def for_environment(
        cls, env: Mapping[str, Any] | None = None, urls: Iterable[str] = ()
    ) -> Redactor:
        """Secrets of this process's environment, of ``env`` and of ``urls``."""
        return cls(secret_values(os.environ) | secret_values(env, urls))

    def text(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        text = _URL_PASSWORD_RE.sub(rf"\1{MASK}\3", text)
        for pattern in (_ENV_ASSIGN_RE, _KEY_ASSIGN_RE, _FLAG_RE):
            text = pattern.sub(rf"\1\2{MASK}", text)
        return text

    def data(self, value: Any) -> Any:
        """A copy of ``value`` with secret-named keys masked and every string redacted."""
        if isinstance(value, Mapping):
            return {k: self._item(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def _item(self, key: str, value: Any) -> Any:
        if is_secret_name(key) and isinstance(value, str | int | float) and value != "":
            return MASK
        return self.data(value)
