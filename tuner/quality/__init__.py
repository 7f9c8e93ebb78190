"""The quality gate: no precision change wins without a quality regression check.

A *quality set* is a JSONL file, one prompt a line (``conf/quality/default.jsonl`` is shipped)::

    {"id": "capital", "prompt": "The capital of France is", "reference": "Paris"}
    {"id": "person", "prompt": "...", "format": "json"}
    {"id": "date", "prompt": "...", "format": "regex", "pattern": "\\d{4}-\\d{2}-\\d{2}"}
    {"id": "passkey", "prompt": "<a long text>", "long": true, "reference": "71432",
     "match": "contains"}

Keys: ``id``, ``prompt`` (required); ``api`` (completions | chat); ``max_tokens``; ``format``
(json | json_strict | regex, with ``pattern``); ``reference`` (a string or a list of accepted
answers) and ``match`` (prefix | exact | contains; case and whitespace are ignored); ``long``.

Flow: after a trial's load test, outside its measurement window, :func:`run_quality_set` sends
the set to the trial's server (sequential, greedy, fixed length) and writes ``quality.jsonl``
into the trial folder. :func:`attach_quality` scores it against the baseline trial's
``quality.jsonl`` (:mod:`tuner.quality.score`); in a gated stage (one that searches
quantization, kv_cache_dtype or dtype) the ``quality_vs_baseline`` constraint
(``objectives/quality.py``) makes the trial infeasible when a gated metric drops by more than
its tolerance.
"""

from tuner.config import QualityConfig
from tuner.quality.collect import OUTPUTS_FILE, QualityOutput, QualityOutputs, run_quality_set
from tuner.quality.items import (
    DEFAULT_SET,
    FORMAT_CHECKS,
    MATCHERS,
    QualityItem,
    format_ok,
    is_correct,
    load_items,
    register_format,
)
from tuner.quality.result import (
    GATE_METRICS,
    QualityResult,
    QualityScores,
    context_excess,
    quality_attrs,
    quality_line,
)
from tuner.quality.score import (
    agreement,
    attach_quality,
    check_config,
    drops,
    gate_applies,
    quality_fingerprint,
    score,
)

__all__ = [
    "DEFAULT_SET",
    "FORMAT_CHECKS",
    "GATE_METRICS",
    "MATCHERS",
    "OUTPUTS_FILE",
    "QualityConfig",
    "QualityItem",
    "QualityOutput",
    "QualityOutputs",
    "QualityResult",
    "QualityScores",
    "agreement",
    "attach_quality",
    "check_config",
    "context_excess",
    "drops",
    "format_ok",
    "gate_applies",
    "is_correct",
    "load_items",
    "quality_attrs",
    "quality_fingerprint",
    "quality_line",
    "register_format",
    "run_quality_set",
    "score",
]
