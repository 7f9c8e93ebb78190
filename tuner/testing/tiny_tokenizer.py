"""A tiny tokenizer built on the spot: a byte-level BPE trained on a synthetic corpus, saved as a
Hugging Face tokenizer folder, so that a request plan can be sized without downloading a model."""

from __future__ import annotations

from pathlib import Path

_WORDS = (
    "the a model token cache batch queue server request prompt output latency throughput "
    "prefill decode kernel tensor parallel memory page block schedule quantize answer question "
    "one two three four five six seven eight nine ten fast slow small large"
)


def make_tiny_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """Train a byte-level BPE on a synthetic corpus and save it as a HF tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = _WORDS.split()
    corpus = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) for i in range(200)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.save_pretrained(str(path))
    return path
