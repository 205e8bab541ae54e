"""Relations and bindings on the built-in ``scenes`` benchmark: hard negatives, geometry, verifier.

Every configuration is trained by ``xmatch train`` from the ``teran-mrsw-scenes`` entry on the
``small`` preset with the same budget (5 epochs, batch 64, Adam 2e-4, cosine, best validation
rsum kept), once per seed, then evaluated by ``xmatch eval`` on

- the test split (100 images, 500 captions): Recall@K and rsum, the papers' protocol;
- the ``groups`` split (twin pairs only, >= 300 per kind): per-kind t2i / i2t group accuracy and
  the Winoground scores with bootstrap 95 % intervals (``--protocol groups``); configurations
  with a verifier also with ``--rerank K`` (reported separately).

Configurations (each changes one thing against the one before):

- ``teran``: the ``scenes-teran`` recipe (today's ``teran-mrsw-scenes``);
- ``teran-hn``: ``scenes-teran-hn``: structural negatives and in-group negatives;
- ``teran-hn-geo``: the same with relative box geometry in the image reasoner;
- ``teran-hn-geo-ver``: the same with a cross-attention verifier head trained alongside;
- ``teran-geo``: geometry without the negatives (what geometry alone does);
- ``teran-e15``, ``teran-hn-geo-ver-e15``: the first and the fourth with 15 epochs each.

Each run writes into ``--out/<config>-s<seed>/`` and is skipped when its results exist, so an
interrupted sweep resumes. ``--shipped`` also evaluates today's zoo models on both splits.

Usage:
    python benchmarks/scenes_hard_negatives.py --out runs/hn --seeds 0,1,2 --jobs 2
    python benchmarks/scenes_hard_negatives.py --out runs/hn --configs teran-hn --seeds 0 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Config:
    """One trained configuration."""

    key: str
    recipe: str
    model_set: list[str] = field(default_factory=list)
    verifier: bool = False
    train_set: list[str] = field(default_factory=list)


GEOMETRY = ["image_reasoner.geometry=relative"]
VERIFIER = ["verifier.name=cross-attention"]
CONFIGS = [
    Config("teran", "scenes-teran"),
    Config("teran-hn", "scenes-teran-hn"),
    Config("teran-hn-geo", "scenes-teran-hn", GEOMETRY),
    Config("teran-hn-geo-ver", "scenes-teran-hn", GEOMETRY + VERIFIER, verifier=True),
    Config("teran-geo", "scenes-teran", GEOMETRY),
    # a three times larger budget, the same for both
    Config("teran-e15", "scenes-teran", train_set=["epochs=15"]),
    Config("teran-hn-geo-ver-e15", "scenes-teran-hn", GEOMETRY + VERIFIER, verifier=True, train_set=["epochs=15"]),
]
XMATCH = [sys.executable, "-m", "xmatch"]
SHIPPED = {"teran-mrsw-scenes": [], "tern-scenes": [], "teran-mrsw-grid-scenes": ["layout=images"]}


def run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Run a command into a log file; its wall time in seconds."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}); see {log}:\n" + log.read_text()[-2000:])
    return time.perf_counter() - start


def eval_commands(model: str, data: Path, folder: Path, device: str, options: list[str], rerank: int | None) -> dict[str, list[str]]:
    """The evaluations of one model; with ``rerank`` each also re-ranks with the verifier (the
    JSON then holds the pooler's figures and, under ``rerank``, the re-ranked ones)."""
    base = [*XMATCH, "eval", model, "--dataset", "scenes", "--data", str(data), "--device", device]
    base += [a for o in options for a in ("--data-option", o)]
    extra = ["--rerank", str(rerank)] if rerank else []
    return {
        "test": base + ["--split", "test", "--json", str(folder / "test.json"), *extra],
        "groups": base + ["--split", "groups", "--protocol", "groups", "--json", str(folder / "groups.json"), *extra],
    }


def run_config(config: Config, seed: int, data: Path, out: Path, device: str, threads: int, rerank: int,
               data_options: list[str], train_set: list[str]) -> dict:
    folder = out / f"{config.key}-s{seed}"
    result_file = folder / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    train = [*XMATCH, "train", "teran-mrsw-scenes", "--dataset", "scenes", "--data", str(data), "--recipe", config.recipe,
             "--set", f"seed={seed}", "--device", device, "--out", str(folder / "run"), "--overwrite", "--no-progress"]
    train += [a for s in config.model_set for a in ("--model-set", s)]
    train += [a for s in [*config.train_set, *train_set] for a in ("--set", s)]
    train += [a for o in data_options for a in ("--data-option", o)]
    done = (folder / "run" / "final").is_dir() and (folder / "run" / "best").is_dir()
    # a run trained to the end (by an interrupted sweep) is evaluated, not trained again
    times = {"train": float("nan") if done else run(train, folder / "train.log", env)}
    model = f"local-dir:{folder / 'run' / 'best'}"
    failures = {}
    for name, cmd in eval_commands(model, data, folder, device, data_options, rerank if config.verifier else None).items():
        try:
            times[name] = run(cmd, folder / f"eval-{name}.log", env)
        except RuntimeError as exc:  # keep the run and the other evaluations
            failures[name] = str(exc)
    result = {"config": config.key, "seed": seed, "seconds": times, "train_command": shlex.join(train), "failures": failures}
    for name in ("test", "groups"):
        if (folder / f"{name}.json").is_file():
            result[name] = json.loads((folder / f"{name}.json").read_text())
    result_file.write_text(json.dumps(result, indent=1))
    print(f"{config.key} seed {seed}: done in {sum(times.values()) / 60:.1f} min", flush=True)
    return result


def run_shipped(name: str, data: Path, out: Path, device: str, threads: int, data_options: list[str]) -> dict:
    folder = out / f"shipped-{name}"
    result_file = folder / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    times = {k: run(cmd, folder / f"eval-{k}.log", env)
             for k, cmd in eval_commands(name, data, folder, device, [*SHIPPED[name], *data_options], None).items()}
    result = {"config": f"shipped:{name}", "seed": None, "seconds": times}
    for key in ("test", "groups"):
        result[key] = json.loads((folder / f"{key}.json").read_text())
    result_file.write_text(json.dumps(result, indent=1))
    return result


def figure(doc: dict, *path: str) -> float:
    """A number from an ``xmatch eval --json`` document (``None`` when absent)."""
    node = doc
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return float("nan")
        node = node[key]
    return float(node)


def group_figures(doc: dict, reranked: bool = False) -> dict[str, dict[str, float]]:
    """``{kind: {figure: value}, "all": ...}`` of the groups protocol in an ``xmatch eval --json``
    document (``reranked``: the verifier's figures)."""
    groups = (doc.get("rerank") or {}).get("groups") if reranked else doc.get("groups")
    if not groups:
        return {}
    plain = lambda figures: {k: float(v) for k, v in figures.items() if isinstance(v, (int, float))}  # noqa: E731
    out = {kind: plain(figures) for kind, figures in groups.get("by_kind", {}).items()}
    out["all"] = plain(groups.get("overall", {}))
    return out


def summary(results: list[dict]) -> str:
    """Mean and standard deviation over seeds per configuration (one row each)."""
    by_config: dict[str, list[dict]] = {}
    for r in results:
        by_config.setdefault(r["config"], []).append(r)
    head = ("| model | seeds | t2i R@1 | rsum | relation t2i | relation group | colour t2i | size t2i | all t2i "
            "| reranked: relation t2i / group, colour t2i, size t2i |")
    lines = [head, "|" + "---|" * 10]

    def cell(values: list[float]) -> str:
        values = [v for v in values if v == v]
        if not values:
            return "-"
        if len(values) == 1:
            return f"{values[0]:.1f}"
        return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"

    for key, runs in by_config.items():
        runs = [r for r in runs if "test" in r and "groups" in r]
        if not runs:
            continue
        test = [r["test"] for r in runs]
        groups = [group_figures(r["groups"]) for r in runs]
        rsum = [sum(figure(t, d, k) for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")) for t in test]
        kinds = lambda gs, kind, name: [g.get(kind, {}).get(name, float("nan")) for g in gs]  # noqa: E731
        reranked = [g for g in (group_figures(r["groups"], reranked=True) for r in runs) if g]
        rr = "-" if not reranked else (f"{cell(kinds(reranked, 'relation', 't2i'))} / {cell(kinds(reranked, 'relation', 'group'))}, "
                                       f"{cell(kinds(reranked, 'colour', 't2i'))}, {cell(kinds(reranked, 'size', 't2i'))}")
        lines.append(
            f"| {key} | {len(runs)} | {cell([figure(t, 't2i', 'r1') for t in test])} | {cell(rsum)} "
            f"| {cell(kinds(groups, 'relation', 't2i'))} | {cell(kinds(groups, 'relation', 'group'))} "
            f"| {cell(kinds(groups, 'colour', 't2i'))} | {cell(kinds(groups, 'size', 't2i'))} | {cell(kinds(groups, 'all', 't2i'))} | {rr} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scenes-hard-negatives"))
    parser.add_argument("--data", type=Path, help="scenes cache folder (default: $XMATCH_HOME/datasets/scenes)")
    parser.add_argument("--configs", help="comma-separated configurations (default: all): " + ", ".join(c.key for c in CONFIGS))
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each gets cores / jobs threads)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (every job shares it)")
    parser.add_argument("--rerank", type=int, default=20, help="verifier re-ranking depth K (default 20)")
    parser.add_argument("--shipped", action="store_true", help="also evaluate today's zoo models")
    parser.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                        help="scenes option for every run, e.g. size=tiny (repeatable)")
    parser.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                        help="training setting for every run, e.g. max_steps=2 (repeatable)")
    args = parser.parse_args(argv)
    keys = args.configs.split(",") if args.configs else [c.key for c in CONFIGS]
    by_key = {c.key: c for c in CONFIGS}
    unknown = sorted(set(keys) - set(by_key))
    if unknown:
        parser.error(f"unknown configurations {unknown}; configurations: {', '.join(by_key)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    from xmatch.data import open_dataset
    from xmatch.io.hub import cache_dir

    data = args.data or cache_dir() / "datasets" / "scenes"
    options = dict(o.split("=", 1) for o in args.data_option)
    for split in ("train", "groups"):  # generate once, before the jobs race for it
        open_dataset("scenes", data, split=split, progress=False, **options)
    if args.shipped:
        open_dataset("scenes", data, split="groups", layout="images", progress=False, **options)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    # the longest runs first, so that the last wave is not one long run alone
    jobs = sorted(((by_key[k], s) for s in seeds for k in keys), key=lambda job: not job[0].train_set)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: run_config(*job, data, args.out, args.device, threads, args.rerank,
                                                                args.data_option, args.train_set), jobs))
        if args.shipped:
            results += list(pool.map(lambda name: run_shipped(name, data, args.out, args.device, threads, args.data_option), SHIPPED))
    print(summary(results))
    (args.out / "summary.md").write_text(summary(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
