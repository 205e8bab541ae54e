"""What the transformer reasoner's ``geometry = "relative"`` buys and costs.

1. Learning "left of": six regions with random features, two of them marked A and B, at random
   places; a linear head on A's reasoned output says whether A's centre lies left of B's.
   ``--boxes-in-features`` adds a linear map of the boxes to the features, as TERAN's box MLP
   does, so the default reasoner can read absolute positions too. Held-out accuracy on 4,000
   sets, per seed.
2. Speed: forward + backward of the image reasoner on one training batch (128 sets of 36 regions
   and the CLS slot), ``none`` against ``relative``, alternated, the fastest of the repeats after
   a warm-up.

    python benchmarks/reasoner_geometry.py                        # both parts, 3 seeds
    python benchmarks/reasoner_geometry.py --boxes-in-features --steps 1000 --part learn
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from xmatch.components.reasoners import TransformerReasoner

DIM, REGIONS = 32, 6


def spatial_task(g: torch.Generator, n: int, markers: torch.Tensor, box_map: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    x = torch.randn(n, REGIONS, DIM, generator=g)
    x[:, 0] += markers[0]
    x[:, 1] += markers[1]
    lo = torch.rand(n, REGIONS, 2, generator=g) * 0.8
    boxes = torch.cat([lo, lo + 0.05 + torch.rand(n, REGIONS, 2, generator=g) * 0.15], -1)
    if box_map is not None:
        x = x + boxes @ box_map
    order = torch.argsort(torch.rand(n, REGIONS, generator=g), 1)
    x, boxes = x.gather(1, order[..., None].expand_as(x)), boxes.gather(1, order[..., None].expand_as(boxes))
    a, b = (order == 0).int().argmax(1), (order == 1).int().argmax(1)
    centre = boxes[..., 0] + boxes[..., 2]
    rows = torch.arange(n)
    return x, boxes, a, (centre[rows, a] < centre[rows, b]).float()


def learn(geometry: str, seed: int, steps: int, boxes_in_features: bool) -> float:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    markers = torch.randn(2, DIM, generator=g) * 2
    box_map = torch.randn(4, DIM, generator=g) * 2 if boxes_in_features else None
    r = TransformerReasoner(DIM, layers=1, heads=4, ff_dim=64, dropout=0.0, geometry=geometry, geometry_dim=32)
    head = nn.Linear(DIM, 1)
    opt = torch.optim.Adam([*r.parameters(), *head.parameters()], lr=3e-3)
    mask = torch.ones(128, REGIONS, dtype=torch.bool)
    for _ in range(steps):
        x, boxes, a, label = spatial_task(g, 128, markers, box_map)
        logit = head(r(x, mask, boxes=boxes)[torch.arange(128), a]).squeeze(-1)
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(logit, label).backward()
        opt.step()
    x, boxes, a, label = spatial_task(g, 4000, markers, box_map)
    with torch.no_grad():
        out = r.eval()(x, torch.ones(4000, REGIONS, dtype=torch.bool), boxes=boxes)
        return ((head(out[torch.arange(4000), a]).squeeze(-1) > 0).float() == label).float().mean().item()


def step_times(dim: int, ff_dim: int, batch: int, repeats: int, device: str) -> dict[str, float]:
    """The fastest forward + backward of each geometry, the two alternated so that a busy
    machine slows both alike."""
    reasoners = {}
    for geometry in ("none", "relative"):
        torch.manual_seed(0)
        reasoners[geometry] = TransformerReasoner(dim, layers=2, heads=4, ff_dim=ff_dim, dropout=0.1, geometry=geometry).to(device)
    x = torch.randn(batch, REGIONS * 6 + 1, dim, device=device)
    mask = torch.ones(batch, x.shape[1], dtype=torch.bool, device=device)
    lo = torch.rand(batch, x.shape[1], 2, device=device) * 0.7
    boxes = torch.cat([lo, lo + 0.2], -1)
    boxes[:, 0] = 0
    times: dict[str, list[float]] = {"none": [], "relative": []}
    for _ in range(repeats + 1):
        for geometry, r in reasoners.items():
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            r(x, mask, boxes=boxes).square().mean().backward()
            if device != "cpu":
                torch.cuda.synchronize()
            times[geometry].append(time.perf_counter() - start)
    return {geometry: min(t[1:]) for geometry, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("learn", "speed", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="training steps of the left-of task")
    parser.add_argument("--boxes-in-features", action="store_true", help="the features also carry the boxes (TERAN's box MLP)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps of the speed part")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("learn", "both"):
        print(f"left-of task, {args.steps} steps, boxes in features: {args.boxes_in_features}")
        for geometry in ("none", "relative"):
            accuracies = [learn(geometry, seed, args.steps, args.boxes_in_features) for seed in range(args.seeds)]
            listed = " ".join(f"{a:.3f}" for a in accuracies)
            print(f"  {geometry:9s} accuracy {listed}  mean {statistics.mean(accuracies):.3f}")
    if args.part in ("speed", "both"):
        print(f"image reasoner step (2 layers, 128 x 37 positions, forward + backward, {args.device})")
        for dim, ff_dim in ((256, 512), (1024, 2048)):
            t = step_times(dim, ff_dim, 128, args.repeats, args.device)
            print(f"  dim {dim:4d}: none {t['none'] * 1e3:7.1f} ms, relative {t['relative'] * 1e3:7.1f} ms "
                  f"({t['relative'] / t['none']:.2f}x)")


if __name__ == "__main__":
    main()
