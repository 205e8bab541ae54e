"""How many structural negatives are valid: samples for a person to read, and the table of their labels.

Draw mode writes, per caption set (scenes, a second synthetic domain, real COCO captions), at
least ``--per-set`` negatives made by the four makers in turn (``swap-roles``,
``swap-attributes``, ``replace-relation``, ``change-count``; seed fixed), each passed through
the check training applies (:func:`xmatch.train.negatives.negative_problem`), as JSONL rows
``{id, set, maker, original, negative}`` in a shuffled order, with no verdict of the maker's,
and a labels sheet (``id<TAB>``) to fill in:

    python benchmarks/negative_validity.py --out /tmp/negatives.jsonl

Label every line ``valid`` (a grammatical caption that is false of the original's picture),
``ungrammatical``, ``true`` (still true of the picture: a synonym, a symmetric relation's sides
swapped) or ``doubtful``; then

    python benchmarks/negative_validity.py --out /tmp/negatives.jsonl --labels /tmp/negatives.labels.tsv

prints, per set and maker, the share of valid negatives and the count of each label.

Caption sources: ``--scenes-captions`` / ``--tabletop-captions`` / ``--coco-captions`` take a
text file (one caption a line) or a COCO annotation file (``{"annotations": [{"caption"}]}``);
without them the scenes captions are generated (:mod:`xmatch.scenes.captions`) and so are the
tabletop ones (:mod:`xmatch.tabletop`); the COCO captions default to
``benchmarks/data/coco-karpathy-test-captions.txt``: the 5,000 captions (1,000 pictures) of the
Karpathy COCO 1K test split, as the SCAN / VSE++ precomputed data lists them (COCO captions,
CC BY 4.0); ``--coco-lines`` picks rows (the makers' rules were read on rows 0:1000, the
default; 1000:5000 were held out). The ``eccv-caption`` package ships COCO's caption ids, not their text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from xmatch.eval.probes import make_tagger, respace
from xmatch.train.negatives import CaptionNegatives, build_makers, negative_problem

#: real COCO captions: the 5,000 of the Karpathy 1K test split (1,000 pictures), CC BY 4.0
COCO_SAMPLE = Path(__file__).parent / "data" / "coco-karpathy-test-captions.txt"

MAKERS = ("swap-roles", "swap-attributes", "replace-relation", "change-count")
LABELS = ("valid", "ungrammatical", "true", "doubtful")


def read_captions(path: Path) -> list[str]:
    """Captions of a text file (one a line) or of a COCO annotation file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        doc = json.loads(text)
        if not isinstance(doc, dict) or "annotations" not in doc:
            raise SystemExit(f"{path}: expected COCO's layout {{'annotations': [{{'caption': ...}}]}}.")
        return [str(a["caption"]).strip() for a in doc["annotations"]]
    return [line.strip() for line in text.splitlines() if line.strip()]


def scenes_captions(count: int, seed: int) -> list[str]:
    from xmatch.scenes.captions import captions
    from xmatch.scenes.render import sample_group

    rng = np.random.default_rng(seed)
    out: list[str] = []
    for group in range(count):
        base, _ = sample_group(np.random.default_rng([seed, group]), 224)
        out += captions(base, rng, 2)
    return out


def tabletop_captions(count: int, seed: int) -> list[str]:
    try:
        from xmatch.tabletop.captions import captions
        from xmatch.tabletop.world import sample_group
    except ImportError:
        raise SystemExit("no tabletop domain here (xmatch.tabletop): pass --tabletop-captions FILE.") from None
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for group in range(count):
        base, _ = sample_group(np.random.default_rng([seed, group]))
        out += captions(base, rng, 2)
    return out


