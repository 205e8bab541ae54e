"""Every benchmark starts from the repository root as the docs show it (``python
benchmarks/NAME.py ...``): its imports resolve, and its command line answers ``--help``.

A benchmark runs for minutes to hours; an import error found at its end (a subprocess that
imports the source tree, say) costs the whole run, so the start is checked here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 9


@pytest.mark.slow
def test_every_benchmark_answers_help_from_the_repository_root():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = {path.name: subprocess.Popen([sys.executable, str(path.relative_to(ROOT)), "--help"], cwd=ROOT, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for path in BENCHMARKS}
    failed = {}
    for name, process in started.items():
        out, _ = process.communicate(timeout=300)
        if process.returncode != 0 or "usage:" not in out:
            failed[name] = out[-2000:]
    assert not failed, "\n\n".join(f"benchmarks/{name}:\n{out}" for name, out in failed.items())


@pytest.mark.slow
def test_a_subprocess_started_from_the_root_imports_the_source_tree():
    # benchmarks/search_synthetic.py measures a resident process started with `python -c`
    out = subprocess.run([sys.executable, "-c", "import xmatch; print(xmatch.__file__); print(len(xmatch.list_models()))"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    path, count = out.stdout.split()
    assert Path(path).is_relative_to(ROOT / "xmatch") and int(count) >= 10
