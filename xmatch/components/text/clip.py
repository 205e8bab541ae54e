"""CLIP and SigLIP text towers (``transformers``' ``CLIPTextModel`` / ``SiglipTextModel``) as
xmatch text encoders: word-piece tokens, and the tower's own pooled embedding.

Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML
2021 (CLIP); Zhai et al., "Sigmoid Loss for Language Image Pre-Training", ICCV 2023 (SigLIP).

The global slot (position 0 of the encoder's output) is exactly what
``CLIPModel.get_text_features`` / ``SiglipModel.get_text_features`` return (``pooler_output``)
for the same token ids, bit for bit: CLIP's end-of-text state through ``text_projection``, in
the place of the start token (never content); SigLIP's last position through its ``head``, in a
column 0 that :meth:`tokenize` adds before the ids (SigLIP has no start token). The word pieces
follow, each through that same
projection / head, so that late interaction (``MrSw``, ``MrAvgw``: FILIP-style) compares them
with the image tower's patch tokens in the joint space. The start and end tokens and padding
are never content. See :mod:`xmatch.components.image.clip` for why the model around these
towers must not project again (``text_projection = false``).

Tokenisation is the hub's: CLIP pads each batch to its longest caption and masks the padding
(``padding=True``); SigLIP pads every caption to ``max_length`` (64) and attends to the
padding, as it was trained (``padding="max_length"``, no attention mask), pooling the last
position. The tokenizer's files come from ``tokenizer``: a local folder, or the model's hub
repository at the pinned revision of its weights, ``hf-hub:org/name@revision``, fetched into
xmatch's cache (:func:`xmatch.io.hub.cache_dir`, offline with ``XMATCH_OFFLINE=1`` /
``HF_HUB_OFFLINE=1``). It is loaded on first use, so a model builds (random weights, a
parameter count) with no network and no tokenizer files.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmatch.components.text.side import TokenCoverage
from xmatch.core.errors import XmatchError
from xmatch.core.sources import HF_HUB, resolve_local_source
from xmatch.model.interfaces import EncoderOutput, TextEncoder, TokenBatch, check_caption_list
from xmatch.model.masks import lengths_to_mask

#: the files a tokenizer of these towers may need (byte-level BPE for CLIP, SentencePiece for SigLIP)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "spiece.model",
)
TOKENIZER_DIR = "text_encoder"


class TokenizerLoadError(XmatchError, OSError):
    """A text tower's tokenizer that cannot be loaded (missing, offline and not cached, or not
    the tokenizer the tower was configured for); the message names it and the fix."""


def load_tokenizer(source: str, encoder: str) -> Any:
    """The ``transformers`` tokenizer at ``source``: a local folder, ``package:`` / ``zoo:``,
    ``hf-hub:org/name@revision`` (its tokenizer files, fetched into xmatch's cache), or a bare
    hub id (through transformers' own cache).

    Example:
        >>> tok = load_tokenizer("hf-hub:openai/clip-vit-base-patch32@3d74acf9a28c67741b2f4f2ea7635f0aaf6f0268", "clip-text")  # downloads 4 MB  # doctest: +SKIP
    """
    from transformers import AutoTokenizer

    location = _fetch_tokenizer(source, encoder) if source.startswith(HF_HUB) else resolve_local_source(source)
    try:
        return AutoTokenizer.from_pretrained(location)
    except Exception as exc:  # OSError, ValueError, ImportError (sentencepiece), tokenizers' bare Exception
        hint = (
            " SigLIP's tokenizer is SentencePiece: pip install 'xmatch-zoo[clip]' (sentencepiece)." if "sentencepiece" in str(exc).lower()
            else " Give a folder with the tokenizer files transformers writes (save_pretrained), or the hub repository."
        )
        raise TokenizerLoadError(f"text encoder '{encoder}': cannot load the tokenizer '{source}' ({_first_line(exc)}).{hint}") from exc


def _fetch_tokenizer(source: str, encoder: str) -> str:
    """The local folder of the tokenizer files of ``hf-hub:org/name@revision``, in the Hugging
    Face layout under xmatch's cache (where ``hf-hub:`` weights go too), each file checked
    against the sha256 or git blob sha1 the Hub named it by (:func:`xmatch.io.hub.fetch_hf_files`)."""
    from xmatch.io import hub

    try:
        return str(hub.fetch_hf_files(source, list(TOKENIZER_FILES)))
    except hub.CorruptCacheError:
        raise  # names the damaged file and the fix
    except hub.OfflineError:
        raise TokenizerLoadError(
            f"text encoder '{encoder}': offline, and the tokenizer of '{source}' is not in the cache "
            f"{hub.cache_dir() / 'huggingface'}. Fetch it once online (`xmatch download ENTRY` fetches an entry's weights "
            "and tokenizer; or encode a caption), then copy the cache; or give tokenizer = a local folder."
        ) from None
    except hub.DownloadError as exc:  # unknown repository or revision, the Hub unreachable
        raise TokenizerLoadError(f"text encoder '{encoder}': cannot fetch the tokenizer '{source}' ({_first_line(exc)}).") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class _TowerTextEncoder(TextEncoder):
    """What the CLIP and SigLIP text towers share: the lazily loaded tokenizer, tokenisation,
    freezing, the upstream checkpoint's names. Subclasses build ``self.text_model`` and
    implement :meth:`_embed` (ids, mask -> pooled ``[B, D]``, tokens ``[B, L, D]``)."""

    name = ""
    upstream_prefixes: tuple[str, ...] = ("text_model.",)
    #: the spec keys :meth:`save_assets` returns, named without loading the tokenizer: a
    #: model's fingerprint leaves them out, so indexing pictures fetches no tokenizer
    asset_keys = ("tokenizer",)
    #: whether :meth:`tokenize` adds a column 0 for the global slot (SigLIP has no start token
    #: whose place it can take)
    slot_column = False
    #: pad every caption to ``max_length`` and attend to the padding (SigLIP), or pad each
    #: batch to its longest caption and mask the padding (CLIP)
    pad_to_max_length = False
    #: lowercase the captions before the tokenizer (the SigLIP 2 checkpoints were trained on
    #: lowercased text, and their tokenizer keeps case)
    lowercase = False

    def __init__(self, tokenizer: str | None, max_length: int, finetune: bool) -> None:
        super().__init__()
        self.tokenizer_source = tokenizer
        self.max_length = max_length
        self.finetune = finetune
        self._tokenizer: Any = None

    def _finish_init(self) -> None:
        self.requires_grad_(self.finetune)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded from ``tokenizer`` on first use."""
        if self._tokenizer is None:
            if self.tokenizer_source is None:
                raise TokenizerLoadError(
                    f"text encoder '{self.name}' has no tokenizer: give tokenizer = a folder with the tokenizer files or "
                    "hf-hub:org/name@revision (the zoo entries name their hub repository)."
                )
            tokenizer = load_tokenizer(self.tokenizer_source, self.name)
            self._check_tokenizer(tokenizer)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _check_tokenizer(self, tokenizer: Any) -> None:
        vocab = self.text_model.config.vocab_size
        if len(tokenizer) > vocab:
            raise TokenizerLoadError(
                f"text encoder '{self.name}': the tokenizer '{self.tokenizer_source}' has {len(tokenizer)} tokens but the "
                f"tower's vocabulary has {vocab}; give the tokenizer of the same model as the weights."
            )
        if tokenizer.pad_token_id is None:
            raise TokenizerLoadError(f"text encoder '{self.name}': the tokenizer '{self.tokenizer_source}' has no padding token.")

    def upstream_names(self, keys: set[str]) -> dict[str, str | None]:
        """``{key of an upstream checkpoint: key of this encoder}`` for the tensors of ``keys``
        that are this encoder's (see
        :meth:`xmatch.components.image.clip.ClipImageEncoder.upstream_names`).

        Example:
            >>> enc = ClipTextEncoder(width=16, layers=1, heads=2, ff_dim=32, vocab_size=64, projection_dim=8, eos_token_id=63)
            >>> enc.upstream_names({"text_projection.weight", "text_model.embeddings.position_ids", "logit_scale"})
            {'text_model.embeddings.position_ids': None, 'text_projection.weight': 'text_projection.weight'}
        """
        return {k: (None if k.endswith(".position_ids") else k) for k in sorted(keys) if k.startswith(self.upstream_prefixes)}

    def tokenize(self, texts: list[str]) -> TokenBatch:
        check_caption_list(texts)
        tokenizer = self.tokenizer
        ids = tokenizer(self._as_trained(texts), add_special_tokens=True, truncation=False)["input_ids"]
        too_long = [k for k, seq in enumerate(ids) if len(seq) > self.max_length]
        if too_long:
            warnings.warn(
                f"captions {too_long[:10]} have more than {self.max_length} tokens and are truncated to the "
                "tower's maximum (the end token kept).", stacklevel=3,
            )
            ids = [seq if len(seq) <= self.max_length else seq[: self.max_length - 1] + seq[-1:] for seq in ids]
        lengths = torch.tensor([len(seq) for seq in ids])
        width = self.max_length if self.pad_to_max_length else int(lengths.max())
        input_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
        for k, seq in enumerate(ids):
            input_ids[k, : len(seq)] = torch.tensor(seq)
        real = lengths_to_mask(lengths, width)
        # an unknown token stands for a word of the caption, unless it is also the end token (CLIP's BPE)
        framing = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
        unknown = {tokenizer.unk_token_id} - framing
        special = torch.tensor(sorted(set(tokenizer.all_special_ids) - unknown))
        content = real & ~torch.isin(input_ids, special)
        empty = (~content.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"captions {empty} have no words left to match ({[texts[k] for k in empty[:3]]!r}); remove empty captions."
            )
        # SigLIP attends to its padding (as trained): every position is a real input of the tower
        mask = torch.ones_like(real) if self.pad_to_max_length else real
        if self.slot_column:  # position 0 holds the global slot: a column the tower does not read
            input_ids = torch.cat([input_ids.new_full((len(ids), 1), tokenizer.pad_token_id), input_ids], dim=1)
            mask = torch.cat([mask.new_ones(len(ids), 1), mask], dim=1)
            content = torch.cat([content.new_zeros(len(ids), 1), content], dim=1)
        return TokenBatch({"input_ids": input_ids}, mask, content, list(texts))

    def token_coverage(self, texts: list[str]) -> TokenCoverage | None:
        """How many pieces of ``texts`` the tokenizer maps to its unknown token; None for CLIP's
        byte-level BPE, which spells every text."""
        tokenizer = self.tokenizer
        unk = tokenizer.unk_token_id
        if unk is None or unk in (tokenizer.eos_token_id, tokenizer.pad_token_id):
            return None
        fast = bool(getattr(tokenizer, "is_fast", False))
        texts = self._as_trained(texts)
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=fast)
        words: Counter[str] = Counter()
        unknown, tokens = [], []
        for k, ids in enumerate(encoded["input_ids"]):
            hits = [j for j, i in enumerate(ids) if i == unk]
            if hits and fast:
                words.update(texts[k][slice(*encoded["offset_mapping"][k][j])].lower() for j in hits)
            unknown.append(len(hits))
            tokens.append(len(ids))
        return TokenCoverage.from_counts(unknown, tokens, words)

    def _as_trained(self, texts: list[str]) -> list[str]:
        """The captions as the tower was trained to read them (lowercased where it was)."""
        return [t.lower() for t in texts] if self.lowercase else list(texts)

    def _embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Token ids and mask of :meth:`tokenize` -> ``[B, L, D]``: the pooled embedding at
        position 0, the tokens' after it."""
        raise NotImplementedError

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            tokens = self._embed(batch.inputs["input_ids"], batch.mask)
        return EncoderOutput(tokens, batch.mask, batch.content, global_slot=True)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        self.tokenizer.save_pretrained(Path(directory) / TOKENIZER_DIR)
        return {"tokenizer": TOKENIZER_DIR}


class ClipTextEncoder(_TowerTextEncoder):
    """CLIP's text tower (``CLIPTextModel`` + ``text_projection``): the projected end-of-text
    state as the global slot, every word piece through the same projection. Defaults: the text
    tower of ``openai/clip-vit-base-patch32`` (and of every OpenAI CLIP ViT-B).

    Args:
        tokenizer: where the tokenizer is (``hf-hub:org/name@revision``, a local folder);
            loaded on first use.
        width, layers, heads, ff_dim: the transformer's hidden size, depth, heads, MLP width.
        vocab_size: rows of the token embedding (49,408 BPE tokens).
        max_length: positions (77); longer captions are truncated with a warning.
        projection_dim: width of the joint embedding (``text_projection``).
        eos_token_id: the end-of-text token, whose state is pooled (49,407 in CLIP's BPE).
        activation, layer_norm_eps: the MLP's activation and the layer norms' epsilon.
        finetune: train the tower (default); False freezes it.

    Example:
        >>> enc = ClipTextEncoder(tokenizer="hf-hub:openai/clip-vit-base-patch32@3d74acf9a28c67741b2f4f2ea7635f0aaf6f0268")
        >>> out = enc(enc.tokenize(["a photo of a cat"]))  # fetches the tokenizer (4 MB)  # doctest: +SKIP
        >>> out.tokens.shape  # the global slot (in the start token's place), a photo of a cat <end>  # doctest: +SKIP
        torch.Size([1, 7, 512])
    """

    name = "clip-text"
    upstream_prefixes = ("text_model.", "text_projection.")

    def __init__(
        self,
        tokenizer: str | None = None,
        width: int = 512,
        layers: int = 12,
        heads: int = 8,
        ff_dim: int = 2048,
        vocab_size: int = 49408,
        max_length: int = 77,
        projection_dim: int = 512,
        eos_token_id: int = 49407,
        activation: str = "quick_gelu",
        layer_norm_eps: float = 1e-5,
        finetune: bool = True,
    ) -> None:
        super().__init__(tokenizer, max_length, finetune)
        from transformers import CLIPTextConfig, CLIPTextModel

        _check_heads(width, heads)
        config = CLIPTextConfig(
            vocab_size=vocab_size, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ff_dim, max_position_embeddings=max_length, projection_dim=projection_dim,
            bos_token_id=None, eos_token_id=eos_token_id, hidden_act=activation, layer_norm_eps=layer_norm_eps,
        )
        self.text_model = CLIPTextModel(config)
        self.text_projection = nn.Linear(width, projection_dim, bias=False)
        self.output_dim = projection_dim
        self._finish_init()

    def _check_tokenizer(self, tokenizer: Any) -> None:
        super()._check_tokenizer(tokenizer)
        eos = self.text_model.config.eos_token_id
        if tokenizer.eos_token_id != eos:
            raise TokenizerLoadError(
                f"text encoder 'clip-text': the tokenizer '{self.tokenizer_source}' ends captions with token "
                f"{tokenizer.eos_token_id}, but the tower pools token eos_token_id = {eos}; set eos_token_id to the "
                "tokenizer's end token."
            )

    def _embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.text_model(input_ids=input_ids, attention_mask=mask.long())
        # CLIPModel.get_text_features: text_projection(final layer norm at the end token); it
        # takes the place of the start token, which is never content
        pooled = self.text_projection(out.pooler_output)
        return torch.cat([pooled.unsqueeze(1), self.text_projection(out.last_hidden_state[:, 1:])], dim=1)


class SiglipTextEncoder(_TowerTextEncoder):
    """SigLIP's text tower (``SiglipTextModel`` with its ``head``): the head's output at the
    last position as the global slot, every word piece through the same head. Defaults: the
    text tower of ``google/siglip-base-patch16-224``.

    Args:
        tokenizer: where the tokenizer is (``hf-hub:org/name@revision``, a local folder;
            SigLIP's SentencePiece tokenizer needs ``pip install 'xmatch-zoo[clip]'``, which installs sentencepiece).
        width, layers, heads, ff_dim: the transformer's hidden size, depth, heads, MLP width.
        vocab_size: rows of the token embedding (32,000).
        max_length: positions (64); every caption is padded to it.
        projection_dim: width of the joint embedding (the head's output; None: ``width``).
        activation, layer_norm_eps: the MLP's activation and the layer norms' epsilon.
        lowercase: lowercase the captions before the tokenizer, as the SigLIP 2 checkpoints
            were trained (their Gemma tokenizer keeps case); the captions the batch carries
            stay as given.
        finetune: train the tower (default); False freezes it.

    Example:
        >>> enc = SiglipTextEncoder(tokenizer="hf-hub:google/siglip-base-patch16-224@7fd15f0689c79d79e38b1c2e2e2370a7bf2761ed")
        >>> enc(enc.tokenize(["a photo of a cat"])).tokens.shape  # fetches the tokenizer; needs sentencepiece  # doctest: +SKIP
        torch.Size([1, 65, 768])
        >>> # the global slot, then 64 positions: the caption's pieces, </s>, padding
    """

    name = "siglip-text"
    upstream_prefixes = ("text_model.",)
    pad_to_max_length = True
    slot_column = True

    def __init__(
        self,
        tokenizer: str | None = None,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        ff_dim: int = 3072,
        vocab_size: int = 32000,
        max_length: int = 64,
        projection_dim: int | None = None,
        activation: str = "gelu_pytorch_tanh",
        layer_norm_eps: float = 1e-6,
        lowercase: bool = False,
        finetune: bool = True,
    ) -> None:
        super().__init__(tokenizer, max_length, finetune)
        from transformers import SiglipTextConfig, SiglipTextModel

        self.lowercase = lowercase

        _check_heads(width, heads)
        config = SiglipTextConfig(
            vocab_size=vocab_size, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ff_dim, max_position_embeddings=max_length, projection_size=projection_dim,
            hidden_act=activation, layer_norm_eps=layer_norm_eps, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
        self.text_model = SiglipTextModel(config)
        self.output_dim = config.projection_size
        self._finish_init()

    def _embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # SiglipModel.get_text_features with the hub's inputs (column 0 is the global slot's):
        # ids padded to max_length, no attention mask
        out = self.text_model(input_ids=input_ids[:, 1:])
        return torch.cat([out.pooler_output.unsqueeze(1), self.text_model.head(out.last_hidden_state)], dim=1)


def _check_heads(width: int, heads: int) -> None:
    if width % heads:
        raise ValueError(f"text tower: width={width} is not divisible by heads={heads}; choose heads that divide it.")
