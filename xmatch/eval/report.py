"""Comparison reports: several evaluated models side by side, as a terminal table, PNG plots
and one self-contained HTML page.

The input is a list of :class:`~xmatch.eval.suite.RunRecord` (``xmatch eval`` makes them,
or reads them back from ``--json`` files). Every table and figure names, per model, the
protocol, split, dataset fingerprint and model fingerprint it was computed with, so a number
can be traced to how it was made; each PNG also carries them in its metadata
(``xmatch-provenance``).

Plots need matplotlib (``pip install 'xmatch-zoo[report]'``), imported only here.

A report folder is the report's own: :func:`write_report` records what it wrote in
``xmatch-report.json`` (:data:`REPORT_MARKER`, each file's sha256) and refuses to write over a
file of one of its names that it did not write, or that changed since (``overwrite=True``,
``--overwrite``, writes anyway); files of other names are never touched. Names (models, kinds,
probes, splits) are printed at most :data:`MAX_NAME_CHARS` long (:func:`shown_name`).

Example:
    >>> records = [run_protocols(m, test, "full,groups", name=n) for n, m in models.items()]  # evaluates models on the scenes benchmark (minutes)  # doctest: +SKIP
    >>> print(comparison_tables(records))  # doctest: +SKIP
    >>> write_report(records, "out/")  # doctest: +SKIP
    {'recall_curves': PosixPath('out/recall_curves.png'), ..., 'html': PosixPath('out/index.html')}
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import json
import logging
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.core.errors import XmatchError
from xmatch.eval.groups import FIGURES as GROUP_FIGURES
from xmatch.eval.suite import NO_RECALL, RunRecord, save_records
from xmatch.io.safe_load import load_json

logger = logging.getLogger(__name__)

DIRECTIONS = {"i2t": "image → text (sentence retrieval)", "t2i": "text → image (image retrieval)"}
MAX_K = 100
#: ground-truth rank bins of the rank-distribution plot (1-based, inclusive)
RANK_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 20), (21, 50), (51, 100), (101, None))
PROBE_FIGURE = "r1"
#: the longest name (model, kind, probe, split, dataset) a table, plot or page prints
MAX_NAME_CHARS = 240
#: the file in which a report lists the files it wrote, with their sha256
REPORT_MARKER = "xmatch-report.json"
REPORT_FORMAT = "xmatch-report/1"


class ReportFolderError(XmatchError, ValueError):
    """The report's folder holds files of the report's names that a report did not write (the
    message names them and the way out: another folder, or ``--overwrite``)."""


# -- names ---------------------------------------------------------------------------------


def shown_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """``name`` as a report prints it: whole when it is at most ``limit`` characters, else its
    start and end around ``…`` followed by 8 hex digits of its sha256, so that two long names
    that differ anywhere stay apart (drawing every character of a 100,000-character name took
    matplotlib most of an hour).

    Example:
        >>> shown_name("teran-mrsw-scenes")
        'teran-mrsw-scenes'
        >>> shown_name("m" * 1000 + "-one") != shown_name("m" * 1000 + "-two"), len(shown_name("m" * 1000))
        (True, 240)
    """
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    tail = (limit - 12) // 3  # the end often tells names apart (a checkpoint step, a variant)
    return f"{name[: limit - 12 - tail]}…{name[-tail:]} ({digest})"


def _bounded(value: Any) -> Any:
    """``value`` (plain data) with every string, keys included, passed through :func:`shown_name`."""
    if isinstance(value, str):
        return shown_name(value)
    if isinstance(value, Mapping):
        return {shown_name(k) if isinstance(k, str) else k: _bounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bounded(v) for v in value]
    return value


def shown_records(records: Sequence[RunRecord]) -> list[RunRecord]:
    """Copies of ``records`` as tables and plots print them: names, protocol, provenance and
    the extras' names (kinds, probes) bounded by :func:`shown_name`; figures and ranks as they are.

    Example:
        >>> from xmatch.eval import evaluate_scores
        >>> [len(r.name) for r in shown_records([RunRecord("m" * 10_000, evaluate_scores(np.eye(3).repeat(5, axis=1)))])]
        [240]
    """
    return [
        dataclasses.replace(
            r, name=shown_name(r.name), result=dataclasses.replace(r.result, protocol=shown_name(str(r.result.protocol))),
            extras=_bounded(r.extras), provenance=_bounded(r.provenance),
        )
        for r in records
    ]


# -- how figures are written -------------------------------------------------------------


@dataclass(frozen=True)
class NotApplicable:
    """A figure that cannot be computed for these data (shown ``n/a``), and why.

    Example:
        >>> str(NotApplicable("no pairs of this kind"))
        'n/a'
    """

    reason: str

    def __str__(self) -> str:
        return "n/a"


@dataclass(frozen=True)
class WithInterval:
    """A figure with its confidence interval, written ``85.3 [82.1, 88.4]``.

    Example:
        >>> format_figure(WithInterval(85.31, 82.06, 88.44))
        '85.3 [82.1, 88.4]'
    """

    value: Any
    low: float
    high: float


#: a figure that was not computed: the protocol was not asked for, or the result file lacks it
NOT_COMPUTED = "-"
#: what each mark means (the report's legend)
LEGEND = {
    NOT_COMPUTED: "not computed (the protocol was not asked for, or the result file lacks the figure)",
    "n/a": "cannot be computed for these data (the reason is given beside the table or plot)",
    "NaN": "the figure came out as not-a-number (e.g. a score matrix holding NaN): check the scores",
    "inf / -inf": "the figure came out infinite: check the scores",
}


def format_figure(value: Any, digits: int = 1) -> str:
    """A figure as the report writes it: a number with ``digits`` decimals, ``-`` when it was
    not computed (None), ``n/a`` when it cannot be (:class:`NotApplicable`), and ``NaN``,
    ``inf`` or ``-inf`` when it came out non-finite (never ``-``: a broken figure must not look
    like a missing one).

    A :class:`WithInterval` is the figure then its interval in brackets.

    Example:
        >>> [format_figure(v) for v in (66.83, 3, None, NotApplicable("no pairs"), float("nan"), float("-inf"))]
        ['66.8', '3', '-', 'n/a', 'NaN', '-inf']
    """
    if isinstance(value, WithInterval):
        return f"{format_figure(value.value, digits)} [{format_figure(value.low, digits)}, {format_figure(value.high, digits)}]"
    if value is None:
        return NOT_COMPUTED
    if isinstance(value, (str, NotApplicable)):
        return str(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.number)):
        return str(value)
    if isinstance(value, (numbers.Integral, np.integer)):
        return str(int(value))
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return f"{number:.{digits}f}"


def legend_lines(values: Sequence[Any]) -> list[str]:
    """The legend entries of the marks among ``values``: ``n/a`` with each of its reasons, then
    ``NaN`` and ``inf``; nothing for plain numbers (``-`` is explained on the report's page).

    Example:
        >>> legend_lines([1.0, float("nan"), NotApplicable("no pairs of this kind")])
        ['n/a: no pairs of this kind', 'NaN: the figure came out as not-a-number (e.g. a score matrix holding NaN): check the scores']
    """
    values = [v.value if isinstance(v, WithInterval) else v for v in values]
    shown = {format_figure(v) for v in values if not isinstance(v, str)}
    reasons = list(dict.fromkeys(v.reason for v in values if isinstance(v, NotApplicable)))
    lines = [f"n/a: {reason}" for reason in reasons]
    if "NaN" in shown:
        lines.append(f"NaN: {LEGEND['NaN']}")
    if shown & {"inf", "-inf"}:
        lines.append(f"inf / -inf: {LEGEND['inf / -inf']}")
    return lines


# -- tables --------------------------------------------------------------------------------


@dataclass
class Table:
    """A titled table that renders as aligned text or as HTML.

    Cells are strings, numbers (``digits`` decimals; NaN and infinities written ``NaN``,
    ``inf``, ``-inf``), None (not computed: ``-``) or :class:`NotApplicable` (``n/a``, its
    reason listed under the table), see :func:`format_figure`.

    Attributes:
        title: the heading.
        columns: column names.
        rows: the cells; a row starting with a non-empty cell after rows with empty first
            cells starts a new block.
        note: a line under the table.
        digits: decimals of a number.
        column_digits: decimals of the numbers of some columns, by column name.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""
    digits: int = 1
    column_digits: dict[str, int] = field(default_factory=dict)

    def _cell(self, value: Any, column: int) -> str:
        return format_figure(value, self.column_digits.get(self.columns[column], self.digits))

    def notes(self) -> list[str]:
        """The lines under the table: its note, then the legend of the marks it shows."""
        return ([self.note] if self.note else []) + legend_lines([v for row in self.rows for v in row])

    def text(self) -> str:
        cells = [self.columns] + [[self._cell(v, k) for k, v in enumerate(row)] for row in self.rows]
        widths = [max(len(r[k]) for r in cells) for k in range(len(self.columns))]
        # names left, numbers right
        text = [all(isinstance(row[k], str) or row[k] is None for row in self.rows) for k in range(len(widths))]
        line = lambda r: "  ".join(c.ljust(w) if t else c.rjust(w) for c, w, t in zip(r, widths, text)).rstrip()  # noqa: E731
        out = [self.title, line(cells[0]), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in cells[1:]]
        out += self.notes()
        return "\n".join(out)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(self._cell(v, k))}</td>" for k, v in enumerate(row)) + "</tr>"
            for row in self.rows
        )
        notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in self.notes())
        return f"<h2>{html.escape(self.title)}</h2><table><tr>{head}</tr>{body}</table>{notes}"


