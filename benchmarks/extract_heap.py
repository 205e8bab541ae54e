"""CPU per picture of ``xmatch extract`` at its defaults with and without kept freed memory, and
of the extractor as it was before 2026-11-27.

``xmatch extract`` makes glibc keep freed blocks in its heap (:func:`xmatch.core.memory.keep_freed_memory`);
``XMATCH_MALLOC=system`` leaves the allocator as it is, which maps every block above 32 MB afresh
and has the kernel zero its pages again. The setting holds for a whole process, so each run is
a process of its own: the command line on ``N`` pictures and on ``2N`` (the first N and N more),
and a picture's cost is the difference divided by N (the start-up, the model's loading and the
first batch's one-time costs cancel out). The two variants take turns, the order rotated each
round; each one's fastest round is kept. User and system CPU come from each child's resource
usage, so the kernel's share is printed apart; the peak resident memory of the 2N run too.
``today`` is the extractor of before 2026-11-27 (batch norms unfolded, files at zlib level 6;
:func:`extract_speed.variant_pipeline`) with the allocator as it is, run by this script in a
process of its own; every variant decodes in its own process (no decoding workers).

    OMP_NUM_THREADS=1 python benchmarks/extract_heap.py --rounds 3
    OMP_NUM_THREADS=1 python benchmarks/extract_heap.py --images ~/.cache/xmatch/datasets/signs/signs-small-256px-seed0-v1/images --pictures 48
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_speed import photo_folder  # noqa: E402
from negatives_cost import cpu_flags, load  # noqa: E402

#: name -> (environment, how the child runs); ratios are to the first
VARIANTS = {
    "today (before 2026-11-27)": ({"XMATCH_MALLOC": "system"}, "today"),
    "now, XMATCH_MALLOC=system": ({"XMATCH_MALLOC": "system"}, "cli"),
    "now, kept (xmatch extract)": ({}, "cli"),
}
#: the defaults' row of extract_speed.py (windows, 600 px, stride 16)
DEFAULTS_ROW = "windows-lite0-600-s16"


def folders(root: Path, images: Path | None, pictures: int) -> tuple[Path, Path, str]:
    """Folders of the first ``pictures`` and ``2 * pictures`` pictures, and what they hold."""
    if images is None:
        source = photo_folder(root, copies=max(1, -(-2 * pictures // 6)))
        what = "scikit-image's photos (300 x 451 to 872 x 1000 px)"
    else:
        source, what = images, str(images)
    files = sorted(p for p in source.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if len(files) < 2 * pictures:
        raise SystemExit(f"{source} holds {len(files)} pictures; --pictures {pictures} needs {2 * pictures}.")
    small, large = root / "n", root / "2n"
    for folder, count in ((small, pictures), (large, 2 * pictures)):
        folder.mkdir()
        for f in files[:count]:
            shutil.copy(f, folder / f.name)
    return small, large, what


def today(folder: Path, out: Path) -> None:
    """Extract as the extractor of before 2026-11-27 did (this script's ``--child-today``)."""
    from extract_speed import variant_pipeline

    from xmatch.extract import extract, writers

    writers.NPZ_LEVEL = 6
    extract(folder, out, variant_pipeline(DEFAULTS_ROW, "today"), workers=0, progress=False)


def run(folder: Path, out: Path, variant: str) -> tuple[float, float, float, int]:
    """One extraction process: wall, user and system seconds, peak resident KiB."""
    environment, how = VARIANTS[variant]
    env = {k: v for k, v in os.environ.items() if k != "XMATCH_MALLOC"} | environment
    command = ([sys.executable, __file__, "--child-today", str(folder), str(out)] if how == "today" else
               [sys.executable, "-m", "xmatch", "extract", str(folder), "--out", str(out), "--workers", "0", "--no-progress"])
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as messages:
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=messages)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own usage and peak memory
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            messages.seek(0)
            raise SystemExit(f"xmatch extract {folder} failed ({child.returncode}):\n{messages.read()}")
    shutil.rmtree(out)
    return wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=Path, help="a folder of pictures (default: scikit-image's photos, copied)")
    parser.add_argument("--pictures", type=int, default=24, help="N: the runs extract N and 2N pictures")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child-today", nargs=2, type=Path, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_today:
        today(*args.child_today)
        return
    print(f"{cpu_flags()}; {os.environ.get('OMP_NUM_THREADS', 'all')} thread(s); load average {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        small, large, what = folders(Path(tmp), args.images, args.pictures)
        print(f"xmatch extract at its defaults, {args.pictures} and {2 * args.pictures} pictures of {what}")
        best: dict[str, tuple[float, float, float, int]] = {}
        names = list(VARIANTS)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                n = run(small, Path(tmp) / "out", name)
                n2 = run(large, Path(tmp) / "out", name)
                per = tuple((b - a) / args.pictures for a, b in zip(n[:3], n2[:3]))
                if name not in best or per[1] + per[2] < best[name][1] + best[name][2]:
                    best[name] = (*per, n2[3])
        base = best[names[0]]
        print(f"per picture, the fastest of {args.rounds} rounds (CPU = user + system):")
        for name, (wall, user, system, peak) in best.items():
            cpu = user + system
            print(f"{name:27s}: {cpu * 1000:5.0f} ms CPU ({user * 1000:4.0f} user, {system * 1000:4.0f} system), "
                  f"{wall * 1000:5.0f} ms wall, {(base[1] + base[2]) / cpu:4.2f}x today's pictures per CPU second; "
                  f"peak memory {peak / 1024:5.0f} MiB")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
