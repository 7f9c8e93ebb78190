"""Workload generation: length distributions, class mix, exact prompts, datasets, arrivals."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.errors import ConfigError
from tuner.loadgen import request_plan as wl
from tuner.testing.tiny_tokenizer import make_tiny_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tok_dir: Path) -> Any:
    return wl.load_tokenizer(str(tok_dir))


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _text(p: wl.PlannedRequest) -> str:
    text = p.prompt if p.messages is None else p.messages[0]["content"]
    assert text is not None
    return text


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------- distributions
def test_fixed_is_one_length() -> None:
    lengths = wl.sample_lengths(LengthDist(kind="fixed", mean=77, std=5), 100, _rng())
    assert set(lengths.tolist()) == {77}


def test_uniform_without_std_spans_low_to_high() -> None:
    # The quick-start's declaration: before, a missing std made every length the mean.
    dist = LengthDist(kind="uniform", mean=192, low=128, high=256)
    lengths = wl.sample_lengths(dist, 20_000, _rng())
    assert lengths.min() == 128 and lengths.max() == 256  # both ends are reached
    assert len(set(lengths.tolist())) == 129  # every length in between too
    assert np.mean(lengths) == pytest.approx(192, rel=0.01)


@pytest.mark.parametrize("kind", ["normal", "lognormal"])
def test_a_spread_without_std_is_refused_not_fixed(kind: str) -> None:
    with pytest.raises(ConfigError, match="std=0 never varies"):
        wl.sample_lengths(LengthDist(kind=kind, mean=77, std=0), 100, _rng())


@pytest.mark.parametrize(
    ("dist", "needle"),
    [
        (LengthDist(kind="uniform", mean=77), r"spans \[low, high\] = \[1, 1000000\]"),
        (LengthDist(kind="uniform", mean=100, low=128, high=256), "outside"),
        (LengthDist(kind="fixed", mean=300, high=256), "outside"),
        (LengthDist(kind="normal", mean=10, std=5, low=20, high=40), "outside"),
    ],
)
def test_a_range_that_disagrees_with_the_mean_is_refused(dist: LengthDist, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        dist.validate("workload.classes[0].prompt_tokens")
    assert "\n" not in err.value.one_line()


@pytest.mark.parametrize("kind", ["uniform", "normal", "lognormal"])
def test_distributions_have_the_asked_mean_and_std(kind: str) -> None:
    lengths = wl.sample_lengths(LengthDist(kind=kind, mean=500, std=100), 50_000, _rng(1))
    assert lengths.dtype == np.int64
    assert np.mean(lengths) == pytest.approx(500, rel=0.01)
    assert np.std(lengths) == pytest.approx(100, rel=0.03)


def test_uniform_spans_mean_plus_minus_sqrt3_std() -> None:
    lengths = wl.sample_lengths(LengthDist(kind="uniform", mean=100, std=10), 20_000, _rng())
    half = np.sqrt(3) * 10
    assert lengths.min() >= np.floor(100 - half) and lengths.max() <= np.ceil(100 + half)


@pytest.mark.parametrize("kind", ["uniform", "normal", "lognormal"])
def test_lengths_are_clipped_to_low_high(kind: str) -> None:
    dist = LengthDist(kind=kind, mean=100, std=80, low=60, high=150)
    lengths = wl.sample_lengths(dist, 20_000, _rng())
    assert lengths.min() >= 60 and lengths.max() <= 150


def test_lengths_are_at_least_one() -> None:
    lengths = wl.sample_lengths(LengthDist(kind="normal", mean=2, std=50), 5_000, _rng())
    assert lengths.min() >= 1


def test_classes_are_picked_by_weight() -> None:
    classes = [RequestClass(name="a", weight=1), RequestClass(name="b", weight=3)]
    picks = wl.pick_classes(classes, 40_000, _rng())
    assert np.mean(picks == 1) == pytest.approx(0.75, abs=0.01)


# ---------------------------------------------------------------------------- arrivals
@pytest.mark.parametrize(("rate", "burstiness"), [(20.0, 1.0), (5.0, 0.5), (100.0, 4.0)])
def test_arrival_gaps_have_mean_one_over_rate(rate: float, burstiness: float) -> None:
    gaps = np.fromiter(itertools.islice(wl.arrival_gaps(rate, burstiness, 3), 100_000), float)
    assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.02)
    # gamma(shape k): coefficient of variation 1/sqrt(k); 1 for Poisson arrivals
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1 / np.sqrt(burstiness), rel=0.03)


def test_arrival_gaps_are_seeded() -> None:
    first = list(itertools.islice(wl.arrival_gaps(10, 1, seed=7), 2000))
    again = list(itertools.islice(wl.arrival_gaps(10, 1, seed=7), 2000))
    other = list(itertools.islice(wl.arrival_gaps(10, 1, seed=8), 2000))
    assert first == again and first != other


# ---------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("n", [1, 2, 5, 64, 256, 1500])
def test_prompts_hit_the_exact_token_count(tokenizer: Any, n: int) -> None:
    synth = wl.PromptSynthesizer(tokenizer, _rng(n))
    for _ in range(5):
        assert _n_tokens(tokenizer, synth.make(n)) == n


def test_prompts_are_exact_without_word_tokens(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Force the general pool (any round-tripping token): the re-encode loop must still converge.
    monkeypatch.setattr(wl, "_MIN_WORD_POOL", 10**9)
    synth = wl.PromptSynthesizer(tokenizer, _rng())
    assert sum(_n_tokens(tokenizer, synth.make(n)) == n for n in range(20, 120, 5)) >= 19


def test_prompts_exclude_special_tokens(tokenizer: Any) -> None:
    synth = wl.PromptSynthesizer(tokenizer, _rng())
    assert not set(synth.pool.tolist()) & set(tokenizer.all_special_ids)
    assert "<s>" not in synth.make(300)


def test_real_model_tokenizer_if_present() -> None:
    path = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
    if not (path / "tokenizer.json").exists():
        pytest.skip("models/tiny-llama is built by scripts/setup.sh")
    tokenizer = wl.load_tokenizer(str(path))
    synth = wl.PromptSynthesizer(tokenizer, _rng())
    assert [_n_tokens(tokenizer, synth.make(n)) for n in (16, 256)] == [16, 256]


# ---------------------------------------------------------------------------- plans
def _workload(**kw: Any) -> WorkloadConfig:
    classes = [
        RequestClass(
            name="short",
            weight=3,
            prompt_tokens=LengthDist(kind="normal", mean=40, std=10, low=8, high=80),
            output_tokens=LengthDist(mean=16),
        ),
        RequestClass(name="chat", weight=1, api="chat", prompt_tokens=LengthDist(mean=24)),
    ]
    return WorkloadConfig(**{"classes": classes, **kw})


def test_plan_is_deterministic_and_exact(tok_dir: Path, tokenizer: Any) -> None:
    plan = wl.build_plan(_workload(seed=5), str(tok_dir), size=200)
    wl._PLAN_CACHE.clear()  # really synthesize again, not the memo
    assert plan == wl.build_plan(_workload(seed=5), str(tok_dir), size=200)
    assert plan != wl.build_plan(_workload(seed=6), str(tok_dir), size=200)
    for p in plan:
        assert _n_tokens(tokenizer, _text(p)) == p.prompt_tokens_target
    chats = [p for p in plan if p.request_class == "chat"]
    assert all(p.api == "chat" and p.prompt is None and p.messages for p in chats)
    assert 0.15 < len(chats) / len(plan) < 0.35
    assert {p.max_tokens for p in plan if p.request_class == "short"} == {16}


def _quickstart() -> WorkloadConfig:
    """The quick-start's workload as the CLI composes it from conf/."""
    from tuner.cli import compose

    return compose(["study=quickstart"]).workload


