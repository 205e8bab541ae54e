"""Everything a plugin may use: the extension surface of xmatch, in one module.

A plugin distribution (``plugins/xmatch-scan``, ``xmatch-vsepp``, ``xmatch-oan``, the one
``docs/tutorial-plugin.md`` writes) imports from here, from ``xmatch`` itself and from the
public modules it names (``xmatch.core.registry``, ``xmatch.core.spec``, ``xmatch.eval``, ``xmatch.data``),
never a name that starts with ``_`` nor a module ``xmatch._*``: those may change in any release.
``tests/test_public_surface.py`` holds the plugins in this repository to that.

Base classes (subclass one, declare it under the entry-point group ``xmatch_<kind>``):

- :class:`ImageEncoder`, :class:`TextEncoder`, :class:`Reasoner`, :class:`Pooler`,
  :class:`Loss`, :class:`Verifier` (a head that scores an image-caption pair for re-ranking):
  the component kinds; :class:`RegionFeaturesImageEncoder` hands precomputed region
  features on (padded slots zeroed, inputs checked); :class:`WordTextEncoder` gives a
  word-level text encoder its vocabulary, tokenizer, unknown-word measure and saved assets;
  :class:`RNNTextEncoder`, :class:`BiGRUTextEncoder`, :class:`BiLSTMTextEncoder` are the
  recurrent encoders to extend (SCAN's text encoder is a :class:`BiGRUTextEncoder`);
  :class:`AlignmentPooler` is the base of a pooler that takes maxima of the region x word
  cosine matrix (its ``alignment``, ``region_max`` and ``word_max`` apply the masks).

Records passed between components:

- :class:`EncoderOutput` (encoder -> model; ``EncoderOutput.global_vector`` for one global
  slot), :class:`TokenBatch` (tokenizer -> text encoder), :class:`Embeddings` (model ->
  poolers, index, disk), :class:`LossOutput`, :class:`MatchingModel`;
- image inputs (model -> image encoder): :class:`RegionInputs` (regions, boxes, mask; checked
  when made), :class:`PixelInputs` (pictures), :data:`ImageInputs` (either); an image encoder
  declares which it reads with ``input_type`` (:func:`input_type_of` reads it off any encoder).

The word-level text pipeline (one for every word-id encoder):

- :func:`split_words`, :class:`Vocabulary`, :func:`load_vocabulary` (caption file,
  ``vocab.json``, the original SCAN / VSE++ vocabulary file, word list), :func:`with_markers`
  (``<start>`` / ``<end>`` at ids 2 and 3), :func:`read_original_vocabulary`,
  :func:`tokenize_words` (truncation warning, markers, padding), :func:`uniform_word_embedding`
  (the U(-0.1, 0.1) table of SCAN / VSE++), :data:`VOCAB_FILE` (the saved vocabulary's file
  name), :data:`START` / :data:`END` (the marker words), :class:`TokenCoverage` (unknown words).

Helpers:

- the region x word cosine matrix: :func:`pairwise_cosines` (``[n_img, R, n_txt, W]`` in one
  matmul, the CPU column padding included; every token pooler starts from it);
- masks: :func:`lengths_to_mask`, :func:`last_true_mask`, :func:`pad_stack`;
- input checks: :func:`check_region_inputs`, :func:`normalize_boxes`;
- losses: :func:`hinge_triplet` (VSE++'s hinge with hardest or summed negatives);
- initialisation: :func:`init_projection_like_original` (the Xavier ``fc`` of SCAN / VSE++);
- zoo entries: :class:`ZooEntry`, :func:`zoo_entries_from_toml` (entries shipped as TOML
  inside the plugin, ``base`` + ``overrides`` as in xmatch's own ``zoo/``), :func:`merge`
  (nested spec overrides);
- registration in one process (a package uses entry points instead): :func:`register_image_encoder`,
  :func:`register_text_encoder`, :func:`register_reasoner`, :func:`register_pooler`,
  :func:`register_loss`, :func:`register_model`, :func:`register_dataset`,
  :func:`register_proposer` (region proposers for ``xmatch extract``), :func:`register_negative`
  (structural hard-negative makers for training), :func:`register_verifier` (re-ranking heads);
- backbones: :func:`create_timm_model` (a timm network with its weights from timm's hub, a
  file or a package, as xmatch's own image encoders make theirs), :func:`load_backbone_weights`
  (a weights file or any :mod:`xmatch.io.hub` source, fetched and checked like zoo weights,
  loaded into a timm network);
- errors: :class:`XmatchError` (derive a plugin's own errors from it), :class:`SpecError` (a
  spec that cannot be built).

Names: a component class is called ``<Name><Kind>``, the kind being ``ImageEncoder``,
``TextEncoder``, ``Reasoner``, ``Pooler`` or ``Loss`` (``ScanT2IPooler``, ``OANCNNTextEncoder``);
the argument that chooses a pretrained network is ``backbone``, a weights file ``weights``, and
``pretrained = true`` loads the backbone's published weights (never together with ``weights``).

Example:
    A region encoder and a text encoder of a plugin, in a few lines each:

    >>> import torch
    >>> from xmatch.plugin import RegionFeaturesImageEncoder, WordTextEncoder, EncoderOutput
    >>> class MeanRegions(RegionFeaturesImageEncoder):
    ...     def forward(self, regions, boxes=None, mask=None):
    ...         tokens, mask = self.real_regions(regions, boxes, mask)
    ...         return EncoderOutput.global_vector(tokens.sum(1) / mask.sum(1, keepdim=True))
    >>> MeanRegions(feature_dim=4)(torch.ones(2, 3, 4)).tokens.shape
    torch.Size([2, 1, 4])
    >>> class BagOfWords(WordTextEncoder):
    ...     component_name = "bag-of-words"
    ...     def __init__(self, vocab=None, min_count=1, dim=8, max_length=None):
    ...         super().__init__(vocab, min_count, max_length, start_end=True)
    ...         self.output_dim = dim
    ...         self.embed = torch.nn.Embedding(len(self.vocabulary), dim, padding_idx=0)
    ...     def forward(self, batch):
    ...         return EncoderOutput(self.embed(batch.inputs["input_ids"]), batch.mask, batch.content)
    >>> BagOfWords(["a", "dog"]).tokenize(["a dog"]).inputs["input_ids"].tolist()
    [[2, 4, 5, 3]]

    The zoo entries of a plugin, read from a TOML file inside its package:

    >>> ENTRIES = zoo_entries_from_toml("my_plugin", "zoo.toml")  # needs a plugin package  # doctest: +SKIP
    >>> my_model_coco = ENTRIES["my-model-coco"]  # doctest: +SKIP
"""

