"""Reports are safe to write and to read back (issue 38): `--report DIR` never writes over files
a report did not write (unless `--overwrite`), a result file's ranks are checked when it is
read, and the names a report prints are bounded in length and stay distinct."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmatch.cli.main import main
from xmatch.eval import evaluate_scores
from xmatch.eval import report
from xmatch.eval.report import MAX_NAME_CHARS, REPORT_MARKER, ReportFolderError, shown_name, write_report
from xmatch.eval.suite import ResultFileError, RunRecord, load_records

pytest.importorskip("matplotlib")


def perfect(name: str) -> RunRecord:
    return RunRecord(name, evaluate_scores(np.eye(3).repeat(5, axis=1), "full"))


def groups_figures(kinds: list[str]) -> dict:
    row = {"t2i": 62.5, "i2t": 37.5, "group": 25.0, "t2i_chance": 50.0, "i2t_chance": 33.3, "group_chance": 16.7,
           "groups": 4, "pairs": 4}
    return {"overall": dict(row), "by_kind": {kind: dict(row) for kind in kinds}}


# -- the folder a report writes into ---------------------------------------------------------------


def test_a_report_does_not_write_over_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    mine = {"index.html": "<h1>my page</h1>", "results.json": '{"mine": true}', "notes.txt": "keep"}
    for name, text in mine.items():
        (out / name).write_text(text)
    with pytest.raises(ReportFolderError) as info:
        write_report([perfect("m")], out)
    message = str(info.value)
    assert str(out) in message and "index.html" in message and "results.json" in message and "overwrite" in message
    assert "notes.txt" not in message  # a file of another name is never written, so it does not block
    assert sorted(p.name for p in out.iterdir()) == sorted(mine)
    assert all((out / name).read_text() == text for name, text in mine.items())

    # the command line refuses before it evaluates anything, in one sentence
    source = tmp_path / "run.json"
    perfect("m").save_json(source)
    assert main(["eval", str(source), "--report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "index.html" in err and "--overwrite" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == sorted(mine)

    # --overwrite writes the report's files; a file of another name stays
    assert main(["eval", str(source), "--report", str(out), "--overwrite"]) == 0
    assert "xmatch eval" in (out / "index.html").read_text() and (out / "notes.txt").read_text() == "keep"
    assert [r.name for r in load_records(out / "results.json")] == ["m"]


def test_a_report_folder_a_report_wrote_is_rewritten_without_its_stale_files(tmp_path):
    out = tmp_path / "out"
    first = write_report([perfect("m")], out)
    assert {"recall_curves", "rank_distribution", "results", "html"} <= set(first)
    assert (out / REPORT_MARKER).is_file()
    # a report without per-query ranks draws no curves: the earlier curves go with the rewrite
    no_ranks = perfect("m")
    no_ranks.result.queries = {}
    second = write_report([no_ranks], out)
    assert "recall_curves" not in second and not (out / "recall_curves.png").exists()
    assert not (out / "rank_distribution.png").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(["index.html", "results.json", REPORT_MARKER])
    # redrawn in place from its own results.json
    assert main(["eval", str(out / "results.json"), "--report", str(out)]) == 0


def test_a_report_file_changed_since_it_was_written_is_not_the_reports_any_more(tmp_path):
    out = tmp_path / "out"
    write_report([perfect("m")], out)
    (out / "index.html").write_text("<p>my notes on the report</p>")
    with pytest.raises(ReportFolderError, match="index.html"):
        write_report([perfect("m")], out)
    assert (out / "index.html").read_text() == "<p>my notes on the report</p>"
    write_report([perfect("m")], out, overwrite=True)
    assert "xmatch eval" in (out / "index.html").read_text()


def test_a_link_among_the_reports_files_is_replaced_never_written_through(tmp_path):
    out, target = tmp_path / "out", tmp_path / "precious.html"
    out.mkdir()
    target.write_text("precious")
    (out / "index.html").symlink_to(target)
    with pytest.raises(ReportFolderError, match="index.html"):
        write_report([perfect("m")], out)
    write_report([perfect("m")], out, overwrite=True)
    assert target.read_text() == "precious" and not (out / "index.html").is_symlink()


# -- ranks read back -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, float("nan"), 0.5, float("inf"), 1e300, 10**30, 15])
def test_ranks_that_cannot_be_ranks_are_refused_naming_the_file_and_the_field(tmp_path, bad):
    data = json.loads(json.dumps(perfect("m").to_dict()))
    data["ranks"]["i2t"][1] = bad  # 3 images query 15 captions: ranks 0 ... 14
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultFileError) as info:
        load_records(path)
    message = str(info.value)
    assert str(path) in message and "ranks -> i2t" in message and "[1]" in message


def test_valid_ranks_load_including_the_first_rank_zero(tmp_path):
    data = json.loads(json.dumps(perfect("m").to_dict()))
    data["ranks"]["i2t"] = [0, 14, 3.0]  # 0-based; a whole float is a whole number
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    assert load_records(path)[0].ranks("i2t").tolist() == [0, 14, 3]


# -- names ---------------------------------------------------------------------------------------


def test_shown_names_are_bounded_and_distinct():
    long_a, long_b = "a" * 100_000 + "x", "a" * 100_000 + "y"
    shown = {shown_name(n) for n in (long_a, long_b, "b" * 50_000 + "a" * 50_001)}
    assert len(shown) == 3 and all(len(n) <= MAX_NAME_CHARS for n in shown)
    assert shown_name("teran-mrsw-scenes") == "teran-mrsw-scenes"


def test_a_report_prints_long_names_bounded(tmp_path, monkeypatch):
    """Names of 5,000 characters (kept small: without the bound, matplotlib lays out every
    character of a legend entry and footer, which is what kept a 100,000-character name busy)."""
    names = ["m" * 5_000 + "-one", "m" * 5_000 + "-two"]
    records = [perfect(n) for n in names]
    for r in records:
        r.extras["groups"] = groups_figures(["k" * 5_000 + "-colour", "k" * 5_000 + "-size"])
        r.provenance = {"protocol": "full+groups", "split": "s" * 5_000, "models": [{"name": r.name, "fingerprint": "f"}],
                        "dataset": {"name": "d" * 5_000, "fingerprint": "0" * 12, "images": 3, "captions": 15}}
    drawn: list[str] = []
    original = report._save

    def capture(fig, path, usable):
        from matplotlib.text import Text

        drawn.extend(t.get_text() for t in fig.findobj(Text))
        return original(fig, path, usable)

    monkeypatch.setattr(report, "_save", capture)
    written = write_report(records, tmp_path / "out")
    assert {"recall_curves", "group_kinds"} <= set(written)
    longest_line = max(len(line) for text in drawn for line in text.splitlines())
    assert longest_line < 6 * MAX_NAME_CHARS  # a footer line holds a few bounded names
    page = written["html"].read_text()
    assert "m" * 1_000 not in page and "k" * 1_000 not in page
    table = report.comparison_tables(records)
    assert max(len(line) for line in table.splitlines()) < 6 * MAX_NAME_CHARS
    assert shown_name(names[0]) in table and shown_name(names[1]) in table
    # the results file keeps every name whole
    assert [r.name for r in load_records(written["results"])] == names
