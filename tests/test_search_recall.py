"""Recall by design: the widening search over centroid lists, its ``effort`` knob, the expert
settings it replaces, and the work each search reports (docs/search.md, "Recall and work")."""

from __future__ import annotations

import math

import pytest

import xmatch
import xmatch.index
from xmatch.index import ann, ranking
from xmatch.index.centroids import list_count
from xmatch.index.synthetic import PlantedCorpus, scoring_model

pytest.importorskip("faiss")

DIM = 32
#: 3,000 images x 8 regions: 24,000 tokens, past the lowered exact-scan limit below
CORPUS = PlantedCorpus(images=3000, regions=8, dim=DIM, concepts=512, groups=20)
#: the exact token scan stops here in these tests, so that a small corpus gets centroid lists
FLAT_LIMIT = 1000



@pytest.fixture(scope="module")
def lists_index(tmp_path_factory) -> xmatch.index.SearchIndex:
    """The corpus in float32 (stage-2 scores equal the exhaustive ones), over centroid lists:
    the flat limit stays lowered while this module's tests run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ann, "FLAT_LIMIT", FLAT_LIMIT)
        index = xmatch.index.create(tmp_path_factory.mktemp("recall") / "idx", scoring_model("MrSw", DIM), dtype="float32")
        for ids, e in CORPUS.batches(1000):
            index.add(e, ids)
        index.prepare()
        yield index


def recall(results, reference) -> float:
    return sum(len(set(r.ids) & set(e.ids)) for r, e in zip(results, reference)) / sum(len(e.ids) for e in reference)


def test_hard_queries_get_the_exact_top_k_where_the_old_defaults_lose_it(lists_index):
    queries = CORPUS.random_queries(20)
    exact = lists_index.search(queries, 10, exact=True)
    assert lists_index.generator(None).lists is not None  # the centroid lists, not the exact scan
    old = lists_index.search(queries, 10, candidates=100, nprobe=8)  # the defaults before widening
    assert recall(old, exact) < 0.95
    found = lists_index.search(queries, 10)
    assert recall(found, exact) >= 0.99
    assert [h.score for h in found[0].hits] == pytest.approx([h.score for h in exact[0].hits], abs=1e-5)
    # estimated, not proven; exact only where widening further would have cost what scoring
    # every item does, so every item was scored (this corpus is small: 3,000 images)
    assert all(r.exact == (r.scored == r.total) for r in found) and not all(r.exact for r in found)
    assert any(r.extra["nprobe"] > ranking.FIRST_NPROBE for r in found)  # some had to widen
    assert all(r.extra["settled"] or r.extra["nprobe"] == ranking.WIDEST_NPROBE for r in found)
    assert max(r.work_share for r in found if not r.exact) < 0.6
    assert max(r.work_share for r in found) < 2  # never much more than scoring every item
    wider = lists_index.search(queries, 10, effort=2)
    assert [set(r.ids) for r in wider] == [set(e.ids) for e in exact]


def test_planted_queries_stop_at_the_first_widths(lists_index):
    planted, _ = CORPUS.queries(10)
    exact = lists_index.search(planted, 10, exact=True)
    found = lists_index.search(planted, 10)
    assert recall(found, exact) == 1.0
    first = {"nprobe": ranking.FIRST_NPROBE, "candidates": ranking.FIRST_CANDIDATES_PER_K * 10, "settled": True}
    assert sum(r.extra == first for r in found) >= 5  # the planted group is ahead: most stop at once
    hard = lists_index.search(CORPUS.random_queries(10), 10)
    assert sum(r.extra == first for r in hard) <= 2
    assert sum(r.work for r in found) < sum(r.work for r in hard)


def test_effort_scales_the_widths(lists_index):
    queries = CORPUS.random_queries(5)
    low, high = lists_index.search(queries, 10, effort=0.5), lists_index.search(queries, 10, effort=2)
    assert all(r.extra["nprobe"] <= ranking.WIDEST_NPROBE // 2 for r in low)
    assert all(r.extra["nprobe"] >= 2 * ranking.FIRST_NPROBE for r in high)
    assert not all(r.extra["settled"] for r in lists_index.search(queries, 10, effort=0.1))  # said, not hidden
    # generators that do not widen score effort x the default candidates
    assert [r.scored for r in lists_index.search(queries, 10, stage1="pooled", effort=0.5)] == [50] * 5
    assert [r.scored for r in lists_index.search(queries, 10, stage1="pooled", effort=2)] == [200] * 5


@pytest.mark.parametrize("effort", [0, -1, math.nan, math.inf, True, "1", [1]])
def test_effort_must_be_a_number_above_zero(lists_index, effort):
    with pytest.raises(ValueError, match=r"effort must be a number > 0 \(1 is the default"):
        lists_index.search(CORPUS.random_queries(1), 10, effort=effort)


@pytest.mark.parametrize("expert", [{"candidates": 100}, {"nprobe": 8}])
def test_effort_and_expert_settings_are_not_mixed(lists_index, expert):
    with pytest.raises(ValueError, match="give effort, or the expert settings candidates / nprobe, not both"):
        lists_index.search(CORPUS.random_queries(1), 10, effort=1, **expert)


def test_expert_settings_still_rule_and_hold_for_one_call(lists_index):
    query = CORPUS.random_queries(1)
    fixed = lists_index.search(query, 10, candidates=37)[0]
    assert fixed.scored == 37 and fixed.extra == {}  # no widening
    assert lists_index.search(query, 10, nprobe=5)[0].scored == 100  # the default candidates
    before = lists_index.search(query, 10, candidates=100)[0].work
    lists_index.search(query, 10, nprobe=64)
    assert lists_index.search(query, 10, candidates=100)[0].work == before  # nprobe 64 did not stay
    widened = lists_index.search(query, 10)[0]
    assert widened.extra["nprobe"] >= ranking.FIRST_NPROBE


def test_work_over_centroid_lists_counts_the_probe_the_lists_and_stage_2(lists_index):
    query = CORPUS.random_queries(1)
    words, tokens = query.tokens.shape[1], CORPUS.images * CORPUS.regions
    lists = list_count(tokens)
    every = lists_index.search(query, 10, candidates=50, nprobe=lists)[0]  # every list: every token reached
    assert every.work == words * lists + words * tokens + words * CORPUS.regions * 50
    assert every.work_exhaustive == words * tokens
    fewer = lists_index.search(query, 10, candidates=50, nprobe=8)[0]
    assert words * lists + words * CORPUS.regions * 50 < fewer.work < every.work
    assert "work" in fewer.text() and "% of scoring every item" in fewer.text()


def test_work_of_the_exact_token_scan_is_every_token(tmp_path):
    """Below the flat limit stage 1 computes every stored token's similarity: the work says so
    (more than scoring everything), however few items stage 2 scores."""
    small = PlantedCorpus(images=40, regions=6, dim=DIM, concepts=64, groups=2, group_size=5)
    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", DIM))
    for ids, e in small.batches(40):
        index.add(e, ids)
    query = small.random_queries(1)
    tokens, words = 40 * 6, query.tokens.shape[1]
    proven = index.search(query, 3)[0]
    assert proven.exact and proven.scored < 40
    assert proven.work == words * tokens + words * 6 * proven.scored
    assert proven.work_share > 1
    everything = index.search(query, 3, exact=True)[0]
    assert everything.work == everything.work_exhaustive == words * tokens
    record = everything.as_dict()
    assert record["work"] == record["work_exhaustive"] == words * tokens


def test_cli_effort(tmp_path, capsys):
    from xmatch.cli.main import main

    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", DIM))  # the model is saved in the index
    for ids, e in PlantedCorpus(images=40, regions=6, dim=DIM, concepts=64, groups=2, group_size=5).batches(40):
        index.add(e, ids)
    assert main(["search", str(tmp_path / "idx"), "--text", "a red circle", "--effort", "2", "--json"]) == 0
    assert "work_exhaustive" in capsys.readouterr().out
    assert main(["search", str(tmp_path / "idx"), "--text", "a red circle", "--effort", "0"]) == 2
    assert "effort must be a number > 0" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "idx"), "--text", "a red circle", "--effort", "1", "--candidates", "5"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("pooler", ["Symm", "MrAvgw", "MwSr"])
def test_other_poolers_widen_too(lists_index, pooler):
    """Symm and MwSr (item-side sums: their estimates are computed again at each width) and
    MrAvgw (per word) over the same lists; MwSr's default was the tokens' mean past the exact
    scan, which found half of these top-10s."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ann, "FLAT_LIMIT", FLAT_LIMIT)
        index = xmatch.index.open(lists_index.root, scoring_model(pooler, DIM))  # the same weights
        queries = CORPUS.random_queries(10)
        exact = index.search(queries, 10, exact=True)
        found = index.search(queries, 10)
        assert recall(found, exact) >= 0.95
        # on this small corpus an item-side sum's widening costs up to 0.8 of scoring everything
        assert all(r.stage1 == "tokens" and r.extra and (r.work_share < 1.0 or r.exact) for r in found)
        assert max(r.work_share for r in found) < 2


def test_an_unsettled_search_says_so_in_its_printed_ranking(lists_index):
    results = lists_index.search(CORPUS.random_queries(5), 10, effort=0.1)
    unsettled = [r for r in results if r.extra["settled"] is False]
    assert unsettled and all("not settled" in r.text() and "--effort 2" in r.text() for r in unsettled)
    assert all("not settled" not in r.text() for r in lists_index.search(CORPUS.queries(3)[0], 10) if r.extra["settled"])
