"""`xmatch serve` under load on loopback: ``--clients`` concurrent clients each send
``--queries`` text searches; prints the latency's p50 / p95 / max and the errors.

The server runs as ``xmatch serve`` in its own process (the clients' threads do not share its
interpreter). Without ``--index`` it serves a synthetic corpus (:class:`PlantedCorpus` of
``--images`` region sets, the scenes vocabulary's scoring model) built into a temporary folder.

    python benchmarks/serve_load.py --clients 50 --queries 20
    python benchmarks/serve_load.py --index idx
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

QUERIES = ["a large red circle left of a small blue seven", "a small green square", "a blue seven above a red circle",
           "a yellow triangle right of a large green square", "two circles", "a small red seven below a blue square"]


def synthetic_index(folder: Path, images: int) -> Path:
    """An index of ``images`` planted region sets, with its model saved inside it."""
    import xmatch.index
    from xmatch.index.synthetic import PlantedCorpus, scoring_model

    corpus = PlantedCorpus(images=images, regions=12, dim=64, concepts=128, groups=8)
    index = xmatch.index.create(folder / "idx", scoring_model("MrSw", 64))
    for ids, embeddings in corpus.batches():
        index.add(embeddings, ids=ids)
    index.close()
    return folder / "idx"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, server: subprocess.Popen, tries: int = 1200) -> None:
    with httpx.Client(base_url=url, timeout=5) as client:
        for _ in range(tries):
            if server.poll() is not None:
                raise SystemExit(f"the server exited ({server.returncode}): {server.stderr.read()}")
            try:
                client.get("/health")
                return
            except httpx.TransportError:
                time.sleep(0.1)
    raise SystemExit("the server did not answer /health")


def client_run(url: str, queries: int, k: int, seed: int) -> tuple[list[float], list[str]]:
    """One client's latencies (seconds) and error lines."""
    latencies, errors = [], []
    with httpx.Client(base_url=url, timeout=120) as client:
        for q in range(queries):
            start = time.perf_counter()
            try:
                response = client.get("/search", params={"text": QUERIES[(seed + q) % len(QUERIES)], "k": k})
                if response.status_code != 200:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies.append(time.perf_counter() - start)
    return latencies, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, help="an index to serve (default: a synthetic one)")
    parser.add_argument("--images", type=int, default=1000, help="synthetic corpus size (default: 1000)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--queries", type=int, default=20, help="queries per client")
    parser.add_argument("-k", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index or synthetic_index(Path(tmp), args.images)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "xmatch", "serve", str(index), "--port", str(port),
                                   "--wait", "600"], stderr=subprocess.PIPE, text=True)
        try:
            wait_until_up(url, server)
            start = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                runs = list(pool.map(lambda c: client_run(url, args.queries, args.k, c), range(args.clients)))
            wall = time.perf_counter() - start
        finally:
            server.terminate()
            server.wait(60)
    latencies = np.array([s for run, _ in runs for s in run]) * 1000
    errors = [e for _, errs in runs for e in errs]
    print(f"{args.clients} clients x {args.queries} queries (k {args.k}) on {index if args.index else f'{args.images} synthetic images'}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"requests {len(latencies)}, errors {len(errors)}, throughput {len(latencies) / wall:.1f} queries/s")
    print(f"latency ms: p50 {np.percentile(latencies, 50):.1f}, p95 {np.percentile(latencies, 95):.1f}, "
          f"max {latencies.max():.1f}")
    for line in errors[:5]:
        print(f"  error: {line}")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