def test_quickstart_prompt_lengths_vary_within_the_declared_range(
    tok_dir: Path, tokenizer: Any
) -> None:
    workload = _quickstart()
    assert {rc.prompt_tokens.kind for rc in workload.classes} == {"uniform"}
    plan = wl.build_plan(workload, str(tok_dir), size=160)
    for rc in workload.classes:
        mine = [p for p in plan if p.request_class == rc.name]
        targets = [p.prompt_tokens_target for p in mine]
        assert len(set(targets)) > 1, (rc.name, set(targets))  # not one length per class
        dist, out = rc.prompt_tokens, rc.output_tokens
        assert dist.low <= min(targets) and max(targets) <= dist.high, rc.name
        assert all(out.low <= p.max_tokens <= out.high for p in mine)
        assert all(_n_tokens(tokenizer, _text(p)) == p.prompt_tokens_target for p in mine)


def test_quickstart_lengths_cover_the_range_and_follow_the_seed() -> None:
    workload = _quickstart()
    size = wl.plan_size(workload)
    first = wl.plan_lengths(workload, size)
    which, prompt_len, _ = first
    for k, rc in enumerate(workload.classes):
        got = prompt_len[which == k]
        dist = rc.prompt_tokens
        assert dist.low <= got.min() < dist.low + 0.1 * (dist.high - dist.low), rc.name
        assert dist.high - 0.1 * (dist.high - dist.low) < got.max() <= dist.high, rc.name
        assert np.mean(got) == pytest.approx(dist.mean, rel=0.05), rc.name
    again = wl.plan_lengths(workload, size)
    assert all(np.array_equal(a, b) for a, b in zip(again, first, strict=True))
    workload.seed += 1
    assert not np.array_equal(wl.plan_lengths(workload, size)[1], prompt_len)


