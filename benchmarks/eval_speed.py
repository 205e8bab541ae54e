"""Benchmark: COCO-5K-sized evaluation of TERAN-shaped embeddings, end to end.

Scores ``--images`` x ``--captions`` random unit-norm region / word sets (36 regions, ~12
words, 1024-d; the paper's shapes) with the MrSw pooler, ranks them in both directions with
the papers' protocol, and prints the time, the peak resident memory and the achieved FLOP rate
next to the rate of a plain matmul measured in the same run on the same kind of block.

FLOPs counted: ``2 * (images * regions) * (captions * words) * dim`` (the region x word
products); the max / sum reductions and the ranking are extra work in the measured time.

Usage:
    python benchmarks/eval_speed.py                       # 5,000 x 25,000 (COCO 5K)
    python benchmarks/eval_speed.py --images 500 --captions 2500 --pooler Symm
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from xmatch.components.poolers import MrAvgw, MrSw, MwSr, Symm
from xmatch.embeddings import Embeddings
from xmatch.eval.protocol import evaluate_scores

POOLERS = {"MrSw": MrSw, "MwSr": MwSr, "Symm": Symm, "MrAvgw": MrAvgw}


def random_sets(n: int, width: int, dim: int, min_len: int, seed: int, chunk: int = 2048) -> Embeddings:
    """Unit-norm token sets with random lengths in [min_len, width], built in place by chunks."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n, width, dim)
    for i in range(0, n, chunk):
        block = tokens[i : i + chunk]
        block.normal_(generator=g)
        block.div_(block.norm(dim=-1, keepdim=True))
    lengths = torch.randint(min_len, width + 1, (n,), generator=g)
    return Embeddings(tokens, torch.arange(width)[None] < lengths[:, None])


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def matmul_rate(rows_a: int, rows_b: int, dim: int, seconds: float = 3.0) -> float:
    """FLOP/s of a plain float32 matmul ``[rows_a, dim] @ [dim, rows_b]``."""
    a, b = torch.randn(rows_a, dim), torch.randn(dim, rows_b)
    a @ b  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        done += 1
    return 2 * rows_a * rows_b * dim * done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--words", type=int, default=12, help="padded caption width (lengths 6..words)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--pooler", choices=sorted(POOLERS), default="MrSw")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.captions % args.images:
        parser.error("--captions must be a multiple of --images (captions per image)")

    img = random_sets(args.images, args.regions, args.dim, args.regions, seed=0)
    txt = random_sets(args.captions, args.words, args.dim, max(1, args.words // 2), seed=1)
    pooler = POOLERS[args.pooler]()
    ic, tc = pooler.chunk_sizes(img, txt)
    reference = matmul_rate(ic * args.regions, tc * args.words, args.dim)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.images} images x {args.captions} captions, {args.pooler}, blocks {ic} x {tc}")
    print(f"plain matmul [{ic * args.regions} x {args.dim}] @ [{args.dim} x {tc * args.words}]: "
          f"{reference / 1e9:.1f} GFLOP/s")

    start = time.perf_counter()
    with torch.inference_mode():
        scores = pooler(img, txt)
    t_sim = time.perf_counter() - start
    start = time.perf_counter()
    result = evaluate_scores(scores, "full", captions_per_image=args.captions // args.images)
    t_rank = time.perf_counter() - start

    flops = 2 * args.images * args.regions * args.captions * args.words * args.dim
    rate = flops / t_sim
    print(f"similarity: {t_sim:.1f} s, {rate / 1e9:.1f} GFLOP/s = {rate / reference:.0%} of the matmul rate")
    print(f"ranking (both directions): {t_rank:.1f} s; end to end {t_sim + t_rank:.1f} s "
          f"({flops / (t_sim + t_rank) / reference:.0%} of the matmul rate)")
    print(f"peak resident memory: {peak_rss_gb():.2f} GB (embeddings {img.tokens.nbytes / 2**30 + txt.tokens.nbytes / 2**30:.2f} GB)")
    print(f"chance-level check: t2i R@1 {result.t2i['r1']:.3f}, i2t R@1 {result.i2t['r1']:.3f}")


if __name__ == "__main__":
    main()
