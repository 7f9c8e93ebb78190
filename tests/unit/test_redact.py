"""Redaction: known secret values, URL passwords and secret-named assignments are masked."""

from __future__ import annotations

import pytest

from tuner.redact import MASK, Redactor, is_secret_name, secret_values


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("HF_TOKEN=hf_abc123 rest", f"HF_TOKEN={MASK} rest"),
        ('export VLLM_API_KEY="abc"', f'export VLLM_API_KEY="{MASK}"'),
        ('{"HF_TOKEN": "abcdef"}', f'{{"HF_TOKEN": "{MASK}"}}'),
        ("postgresql+psycopg://u:pw123@h:5432/db", f"postgresql+psycopg://u:{MASK}@h:5432/db"),
        ("--api-key abcd --port 1", f"--api-key {MASK} --port 1"),
        ("api_key: xyz", f"api_key: {MASK}"),
        # Not secrets: a Secret's key name, token counts, a variable named on its own.
        ("key: vllm-api-key\n  optional: true", "key: vllm-api-key\n  optional: true"),
        ("max_tokens: 64, kv_cache_tokens: 9", "max_tokens: 64, kv_cache_tokens: 9"),
        ("- name: VLLM_API_KEY\n  valueFrom:", "- name: VLLM_API_KEY\n  valueFrom:"),
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert Redactor().text(text) == expected


def test_known_values_are_masked_anywhere_longest_first() -> None:
    r = Redactor(["secret-1234", "secret-1234-long", "ab"])  # "ab" is too short to mask
    assert r.text("x secret-1234-long y secret-1234 ab") == f"x {MASK} y {MASK} ab"


def test_data_masks_secret_keys_and_nested_strings() -> None:
    r = Redactor(["planted-9999"])
    data = {"env": {"HF_TOKEN": "x1234", "A": "b"}, "notes": ["see planted-9999"], "n": 3}
    assert r.data(data) == {"env": {"HF_TOKEN": MASK, "A": "b"}, "notes": [f"see {MASK}"], "n": 3}


def test_secret_names_and_values_from_env_and_urls() -> None:
    names = ["HF_TOKEN", "VLLM_API_KEY", "api_key", "db-password", "AWS_SECRET_ACCESS_KEY"]
    assert all(is_secret_name(n) for n in names)
    assert not any(is_secret_name(n) for n in ["key", "max_tokens", "secretKeyRef", "MODEL"])
    env = {"HF_TOKEN": "hf_value_1", "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_API_KEY": "1"}
    found = secret_values(env, ["postgresql://u:pw-5678@h/db", "sqlite:///x.db"])
    assert found == {"hf_value_1", "pw-5678"}


def test_for_environment_reads_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_from_env_42")
    assert Redactor.for_environment().text("token hf_from_env_42") == f"token {MASK}"