def test_output_lengths_are_drawn_too() -> None:
    out = LengthDist(kind="uniform", mean=48, low=32, high=64)
    workload = WorkloadConfig(classes=[RequestClass(name="a", output_tokens=out)])
    _, _, output_len = wl.plan_lengths(workload, 2000)
    assert output_len.min() == 32 and output_len.max() == 64
    assert len(set(output_len.tolist())) > 16


def test_plan_round_trips_through_jsonl(tok_dir: Path, tmp_path: Path) -> None:
    plan = wl.build_plan(_workload(), str(tok_dir), size=20)
    wl.write_plan(tmp_path / "plan.jsonl", plan)
    assert wl.read_plan(tmp_path / "plan.jsonl") == plan


def test_plan_size_covers_an_open_loop_run() -> None:
    assert wl.plan_size(_workload(mode="open", rate=100, warmup_s=5, window_s=30)) == 4375
    closed = _workload(mode="closed", concurrency=16, warmup_s=5, window_s=30)
    assert wl.plan_size(closed) == 16 * 35 * 6
    assert wl.plan_size(_workload(mode="closed", concurrency=1)) == wl.MIN_PLAN_SIZE
    assert wl.plan_size(_workload(mode="open", rate=10_000, window_s=600)) == wl.MAX_PLAN_SIZE


# ---------------------------------------------------------------------------- datasets
def _write(path: Path, rows: list[Any]) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_dataset_rows_are_used(tok_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    rows = [
        {"prompt": "the model answer", "max_tokens": 7},
        {"prompt": "one two three four", "request_class": "chat"},
        {"prompt": "fast slow", "max_tokens": 3, "request_class": "short"},
    ]
    plan = wl.build_plan(_workload(dataset=_write(tmp_path / "d.jsonl", rows)), str(tok_dir))
    assert len(plan) == 3
    by_text = {_text(p): p for p in plan}
    assert by_text["the model answer"].max_tokens == 7
    chat = by_text["one two three four"]
    assert chat.api == "chat" and chat.max_tokens == 64  # drawn from the class's output dist
    assert by_text["fast slow"].request_class == "short"
    assert chat.prompt_tokens_target == _n_tokens(tokenizer, "one two three four")


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (['{"prompt": "ok"}', "{not json"], "d.jsonl:2"),
        ([{"text": "no prompt key"}], "prompt"),
        ([{"prompt": "x", "max_tokens": 0}], "max_tokens"),
        ([{"prompt": "x", "request_class": "nope"}], "nope"),
        ([], "no prompts"),
    ],
)
def test_bad_datasets_raise_config_error(
    tok_dir: Path, tmp_path: Path, rows: list[Any], needle: str
) -> None:
    path = _write(tmp_path / "d.jsonl", rows) if rows else str(tmp_path / "d.jsonl")
    if not rows:
        Path(path).write_text("\n")
    with pytest.raises(ConfigError, match=needle):
        wl.build_plan(_workload(dataset=path), str(tok_dir))


def test_missing_dataset_raises_config_error(tok_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read workload\.dataset"):
        wl.build_plan(_workload(dataset=str(tmp_path / "absent.jsonl")), str(tok_dir))


# ---------------------------------------------------------------------------- tokenizer errors
def test_missing_tokenizer_dir_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as err:
        wl.load_tokenizer(str(tmp_path / "nope"))
    assert "\n" not in err.value.one_line()


def test_unreadable_tokenizer_raises_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{broken")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot load a tokenizer") as err:
        wl.load_tokenizer(str(tmp_path))
    assert "\n" not in err.value.one_line()


def test_the_plan_is_built_ahead_while_the_server_starts(tok_dir: Path) -> None:
    """run_trial's planner thread leaves the plan in the cache the load phase reads."""
    from tuner.config import TunerConfig
    from tuner.trial.run import _plan_ahead

    config, tok = TunerConfig(), str(tok_dir)
    config.server.model = tok
    config.workload = WorkloadConfig(classes=[RequestClass(name="short")], concurrency=2)
    wl._PLAN_CACHE.clear()
    _plan_ahead(config).join(timeout=60)
    assert len(wl._PLAN_CACHE) == 1
    (cached,) = wl._PLAN_CACHE.values()
    assert wl.build_plan(config.workload, tok) == cached  # the load phase: a cache hit
