"""Prove a conversion: re-score the inputs stored with an original TERN or TERAN checkpoint
and compare with the outputs the original code computed (the ``io.npz`` layout of the fixtures
in ``tests/fixtures/teran-original`` and ``tests/fixtures/tern-original``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from xmatch.model.inputs import RegionInputs
from xmatch.model.masks import lengths_to_mask

#: xmatch pooler -> key suffix of the original outputs
ORIGINAL_NAMES = {"MrSw": "MrSw", "MwSr": "MwSr", "Symm": "symm", "MrAvgw": "MrAVGw"}


@dataclass
class CheckReport:
    """Largest absolute difference per compared output, and the tolerance used."""

    differences: dict[str, float] = field(default_factory=dict)
    tolerance: float = 1e-5

    @property
    def ok(self) -> bool:
        return all(d <= self.tolerance for d in self.differences.values())

    def table(self) -> str:
        rows = [f"{'output':28s} {'max |diff|':>12s}  ok"]
        for name, diff in self.differences.items():
            rows.append(f"{name:28s} {diff:12.3e}  {'yes' if diff <= self.tolerance else 'NO'}")
        return "\n".join(rows)


#: the inputs every io file holds (regions zero-padded to a common width, pixel boxes already
#: divided by the image size, one caption string per row)
INPUTS = ("region_features", "boxes_norm", "n_regions", "captions")
#: outputs a check can compare; an io file holds those of its model family
OUTPUTS = (
    "eval_img_set", "eval_cap_seq", "eval_img_set_raw", "eval_cap_set_raw", "img_emb_aggr", "cap_emb_aggr",
    "sim_dot", *(f"sim_{name}" for name in ORIGINAL_NAMES.values()),
)


def compare_with_original_outputs(model: torch.nn.Module, io_path: str | os.PathLike, tolerance: float = 1e-5) -> CheckReport:
    """Encode the stored regions and captions with ``model`` and compare every output the file
    holds with what the original code computed from them.

    Two layouts are read (``tests/fixtures/*-original/*/io.npz``). TERAN's holds the
    normalised evaluation sets (``eval_img_set``, ``eval_cap_seq``: the original keeps words
    1 .. len-3) and the alignment similarities ``sim_MrSw`` etc.; TERN's holds its raw
    (unnormalised) sets (``eval_img_set_raw``, ``eval_cap_set_raw``: every word-piece between
    [CLS] and [SEP]) and ``sim_dot``, the dot product of the unit CLS outputs that its ``t2i``
    ranks. Both hold the CLS outputs ``img_emb_aggr`` / ``cap_emb_aggr``. A shape that does
    not match reports an infinite difference.

    Raises:
        ValueError: the file lacks the inputs, or holds none of the outputs above.

    Example:
        >>> report = compare_with_original_outputs(model, "tern-small/io.npz")  # needs a converted model and the original outputs  # doctest: +SKIP
        >>> report.ok, report.differences["similarity global-cosine"] < 1e-5  # doctest: +SKIP
        (True, True)
    """
    from xmatch.core.registry import poolers

    io = np.load(io_path)
    if not isinstance(io, np.lib.npyio.NpzFile):
        raise ValueError(f"{io_path} is a single array, not the .npz archive of inputs and outputs --check reads.")
    missing = [key for key in INPUTS if key not in io]
    if missing:
        raise ValueError(
            f"{io_path} lacks the inputs {missing} (it holds {sorted(io.files)}); --check reads the io.npz "
            "layout of tests/fixtures/teran-original and tests/fixtures/tern-original (docs/compat.md)."
        )
    if not any(key in io for key in OUTPUTS):
        raise ValueError(
            f"{io_path} holds none of the original outputs a check compares ({', '.join(OUTPUTS)}); "
            f"it holds {sorted(io.files)}."
        )
    regions = torch.from_numpy(io["region_features"])
    boxes = torch.from_numpy(io["boxes_norm"])
    mask = lengths_to_mask(torch.from_numpy(io["n_regions"]), regions.shape[1])
    with torch.no_grad():
        img = model.encode_images(RegionInputs(regions, boxes, mask))
        txt = model.encode_texts([str(c) for c in io["captions"]])
    report = CheckReport(tolerance=tolerance)
    # (name, stored sets, their lengths key, how many trailing slots the original leaves out, normalise)
    sets = (
        ("region embeddings", img, "eval_img_set", "eval_img_lengths", 0, False),
        ("word embeddings", txt, "eval_cap_seq", "eval_cap_lengths", 2, False),
        ("region embeddings", img, "eval_img_set_raw", "eval_img_lengths", 0, True),
        ("word embeddings", txt, "eval_cap_set_raw", "eval_cap_lengths", 1, True),
    )
    for name, ours, key, lengths_key, dropped_at_end, normalise in sets:
        if key not in io:
            continue
        ref, lengths = io[key], io[lengths_key]
        if normalise:  # TERN never normalises its sets; xmatch's tokens are unit vectors
            ref = ref / np.maximum(np.linalg.norm(ref, axis=-1, keepdims=True), 1e-12)
        report.differences[name] = max(
            _max_diff(ours.tokens[k][ours.mask[k]].numpy(), ref[k, 1 : lengths[k] - dropped_at_end])
            for k in range(len(ref))
        )
    for name, ours, key in (("image CLS embeddings", img, "img_emb_aggr"), ("text CLS embeddings", txt, "cap_emb_aggr")):
        if key in io:
            report.differences[name] = _max_diff(None if ours.pooled is None else ours.pooled.numpy(), io[key])
    compat = model.spec["pooler"].get("compat", "clean")
    for name, original in ORIGINAL_NAMES.items():
        key = f"sim_{original}"
        if key in io:
            with torch.no_grad():
                scores = poolers.get(name)(compat=compat)(img, txt).numpy()
            report.differences[f"similarity {name}"] = _max_diff(scores, io[key])
    if "sim_dot" in io:
        with torch.no_grad():
            scores = poolers.get("global-cosine")()(img, txt).numpy() if img.pooled is not None else None
        report.differences["similarity global-cosine"] = _max_diff(scores, io["sim_dot"])
    return report


def _max_diff(ours: np.ndarray | None, reference: np.ndarray) -> float:
    """Largest absolute difference; infinite when ``ours`` is missing or shaped otherwise."""
    if ours is None or ours.shape != reference.shape:
        return float("inf")
    return float(np.abs(ours - reference).max())
