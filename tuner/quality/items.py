"""A quality set: prompts with what their answers are checked against, parsed from JSONL.

Format checks and reference matchers are registries by name (``format``, ``match`` in an item).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

DEFAULT_SET = Path(__file__).resolve().parents[2] / "conf" / "quality" / "default.jsonl"


@dataclass(frozen=True)
class QualityItem:
    """One prompt of a quality set and what its answer is checked against."""

    id: str
    prompt: str
    api: str = "completions"
    max_tokens: int | None = None
    format: str | None = None
    pattern: str | None = None
    reference: tuple[str, ...] = ()
    match: str = "prefix"
    long: bool = False

    @property
    def digest(self) -> str:
        """Identifies what was asked, so that outputs of different prompts are never compared."""
        key = json.dumps([self.api, self.prompt, self.max_tokens], ensure_ascii=False)
        return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Api:
    """An OpenAI-compatible endpoint: its path, the item's part of the body, the answer's text."""

    path: str
    body: Callable[[QualityItem], dict[str, Any]]
    text: Callable[[dict[str, Any]], str]  # one response choice -> the generated text


APIS: dict[str, Api] = {
    "completions": Api("/v1/completions", lambda i: {"prompt": i.prompt}, lambda c: c["text"]),
    "chat": Api(
        "/v1/chat/completions",
        lambda i: {"messages": [{"role": "user", "content": i.prompt}]},
        lambda c: c["message"]["content"] or "",
    ),
}

FormatCheck = Callable[[str, QualityItem], bool]
FORMAT_CHECKS: dict[str, FormatCheck] = {}


def register_format(name: str) -> Callable[[FormatCheck], FormatCheck]:
    """Make a format check available as ``"format": name`` in a quality set."""

    def deco(check: FormatCheck) -> FormatCheck:
        FORMAT_CHECKS[name] = check
        return check

    return deco


_FENCE = re.compile(r"^\s*```(?:json)?\s*")


@register_format("json")
def _json_value_first(text: str, item: QualityItem) -> bool:
    """The output starts with a complete JSON object or array (after an optional ```json fence).

    Text after it is allowed: with ``ignore_eos`` a model keeps generating after its answer.
    """
    try:
        value, _end = json.JSONDecoder().raw_decode(_FENCE.sub("", text, count=1).lstrip())
    except ValueError:
        return False
    return isinstance(value, dict | list)


@register_format("json_strict")
def _json_whole(text: str, item: QualityItem) -> bool:
    """The whole output (surrounding whitespace aside) is one JSON value."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@register_format("regex")
def _regex(text: str, item: QualityItem) -> bool:
    """``re.search(pattern, output)``: anchor with ^ / $ and add (?i), (?s) as needed."""
    return re.search(item.pattern or "", text) is not None


MATCHERS: dict[str, Callable[[str, str], bool]] = {
    "exact": lambda out, ref: out == ref,
    "prefix": lambda out, ref: out.startswith(ref),
    "contains": lambda out, ref: ref in out,
}


def _normalize(text: str) -> str:
    return " ".join(text.split()).casefold()


def is_correct(text: str, item: QualityItem) -> bool | None:
    """Whether the output matches a reference (case and whitespace ignored); None: no reference."""
    if not item.reference:
        return None
    out, matcher = _normalize(text), MATCHERS[item.match]
    return any(matcher(out, _normalize(ref)) for ref in item.reference)


def format_ok(text: str, item: QualityItem) -> bool | None:
    """Whether the output has the item's format; None when the item asks for none."""
    return FORMAT_CHECKS[item.format](text, item) if item.format else None


_ITEM_KEYS = {f.name for f in fields(QualityItem)}


def load_items(path: str | Path | None = None) -> list[QualityItem]:
    """Parse and check a quality set; a ConfigError names the file and line of any problem."""
    source = Path(path).expanduser() if path else DEFAULT_SET
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(
            f"quality set {source} cannot be read: {exc.strerror}",
            hint="set quality.prompts to a JSONL file, or leave it unset for the default set",
        ) from exc
    items = [parse_item(line, f"{source}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not items:
        raise ConfigError(f"quality set {source} has no prompts")
    ids = [i.id for i in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"quality set {source}: duplicate id(s) {', '.join(dupes)}")
    return items


def parse_item(line: str, where: str) -> QualityItem:
    """One JSONL line -> a checked item; ``where`` (file:line) starts every error message."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f'{where}: expected a JSON object like {{"id": ..., "prompt": ...}}')
    unknown = sorted(set(raw) - _ITEM_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}",
            hint=f"known keys: {', '.join(sorted(_ITEM_KEYS))}",
        )
    if not isinstance(raw.get("id"), str | int) or not isinstance(raw.get("prompt"), str):
        raise ConfigError(f"{where}: 'id' and 'prompt' (a string) are required")
    ref = raw.get("reference", ())
    refs = [ref] if isinstance(ref, str) else ref
    if not isinstance(refs, list | tuple) or not all(isinstance(r, str) for r in refs):
        raise ConfigError(f"{where}: 'reference' must be a string or a list of strings")
    item = QualityItem(**{**raw, "id": str(raw["id"]), "reference": tuple(refs)})
    _check_item(item, where)
    return item


def _check_item(item: QualityItem, where: str) -> None:
    for key, value, known in (
        ("api", item.api, tuple(APIS)),
        ("format", item.format, tuple(FORMAT_CHECKS)),
        ("match", item.match, tuple(MATCHERS)),
    ):
        if value is not None and value not in known:
            raise ConfigError(f"{where}: {key}={value!r} is unknown (known: {', '.join(known)})")
    tokens = item.max_tokens
    if tokens is not None and (type(tokens) is not int or tokens < 1):
        raise ConfigError(f"{where}: max_tokens must be an integer >= 1, got {tokens!r}")
    if item.format == "regex":
        if not item.pattern:
            raise ConfigError(f"{where}: format 'regex' needs a 'pattern'")
        try:
            re.compile(item.pattern)
        except re.error as exc:
            raise ConfigError(f"{where}: bad regex pattern {item.pattern!r}: {exc}") from None
    if type(item.long) is not bool:
        raise ConfigError(f"{where}: 'long' must be true or false")
