"""``xmatch extract --ray``: 2 workers against 1 on this machine, and the memory of a worker.

A folder of real photos (scikit-image's, as ``benchmarks/extract_speed.py`` copies them) is
extracted on a local Ray cluster of ``--cpus`` CPUs by 1 and by 2 workers, each worker with one
torch thread (``OMP_NUM_THREADS=1``), the pipeline built beforehand. The variants are
interleaved, one extraction of each per round, the order swapped every round, and the best
round of each kept: a loaded machine slows them alike. The time is the whole ``extract`` call
(the actors started, the pipeline sent to them, the images decoded, computed and written, the
dataset files written), so the figure is what a user gets, start-up included. The peak resident
memory (``VmHWM``: over the process's life, which Ray may have reused from an earlier run) and
the CPU time this run took of every worker process are read from ``/proc`` while it runs (CPU seconds per picture: what a cluster's cost grows with). CPU flags and the load
average are printed with the figures. Ray starts its workers at a lower priority (nice 15);
here ``RAY_worker_niceness=0`` (unless set) makes them compete with other jobs on equal terms.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/ray_scale.py --copies 11 --rounds 3
    OMP_NUM_THREADS=1 python benchmarks/ray_scale.py --copies 11 --rounds 3 --image-size 224
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_speed import photo_folder  # noqa: E402

WORKER_TITLE = "ChunkWorker"


def cpu_flags() -> str:
    """The CPU model and its vector extensions that torch's kernels use."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma")
    return f"{model}; {' '.join(f for f in wanted if f in flags) or 'no AVX2'}"


class WorkerMemory:
    """Peak resident memory (VmHWM, MiB) and CPU seconds (user + system) of the Ray worker
    processes of the extraction, polled."""

    def __init__(self) -> None:
        self.peak: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        # Ray may reuse an idle worker process for the next run's actor: its CPU time so far is not this run's
        self.before = {int(p.name): self._cpu(p) for p in Path("/proc").iterdir() if p.name.isdigit()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def _cpu(proc: Path) -> float:
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    if WORKER_TITLE not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                        continue
                    self.cpu[int(proc.name)] = self._cpu(proc) - self.before.get(int(proc.name), 0.0)
                    for line in (proc / "status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            kib = float(line.split()[1])
                            self.peak[int(proc.name)] = max(self.peak.get(int(proc.name), 0.0), kib / 1024)
                except OSError:
                    continue
            self._stop.wait(0.2)


def steady_rate(out: Path) -> float:
    """Images per second once the workers run: the region files written after the first one,
    over the time from the first to the last (their modification times)."""
    times = sorted(p.stat().st_mtime for p in (out / "bu_att").iterdir())
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=11, help="copies of the 6 photos (default 11: 66 pictures)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--image-size", type=int, help="shorter side fed to the backbone (default: 600, the extractor's)")
    parser.add_argument("--batch-size", type=int, default=4, help="images per chunk (default 4)")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != "1":
        sys.exit("run with OMP_NUM_THREADS=1: each worker gets one thread, so 2 workers use 2 cores against 1's one")

    import ray

    from xmatch.extract import extract
    from xmatch.regions import RegionPipeline

    # windows pooled from a stride-16 map (xmatch extract's defaults), pinned as docs/scale.md measured them
    roi = {"image_size": args.image_size or 600, "output_stride": 16, "mode": "roi"}
    # Ray starts its workers at nice 15; here they compete with the other jobs on equal terms
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    root = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    try:
        photos = photo_folder(root, args.copies)
        count = sum(1 for p in photos.iterdir() if p.is_file())
        pipe = RegionPipeline.from_table({"proposer": "windows", "roi": roi})
        best: dict[int, float] = {}
        memory: dict[int, list[float]] = {}
        cpu: dict[int, list[float]] = {}
        steady: dict[int, float] = {}
        for round_ in range(args.rounds):
            for workers in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                out = root / f"out-{workers}"
                shutil.rmtree(out, ignore_errors=True)
                with WorkerMemory() as watched:
                    start = time.perf_counter()
                    extract(photos, out, pipe, batch_size=args.batch_size, progress=False, ray="local", ray_workers=workers)
                    seconds = time.perf_counter() - start
                best[workers] = min(best.get(workers, float("inf")), seconds)
                steady[workers] = max(steady.get(workers, 0.0), steady_rate(out))
                memory.setdefault(workers, []).extend(watched.peak.values())
                cpu.setdefault(workers, []).append(sum(watched.cpu.values()))
                print(f"round {round_ + 1}, {workers} worker(s): {seconds:.1f} s ({count / seconds:.2f} images/s), "
                      f"workers' CPU {sum(watched.cpu.values()):.1f} s, load average {os.getloadavg()[0]:.2f}", flush=True)
        size = args.image_size or 600
        print(f"\n{count} photos, windows 36 + EfficientNet-Lite0 at {size} px, {args.batch_size} per chunk; "
              f"{cpu_flags()}; {os.cpu_count()} cores; load average at the end {os.getloadavg()}")
        for workers in (1, 2):
            peak = max(memory[workers]) if memory[workers] else float("nan")
            print(f"{workers} worker(s): best {best[workers]:.1f} s, {count / best[workers]:.2f} images/s start-up "
                  f"included, {steady[workers]:.2f} images/s once running; workers' CPU "
                  f"{min(cpu[workers]) / count:.3f} s per picture (least of the rounds, start-up included); "
                  f"worker peak RSS {peak:.0f} MiB")
        print(f"speed-up of 2 workers over 1: {best[1] / best[2]:.2f}x start-up included, "
              f"{steady[2] / steady[1]:.2f}x once running")
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
