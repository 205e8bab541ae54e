"""Tiny CLIP- and SigLIP-shaped towers for the tests: tokenizers written offline and the
architecture arguments of towers that build in a fraction of a second."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

#: the tiny towers' architecture (the encoders' own arguments)
VISION = {"width": 32, "layers": 2, "heads": 4, "ff_dim": 64, "patch_size": 16, "image_size": 32}
TEXT = {"width": 32, "layers": 2, "heads": 4, "ff_dim": 64}
WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding", "photo", "of", "blue", "square"]


def write_clip_tokenizer(directory: Path) -> Path:
    """A byte-level BPE tokenizer of CLIP's kind (start / end-of-text tokens, padding with the
    end token) whose vocabulary is the 256 byte symbols, alone and word-final, and no merges:
    it spells every text, one piece per character."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"])}
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(directory)
    return directory


def write_word_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer shaped like SigLIP's (``</s>`` ends every caption and pads it,
    ``<unk>`` for other words); SigLIP's own is SentencePiece, which needs the sentencepiece
    package the tests do without."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="</s>", unk_token="<unk>").save_pretrained(directory)
    return directory


@functools.cache
def tokenizer_dirs() -> dict[str, str]:
    """``{"clip": folder, "siglip": folder}``, written once per test process."""
    root = Path(tempfile.mkdtemp(prefix="xmatch-clip-tokenizers-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # one folder per test process, gone with it
    return {"clip": str(write_clip_tokenizer(root / "clip")), "siglip": str(write_word_tokenizer(root / "siglip"))}


def tiny_text(kind: str) -> dict:
    """The tiny text tower's arguments, with the test tokenizer of ``kind``."""
    if kind == "clip":
        return {**TEXT, "tokenizer": tokenizer_dirs()["clip"], "vocab_size": 514, "eos_token_id": 513, "projection_dim": 24}
    return {**TEXT, "tokenizer": tokenizer_dirs()["siglip"], "vocab_size": 3 + len(WORDS), "max_length": 12}


def tiny_tower_overrides(kind: str) -> dict:
    """Overrides that shrink a CLIP-family zoo entry (``kind``: ``clip`` or ``siglip``) to
    tiny towers, keeping its layout (no projection, identity reasoners, its pooler and loss)."""
    vision = {**VISION, "projection_dim": 24} if kind == "clip" else dict(VISION)
    return {"embed_dim": 24 if kind == "clip" else 32, "image_encoder": vision, "text_encoder": tiny_text(kind)}
