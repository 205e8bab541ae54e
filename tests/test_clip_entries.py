"""The CLIP and SigLIP zoo entries as published promises: every hub reference names an immutable
commit, the weights' layout is the upstream checkpoint's (transformers' CLIPModel / SiglipModel
built from the repository's config.json numbers, on the meta device: no download), the stated
parameter count is the built model's, card figures name the table they come from, and the
SigLIP 2 entries read pictures and captions the way those checkpoints were trained."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipImageProcessor, SiglipModel
from transformers.image_utils import PILImageResampling

import xmatch
from xmatch.components.image.clip import SiglipImageEncoder
from xmatch.components.text.clip import SiglipTextEncoder
from xmatch.io.bundle import upstream_names
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)

PINNED = re.compile(r"hf-hub:[\w.-]+/[\w.-]+@[0-9a-f]{40}(/[\w./-]+)?")

CLIP_B = {"text": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 12},
          "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
                     "patch_size": 32, "image_size": 224}, "projection_dim": 512}
CLIP_L = {"text": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12},
          "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                     "patch_size": 14, "image_size": 224}, "projection_dim": 768}
SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27}
#: the numbers of each repository's config.json (the rest are transformers' defaults, which these
#: checkpoints keep: quick_gelu and 49,408 tokens for CLIP, 32,000 tokens and 64 positions for SigLIP)
UPSTREAM = {
    "clip-vit-b-32": ("clip", CLIP_B),
    "clip-vit-l-14": ("clip", CLIP_L),
    "clip-vit-l-14-336": ("clip", {**CLIP_L, "vision": {**CLIP_L["vision"], "image_size": 336}}),
    "siglip-base-patch16-224": ("siglip", {"text": {}, "vision": {}}),
    "siglip-so400m-patch14-384": ("siglip", {"text": SO400M, "vision": {**SO400M, "patch_size": 14, "image_size": 384}}),
    "siglip2-base-patch16-224": ("siglip", {"text": {"vocab_size": 256000}, "vision": {}}),
    "siglip2-so400m-patch14-384": ("siglip", {"text": {**SO400M, "vocab_size": 256000},
                                              "vision": {**SO400M, "patch_size": 14, "image_size": 384}}),
}
#: the one entry without weights: no record shows a commit of its repository with model.safetensors
NO_SAFETENSORS_COMMIT = {"clip-vit-l-14-336"}


def test_the_clip_family_entries_are_the_ones_checked_here():
    assert set(xmatch.list_models("clip-*")) | set(xmatch.list_models("siglip*")) == set(UPSTREAM)


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_every_hub_reference_names_a_commit_and_the_weights_are_model_safetensors(name):
    entry = xmatch.info(name)
    assert PINNED.fullmatch(entry.spec["text_encoder"]["tokenizer"]), entry.spec["text_encoder"]["tokenizer"]
    if name in NO_SAFETENSORS_COMMIT:
        assert entry.weights == [] and "No weights are listed" in entry.notes
        return
    [weights] = entry.weights
    assert PINNED.fullmatch(weights["source"]) and weights["source"].endswith("/model.safetensors")
    repo = weights["source"].removeprefix("hf-hub:").partition("@")[0]
    assert repo.split("/")[1] in entry.origin and weights["source"].split("@")[1][:8] in entry.origin
    for key, pattern in (("sha256", r"[0-9a-f]{64}"), ("size", None)):
        if key in weights:  # optional: read in records, then checked against the Hub's LFS metadata
            assert re.fullmatch(pattern, weights[key]) if pattern else weights[key] > 0


def upstream_model(name: str) -> torch.nn.Module:
    """transformers' own two-tower model of ``name``'s repository, from its config.json numbers."""
    kind, numbers = UPSTREAM[name]
    with torch.device("meta"):
        if kind == "clip":
            return CLIPModel(CLIPConfig(text_config=numbers["text"], vision_config=numbers["vision"],
                                        projection_dim=numbers["projection_dim"]))
        return SiglipModel(SiglipConfig(text_config=numbers["text"], vision_config=numbers["vision"]))


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_the_upstream_checkpoint_has_exactly_the_tensors_the_entry_loads(name):
    with torch.device("meta"):
        model = xmatch.build(name)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in upstream_model(name).state_dict().items()}
    names = upstream_names(model, set(theirs))
    # every upstream tensor is read and fills every tensor of the model, the learned
    # temperature (and SigLIP's bias) the loss's
    assert set(names) == set(theirs)
    targets = {target: key for key, target in names.items() if target is not None}
    assert set(targets) == set(ours) and {"loss.logit_scale"} <= set(targets)
    towers = {t: k for t, k in targets.items() if not t.startswith("loss.")}
    assert {t: ours[t] for t in towers} == {t: theirs[k] for t, k in towers.items()}
    # SigLIP's file holds its temperature and bias as [1], the loss as scalars (it reshapes them)
    assert all(np.prod(ours[t]) == np.prod(theirs[k]) == 1 for t, k in targets.items() if t.startswith("loss."))
    # the stated parameter count is the built model's, and the upstream model's (the loss holds its temperature)
    assert sum(p.numel() for p in model.parameters()) == xmatch.info(name).params
    assert sum(p.numel() for p in upstream_model(name).parameters()) == xmatch.info(name).params


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_card_figures_name_their_paper_table(name):
    entry = xmatch.info(name)
    for bench, figures in entry.metrics.items():
        assert re.search(r"arXiv:\d{4}\.\d{5}\), Table \d+", figures["source"]), (bench, figures["source"])
        assert "xmatch has not re-measured them" in entry.notes
    # no figure without a table: the CLIP paper reports retrieval for its ViT-L/14@336px model only
    assert bool(entry.metrics) == (name not in {"clip-vit-b-32", "clip-vit-l-14"})


def test_a_patch_grid_that_does_not_fill_the_square_gives_the_boxes_the_patches_cover():
    # So400m/14 at 384 px: the patch convolution keeps 27 cells a side (378 of 384 pixels)
    enc = SiglipImageEncoder(width=32, layers=1, heads=2, ff_dim=64, patch_size=14, image_size=32)
    out = enc(images=[Image.new("RGB", (40, 40))])
    assert out.tokens.shape == (1, 1 + 2 * 2, 32)
    a, b = 14 / 32, 28 / 32
    want = torch.tensor([[0, 0, a, a], [a, 0, b, a], [0, a, a, b], [a, a, b, b]])
    assert torch.allclose(out.boxes[0, 1:], want)


def test_siglip2_entries_resize_bilinearly_as_their_image_processor_does():
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8))
    tiny = {"width": 32, "layers": 1, "heads": 2, "ff_dim": 64, "patch_size": 16, "image_size": 32}
    for name, resample in (("siglip2-base-patch16-224", PILImageResampling.BILINEAR),
                           ("siglip-base-patch16-224", PILImageResampling.BICUBIC)):
        spec = xmatch.info(name).spec["image_encoder"]
        enc = SiglipImageEncoder(**tiny, resample=spec.get("resample", "bicubic"))
        hub = SiglipImageProcessor(size={"height": 32, "width": 32}, resample=resample)
        assert torch.equal(enc.preprocess([picture]), hub(images=[picture], return_tensors="pt")["pixel_values"])
    with pytest.raises(ValueError, match="resample='nearest' is not one of"):
        SiglipImageEncoder(**tiny, resample="nearest")


def test_siglip2_entries_lowercase_captions_before_their_case_keeping_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", "a", "cat", "A", "Cat"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))  # keeps case, as Gemma's does
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    tiny = {"tokenizer": str(tmp_path), "width": 16, "layers": 1, "heads": 2, "ff_dim": 32, "vocab_size": 7, "max_length": 6}
    assert xmatch.info("siglip2-so400m-patch14-384").spec["text_encoder"]["lowercase"] is True
    assert "lowercase" not in xmatch.info("siglip-base-patch16-224").spec["text_encoder"]
    lowered = SiglipTextEncoder(**tiny, lowercase=True).tokenize(["A Cat"])
    kept = SiglipTextEncoder(**tiny).tokenize(["A Cat"])
    assert lowered.inputs["input_ids"][0, 1:4].tolist() == [3, 4, 1]  # a cat </s>, after the global slot's column
    assert kept.inputs["input_ids"][0, 1:4].tolist() == [5, 6, 1]
    assert lowered.texts == ["A Cat"]  # the batch carries the captions as given
