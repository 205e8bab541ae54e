"""Does a model ground a caption's words in the objects they name? Word by word, on a generated world.

The grounded verifier (``verifier.name=grounded``) finds each word's referent through the
matching model's own region-word similarities. This measures whether those similarities point
at the right object: for every word of a test caption that names an object of its picture (the
noun, and the colour, pattern and size words before it, the worlds' grammar being
``[size] [pattern] colour noun``), the region most similar to the word is taken, and the word
counts as grounded when the object that region overlaps most (IoU) is the one the word names,
and as grounded tightly when that region is the object's box (IoU at least 0.5): what reading a
relation from the referents' boxes needs. Beside each, the same share for a region drawn at
random from the picture's regions (chance).

    python benchmarks/grounding_accuracy.py --model local-dir:runs/base/best --world tabletop \\
        --root data/tabletop --features feats --split test

``--features``: a folder made by ``xmatch extract`` from the world's pictures (``layout=images``);
without it, the world's own region features. Only word-level text sides (``bigru``,
``bilstm``) align words to tokens here; captions whose tokens do not split word by word are
counted and skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torchvision.ops import box_iou

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xmatch.scenes import captions as scenes_captions  # noqa: E402
from xmatch.tabletop import captions as tabletop_captions  # noqa: E402

#: words said before a colour and a noun, from the worlds' own grammars (tabletop: patterns and sizes; scenes: sizes)
PATTERN_WORDS = {w for words in tabletop_captions.PATTERN_WORDS.values() for w in words}
SIZE_WORDS = {w for lexicon in (tabletop_captions.SIZE_WORDS, scenes_captions.SIZE_WORDS) for words in lexicon.values() for w in words}
WORD = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*|[^\sa-z0-9]")


def caption_words(caption: str) -> list[str]:
    """The caption's words and punctuation marks, lower-cased.

    Example:
        >>> caption_words("A polka-dot cup; two mugs")
        ['a', 'polka-dot', 'cup', ';', 'two', 'mugs']
    """
    return WORD.findall(caption.lower())


def _names(thing: dict, word: str) -> bool:
    kind = thing["kind"]
    return word in (kind, kind + "s", kind + "es")


def word_targets(words: Sequence[str], things: Sequence[dict]) -> list[tuple[int, int, str]]:
    """``(word position, object index, class)`` for each word that names one object of the
    picture without ambiguity: a noun whose kind is unique in the picture, a colour word right
    before a noun (the object of that colour and kind), a pattern or size word before a colour
    and a noun.

    Example:
        >>> things = [{"kind": "cup", "colour": "red"}, {"kind": "box", "colour": "red"}]
        >>> word_targets("a big striped red cup left of a box".split(), things)
        [(1, 0, 'size'), (2, 0, 'pattern'), (3, 0, 'colour'), (4, 0, 'noun'), (8, 1, 'noun')]
    """
    colours = {t["colour"] for t in things}
    out = []
    for p, word in enumerate(words):
        named = [j for j, t in enumerate(things) if _names(t, word)]
        if len(named) == 1:
            out.append((p, named[0], "noun"))
            continue
        q = p
        while q < len(words) and (words[q] in PATTERN_WORDS or words[q] in SIZE_WORDS):
            q += 1
        if q + 1 >= len(words) or words[q] not in colours or (q == p and word not in colours):
            continue
        match = [j for j, t in enumerate(things) if t["colour"] == words[q] and _names(t, words[q + 1])]
        if len(match) == 1:
            out.append((p, match[0], "colour" if q == p else "pattern" if word in PATTERN_WORDS else "size"))
    return out


#: IoU from which a region is its object's box ("grounded tightly")
TIGHT_IOU = 0.5


class Hit(NamedTuple):
    """One word's grounding: its class, whether its most similar region overlaps its object
    more than any other object (``grounded``) and is its box (``tight``, IoU >= 0.5), and the
    share of the picture's regions that would be either (``chance``, ``tight_chance``)."""

    cls: str
    grounded: bool
    tight: bool
    chance: float
    tight_chance: float


