"""What ordering the verifier's pairs by caption length buys when re-ranking (docs/evaluation.md,
"Relations over the whole split").

``rerank_scores`` hands the verifier ``--batch`` pairs per call, and a call pads its captions to
its longest. In image order nearly every call holds a long caption; with ``text_lengths`` the
pairs go shortest caption first. This re-ranks the same lists both ways, interleaved round by
round (the order of the two alternating), keeps each one's fastest round, and checks that the
re-ranked scores agree. The machine's load and the CPU's vector extensions are printed.

    OMP_NUM_THREADS=1 python benchmarks/rerank_batching.py teran-mrsw-hn-scenes --images 400 --k 20 --neighbours 1
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.eval import encode_dataset, score_blocks
from xmatch.model.rerank import RowGatherer, rerank_scores


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(flag for flag in wanted if flag in flags) or "no avx2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="teran-mrsw-hn-scenes", help="zoo name or local-dir:DIR with a verifier")
    parser.add_argument("--split", default="groups", help="scenes split (default: groups, 1,920 images)")
    parser.add_argument("--images", type=int, default=400, help="first N images and their captions")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--neighbours", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256, help="pairs per verifier call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = xmatch.build(args.model, pretrained=True).eval()
    split = open_dataset("scenes", None, split=args.split, progress=False)
    c = split.captions_per_image
    with torch.inference_mode():
        encoded = encode_dataset(model, split, progress=False)
        img, txt = encoded.images[0 : args.images], encoded.captions[0 : c * args.images]
        scores = torch.from_numpy(score_blocks(model, encoded, [slice(0, args.images)], c, progress=False)[0])
        near = model.image_neighbours(img, args.neighbours) if args.neighbours else None
    images, texts = RowGatherer(img), RowGatherer(txt)
    pairs = [0]

    def verify(i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        pairs[0] += len(i)
        return model.verify(images(i), texts(t), batch_size=args.batch)

    ways = {"image order": None, "shortest caption first": txt.lengths}
    best = {name: float("inf") for name in ways}
    out = {}
    print(f"{args.model} on scenes {args.split}: {args.images} images, {len(txt)} captions, top {args.k} "
          f"+ {args.neighbours} neighbours, {args.batch} pairs a call, {torch.get_num_threads()} threads; "
          f"CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f}")
    with torch.inference_mode():
        for r in range(args.rounds):
            for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                pairs[0] = 0
                start = time.perf_counter()
                out[name] = rerank_scores(scores, args.k, verify, ("t2i", "i2t"), args.batch, image_neighbours=near,
                                          text_lengths=ways[name])
                best[name] = min(best[name], time.perf_counter() - start)
    base = best["image order"]
    for name, seconds in best.items():
        print(f"{name:24s}: {seconds:7.2f} s, {pairs[0] / seconds:8.0f} pairs/s, {base / seconds:.2f}x image order")
    a, b = out.values()
    diff = max(float((a[d] - b[d]).abs().max()) for d in a)
    print(f"largest difference of the re-ranked scores: {diff:.2e}; load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
