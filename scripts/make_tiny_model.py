"""Build a tiny, real Hugging Face Llama model folder that vLLM (CPU build) loads and serves.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a synthetic corpus and
the weights are random (seeded), so the output is deterministic for a given seed. Facts that
shaped it: head_dim must be 64 for vLLM's CPU attention kernel, and a
chat template is needed for /v1/chat/completions.

Usage: python scripts/make_tiny_model.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "model",
    "server",
    "token",
    "cache",
    "batch",
    "latency",
    "throughput",
    "memory",
    "request",
    "prompt",
    "output",
    "tensor",
    "parallel",
    "quantize",
    "kernel",
    "decode",
    "prefill",
    "queue",
    "schedule",
    "page",
    "block",
    "time",
    "second",
    "fast",
    "slow",
    "large",
    "small",
    "high",
    "low",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "data",
    "value",
    "result",
    "system",
    "user",
    "assistant",
    "answer",
    "question",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 30))]
        digits = str(rng.randint(0, 10_000))
        out.append(" ".join(words) + f' {digits}, {{"k": [1, 2]}}.')
    return out


def build_tokenizer(seed: int, vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<unk>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, bos: int, eos: int, pad: int, seed: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # 16 is rejected by the CPU attention kernel
        max_position_embeddings=4096,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=512)
    args = parser.parse_args(argv)
    tok = build_tokenizer(args.seed, args.vocab_size)
    model = build_model(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(args.out)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"tiny model written to {args.out} (vocab {len(tok)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
