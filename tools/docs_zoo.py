"""Print ``docs/zoo.md`` from the built-in zoo entries: ``python tools/docs_zoo.py > docs/zoo.md``.
A developer tool of the repository; a test checks that the page is up to date."""

from __future__ import annotations

from typing import Any

import xmatch
from xmatch.core.zoo import ZooEntry, format_params


def render() -> str:
    """The page, from the entries registered by xmatch itself (not by plugins)."""
    return zoo_markdown([xmatch.info(name) for name in xmatch.list_models() if xmatch.core.registry.models.origin(name) == "xmatch"])


def zoo_markdown(entries: list[ZooEntry]) -> str:
    """``docs/zoo.md``: one table row per entry, with the paper's figures per benchmark."""
    lines = [
        "# Zoo",
        "",
        "Generated from the entries in `zoo/` (`python tools/docs_zoo.py > docs/zoo.md`); a test",
        "checks that this page is up to date. Figures are the papers' (R@1/R@5/R@10, percent).",
        "",
        "`xmatch models [PATTERN]` lists the entries, plugins' included, and which have weights that",
        "`xmatch.build(name, pretrained=True)` loads; `xmatch models --pretrained` (in Python",
        "`xmatch.list_models(pretrained=True)`) only those. `xmatch info NAME` prints an entry's card",
        "and `xmatch info NAME --spec > my.toml` its spec as a TOML file to edit and build.",
        "",
        "`params` is the number of parameters of `xmatch.build(entry)` (a module shared by both",
        "modalities counted once). A test rebuilds every entry on the `meta` device, with",
        "bert-base-uncased's architecture and random weights, and checks it; after changing an",
        "architecture, `python tools/zoo_params.py` prints the stated and recomputed counts and",
        "`python tools/zoo_params.py --write` writes the recomputed ones into `zoo/*.toml`.",
        "",
        "† Without the word-embedding table (Bi-GRU / Bi-LSTM): its size depends on the caption",
        "corpus the vocabulary is built from, one `word_dim`-wide row per word (see the entry's notes).",
        "",
        "Every entry that reads precomputed regions also runs on your own pictures: `xmatch extract`",
        "writes region features of an image folder, and `xmatch.extract.on_pixels(model, features)`",
        "(or `image_encoder.name = \"pixel-regions\"`) puts the same proposer, backbone and RoI pooling",
        "in front of the entry's region encoder, so `encode_images(images=[...])` takes photos and",
        "returns the regions' boxes (`docs/extract.md`).",
        "",
        "| entry | dataset | pooler | text encoder | params | benchmark | i→t R@1/5/10 | t→i R@1/5/10 | source |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def triple(figures: dict[str, Any], d: str) -> str:
        values = [figures.get(f"{d}_r{k}") for k in (1, 5, 10)]
        return "/".join("–" if v is None else f"{v}" for v in values)

    groups = []
    for e in sorted(entries, key=lambda e: e.name):
        params = "–" if e.params is None else format_params(e.params, e.spec, note=" †")
        head = f"| `{e.name}` | {e.dataset} | {e.spec['pooler']['name']} | {e.spec['text_encoder']['name']} | {params}"
        recall = {bench: figures for bench, figures in e.metrics.items() if not _is_groups(figures)}
        if not recall:
            lines.append(f"{head} | – | – | – | – |")
        for bench, figures in recall.items():
            lines.append(f"{head} | {bench} | {triple(figures, 'i2t')} | {triple(figures, 't2i')} | {figures.get('source', '')} |")
        groups += [(e.name, bench, figures) for bench, figures in e.metrics.items() if _is_groups(figures)]
    return "\n".join(lines + _groups_section(groups) + CLIP_SECTION) + "\n"


#: the hard-negative kinds a groups benchmark's figures are given for, in the card's order
GROUP_KINDS = ("relation", "colour", "size", "all")


def _is_groups(figures: dict[str, Any]) -> bool:
    """Figures of the hard-negative groups protocol (``relation_t2i``, ...) rather than Recall@K."""
    return any(f"{kind}_t2i" in figures for kind in GROUP_KINDS)


def _groups_section(rows: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The entries' figures on hard-negative groups (t2i accuracy and Winoground group score)."""
    if not rows:
        return []
    lines = [
        "",
        "## Relations and bindings",
        "",
        "Figures of the hard-negative groups protocol (`docs/evaluation.md`, \"Hard-negative groups\"): t2i is",
        "the share of captions whose own image beats its twin (chance 50), group the Winoground group score",
        "(chance 16.7), percent, per kind of twin.",
        "",
        "| entry | benchmark | " + " | ".join(f"{k} t2i / group" for k in GROUP_KINDS) + " | source |",
        "|---|---|" + "---|" * len(GROUP_KINDS) + "---|",
    ]
    for name, bench, figures in rows:
        cells = [f"{figures.get(f'{k}_t2i', '–')} / {figures.get(f'{k}_group', '–')}" for k in GROUP_KINDS]
        lines.append(f"| `{name}` | {bench} | " + " | ".join(cells) + f" | {figures.get('source', '')} |")
    return lines


#: how to use the CLIP / SigLIP entries (zoo/clip.toml), after the table
CLIP_SECTION = [
    "",
    "## CLIP and SigLIP",
    "",
    "`clip-vit-b-32`, `clip-vit-l-14`, `clip-vit-l-14-336`, `siglip-base-patch16-224`,",
    "`siglip-so400m-patch14-384`, `siglip2-base-patch16-224` and `siglip2-so400m-patch14-384` wrap the image",
    "and text towers of `transformers`' `CLIPModel` / `SiglipModel` (encoders `clip-vision`, `clip-text`,",
    "`siglip-vision`, `siglip-text`; the fixed-resolution SigLIP 2 checkpoints are `SiglipModel` checkpoints",
    "with the Gemma tokenizer, 256,000 tokens). Their dataset is the web-scale set they were pre-trained on",
    "(`wit-400m`, `webli`): their figures are zero-shot, and each names the paper's table it comes from (the",
    "SigLIP and SigLIP 2 rows of the SigLIP 2 paper's Table 1 give recall@1 only). Of these,",
    "`siglip2-so400m-patch14-384` has the best published COCO and Flickr30k figures. One model gives:",
    "",
    "- the towers' own **pooled embeddings** as `Embeddings.pooled`, bit for bit `get_image_features` /",
    "  `get_text_features` L2-normalised (a test checks it on random small towers): the entries set",
    "  `image_projection = false`, `text_projection = false` and `identity` reasoners, so nothing re-projects",
    "  them. The entries' pooler, `global-cosine`, is the CLIP cosine; a search index's stage 1 reads the",
    "  same vectors.",
    "- **patch tokens** with their boxes in the picture's frame (the resize and centre crop undone) and",
    "  **word-piece tokens**, each through the tower's own projection (SigLIP: its pooling head applied to",
    "  each patch alone), for late interaction with any token pooler: `MrAvgw` is FILIP's text-to-image",
    "  score (the mean over words of the best patch), `Symm` adds the other direction.",
    "",
    "Cosine or late interaction: the towers were trained through their pooled vectors only, so the cosine",
    "is what works zero-shot; token-level scores are not what they were trained for (not measured here):",
    "fine-tune before relying on them. Fine-tuning uses the trainer with the entry's loss (`infonce`, CLIP's",
    "symmetric contrastive loss with a learned temperature, or `sigmoid`, SigLIP's pairwise loss; both start",
    "from the checkpoint's own temperature and bias), or `hinge`, e.g.",
    "`xmatch train clip-vit-b-32 --model-set pooler.name=MrAvgw ...`.",
    "",
    "Weights are the upstream `model.safetensors` of the hub repository at a full 40-hex commit where that",
    "file exists, loaded by `pretrained=True`: the commit is immutable, so the download is checked against",
    "the sha256 and size the Hub's LFS metadata states for it (where the entry also writes them, read in public",
    "records, both must agree). Each entry's `origin` says where its commit was seen. The tokenizer is pinned",
    "to a commit of the same repository (OpenAI's CLIP entries share clip-vit-base-patch32's BPE) and goes into",
    "the same cache, so a copied cache works offline. `clip-vit-l-14-336` lists no weights: no public record",
    "shows a commit of its repository with `model.safetensors` (only `pytorch_model.bin`, which xmatch never",
    "loads from the network); load such a file with `checkpoint=`. The SigLIP 2 entries lowercase captions",
    "(`text_encoder.lowercase`) and resize pictures bilinearly (`image_encoder.resample`), as those",
    "checkpoints were trained and as their image processor does. SigLIP's tokenizer needs SentencePiece:",
    "`pip install 'xmatch-zoo[clip]'`.",
    "",
    "<!-- skip: downloads the weights from the Hugging Face Hub -->",
    "```python",
    "model = xmatch.build(\"siglip-base-patch16-224\", pretrained=True).eval()",
    "img = model.encode_images(images=[\"cat.jpg\", \"rocket.jpg\"])  # pooled vectors, patch tokens and their boxes",
    "txt = model.encode_texts([\"a cat on a sofa\", \"a rocket on the launch pad\"])",
    "cosine = model.similarity(img, txt)  # [2 images, 2 captions], the CLIP cosine",
    "filip = xmatch.build(\"siglip-base-patch16-224\", pretrained=True, pooler={\"name\": \"MrAvgw\"}).eval()",
    "late = filip.similarity(filip.encode_images(images=[\"cat.jpg\"]), filip.encode_texts([\"a cat on a sofa\"]))",
    "clip = xmatch.build(\"clip-vit-b-32\", pretrained=True)  # openai/clip-vit-base-patch32 at its pinned commit",
    "```",
]


if __name__ == "__main__":
    print(render(), end="")
