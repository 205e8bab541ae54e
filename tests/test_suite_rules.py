"""Rules the test suite keeps about itself (docs/testing.md).

No test measures how long something takes: a timed assertion fails on a loaded or slower
machine while the code is right, so timings belong to ``benchmarks/``. Waiting with a deadline
(``time.monotonic()``: give up on a process that hangs) is not measuring and stays allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_FILES = sorted([*ROOT.glob("tests/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")])
#: the clocks one measures durations with, and a clock's reading minus another (a duration)
MEASURING = re.compile(r"\b(perf_counter|perf_counter_ns|process_time|process_time_ns|timeit)\b"
                       r"|\b(monotonic|time)\(\)\s*-\s*\w")


def test_no_test_measures_a_duration():
    here = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in TEST_FILES if path.resolve() != here
             for number, line in enumerate(path.read_text().splitlines(), 1) if MEASURING.search(line)]
    assert not found, "timings belong to benchmarks/, not to tests:\n" + "\n".join(found)


def test_the_rule_sees_a_timed_test():
    assert MEASURING.search("    start = time.perf_counter()")
    assert MEASURING.search("    assert time.monotonic() - start < 2.0")
    assert not MEASURING.search("    deadline = time.monotonic() + 60")
    assert not MEASURING.search("    item.finished.append(time.time())  # when the body was sent")
