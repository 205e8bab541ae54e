"""Comparison reports and `xmatch eval` on several models: the table, the plots, the HTML page,
result files read back, provenance on every figure, ensembles kept behind --ensemble."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
from xmatch.cli.main import main
from xmatch.eval import evaluate_scores
from xmatch.eval import report
from xmatch.eval.report import comparison_tables, group_table, rank_histogram, recall_curve, recall_table
from xmatch.eval.suite import RunRecord, load_records, parse_protocols, run_protocols

pytest.importorskip("timm")
ZOO = Path(__file__).resolve().parents[1] / "zoo"
FAST = ["--data-option", "size=tiny", "--data-option", "backbone=test_efficientnet", "--data-option", "weights=random"]


def _spec(pooler: str) -> dict:
    return {
        "embed_dim": 32,
        "image_encoder": {"name": "bottomup", "feature_dim": 256, "layers": 0, "box_hidden_dim": 16},
        "text_encoder": {"name": "bigru", "vocab": str(ZOO / "weights/teran-mrsw-scenes/vocab.json"),
                         "word_dim": 16, "hidden_dim": 8},
        "image_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32},
        "text_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32},
        "pooler": {"name": pooler},
        "loss": {"name": "hinge"},
    }


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> list[str]:
    out = []
    for k, pooler in enumerate(("MrSw", "Symm")):
        torch.manual_seed(k)
        path = tmp_path_factory.mktemp(f"model-{pooler}")
        xmatch.save_pretrained(xmatch.build(_spec(pooler)), path)
        out.append(f"local-dir:{path}")
    return out


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scenes")


def test_parse_protocols():
    assert parse_protocols("full") == ("full", ())
    assert parse_protocols("groups,probes") == ("full", ("groups", "probes"))
    assert parse_protocols("coco-1k, cxc") == ("coco-1k", ("cxc",))
    assert parse_protocols("eccv-caption") == ("coco-5k", ("eccv-caption",))
    with pytest.raises(ValueError, match="unknown protocol 'grups'"):
        parse_protocols("grups")
    with pytest.raises(ValueError, match="one Recall@K protocol"):
        parse_protocols("full,coco-5k")
    # a split's own default (the scenes groups split: none) applies when no Recall@K is named
    assert parse_protocols("groups", default="none") == ("none", ("groups",))
    assert parse_protocols("full,groups", default="none") == ("full", ("groups",))
    assert parse_protocols("none,groups") == ("none", ("groups",))
    assert parse_protocols("groups,probes", default="none") == ("full", ("groups", "probes"))
    assert parse_protocols("groups", default="coco-1k") == ("coco-1k", ("groups",))
    with pytest.raises(ValueError, match="probes measure what a perturbation costs in R@K"):
        parse_protocols("none,probes")
    with pytest.raises(ValueError, match="needs an extra protocol beside it"):
        parse_protocols("none")


def test_curves_and_histograms_from_ranks():
    ranks = np.array([0, 0, 1, 4, 120])
    curve = recall_curve(ranks)
    assert curve.shape == (100,) and curve[0] == 40.0 and curve[1] == 60.0 and curve[4] == 80.0 and curve[-1] == 80.0
    result = evaluate_scores(np.random.default_rng(0).normal(size=(20, 100)))
    for d in ("i2t", "t2i"):
        curve = recall_curve(result.queries[f"{d}_ranks"])
        assert [curve[0], curve[4], curve[9]] == [getattr(result, d)[k] for k in ("r1", "r5", "r10")]
    assert rank_histogram(ranks).tolist() == [40.0, 20.0, 20.0, 0.0, 0.0, 0.0, 0.0, 20.0]


# -- rendering: what a table or plot shows for a figure that is not a plain number ---------


def _perfect(name: str) -> RunRecord:
    return RunRecord(name, evaluate_scores(np.eye(3).repeat(5, axis=1), "full"))


def test_tables_write_nan_and_inf_apart_from_not_computed():
    broken, scored = _perfect("broken"), _perfect("scored")
    broken.result.i2t["r1"], broken.result.t2i["r5"], broken.result.t2i["medr"] = np.nan, np.inf, -np.inf
    scored.result.i2t["ndcg_rougel"], scored.result.t2i["ndcg_rougel"] = 0.5, np.float32("nan")
    table = recall_table([broken, scored])
    text = table.text()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:5]}
    # model, i2t R@1 R@5 R@10, t2i R@1 R@5 R@10, i2t medr, t2i medr, i2t NDCG, t2i NDCG, rsum
    assert rows["broken"][1] == "NaN" and rows["broken"][5] == "inf" and rows["broken"][8] == "-inf"
    assert rows["broken"][9:11] == ["-", "-"], "NDCG was not computed for this model"
    assert rows["scored"][9:11] == ["0.5000", "NaN"] and rows["scored"][1] == "100.0"
    assert "NaN: the figure came out as not-a-number" in text and "inf / -inf: the figure came out infinite" in text
    page = table.html()
    assert "<td>NaN</td>" in page and "<td>inf</td>" in page and "<td>-inf</td>" in page and "<td>-</td>" in page
    assert "the figure came out infinite" in page
    # a table of plain numbers carries no legend
    assert recall_table([_perfect("fine")]).text().splitlines()[-1].startswith("fine")


def _groups(kinds: int, pairs_every: int = 2, value: float = 62.5, intervals: bool = False) -> dict:
    """Group figures of ``kinds`` kinds; every other kind has no pairs (no Winoground scores);
    with ``intervals``, each figure's bootstrap interval (value -8 / +6, within 0..100)."""
    by_kind = {}
    for k in range(kinds):
        pairs = k % pairs_every == 0
        row = {
            "t2i": value, "i2t": 100.0 - value, "text": 50.0 if pairs else None, "image": 50.0 if pairs else None,
            "group": 25.0 if pairs else None, "t2i_chance": 50.0, "i2t_chance": 33.3,
            "text_chance": 25.0 if pairs else None, "image_chance": 25.0 if pairs else None,
            "group_chance": 100 / 6 if pairs else None, "groups": 2 + k, "pairs": 2 + k if pairs else 0,
        }
        if intervals:
            row |= {f"{f}_ci": None if row[f] is None else [max(row[f] - 8, 0.0), min(row[f] + 6, 100.0)]
                    for f in ("t2i", "i2t", "text", "image", "group")}
        by_kind[f"kind-{k:02d}" + ("-with-a-longer-name" if k == 1 else "")] = row
    overall = {**by_kind[min(by_kind)], "groups": sum(r["groups"] for r in by_kind.values())}
    out = {"overall": overall, "by_kind": by_kind if kinds > 1 else {}}
    if intervals:
        out["bootstrap"] = {"resamples": 1000, "confidence": 0.95, "seed": 0, "method": "percentile"}
    return out


