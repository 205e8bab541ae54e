"""Prove a conversion: re-score the inputs stored with an original checkpoint and compare
with the outputs the original code computed (the ``io.npz`` layout of the fixtures)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from xmatch.masks import lengths_to_mask

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


def compare_with_original_outputs(model: torch.nn.Module, io_path: str | os.PathLike, tolerance: float = 1e-5) -> CheckReport:
    """Encode the stored regions and captions with ``model`` and compare embeddings and every
    similarity the file holds (evaluation layout) with the original outputs."""
    from xmatch.registry import poolers

    io = np.load(io_path)
    regions = torch.from_numpy(io["region_features"])
    boxes = torch.from_numpy(io["boxes_norm"])
    mask = lengths_to_mask(torch.from_numpy(io["n_regions"]), regions.shape[1])
    with torch.no_grad():
        img = model.encode_images(regions, boxes, mask)
        txt = model.encode_texts([str(c) for c in io["captions"]])
    report = CheckReport(tolerance=tolerance)
    ref_img, img_len = io["eval_img_set"], io["eval_img_lengths"]
    report.differences["region embeddings"] = max(
        float(np.abs(img.tokens[i][img.mask[i]].numpy() - ref_img[i, 1 : img_len[i]]).max()) for i in range(len(ref_img))
    )
    ref_cap, cap_len = io["eval_cap_seq"], io["eval_cap_lengths"]
    report.differences["word embeddings"] = max(
        float(np.abs(txt.tokens[k][txt.mask[k]].numpy() - ref_cap[k, 1 : cap_len[k] - 2]).max()) for k in range(len(ref_cap))
    )
    compat = model.spec["pooler"].get("compat", "clean")
    for name, original in ORIGINAL_NAMES.items():
        key = f"sim_{original}"
        if key in io:
            with torch.no_grad():
                scores = poolers.get(name)(compat=compat)(img, txt).numpy()
            report.differences[f"similarity {name}"] = float(np.abs(scores - io[key]).max())
    return report
