"""Re-ranking with each candidate's nearest images (``--rerank-neighbours``): a caption's list
also holds the near-duplicates of its top K, so a twin the first stage ranked low is ordered by
the verifier beside its partner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.model.rerank import TWIN_WEIGHT, nearest_items, rerank_scores
from test_verifier import FAST, small_spec


def _order(column: torch.Tensor) -> list[int]:
    return column.argsort(descending=True, stable=True).tolist()


def test_nearest_items_are_symmetric_and_never_the_item_itself():
    sim = torch.tensor([[9.0, 0.9, 0.1, 0.0], [0.1, 9.0, 0.2, 0.0], [0.1, 0.3, 9.0, 0.8], [0.0, 0.1, 0.6, 9.0]])
    # (sim + sim.T) / 2: 0-1 0.5, 1-2 0.25, 2-3 0.7, 1-3 0.05; the diagonal is never chosen
    assert nearest_items(sim, 1).flatten().tolist() == [1, 0, 3, 2]
    assert nearest_items(sim, 2).tolist() == [[1, 2], [0, 2], [3, 1], [2, 1]]


@pytest.mark.parametrize("m", [0, 4, -1, 1.0, True])
def test_nearest_items_refuses_a_count_out_of_range(m):
    with pytest.raises(ValueError, match="from 1 to 3"):
        nearest_items(torch.eye(4), m)


def test_nearest_items_needs_a_square_matrix():
    with pytest.raises(ValueError, match=r"square \[n, n\] similarity, got \(3, 4\)"):
        nearest_items(torch.zeros(3, 4), 1)


def test_a_twin_outside_the_top_k_is_verified_beside_its_partner():
    # caption 0 ranks image 0 first and image 3 (its true image, image 0's twin) last;
    # the verifier prefers image 3 for caption 0
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.7], [0.7, 0.6], [0.1, 0.2]])
    verified = []

    def logits(i, t):
        verified.extend(zip(i.tolist(), t.tolist()))
        return ((i == 3) & (t == 0)).float()

    near = torch.tensor([[3], [2], [1], [0]])
    plain = rerank_scores(scores, 1, logits)["t2i"]
    assert _order(plain[:, 0])[0] == 0 and (3, 0) not in verified
    verified.clear()
    widened = rerank_scores(scores, 1, logits, image_neighbours=near)["t2i"]
    # by score + half the nearest image's, caption 0's top 1 is image 1 (0.8 + 0.35 against image 0's
    # 0.9 + 0.05): its list is image 1 and its neighbour 2, as caption 1's is
    assert sorted(verified) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert _order(widened[:, 0])[:2] == [1, 2]


def test_the_top_k_are_drawn_with_their_nearest_images_scores():
    # caption 0: images 0 and 1 are twins and both score high; image 2 scores highest alone
    scores = torch.tensor([[0.80], [0.78], [0.85], [0.10]])
    near = torch.tensor([[1], [0], [3], [2]])
    verified = []

    def logits(i, t):
        verified.extend(i.tolist())
        return (i == 1).float()  # image 1 is the caption's picture

    plain = rerank_scores(scores, 1, logits, image_neighbours=None)["t2i"]
    assert _order(plain[:, 0])[0] == 2 and verified == [2]
    verified.clear()
    # 0.80 + 0.39 and 0.78 + 0.40 pass 0.85 + 0.05: image 0 first, its twin with it
    widened = rerank_scores(scores, 1, logits, image_neighbours=near)["t2i"]
    assert sorted(verified) == [0, 1]
    assert _order(widened[:, 0]) == [1, 0, 2, 3]  # the verifier's choice, then its partner, then the pooler's order
    torch.testing.assert_close(widened[[2, 3], 0], scores[[2, 3], 0])  # images outside the list keep their score


def test_an_images_list_also_holds_the_captions_whose_list_held_it():
    scores = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.2, 0.6], [0.1, 0.2]])
    verified = []

    def logits(i, t):
        verified.extend(zip(i.tolist(), t.tolist()))
        return ((i == 3) & (t == 0)).float()  # image 3 is caption 0's picture

    near = torch.tensor([[3], [2], [1], [0]])
    assert _order(rerank_scores(scores, 1, logits, ("t2i", "i2t"))["i2t"][3]) == [1, 0]  # the pooler's order
    verified.clear()
    out = rerank_scores(scores, 1, logits, ("t2i", "i2t"), image_neighbours=near)
    # caption 0's list (image 0 and its nearest, image 3) held image 3, so image 3's list holds caption 0, verified first
    assert _order(out["i2t"][3]) == [0, 1]
    # no pair beyond the two directions' lists: t2i {0, 3} and {1, 2}, i2t each image's top 1
    assert sorted(set(verified)) == [(0, 0), (1, 1), (2, 1), (3, 0), (3, 1)] and len(verified) == 5


def test_a_captions_list_also_holds_the_images_whose_list_held_it():
    # image 2's top caption is caption 0; caption 0's own list (image 0 and its neighbour 1) lacks image 2
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.5, 0.1], [0.1, 0.9]])
    logit = lambda i, t: ((i == 2) & (t == 0)).float()  # noqa: E731
    near = torch.tensor([[1], [0], [3], [2]])
    out = rerank_scores(scores, 1, logit, ("t2i", "i2t"), image_neighbours=near)
    assert _order(out["t2i"][:, 0])[0] == 2  # the verifier's pick, from image 2's list
    assert _order(rerank_scores(scores, 1, logit, ("t2i",), image_neighbours=near)["t2i"][:, 0])[0] != 2


def test_neighbours_already_in_the_list_change_nothing():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.8, 0.7, 0.2], [0.1, 0.3, 0.6]])
    logit = lambda i, t: -(i * 3 + t).float()  # noqa: E731
    near = torch.tensor([[1], [0], [1]])
    plain = rerank_scores(scores, 3, logit, ("t2i", "i2t"))
    widened = rerank_scores(scores, 3, logit, ("t2i", "i2t"), image_neighbours=near)
    assert all(torch.equal(plain[d], widened[d]) for d in plain)


def test_image_neighbours_are_checked():
    scores = torch.zeros(3, 2)
    logit = lambda i, t: i.float()  # noqa: E731
    with pytest.raises(ValueError, match=r"\[n_images, m\] = \[3, m >= 1\] image rows, got \(2, 1\)"):
        rerank_scores(scores, 1, logit, image_neighbours=torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="integer image rows, got torch.float32"):
        rerank_scores(scores, 1, logit, image_neighbours=torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"rows outside 0..2"):
        rerank_scores(scores, 1, logit, image_neighbours=torch.full((3, 1), 3))
    with pytest.raises(ValueError, match="add 't2i' to the directions"):
        rerank_scores(scores, 1, logit, ("i2t",), image_neighbours=torch.zeros(3, 1, dtype=torch.long))


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    torch.manual_seed(0)
    return xmatch.build(small_spec(verifier={"name": "cross-attention", "layers": 1, "heads": 2})).eval()


def test_model_rerank_widens_each_caption_list_with_the_poolers_image_neighbours(model):
    g = torch.Generator().manual_seed(3)
    corner = torch.rand(6, 5, 2, generator=g) * 0.5
    with torch.inference_mode():
        img = model.encode_images(xmatch.RegionInputs(torch.rand(6, 5, 256, generator=g), torch.cat([corner, corner + 0.3], -1)))
        txt = model.encode_texts(["a red circle left of a blue seven", "a small green square", "a big blue three"])
        scores = model.similarity(img, txt)
        near = model.image_neighbours(img, 1)
        assert torch.equal(near, nearest_items(model.pooler(img, img), 1))
        got = model.rerank(scores, img, txt, 2, neighbours=1)["t2i"]
        for j in range(len(txt)):
            top = _order(scores[:, j] + TWIN_WEIGHT * scores[near[:, 0], j])[:2]
            pool = list(dict.fromkeys(top + near[top].flatten().tolist()))
            logits = model.verify(img[torch.tensor(pool)], txt[torch.tensor([j] * len(pool))])
            rest = [i for i in _order(scores[:, j]) if i not in pool]
            assert _order(got[:, j]) == [pool[i] for i in _order(logits)] + rest
        assert torch.equal(model.rerank(scores, img, txt, 2, neighbours=0)["t2i"], model.rerank(scores, img, txt, 2)["t2i"])


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scenes")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, model) -> str:
    path = tmp_path_factory.mktemp("verifier")
    xmatch.save_pretrained(model, path)
    return f"local-dir:{path}"


def test_eval_reports_the_widened_lists_as_their_own_row(bundle, scenes_root, tmp_path, capsys):
    pytest.importorskip("timm")
    from xmatch.cli.main import main
    from xmatch.eval.suite import load_records, with_reranked

    data = ["--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "train", "--protocol", "full,groups"]
    assert main(["eval", bundle, *data, "--rerank", "2", "--json", str(tmp_path / "k.json")]) == 0
    capsys.readouterr()
    assert main(["eval", bundle, *data, "--rerank", "2", "--rerank-neighbours", "1", "--json", str(tmp_path / "n.json")]) == 0
    text = capsys.readouterr().out
    assert "re-scores each query's top 2 and, for each caption, the 1 nearest image of each" in text
    (plain,), (widened,) = load_records(tmp_path / "k.json"), load_records(tmp_path / "n.json")
    assert plain.extras["rerank"]["neighbours"] == 0 and widened.extras["rerank"]["neighbours"] == 1
    assert widened.extras["rerank"]["pairs"] > plain.extras["rerank"]["pairs"]  # more images verified per caption
    assert [r.name for r in with_reranked([widened])][1] == f"{bundle} + verifier@2+1nn"


def test_eval_refuses_neighbours_without_rerank(bundle, scenes_root, capsys):
    from xmatch.cli.main import main

    data = ["--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "train"]
    assert main(["eval", bundle, *data, "--rerank-neighbours", "1"]) == 2
    assert "--rerank-neighbours 1 widens the verifier's lists; give --rerank K as well" in capsys.readouterr().err
    assert main(["eval", bundle, *data, "--rerank", "2", "--rerank-neighbours", "-1"]) == 2
    assert "0 or more; got -1" in capsys.readouterr().err


def test_run_protocols_refuses_neighbours_without_rerank(model):
    from xmatch.eval.rerank import check_rerank_models

    with pytest.raises(ValueError, match="give --rerank K as well"):
        check_rerank_models([model], ["m"], None, 1)
    check_rerank_models([model], ["m"], None, 0)  # no re-ranking asked: nothing to refuse