def draw(sets: dict[str, list[str]], word_classes: str, per_set: int, seed: int) -> list[dict[str, object]]:
    """Negatives per set: the makers in turn over the captions (in a seeded order), up to
    ``per_set / 4`` (rounded up) per maker, then, where a maker finds too little to change
    (scenes captions hold no counts), the others up to ``per_set``; those the check refuses
    are left out, as in training."""
    tagger = make_tagger(word_classes)
    makers = build_makers(MAKERS, tagger)
    quota = -(-per_set // len(makers))
    rows: list[dict[str, object]] = []
    for name, captions in sets.items():
        order = np.random.default_rng([seed, len(name)]).permutation(len(captions))
        made: Counter = Counter()
        used: set[tuple[int, str]] = set()
        for cap in (quota, per_set):
            for k, index in enumerate(order):
                if sum(made.values()) >= per_set or all(made[m.name] >= cap for m in makers):
                    break
                caption = captions[int(index)]
                for turn in range(len(makers)):
                    maker = makers[(k + turn) % len(makers)]
                    if made[maker.name] >= cap or (int(index), maker.name) in used:
                        continue
                    used.add((int(index), maker.name))
                    negative = maker(caption, np.random.default_rng([seed, int(index)]))
                    if negative is not None:
                        negative = respace(caption, negative)  # as training's CaptionNegatives does
                    if negative is None or negative.lower() == caption.lower() or negative_problem(caption, negative, tagger):
                        continue
                    rows.append({"set": name, "maker": maker.name, "original": caption, "negative": negative})
                    made[maker.name] += 1
                    break
        print(f"{name}: {sum(made.values())} negatives from {len(captions)} captions ({dict(made)})", file=sys.stderr)
    order = np.random.default_rng(seed).permutation(len(rows))
    return [{"id": i, **rows[int(j)]} for i, j in enumerate(order)]


def coverage(sets: dict[str, list[str]], word_classes: str, seed: int) -> str:
    """Per set, how many captions training's :class:`~xmatch.train.negatives.CaptionNegatives`
    (the four makers, up to 2 a caption, the check on) gives at least one negative in epoch 0."""
    negatives = CaptionNegatives(build_makers(MAKERS, make_tagger(word_classes)), per_caption=2, seed=seed)
    lines = [f"{'set':10s} {'captions':>8s} {'with a negative':>16s} {'negatives a caption':>20s}"]
    for name, captions in sets.items():
        batch = negatives.draw(captions, list(range(len(captions))), epoch=0)
        covered = len(set(batch.owner.tolist()))
        lines.append(f"{name:10s} {len(captions):8d} {100 * covered / len(captions):15.1f}% {len(batch) / len(captions):20.2f}")
    return "\n".join(lines)


def read_labels(path: Path) -> dict[int, str]:
    """``id<TAB>label`` lines (or JSONL ``{"id", "label"}``); blank labels are skipped."""
    labels: dict[int, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            doc = json.loads(line)
            key, label = doc["id"], str(doc.get("label", ""))
        else:
            key, _, label = line.partition("\t")
        label = label.strip().lower()
        if not label:
            continue
        if label not in LABELS:
            raise SystemExit(f"{path}:{n}: label {label!r} is not one of {', '.join(LABELS)}.")
        labels[int(key)] = label
    return labels


def table(rows: list[dict[str, object]], labels: dict[int, str]) -> str:
    """Per set and maker (and per set, all makers): labelled count, share valid, each label's count."""
    cells: dict[tuple[str, str], Counter] = {}
    for row in rows:
        label = labels.get(int(row["id"]))
        if label is None:
            continue
        for key in ((str(row["set"]), str(row["maker"])), (str(row["set"]), "all")):
            cells.setdefault(key, Counter())[label] += 1
    head = f"{'set':12s}{'maker':18s}{'n':>5s}{'valid %':>9s}" + "".join(f"{label:>15s}" for label in LABELS)
    lines = [head]
    for (name, maker), counts in sorted(cells.items()):
        n = sum(counts.values())
        lines.append(f"{name:12s}{maker:18s}{n:5d}{100.0 * counts['valid'] / n:9.1f}" + "".join(f"{counts[label]:15d}" for label in LABELS))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the JSONL file of drawn negatives (written, or read with --labels)")
    parser.add_argument("--coverage", action="store_true",
                        help="instead: the share of each set's captions that training gives a negative (2 per caption at most)")
    parser.add_argument("--labels", type=Path, help="a person's labels of --out: print the table")
    parser.add_argument("--per-set", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--word-classes", default="spacy", help="the makers' tagger (default spacy, the route of a new domain)")
    parser.add_argument("--scenes-captions", type=Path)
    parser.add_argument("--tabletop-captions", type=Path)
    parser.add_argument("--coco-captions", type=Path, default=COCO_SAMPLE)
    parser.add_argument("--coco-lines", default="0:1000", metavar="START:STOP",
                        help="which captions of --coco-captions to draw from (default 0:1000, the rows the makers' rules "
                             "were read on; 1000:5000 held out)")
    args = parser.parse_args()
    if args.labels is not None:
        rows = [json.loads(line) for line in args.out.read_text(encoding="utf-8").splitlines() if line.strip()]
        print(table(rows, read_labels(args.labels)))
        return
    sets = {
        "scenes": read_captions(args.scenes_captions) if args.scenes_captions else scenes_captions(200, args.seed),
        "tabletop": read_captions(args.tabletop_captions) if args.tabletop_captions else tabletop_captions(200, args.seed),
        "coco": read_captions(args.coco_captions)[slice(*(int(x) for x in args.coco_lines.split(":")))],
    }
    if args.coverage:
        print(coverage(sets, args.word_classes, args.seed))
        return
    if args.out is None:
        parser.error("--out is needed to draw or to read labels")
    rows = draw(sets, args.word_classes, args.per_set, args.seed)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    sheet = args.out.with_suffix(".labels.tsv")
    sheet.write_text("".join(f"{r['id']}\t\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} negatives in {args.out}; label them in {sheet} ({', '.join(LABELS)})", file=sys.stderr)


if __name__ == "__main__":
    main()
