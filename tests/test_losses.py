"""Hinge triplet and uncertainty-weighted losses on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from xmatch.components.losses import HingeTripletLoss, UncertaintyWeightedLoss, hinge_triplet

SCORES = torch.tensor([[0.9, 0.8, 0.1], [0.5, 0.6, 0.75], [0.2, 0.3, 0.4]])


def test_hardest_negative_by_hand():
    # rows (image anchors): [0.1, 0.35, 0.1]; columns (caption anchors): [0.0, 0.4, 0.55]
    loss, count = hinge_triplet(SCORES, margin=0.2, max_violation=True)
    assert loss.item() == pytest.approx(0.1 + 0.35 + 0.1 + 0.0 + 0.4 + 0.55)
    assert count == 6


def test_sum_over_negatives_by_hand():
    loss, _ = hinge_triplet(SCORES, margin=0.2, max_violation=False)
    rows = (0.1 + 0.0) + (0.1 + 0.35) + (0.0 + 0.1)
    cols = (0.0 + 0.0) + (0.4 + 0.0) + (0.0 + 0.55)
    assert loss.item() == pytest.approx(rows + cols)


def test_same_image_ids_are_not_negatives():
    scores = torch.tensor([[0.5, 0.9], [0.9, 0.5]])
    with_dupes, _ = hinge_triplet(scores, 0.2, True)
    assert with_dupes.item() == pytest.approx(4 * 0.6)
    masked, _ = hinge_triplet(scores, 0.2, True, image_ids=torch.tensor([7, 7]))
    assert masked.item() == 0.0


def test_loss_reports_sum_and_mean_and_optimises_the_chosen_one():
    out = HingeTripletLoss(margin=0.2)({"main": SCORES})
    assert out.logs["main_sum"] == pytest.approx(1.5)
    assert out.logs["main_mean"] == pytest.approx(1.5 / 6)
    assert out.loss.item() == pytest.approx(1.5)
    assert HingeTripletLoss(reduction="mean")({"main": SCORES}).loss.item() == pytest.approx(1.5 / 6)


def test_non_square_scores_are_rejected():
    with pytest.raises(ValueError, match="square"):
        hinge_triplet(torch.zeros(2, 3))


def test_uncertainty_weighting_formula_and_gradients():
    loss = UncertaintyWeightedLoss(terms=["main", "alignment"])
    with torch.no_grad():
        loss.log_variances.copy_(torch.tensor([0.5, -1.0]))
    scores = {"main": SCORES.clone().requires_grad_(), "alignment": SCORES.T.clone().requires_grad_()}
    out = loss(scores)
    a = hinge_triplet(SCORES)[0].item()
    b = hinge_triplet(SCORES.T)[0].item()
    expected = torch.exp(torch.tensor(-0.5)).item() * a + 0.5 + torch.exp(torch.tensor(1.0)).item() * b - 1.0
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    out.loss.backward()
    assert loss.log_variances.grad is not None and scores["main"].grad is not None
    assert {"main_sum", "alignment_sum", "main_log_variance"} <= set(out.logs)


def test_missing_term_is_a_clear_error():
    with pytest.raises(KeyError, match="alignment"):
        HingeTripletLoss(term="alignment")({"main": SCORES})