from __future__ import annotations

from xmatch import Embeddings, EncoderOutput, ImageEncoder, Loss, LossOutput, MatchingModel, Pooler, Reasoner
from xmatch.model.interfaces import Verifier
from xmatch import SpecError, TextEncoder, XmatchError, TokenBatch, ZooEntry, normalize_boxes, zoo_entries_from_toml
from xmatch import register_dataset, register_image_encoder, register_loss, register_model, register_pooler
from xmatch import register_negative, register_proposer, register_reasoner, register_text_encoder, register_verifier
from xmatch.components.alignment import AlignmentPooler, pairwise_cosines
from xmatch.components.image.bottomup import RegionFeaturesImageEncoder, check_region_inputs
from xmatch.components.image.backbone import create_timm_model
from xmatch.components.image.backbone_weights import load_backbone_weights
from xmatch.components.losses import hinge_triplet
from xmatch.components.text.rnn import BiGRUTextEncoder, BiLSTMTextEncoder, RNNTextEncoder
from xmatch.components.text.side import TokenCoverage
from xmatch.components.text.words import (
    END,
    START,
    VOCAB_FILE,
    Vocabulary,
    WordTextEncoder,
    load_vocabulary,
    read_original_vocabulary,
    split_words,
    tokenize_words,
    uniform_word_embedding,
    with_markers,
)
from xmatch.model.inputs import ImageInputs, PixelInputs, RegionInputs, input_type_of
from xmatch.model.masks import last_true_mask, lengths_to_mask, pad_stack
from xmatch.components.projection_init import init_projection_like_original
from xmatch.core.spec import merge

__all__ = [
    "AlignmentPooler", "BiGRUTextEncoder", "BiLSTMTextEncoder", "check_region_inputs", "create_timm_model",
    "Embeddings", "EncoderOutput", "END", "hinge_triplet", "ImageEncoder", "ImageInputs",
    "init_projection_like_original", "input_type_of", "last_true_mask", "lengths_to_mask",
    "load_backbone_weights", "load_vocabulary", "Loss", "LossOutput", "MatchingModel", "merge",
    "normalize_boxes", "pad_stack", "pairwise_cosines", "PixelInputs", "Pooler", "read_original_vocabulary",
    "Reasoner", "RegionFeaturesImageEncoder", "Verifier", "RegionInputs", "register_dataset", "register_image_encoder",
    "register_loss", "register_model", "register_negative", "register_pooler", "register_proposer", "register_reasoner",
    "register_text_encoder", "register_verifier", "RNNTextEncoder", "SpecError", "split_words", "START", "TextEncoder",
    "TokenBatch", "TokenCoverage", "tokenize_words", "uniform_word_embedding", "VOCAB_FILE", "Vocabulary",
    "with_markers", "WordTextEncoder", "XmatchError", "zoo_entries_from_toml", "ZooEntry",
]