def _fingerprints(record: RunRecord) -> str:
    models = record.provenance.get("models") or []
    return ", ".join(f"{m['name']} {m['fingerprint']}" for m in models) or "-"


def provenance_table(records: Sequence[RunRecord]) -> Table:
    """Where each row's numbers come from."""
    table = Table("How each number was computed", ["model", "protocol", "split", "dataset (fingerprint)",
                                                   "model fingerprint", "created"])
    for r in records:
        p = r.provenance
        data = p.get("dataset") or {}
        dataset = f"{data.get('name', '?')} {data.get('fingerprint', '?')}" if data else p.get("source", "?")
        kind = " (ensemble)" if p.get("ensemble") else ""
        table.rows.append([r.name, p.get("protocol", r.result.protocol), p.get("split"), dataset,
                           _fingerprints(r) + kind, p.get("created", "-")])
    return table


def recall_table(records: Sequence[RunRecord]) -> Table | None:
    """R@1/5/10 both ways, medr, rsum and any NDCG, one row per model (None when no record
    computed Recall@K: protocol ``none``, e.g. the scenes ``groups`` split)."""
    records = [r for r in records if r.result.protocol != NO_RECALL]
    if not records:
        return None
    ndcg = sorted({k for r in records for k in r.result.t2i if k.startswith("ndcg_")})
    columns = ["model", *(f"{d} R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)), "i2t medr", "t2i medr",
               *(f"{d} {n.replace('ndcg_', 'NDCG ')}" for n in ndcg for d in ("i2t", "t2i")), "rsum"]
    protocols = sorted({r.result.protocol for r in records})
    table = Table(f"Recall@K ({', '.join(protocols)})", columns,
                  column_digits={c: 4 for c in columns if "NDCG" in c})
    for r in records:
        res = r.result
        table.rows.append([r.name, *(getattr(res, d).get(f"r{k}") for d in ("i2t", "t2i") for k in (1, 5, 10)),
                           res.i2t.get("medr"), res.t2i.get("medr"),
                           *(getattr(res, d).get(n) for n in ndcg for d in ("i2t", "t2i")), res.rsum])
    return table


#: the Winoground scores, defined on groups of two only
WINOGROUND = ("text", "image", "group")
#: why a kind without pairs has no Winoground scores
NO_PAIRS = NotApplicable("no groups of two (pairs) of this kind: the Winoground scores (text, image, group) are "
                         "defined on pairs only")


def group_figure(row: Mapping[str, Any], figure: str) -> Any:
    """A figure of a group result row (``t2i``, ``group``, ``group_chance``...): None when the
    row does not hold it (not computed), :class:`NotApplicable` when it is recorded as
    undefined (a Winoground score of a kind without pairs), else the number.

    Example:
        >>> group_figure({"t2i": 50.0, "group": None, "pairs": 0}, "group")
        NotApplicable(reason='no groups of two (pairs) of this kind: the Winoground scores (text, image, group) are defined on pairs only')
    """
    if figure not in row:
        return None
    value = row[figure]
    if value is not None:
        return value
    if figure.removesuffix("_chance") in WINOGROUND:
        return NO_PAIRS
    return NotApplicable("no queries of this kind")


def group_interval(row: Mapping[str, Any], figure: str) -> tuple[float, float] | None:
    """The bootstrap interval ``(low, high)`` of a group figure (``row["t2i_ci"]``), None when
    the row has none (results made before the intervals, or a figure that cannot be computed).

    Example:
        >>> group_interval({"t2i": 85.3, "t2i_ci": [82.1, 88.4]}, "t2i")
        (82.1, 88.4)
    """
    interval = row.get(f"{figure}_ci")
    if not isinstance(interval, (list, tuple)) or len(interval) != 2 or group_figure(row, figure) is None:
        return None
    return float(interval[0]), float(interval[1])


def group_cell(row: Mapping[str, Any], figure: str) -> Any:
    """A group figure as a table cell: with its interval (:class:`WithInterval`) when it has one,
    else as :func:`group_figure` gives it."""
    value, interval = group_figure(row, figure), group_interval(row, figure)
    return value if interval is None or isinstance(value, NotApplicable) else WithInterval(value, *interval)


def interval_note(records: Sequence[RunRecord]) -> str:
    """What the group figures' intervals are, from the first record that has them ('' if none)."""
    for r in records:
        b = (r.extras.get("groups") or {}).get("bootstrap")
        if b:
            return (f"[low, high]: {100 * float(b['confidence']):g}% bootstrap interval: the groups resampled with "
                    f"replacement {b['resamples']} times (a kind's within the kind), percentiles (seed {b['seed']}).")
    return ""


def group_table(records: Sequence[RunRecord]) -> Table | None:
    """Hard-negative group accuracies and Winoground scores, per kind of difference, with the
    number of groups of each kind and, where computed, each figure's bootstrap interval."""
    with_groups = [r for r in records if "groups" in r.extras]
    if not with_groups:
        return None
    table = Table("Hard-negative groups (percent; ties count as wrong)",
                  ["model", "kind", "groups", *GROUP_FIGURES])
    chance = with_groups[0].extras["groups"]["overall"]
    for r in with_groups:
        g = r.extras["groups"]
        for k, (kind, row) in enumerate([*sorted(g["by_kind"].items()), ("all", g["overall"])]):
            table.rows.append([r.name if k == 0 else "", kind, row.get("groups"),
                               *(group_cell(row, f) for f in GROUP_FIGURES)])
    table.rows.append(["chance", "", "", *(group_figure(chance, f"{f}_chance") for f in GROUP_FIGURES)])
    table.note = " ".join(filter(None, [
        "t2i: a caption's own image beats every other image of its group; i2t: an image's own caption beats every "
        "caption of the other members; text / image / group: Winoground scores over pairs.", interval_note(with_groups)]))
    return table


def probe_table(records: Sequence[RunRecord]) -> Table | None:
    """What each perturbation costs, in R@K points."""
    with_probes = [r for r in records if "probes" in r.extras]
    if not with_probes:
        return None
    table = Table("Perturbation probes: cost in R@K points (original minus perturbed captions)",
                  ["model", "probe", "changed %", *(f"{d} R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10))])
    for r in with_probes:
        for k, (name, probe) in enumerate(r.extras["probes"]["probes"].items()):
            costs = [probe["cost"][d][f"r{n}"] for d in ("i2t", "t2i") for n in (1, 5, 10)]
            table.rows.append([r.name if k == 0 else "", name, probe["changed"], *costs])
    table.note = "Positive = the model loses recall when the captions lose that structure."
    return table


def eccv_table(records: Sequence[RunRecord]) -> Table | None:
    """ECCV Caption mAP@R, R-Precision, R@1 and PMRP."""
    rows = [r for r in records if "eccv-caption" in r.extras]
    if not rows:
        return None
    table = Table("ECCV Caption (COCO 5K test, extra verified positives; percent)",
                  ["model", *(f"{d} {m}" for d in ("i2t", "t2i") for m in ("mAP@R", "R-P", "R@1")), "i2t PMRP", "t2i PMRP"])
    missing = ""
    for r in rows:
        e = r.extras["eccv-caption"]
        p = e.get("pmrp") or {}
        missing = missing or p.get("missing", "")
        table.rows.append([r.name, *(e[d][m] for d in ("i2t", "t2i") for m in ("map_at_r", "rprecision", "r1")),
                           p.get("i2t"), p.get("t2i")])
    table.note = missing
    return table


def cxc_table(records: Sequence[RunRecord]) -> Table | None:
    """CxC Recall@K."""
    rows = [r for r in records if "cxc" in r.extras]
    if not rows:
        return None
    table = Table("CxC Recall@K (COCO 5K test, extra positives; percent)",
                  ["model", *(f"{d} R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10))])
    for r in rows:
        table.rows.append([r.name, *(r.extras["cxc"][d][f"r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))])
    return table


def tables(records: Sequence[RunRecord]) -> list[Table]:
    """Every table that applies to these records (names bounded, :func:`shown_records`)."""
    records = shown_records(records)
    found = [recall_table(records), group_table(records), probe_table(records), eccv_table(records),
             cxc_table(records), provenance_table(records)]
    return [t for t in found if t is not None]


def comparison_tables(records: Sequence[RunRecord]) -> str:
    """All tables as terminal text.

    Example:
        >>> from xmatch.eval import evaluate_scores
        >>> from xmatch.eval.suite import RunRecord
        >>> records = [RunRecord("perfect", evaluate_scores(np.eye(3).repeat(5, axis=1), "full"))]  # or load_records(...)
        >>> print(comparison_tables(records))
        Recall@K (full)
        model    i2t R@1  i2t R@5  i2t R@10  t2i R@1  t2i R@5  t2i R@10  i2t medr  t2i medr   rsum
        -------  -------  -------  --------  -------  -------  --------  --------  --------  -----
        perfect    100.0    100.0     100.0    100.0    100.0     100.0       1.0       1.0  600.0
        ...
    """
    if not records:
        raise ValueError("a comparison needs at least one evaluated model or result file.")
    return "\n\n".join(t.text() for t in tables(records))


# -- plots ---------------------------------------------------------------------------------


def check_plotting() -> None:
    """Fail now, before a long evaluation, when the plots cannot be drawn (no matplotlib)."""
    _pyplot()


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the report's plots need matplotlib: pip install matplotlib (or 'xmatch-zoo[report]').") from None
    matplotlib.use("Agg", force=True)  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def recall_curve(ranks: np.ndarray, max_k: int = MAX_K) -> np.ndarray:
    """R@K (percent) for K = 1 ... ``max_k`` from 0-based ground-truth ranks.

    Example:
        >>> recall_curve(np.array([0, 0, 3, 7]), 4).tolist()
        [50.0, 50.0, 50.0, 75.0]
    """
    counts = np.bincount(np.minimum(np.asarray(ranks, dtype=np.int64), max_k), minlength=max_k + 1)
    return 100.0 * np.cumsum(counts[:max_k]) / len(ranks)


def rank_histogram(ranks: np.ndarray) -> np.ndarray:
    """Percent of queries per bin of :data:`RANK_BINS` (1-based ground-truth rank).

    Example:
        >>> rank_histogram(np.array([0, 1, 2, 500])).tolist()
        [25.0, 25.0, 25.0, 0.0, 0.0, 0.0, 0.0, 25.0]
    """
    rank = np.asarray(ranks) + 1
    hits = [(rank >= lo) & (rank <= (hi if hi is not None else np.inf)) for lo, hi in RANK_BINS]
    return 100.0 * np.array([h.mean() for h in hits])


def _footer_lines(records: Sequence[RunRecord]) -> list[str]:
    lines = []
    for r in records:
        p = r.provenance
        data = p.get("dataset") or {}
        lines.append(f"{r.name}: protocol {p.get('protocol', r.result.protocol)} · split {p.get('split')} · "
                     f"dataset {data.get('name', '?')} {data.get('fingerprint', '?')} · model {_fingerprints(r)}")
    return lines


def _footer_text(fig: Any, lines: Sequence[str]) -> Any:
    return fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="#555555", va="bottom", ha="left",
                    family="monospace")


def _footer(fig: Any, records: Sequence[RunRecord]) -> None:
    lines = _footer_lines(records)
    _footer_text(fig, lines)
    fig.subplots_adjust(bottom=0.14 + 0.035 * len(lines))


def _save(fig: Any, path: Path, records: Sequence[RunRecord]) -> Path:
    provenance = json.dumps([{"name": r.name, **r.provenance} for r in records])
    fig.savefig(path, dpi=110, metadata={"xmatch-provenance": provenance, "Software": "xmatch"})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _colours(n: int) -> list[Any]:
    plt = _pyplot()
    return [plt.get_cmap("tab10")(k % 10) for k in range(n)]


def plot_recall_curves(records: Sequence[RunRecord], path: str | os.PathLike) -> Path | None:
    """Recall@K for K = 1 ... 100 in both directions, one line per model (log K axis)."""
    plt = _pyplot()
    usable = [r for r in shown_records(records) if r.ranks("i2t") is not None and r.ranks("t2i") is not None]
    if not usable:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8 + 0.25 * len(usable)))
    for ax, direction in zip(axes, ("i2t", "t2i")):
        for r, colour in zip(usable, _colours(len(usable))):
            ranks = r.ranks(direction)
            gallery = int(r.provenance.get("dataset", {}).get("captions" if direction == "i2t" else "images") or MAX_K)
            ks = np.arange(1, min(MAX_K, gallery) + 1)
            ax.plot(ks, recall_curve(ranks, MAX_K)[: len(ks)], label=r.name, color=colour, linewidth=2)
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 5, 10, 20, 50, 100], labels=["1", "2", "5", "10", "20", "50", "100"])
        ax.set_xlabel("K")
        ax.set_ylabel("R@K (%)")
        ax.set_ylim(0, 101)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(DIRECTIONS[direction])
    axes[1].legend(loc="lower right")
    fig.suptitle("Recall@K: share of queries whose ground truth is in the top K")
    _footer(fig, usable)
    return _save(fig, Path(path), usable)


def _finite(value: Any) -> float | None:
    """The value as a float when it is a finite number, else None (a mark is drawn instead)."""
    if isinstance(value, (numbers.Real, np.number)) and not isinstance(value, (bool, np.bool_)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


#: how a mark (``n/a``, ``-``, ``NaN``, ``inf``) is drawn in a plot, beside its empty slot
MARK_STYLE = {"fontsize": 7, "color": "#888888", "fontstyle": "italic"}


def _bars(ax: Any, labels: Sequence[str], series: Sequence[tuple[str, Sequence[Any]]],
          colours: Sequence[Any]) -> None:
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(labels))
    for k, ((name, values), colour) in enumerate(zip(series, colours)):
        heights = [np.nan if (number := _finite(v)) is None else number for v in values]
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, heights, width, label=name, color=colour)
        for bar, value, height in zip(bars, values, heights):
            centre = bar.get_x() + bar.get_width() / 2
            if np.isfinite(height):
                ax.annotate(f"{round(height) + 0:.0f}", (centre, max(height, 0)), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
            else:  # the empty slot says why it is empty
                ax.annotate(format_figure(value), (centre, 0), ha="center", va="bottom", xytext=(0, 1),
                            textcoords="offset points", rotation=90, **MARK_STYLE)
    ax.set_xticks(x, labels=labels)
    ax.grid(True, axis="y", alpha=0.3)


def plot_rank_distribution(records: Sequence[RunRecord], path: str | os.PathLike) -> Path | None:
    """Share of queries per ground-truth rank bin, both directions."""
    plt = _pyplot()
    usable = [r for r in shown_records(records) if r.ranks("i2t") is not None and r.ranks("t2i") is not None]
    if not usable:
        return None
    labels = [f"{lo}" if lo == hi else (f"{lo}–{hi}" if hi else f">{lo - 1}") for lo, hi in RANK_BINS]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8 + 0.25 * len(usable)))
    colours = _colours(len(usable))
    for ax, direction in zip(axes, ("i2t", "t2i")):
        _bars(ax, labels, [(r.name, rank_histogram(r.ranks(direction)).tolist()) for r in usable], colours)
        ax.set_xlabel("rank of the (best) ground truth")
        ax.set_ylabel("queries (%)")
        ax.set_title(DIRECTIONS[direction])
    axes[1].legend(loc="upper right")
    fig.suptitle("Where the right answer ranks")
    _footer(fig, usable)
    return _save(fig, Path(path), usable)


#: the group-kinds figure's layout, in inches: a panel's width, the gap between panels, the
#: room for the right margin, and per kind the height of one bar (a 7-point value fits beside it)
GROUP_PANEL_IN, GROUP_GAP_IN, GROUP_RIGHT_IN, GROUP_BAR_IN = 3.4, 0.3, 0.3, 0.17
#: behind a value written beside its bar: the chance line stays visible, the digits readable
VALUE_BOX = {"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
GROUP_TITLES = {"t2i": "t2i: own image beats the group's others", "i2t": "i2t: own caption beats the others'",
                "group": "Winoground group score (pairs)"}


def _kind_label(usable: Sequence[RunRecord], kind: str) -> str:
    for r in usable:  # the first record that has the kind gives its size
        g = r.extras["groups"]
        row = g["overall"] if kind == "all" else g["by_kind"].get(kind)
        if row is not None and row.get("groups") is not None:
            return f"{kind} ({row['groups']} groups)"
    return kind


def _inches(artists: Sequence[Any], renderer: Any, dpi: float) -> float:
    """The widest of ``artists`` (drawn text), in inches."""
    return max((a.get_window_extent(renderer).width / dpi for a in artists if a.get_text()), default=0.0)


def group_kinds_figure(records: Sequence[RunRecord]) -> Any:
    """The figure of :func:`plot_group_kinds`, not saved (None when no record has groups).

    One row per kind of difference (and ``all``), one horizontal bar per model, the value
    beside its bar; a figure that cannot be computed (a Winoground score of a kind without
    pairs) leaves its slot empty with ``n/a`` written in it and the reason under the panels.
    The figure grows with the number of kinds and models and the width of the longest kind
    name, so no label overprints another whatever their number.

    Example:
        >>> fig = group_kinds_figure(records)  # records of `run_protocols(..., "full,groups")`  # doctest: +SKIP
        >>> fig.savefig("kinds.png")  # doctest: +SKIP
    """
    plt = _pyplot()
    usable = [r for r in shown_records(records) if "groups" in r.extras]
    if not usable:
        return None
    kinds = sorted({k for r in usable for k in r.extras["groups"]["by_kind"]}) + ["all"]
    # a panel whose figure is recorded, even as undefined everywhere: its slots then say n/a
    panels = [f for f in ("t2i", "i2t", "group") if any(f in r.extras["groups"]["overall"] for r in usable)] or ["t2i"]
    n, rows = len(usable), len(kinds)
    row_in = max(0.3, GROUP_BAR_IN * n + 0.1)
    footer = _footer_lines(usable)
    handles_per_row = min(n + 1, 4)  # the models and the chance line
    top_in = 0.45 + 0.22 * -(-(n + 1) // handles_per_row) + 0.35  # title, legend rows, panel titles
    values = {f: [(r.name, [group_figure(_kind_row(r, k), f) for k in kinds]) for r in usable] for f in panels}
    intervals = {f: [[group_interval(_kind_row(r, k), f) for k in kinds] for r in usable] for f in panels}
    reasons = legend_lines([v for series in values.values() for _, vs in series for v in vs])
    note = interval_note(usable)
    if note and any(i is not None for per_model in intervals.values() for row in per_model for i in row):
        reasons.append("error bars: " + note.removeprefix("[low, high]: "))
    bottom_in = 0.6 + 0.18 * len(reasons) + 0.14 * len(footer) + 0.1
    height = top_in + rows * row_in + bottom_in

    fig = plt.figure(figsize=(GROUP_PANEL_IN * len(panels), height))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    colours = _colours(n)
    bar = 0.8 / n
    y = np.arange(rows)
    for ax, figure in zip(axes, panels):
        for k, ((name, vals), colour, spans) in enumerate(zip(values[figure], colours, intervals[figure])):
            at = y + (k - (n - 1) / 2) * bar
            widths = [np.nan if (number := _finite(v)) is None else number for v in vals]
            ax.barh(at, widths, bar, label=name, color=colour)
            shown = [j for j, (w, span) in enumerate(zip(widths, spans)) if np.isfinite(w) and span is not None]
            if shown:  # the bootstrap interval as an error bar on the bar
                low = [widths[j] - spans[j][0] for j in shown]
                high = [spans[j][1] - widths[j] for j in shown]
                ax.errorbar([widths[j] for j in shown], at[shown], xerr=np.clip([low, high], 0, None), fmt="none",
                            ecolor="black", elinewidth=0.8, capsize=min(2.0, 30 * bar), capthick=0.8)
            for centre, value, width, span in zip(at, vals, widths, spans):
                if np.isfinite(width):
                    # beside the bar, or beside its error bar where that reaches further
                    end = max(width, 0, span[1] if span is not None else 0)
                    ax.annotate(f"{width:.1f}", (end, centre), xytext=(2, 0), textcoords="offset points",
                                ha="left", va="center", fontsize=7, bbox=VALUE_BOX)
                else:
                    ax.annotate(format_figure(value), (0, centre), xytext=(2, 0), textcoords="offset points",
                                ha="left", va="center", **MARK_STYLE)
        chance = _finite(usable[0].extras["groups"]["overall"].get(f"{figure}_chance"))
        if chance is not None:
            ax.axvline(chance, color="black", linestyle="--", linewidth=1, label="chance")
        ax.axhline(rows - 1.5, color="#999999", linewidth=0.8)  # "all" below, apart from the kinds
        ax.set_xlim(0, 112)  # room for "100.0" beside a full bar
        ax.set_xticks([0, 20, 40, 60, 80, 100])
        ax.set_xlabel("percent")
        ax.set_title(GROUP_TITLES[figure], fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels=[_kind_label(usable, k) for k in kinds], fontsize=8)
    axes[0].set_ylim(rows - 0.5, -0.5)  # the first kind on top, "all" last
    handles, labels = axes[-1].get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.45 / height),
                        ncol=handles_per_row, fontsize=8, frameon=False)
    title = fig.suptitle("Hard-negative groups by kind of difference", y=1 - 0.1 / height, va="top")
    notes = [fig.text(0.01, (0.12 + 0.14 * len(footer) + 0.18 * k) / height, line, fontsize=8, va="bottom",
                      ha="left") for k, line in enumerate(reversed(reasons))]
    footer_text = _footer_text(fig, footer)
    footer_text.set_y(0.08 / height)  # in inches from the bottom, however tall the figure

    # Measured once drawn: the kind names set the left margin, the widest line the width.
    fig.canvas.draw()
    renderer, dpi = fig.canvas.get_renderer(), fig.dpi
    left_in = _inches(axes[0].get_yticklabels(), renderer, dpi) + 0.2
    panels_in = left_in + len(panels) * GROUP_PANEL_IN + (len(panels) - 1) * GROUP_GAP_IN + GROUP_RIGHT_IN
    lines_in = _inches([footer_text, title, *notes], renderer, dpi) + 0.3
    legend_in = legend.get_window_extent(renderer).width / dpi + 0.3
    width = max(panels_in, lines_in, legend_in)
    panel_in = (width - left_in - GROUP_RIGHT_IN - (len(panels) - 1) * GROUP_GAP_IN) / len(panels)
    fig.set_size_inches(width, height)
    fig.subplots_adjust(left=left_in / width, right=1 - GROUP_RIGHT_IN / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=GROUP_GAP_IN / panel_in)
    return fig


def _kind_row(record: RunRecord, kind: str) -> dict[str, Any]:
    """A record's group figures of ``kind`` (``all``: overall); empty when it has none."""
    g = record.extras["groups"]
    return g["overall"] if kind == "all" else g["by_kind"].get(kind) or {}


def plot_group_kinds(records: Sequence[RunRecord], path: str | os.PathLike) -> Path | None:
    """Group accuracy (t2i, i2t) and Winoground group score per kind of difference
    (:func:`group_kinds_figure`), saved as a PNG."""
    fig = group_kinds_figure(records)
    if fig is None:
        return None
    return _save(fig, Path(path), [r for r in records if "groups" in r.extras])


def plot_probe_costs(records: Sequence[RunRecord], path: str | os.PathLike) -> Path | None:
    """R@1 cost of each perturbation, both directions."""
    plt = _pyplot()
    usable = [r for r in shown_records(records) if "probes" in r.extras]
    if not usable:
        return None
    names = list(dict.fromkeys(n for r in usable for n in r.extras["probes"]["probes"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8 + 0.25 * len(usable)))
    colours = _colours(len(usable))
    for ax, direction in zip(axes, ("i2t", "t2i")):
        series = []
        for r in usable:
            probes = r.extras["probes"]["probes"]
            series.append((r.name, [probes[n]["cost"][direction][PROBE_FIGURE] if n in probes else None for n in names]))
        _bars(ax, names, series, colours)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel("R@1 lost (points)")
        ax.set_title(DIRECTIONS[direction])
        ax.tick_params(axis="x", labelrotation=20)
    axes[1].legend(loc="upper right", fontsize=8)
    fig.suptitle("What each caption perturbation costs (R@1, original minus perturbed)")
    _footer(fig, usable)
    return _save(fig, Path(path), usable)


PLOTS: dict[str, tuple[Callable[[Sequence[RunRecord], Any], Path | None], str]] = {
    "recall_curves": (plot_recall_curves, "Recall@K for K = 1 to 100 (log scale): the share of queries whose right "
                      "answer is among the first K. Higher is better; at K = 1, 5, 10 it is the table's R@K."),
    "rank_distribution": (plot_rank_distribution, "How many queries find their ground truth at rank 1, 2, 3–5, "
                          "... A long right tail means answers the model ranks far down."),
    "group_kinds": (plot_group_kinds, "Within a group of near-identical items (e.g. the scenes twins), how often the "
                    "right one wins, per kind of difference. The dashed line is chance for random scores; a model "
                    "that scores both members of a pair alike falls below it on the Winoground scores, which need "
                    "two comparisons to go opposite ways. n/a marks a figure that cannot be computed: a kind "
                    "without pairs (groups of two) has no Winoground score. Error bars, where drawn, are the "
                    "bootstrap intervals over the groups written under the plot; the number of groups of each kind is "
                    "beside its name."),
    "probe_costs": (plot_probe_costs, "R@1 lost when every caption is altered. A model that reads word order loses "
                    "recall under shuffling; a bag-of-words model loses none."),
}


# -- the HTML page -------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}h1{font-size:1.6em}h2{font-size:1.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:0.9em;margin:0.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;
text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f2f2f2}
tr:nth-child(even) td{background:#fafafa}img{max-width:100%;border:1px solid #ddd}.note{color:#555;font-size:0.9em}
figure{margin:1.5em 0}figcaption{color:#444;font-size:0.9em;margin-top:0.3em}code{background:#f2f2f2;padding:1px 4px}
"""


def _html_page(records: Sequence[RunRecord], figures: dict[str, Path], command: str | None) -> str:
    names = ", ".join(shown_name(r.name) for r in records)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>xmatch eval: {html.escape(names)}</title>",
             f"<style>{_CSS}</style></head><body><h1>xmatch eval: {html.escape(names)}</h1>"]
    if command:
        parts.append(f"<p>Made by <code>{html.escape(command)}</code>.</p>")
    parts.append("<p class='note'>Figures are percentages unless stated. i2t = an image queries the captions; "
                 "t2i = a caption queries the images. The last table says how every number was computed "
                 "(protocol, split, dataset and model fingerprints); the plots carry the same in their footers.</p>")
    marks = "; ".join(f"<b>{html.escape(mark)}</b> {html.escape(meaning)}" for mark, meaning in LEGEND.items())
    parts.append(f"<p class='note'>Marks in the tables and plots: {marks}.</p>")
    all_tables = tables(records)
    parts.append(all_tables[0].html())
    for key, path in figures.items():
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f"<figure><img alt='{key}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(PLOTS[key][1])}</figcaption></figure>")
    parts += [t.html() for t in all_tables[1:]]
    parts.append("</body></html>")
    return "\n".join(parts)


def check_report_folder(out: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse a report folder that holds a file of one of the report's names (its plots,
    ``results.json``, ``index.html``) that a report did not write there, or that changed since
    (a report lists what it wrote, with each file's sha256, in :data:`REPORT_MARKER`). Files of
    other names never block: a report does not touch them. ``xmatch eval`` checks this before
    it evaluates anything.

    Args:
        out: the report folder (it need not exist).
        overwrite: accept such files; the report writes over them.

    Raises:
        ReportFolderError: such files are there (named), and not ``overwrite``; or ``out`` is a file.

    Example:
        >>> _ = Path("out").mkdir(), Path("out/index.html").write_text("<h1>mine</h1>")
        >>> check_report_folder("out")
        Traceback (most recent call last):
        ...
        xmatch.eval.report.ReportFolderError: the report folder out holds index.html, which a report did not write ...
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReportFolderError(f"the report folder {out} is a file; choose a folder for --report.")
    if overwrite or not out.is_dir():
        return
    owned = _owned_files(out)
    foreign = [name for name in _report_names() if os.path.lexists(out / name) and not _is_owned(out / name, owned)]
    if foreign:
        them = ", ".join(foreign)
        raise ReportFolderError(
            f"the report folder {out} holds {them}, which a report did not write (or which changed since); a report "
            f"would write over {'them' if len(foreign) > 1 else 'it'}. Choose another folder, or pass --overwrite "
            "(write_report(..., overwrite=True)) to replace them; files of other names are left as they are."
        )


def _report_names() -> list[str]:
    """Every file name a report may write besides its marker."""
    return [*(f"{key}.png" for key in PLOTS), "results.json", "index.html"]


def _owned_files(out: Path) -> dict[str, str | None]:
    """``{name: sha256}`` of the files the marker lists (None: being written when the report
    stopped); empty when there is no marker or it cannot be read."""
    marker = out / REPORT_MARKER
    if marker.is_symlink() or not marker.is_file():
        return {}
    try:
        data = load_json(marker.read_text(encoding="utf-8"), marker)
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == REPORT_FORMAT else None
    if not isinstance(files, dict):
        return {}
    names = set(_report_names())
    return {k: v for k, v in files.items() if k in names and (v is None or isinstance(v, str))}


def _is_owned(path: Path, owned: dict[str, str | None]) -> bool:
    """Whether ``path`` is a file a report wrote and nobody changed since (a link never is)."""
    if path.name not in owned or path.is_symlink() or not path.is_file():
        return False
    recorded = owned[path.name]
    return recorded is None or _sha256(path) == recorded


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_marker(out: Path, files: dict[str, str | None]) -> None:
    tmp = out / f".{REPORT_MARKER}.partial"
    tmp.unlink(missing_ok=True)
    tmp.write_text(json.dumps({"format": REPORT_FORMAT, "files": files}, indent=1), encoding="utf-8")
    os.replace(tmp, out / REPORT_MARKER)


def write_report(records: Sequence[RunRecord], out: str | os.PathLike, *, command: str | None = None,
                 overwrite: bool = False) -> dict[str, Path]:
    """Write the plots (PNG), ``results.json`` (every record: ``xmatch eval out/results.json``
    redraws the report) and ``index.html`` (tables and plots in one file) into ``out``, and
    list them in :data:`REPORT_MARKER`.

    The folder is checked first (:func:`check_report_folder`): a file of the report's names
    that a report did not write is not written over unless ``overwrite``. A report folder
    written before is rewritten, and its files this report does not draw (a plot of a protocol
    no longer asked for) are removed. Each file is written under a temporary name and renamed
    into place, so a link in its place is replaced, never written through.

    Args:
        records: the evaluated models.
        out: the folder (created).
        command: the command line, shown on the page.
        overwrite: write over files of the report's names that a report did not write.

    Returns:
        ``{name: path}`` of every file written.

    Raises:
        ReportFolderError: ``out`` holds such files and not ``overwrite``.

    Example:
        >>> write_report(records, "out")["html"]  # draws its plots with matplotlib (seconds)  # doctest: +SKIP
        PosixPath('out/index.html')
    """
    if not records:
        raise ValueError("a report needs at least one evaluated model or result file.")
    out = Path(out)
    check_report_folder(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    before = _owned_files(out)
    stale = {name for name in before if _is_owned(out / name, before)}
    # listed before they are written (a report stopped half-way still owns what it wrote), but
    # never a file of another's that --overwrite is about to replace
    _write_marker(out, {name: None for name in _report_names() if name in stale or not os.path.lexists(out / name)})
    written: dict[str, Path] = {}
    for key, (plot, _) in PLOTS.items():
        tmp = out / f".{key}.partial.png"  # matplotlib picks the format from the suffix
        tmp.unlink(missing_ok=True)
        if plot(records, tmp) is not None:
            written[key] = _into_place(tmp, out / f"{key}.png")
    missing = [shown_name(r.name) for r in records if r.ranks("t2i") is None and r.result.protocol != NO_RECALL]
    if missing:
        logger.warning("no per-query ranks for %s (result files written without them): no curves drawn for them",
                       ", ".join(missing))
    tmp = out / ".results.partial.json"
    tmp.unlink(missing_ok=True)
    save_records(records, tmp)
    written["results"] = _into_place(tmp, out / "results.json")
    tmp = out / ".index.partial.html"
    tmp.unlink(missing_ok=True)
    tmp.write_text(_html_page(records, {k: v for k, v in written.items() if k in PLOTS}, command), encoding="utf-8")
    written["html"] = _into_place(tmp, out / "index.html")
    for name in stale - {p.name for p in written.values()}:
        (out / name).unlink(missing_ok=True)  # an earlier report's file this one does not draw
    _write_marker(out, {p.name: _sha256(p) for p in written.values()})
    return written


def _into_place(tmp: Path, path: Path) -> Path:
    os.replace(tmp, path)
    return path


__all__ = [
    "LEGEND", "MAX_NAME_CHARS", "NOT_COMPUTED", "REPORT_MARKER", "NotApplicable", "ReportFolderError", "Table",
    "WithInterval", "check_plotting", "check_report_folder", "comparison_tables",
    "cxc_table", "eccv_table", "format_figure", "group_cell", "group_figure", "group_interval", "group_kinds_figure",
    "group_table", "interval_note", "legend_lines",
    "plot_group_kinds", "plot_probe_costs", "plot_rank_distribution", "plot_recall_curves", "probe_table",
    "provenance_table", "rank_histogram", "recall_curve", "recall_table", "shown_name", "shown_records", "tables",
    "write_report",
]