def test_group_table_says_n_a_with_the_reason_where_a_kind_has_no_pairs():
    record = _perfect("m")
    record.extras["groups"] = _groups(3)
    table = group_table([record])
    lines = table.text().splitlines()
    no_pairs = next(line for line in lines if "kind-01" in line).split()
    assert no_pairs[-5:] == ["62.5", "37.5", "n/a", "n/a", "n/a"]
    assert next(line for line in lines if "kind-02" in line).split()[-3:] == ["50.0", "50.0", "25.0"]
    assert any(line.startswith("n/a: no groups of two (pairs) of this kind") for line in lines)
    assert "<td>n/a</td>" in table.html() and "defined on pairs only" in table.html()


def _texts_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts (tick labels, values, titles, legend, footer) whose boxes overlap."""
    import matplotlib.text
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    inside = fig.bbox.padded(1)
    assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for _, b in boxes), "a text leaves the figure"
    return [(a, b) for k, (a, box) in enumerate(boxes) for b, other in boxes[k + 1 :] if box.overlaps(other)]


def test_group_table_shows_each_figure_with_its_interval_and_the_groups_per_kind():
    with_ci, without = _perfect("new"), _perfect("old")  # an older result file has no intervals
    with_ci.extras["groups"], without.extras["groups"] = _groups(3, intervals=True), _groups(3)
    table = group_table([with_ci, without])
    lines = table.text().splitlines()
    new_rows = [line for line in lines if "kind-00" in line]
    assert new_rows[0].split()[1:] == ["kind-00", "2", "62.5", "[54.5,", "68.5]", "37.5", "[29.5,", "43.5]",
                                       "50.0", "[42.0,", "56.0]", "50.0", "[42.0,", "56.0]", "25.0", "[17.0,", "31.0]"]
    assert new_rows[1].split()[1:] == ["kind-00", "2", "62.5", "37.5", "50.0", "50.0", "25.0"]
    assert next(line for line in lines if "kind-01" in line).split()[-5:] == ["[29.5,", "43.5]", "n/a", "n/a", "n/a"]
    assert "95% bootstrap interval: the groups resampled with replacement 1000 times" in table.text()
    assert "<td>62.5 [54.5, 68.5]</td>" in table.html()


@pytest.mark.parametrize("kinds, intervals", [(1, False), (3, False), (10, False), (30, False), (3, True)])
def test_group_kinds_plot_stays_legible_for_any_number_of_kinds(kinds, intervals, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = []
    save = report._save
    monkeypatch.setattr(report, "_save", lambda fig, path, records: drawn.append(fig) or save(fig, path, records))
    records = []
    for k, value in enumerate((62.5, 100.0)):  # two models: two bars and two values per slot
        record = _perfect(f"model-{k}")
        record.extras["groups"] = _groups(kinds, value=value, intervals=intervals)
        records.append(record)
    assert report.plot_group_kinds(records, tmp_path / "group_kinds.png") == tmp_path / "group_kinds.png"
    (fig,) = drawn
    assert _texts_overlap(fig) == []
    axes = fig.axes[0]
    assert len(axes.get_yticklabels()) == max(kinds, 1) + (kinds > 1)  # the kinds and "all"
    marks = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text() == "n/a"]
    assert len(marks) == 2 * (kinds // 2) * (len(fig.axes) == 3), "a kind without pairs: its Winoground slots say n/a"
    if marks:
        assert any("n/a: no groups of two (pairs)" in t.get_text() for t in fig.texts)
    # an error bar per bar with an interval: both models, every kind and "all", each panel
    from matplotlib.collections import LineCollection

    bars = [c for ax in fig.axes for c in ax.collections if isinstance(c, LineCollection)]
    with_ci = sum(len(c.get_segments()) for c in bars)
    defined = sum(1 for ax_figure in ("t2i", "i2t", "group") for r in records
                  for row in [*r.extras["groups"]["by_kind"].values(), r.extras["groups"]["overall"]]
                  if row.get(f"{ax_figure}_ci"))
    assert with_ci == (defined if intervals else 0)
    assert any("error bars: 95% bootstrap interval" in t.get_text() for t in fig.texts) == intervals


def test_report_page_explains_its_marks(tmp_path):
    pytest.importorskip("matplotlib")
    record = _perfect("m")
    record.result.i2t["r1"] = np.nan
    page = report.write_report([record], tmp_path)["html"].read_text()
    assert "Marks in the tables and plots" in page and "<b>n/a</b>" in page and "<td>NaN</td>" in page


def test_extra_protocols_refuse_before_encoding(bundles, scenes_root, monkeypatch):
    from xmatch.scenes.dataset import open_scenes
    from xmatch.eval import suite

    test = open_scenes(scenes_root, "test", size="tiny", backbone="test_efficientnet", weights="random", progress=False)
    model = xmatch.build(bundles[0], pretrained=True)
    monkeypatch.setattr(suite, "ensemble_blocks", lambda *a, **k: pytest.fail("encoded before refusing"))
    with pytest.raises(ValueError, match="--caption-ids FILE"):
        run_protocols(model, test, "eccv-caption")
    del test.hard_negative_groups, test.word_classes  # a dataset that declares nothing
    with pytest.raises(ValueError, match="declares no hard-negative groups"):
        run_protocols(model, test, "groups")
    with pytest.raises(ValueError, match="--word-classes"):
        run_protocols(model, test, "probes")


def test_groups_on_the_groups_split_score_only_their_pairs_and_give_the_whole_matrix_figures(
    bundles, scenes_root, tmp_path, monkeypatch
):
    """`--protocol groups` on the scenes groups split: no Recall@K (the split declares none),
    each caption scored against its own group's images only, the same figures as from the
    whole images x captions matrix (`full,groups`) and from Recall@K folds beside the pairs."""
    from xmatch.eval.groups import Group, GroupSet
    from xmatch.scenes.dataset import open_scenes

    split = open_scenes(scenes_root, "groups", size="tiny", backbone="test_efficientnet", weights="random",
                        progress=False)
    model = xmatch.build(bundles[1], pretrained=True)
    blocks = GroupSet.blocks
    monkeypatch.setattr(GroupSet, "blocks", lambda self, groups_per_block=1: blocks(self, 1))  # one group a block
    scored = []
    similarity = model.similarity
    monkeypatch.setattr(model, "similarity", lambda img, txt, **k: scored.append((len(img), len(txt))) or similarity(img, txt, **k))
    pairs = run_protocols(model, split, "groups", name="pairs", progress=False)
    assert scored == [(2, 10)] * 6  # 6 twin pairs, 5 captions an image: 120 of the 720 pairs
    scored.clear()
    whole = run_protocols(model, split, "full,groups", name="whole", progress=False)
    assert sum(a * b for a, b in scored) == 12 * 60
    folds = run_protocols(model, split, "full,groups", fold_images=4, progress=False)
    assert pairs.extras["groups"] == whole.extras["groups"] == folds.extras["groups"]
    # groups whose members are not neighbours, with chosen captions: gathered, the same figures
    scattered = GroupSet([Group((0, 5), "x"), Group((3, 1, 7), "y", captions=((15,), (5, 6), (35,)))],
                         split.caption_image)
    assert (run_protocols(model, split, "none,groups", groups=scattered, progress=False).extras["groups"]
            == run_protocols(model, split, "full,groups", groups=scattered, progress=False).extras["groups"])
    assert pairs.extras["groups"]["overall"]["groups"] == 6 and "t2i_ci" in pairs.extras["groups"]["by_kind"]["size"]
    assert pairs.result.protocol == "none" and pairs.provenance["protocol"] == "groups" and pairs.ranks("t2i") is None
    assert whole.provenance["protocol"] == "full+groups" and whole.provenance["split"] == "groups"
    # no Recall@K table for a record without Recall@K; the report and the result file go on
    assert "Recall@K" not in comparison_tables([pairs]) and "Recall@K (full)" in comparison_tables([pairs, whole])
    pytest.importorskip("matplotlib")
    written = report.write_report([pairs], tmp_path / "report")
    assert "recall_curves" not in written and "group_kinds" in written
    (again,) = load_records(written["results"])
    assert again.extras["groups"] == json.loads(json.dumps(pairs.extras["groups"]))
    with pytest.raises(ValueError, match="NDCG"):
        run_protocols(model, split, "groups", relevance={"rougel": np.zeros((60, 12))})


def test_scenes_fingerprint_tells_two_feature_sets_of_the_same_scenes_apart(scenes_root):
    from xmatch.eval.suite import dataset_fingerprint
    from xmatch.scenes.dataset import open_scenes

    def split(**options):
        return open_scenes(scenes_root, "test", size="tiny", backbone="test_efficientnet", weights="random",
                           progress=False, **options)

    default, fewer = split(), split(regions=12)
    assert default.captions == fewer.captions and default.image_names == fewer.image_names
    assert dataset_fingerprint(default) != dataset_fingerprint(fewer)
    assert dataset_fingerprint(split()) == dataset_fingerprint(default)
    assert dataset_fingerprint(split(layout="images")) not in (dataset_fingerprint(default), dataset_fingerprint(fewer))


def test_old_result_files_load_without_provenance(tmp_path: Path):
    result = evaluate_scores(np.random.default_rng(0).normal(size=(10, 50)))
    result.save_json(tmp_path / "old.json", with_queries=True)
    (record,) = load_records(tmp_path / "old.json")
    assert record.name == "old" and record.provenance["source"].endswith("old.json")
    np.testing.assert_array_equal(record.ranks("t2i"), result.queries["t2i_ranks"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not an xmatch eval result"):
        load_records(tmp_path / "bad.json")


def test_eval_compares_models_and_writes_a_report(bundles, scenes_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    code = main(["eval", *bundles, "--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "train",
                 "--protocol", "groups,probes", "--report", str(out), "--json", str(tmp_path / "runs.json")])
    text = capsys.readouterr().out
    assert code == 0, text
    for heading in ("Recall@K (full)", "Hard-negative groups", "Perturbation probes", "How each number was computed"):
        assert heading in text
    assert all(b in text for b in bundles)
    records = load_records(out / "results.json")
    assert [r.name for r in records] == bundles
    for record in records:
        p = record.provenance
        assert p["protocol"] == "full+groups+probes" and p["split"] == "train" and p["dataset"]["name"] == "scenes"
        assert len(p["dataset"]["fingerprint"]) == 12 and len(p["models"][0]["fingerprint"]) == 12
        assert record.extras["groups"]["overall"]["groups"] == 4 and "shuffle" in record.extras["probes"]["probes"]
    assert records[0].provenance["models"][0]["fingerprint"] != records[1].provenance["models"][0]["fingerprint"]
    # every plot, legible size, provenance in its metadata
    for name in ("recall_curves", "rank_distribution", "group_kinds", "probe_costs"):
        png = Image.open(out / f"{name}.png")
        assert png.width >= 1000 and png.height >= 400
        provenance = json.loads(png.info["xmatch-provenance"])
        assert [p["name"] for p in provenance] == bundles
        assert provenance[0]["dataset"]["fingerprint"] == records[0].provenance["dataset"]["fingerprint"]
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and records[0].provenance["dataset"]["fingerprint"] in page
    assert "<table>" in page and "Winoground" in page
    # the --json file holds the same runs; result files compare again without data
    assert [r.name for r in load_records(tmp_path / "runs.json")] == bundles
    assert main(["eval", str(out / "results.json"), "--report", str(tmp_path / "again")]) == 0
    again = capsys.readouterr().out
    assert comparison_tables(records) in again and (tmp_path / "again" / "group_kinds.png").is_file()


def test_ensemble_averages_the_models_into_one_entry(bundles, scenes_root, tmp_path, capsys):
    code = main(["eval", *bundles, "--ensemble", "--dataset", "scenes", "--data", str(scenes_root), *FAST,
                 "--split", "train", "--json", str(tmp_path / "e.json")])
    text = capsys.readouterr().out
    assert code == 0, text
    (record,) = load_records(tmp_path / "e.json")
    assert record.name == " + ".join(bundles) and record.provenance["ensemble"] is True
    assert f"{' + '.join(bundles)} on scenes:train" in text  # one entry: the single-run table
    from xmatch.scenes.dataset import open_scenes
    from xmatch.eval import evaluate

    train = open_scenes(scenes_root, "train", size="tiny", backbone="test_efficientnet", weights="random", progress=False)
    models = [xmatch.build(b, pretrained=True) for b in bundles]
    assert record.result.rsum == pytest.approx(evaluate(models, train, progress=False).rsum)


def test_a_record_round_trips_through_json(bundles, scenes_root, tmp_path):
    from xmatch.scenes.dataset import open_scenes

    train = open_scenes(scenes_root, "train", size="tiny", backbone="test_efficientnet", weights="random", progress=False)
    record = run_protocols(xmatch.build(bundles[0], pretrained=True), train, "full,groups", name="m", progress=False)
    record.save_json(tmp_path / "r.json")
    (again,) = load_records(tmp_path / "r.json")
    assert again.name == "m" and again.extras == json.loads(json.dumps(record.extras))
    assert again.result.figures() == json.loads(json.dumps(record.result.figures()))
    np.testing.assert_array_equal(again.ranks("i2t"), record.ranks("i2t"))


@pytest.mark.slow
def test_the_issue_command_on_the_shipped_scenes_models(tmp_path, capsys):
    """`xmatch eval teran-mrsw-scenes tern-scenes --dataset scenes --protocol groups --report out/`."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    out = tmp_path / "out"
    assert main(["eval", "teran-mrsw-scenes", "tern-scenes", "--dataset", "scenes", "--protocol", "groups",
                 "--report", str(out)]) == 0
    text = capsys.readouterr().out
    teran, tern = load_records(out / "results.json")
    assert teran.extras["groups"]["overall"]["t2i"] == pytest.approx(66.8)  # the documented twin accuracy
    assert tern.extras["groups"]["overall"]["t2i"] == pytest.approx(50.2)
    assert "colour" in text and "relation" in text and (out / "index.html").is_file()