def grounding_hits(similarity: np.ndarray, region_boxes: np.ndarray, object_boxes: np.ndarray,
                   targets: Sequence[tuple[int, int, str]]) -> list[Hit]:
    """The grounding of each target ``(word, object, class)`` (:class:`Hit`).

    ``similarity`` is ``[words, regions]``; the boxes in one unit (pixels or normalised).

    Example:
        >>> regions = np.array([[0, 0, 10, 10], [20, 0, 30, 10], [0, 0, 40, 40]], float)
        >>> objects = np.array([[1, 1, 9, 9], [21, 1, 29, 9]], float)
        >>> hits = grounding_hits(np.array([[0.1, 0.9, 0], [0.8, 0.2, 0], [0, 0, 1]]), regions, objects,
        ...                       [(0, 1, "noun"), (1, 1, "colour"), (2, 0, "size")])
        >>> [(h.cls, h.grounded, h.tight) for h in hits]
        [('noun', True, True), ('colour', False, False), ('size', True, False)]
    """
    overlap = box_iou(torch.as_tensor(region_boxes, dtype=torch.float64), torch.as_tensor(object_boxes, dtype=torch.float64)).numpy()  # [R, O]
    owner = np.where(overlap.max(1) > 0, overlap.argmax(1), -1)  # the object each region covers best
    best = similarity.argmax(1)
    return [Hit(cls, bool(owner[best[p]] == obj), bool(overlap[best[p], obj] >= TIGHT_IOU),
                float((owner == obj).mean()), float((overlap[:, obj] >= TIGHT_IOU).mean()))
            for p, obj, cls in targets]


def token_starts(model, words: Sequence[str]) -> list[int] | None:
    """The index of each word's first token in the caption's token sequence, or None when the
    text side does not tokenise the caption word by word."""
    counts = [int(model.tokenize([w]).mask.sum()) for w in words]
    total = int(model.tokenize([" ".join(words)]).mask.sum())
    if sum(counts) != total:
        return None
    return list(np.cumsum([0, *counts[:-1]]))


def world_records(world: str, root: str) -> tuple[dict[str, dict], int]:
    """The generated set's records by image id, and its canvas side in pixels."""
    folder = next((p for p in sorted(Path(root).glob(f"{world}-*")) if (p / f"{world}.json").is_file()), None)
    if folder is None:
        raise SystemExit(f"no generated {world} set in {root}: generate it first (open_dataset({world!r}, root, generate=True)).")
    meta = json.loads((folder / f"{world}.json").read_text(encoding="utf-8"))
    records = meta["tables"] if world == "tabletop" else meta["scenes"]
    for r in records:
        r["things"] = r.get("things") or r["objects"]
    return {str(r["id"]): r for r in records}, int(meta["params"]["canvas"])


def measure(model_name: str, world: str, root: str, features: str | None, split: str) -> dict:
    import xmatch
    from xmatch.data import open_dataset
    from xmatch.data.layouts import choose_layout

    torch.set_grad_enabled(False)
    model = xmatch.build(model_name, pretrained=True).eval()
    records, canvas = world_records(world, root)
    data = open_dataset(world, root, split=split) if features is None else open_dataset(choose_layout(features), features, split=split)
    rows: dict[str, list[Hit]] = defaultdict(list)
    skipped = 0
    for i in range(data.num_images):
        record = records[Path(data.image_names[i]).stem]
        image = data.image(i)
        emb = model.encode_images(xmatch.RegionInputs(torch.from_numpy(image.regions)[None], torch.from_numpy(image.boxes)[None]))
        regions, boxes = emb.tokens[0][emb.mask[0]], emb.boxes[0][emb.mask[0]].numpy() * canvas
        objects = np.array([t["box"] for t in record["things"]], dtype=np.float64)
        for k in np.flatnonzero(data.caption_image == i):
            words = caption_words(data.captions[k])
            starts = token_starts(model, words)
            if starts is None:
                skipped += 1
                continue
            txt = model.encode_texts([" ".join(words)])
            similarity = (txt.tokens[0][txt.mask[0]] @ regions.T).numpy()[starts]
            for hit in grounding_hits(similarity, boxes, objects, word_targets(words, record["things"])):
                rows[hit.cls].append(hit)
    table = {cls: {"words": len(hits), **{field: 100 * float(np.mean([getattr(h, field) for h in hits]))
                                          for field in ("grounded", "chance", "tight", "tight_chance")}}
             for cls, hits in sorted(rows.items())}
    return {"model": model_name, "world": world, "features": features or f"the {world} world's own", "split": split,
            "captions_skipped": skipped, "classes": table}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a zoo name or local-dir:RUN/best")
    parser.add_argument("--world", choices=("tabletop", "scenes"), required=True)
    parser.add_argument("--root", required=True, help="the folder the world was generated into")
    parser.add_argument("--features", help="a folder of xmatch extract's features of the world's pictures")
    parser.add_argument("--split", default="test")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    out = measure(args.model, args.world, args.root, args.features, args.split)
    print(f"{out['model']} on {out['world']} ({out['features']} features, {out['split']} split; "
          f"{out['captions_skipped']} captions not split word by word, skipped)")
    print("| word class | words | on its object (a random region) | on its object's box, IoU >= 0.5 (a random region) |")
    print("|---|---|---|---|")
    for cls, row in out["classes"].items():
        print(f"| {cls} | {row['words']} | {row['grounded']:.1f} % ({row['chance']:.1f} %) "
              f"| {row['tight']:.1f} % ({row['tight_chance']:.1f} %) |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
