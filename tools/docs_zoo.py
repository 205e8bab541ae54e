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

    for e in sorted(entries, key=lambda e: e.name):
        params = "–" if e.params is None else format_params(e.params, e.spec, note=" †")
        head = f"| `{e.name}` | {e.dataset} | {e.spec['pooler']['name']} | {e.spec['text_encoder']['name']} | {params}"
        if not e.metrics:
            lines.append(f"{head} | – | – | – | – |")
        for bench, figures in e.metrics.items():
            lines.append(f"{head} | {bench} | {triple(figures, 'i2t')} | {triple(figures, 't2i')} | {figures.get('source', '')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
