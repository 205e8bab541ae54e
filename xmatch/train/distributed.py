"""Multi-process training with PyTorch DDP (launched by ``torchrun``).

``torchrun`` sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; :func:`setup` joins the process
group (NCCL on CUDA, Gloo on CPU) and picks this process's device. Only rank 0 writes files.

With ``global_negatives`` every process all-gathers the batch's embeddings, so the hinge loss
mines its hardest negatives over the whole global batch; a process's own share keeps its
autograd graph, the others' come in as constants. Every process then computes the same global
loss and backpropagates it into its own share; DDP averages gradients over the N processes,
so the loss is scaled by N before backward and the summed gradient equals a single process's on the global
batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from xmatch.model.interfaces import LossOutput
from xmatch.core.devices import resolve_device
from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import PairBatch
from xmatch.train.negatives import NegativeTexts, structural_hinge


@dataclass
class Context:
    """Where this process stands: rank, number of processes, device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        """Average logged figures over the processes."""
        if not self.distributed or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return {k: float(v) / self.world_size for k, v in zip(keys, t.tolist())}

    def any(self, flag: bool) -> bool:
        """True on every process when any process says True."""
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t)
        return bool(t.item())

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def setup(device: str | torch.device | None = None) -> Context:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1).

    Args:
        device: ``cpu``, ``cuda``, ``mps`` (default: CUDA when available). Under ``torchrun``
            on CUDA each process takes ``cuda:LOCAL_RANK``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    requested = resolve_device(device, default="auto")
    if requested.type == "cuda":
        requested = torch.device("cuda", local if world > 1 else (requested.index or 0))
        torch.cuda.set_device(requested)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if requested.type == "cuda" else "gloo")
    return Context(rank, world, local, requested)


def teardown(ctx: Context) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def gather_embeddings(e: Embeddings, ctx: Context) -> Embeddings:
    """All processes' embeddings, in rank order; this process's share keeps its gradient."""
    n, width = len(e), e.tokens.shape[1]
    sizes = torch.tensor([[n, width]], device=e.tokens.device)
    all_sizes = [torch.zeros_like(sizes) for _ in range(ctx.world_size)]
    dist.all_gather(all_sizes, sizes)
    counts = [int(s[0, 0]) for s in all_sizes]
    max_n, max_w = max(counts), max(int(s[0, 1]) for s in all_sizes)
    tokens = nn.functional.pad(e.tokens, (0, 0, 0, max_w - width, 0, max_n - n))
    mask = nn.functional.pad(e.mask.to(torch.uint8), (0, max_w - width, 0, max_n - n))
    parts = {"tokens": tokens, "mask": mask}
    if e.pooled is not None:
        parts["pooled"] = nn.functional.pad(e.pooled, (0, 0, 0, max_n - n))
    gathered: dict[str, list[torch.Tensor]] = {}
    for key, local in parts.items():
        bucket = [torch.empty_like(local) for _ in range(ctx.world_size)]
        dist.all_gather(bucket, local.detach().contiguous())
        bucket[ctx.rank] = local  # the own share keeps its autograd graph
        gathered[key] = [t[:c] for t, c in zip(bucket, counts)]
    pooled = torch.cat(gathered["pooled"]) if "pooled" in gathered else None
    return Embeddings(torch.cat(gathered["tokens"]), torch.cat(gathered["mask"]).bool(), pooled).trimmed()


def gather_ids(ids: torch.Tensor, ctx: Context) -> torch.Tensor:
    """All processes' image ids (variable counts), in rank order."""
    return torch.cat([torch.as_tensor(t, device=ids.device) for t in ctx.gather_objects(ids.cpu())])


class TrainStep(nn.Module):
    """One forward pass of training: encode the local share, optionally gather the global
    batch, pool and score. This is the module DDP wraps (its parameters are the model's).

    With structural negatives (``negatives_margin`` set; :mod:`xmatch.train.negatives`) the
    step also encodes the batch's negative captions (in one text batch with the captions),
    scores each against its own caption's image only (:meth:`~xmatch.MatchingModel.paired_scores`)
    and adds their hinge term, and the in-group terms where ``group_ids`` are given; a model with a verifier head adds the verifier's own
    loss. These extra terms read the local share only (never the gathered batch).
    """

    def __init__(
        self,
        model: nn.Module,
        ctx: Context,
        global_negatives: bool,
        negatives_margin: float | None = None,
        negatives_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.ctx = ctx
        self.gather = global_negatives and ctx.distributed
        self.negatives_margin = negatives_margin
        self.negatives_weight = negatives_weight
        #: what the loss is multiplied by before backward (DDP averages gradients)
        self.loss_scale = ctx.world_size if self.gather else 1

    def forward(
        self, batch: PairBatch, negatives: NegativeTexts | None = None, group_ids: torch.Tensor | None = None
    ) -> LossOutput:
        negative_txt = None
        if negatives is not None and len(negatives):
            img, txt, negative_txt = self._encode_with_negatives(batch, negatives)
        else:
            img, txt = self.model.encode_batch(batch)
        ids = batch.image_ids
        verifier = getattr(self.model, "verifier", None)
        if self.negatives_margin is None and verifier is None:
            if not self.gather:
                return self.model.batch_loss(img, txt, ids)
            gathered_ids = gather_ids(ids, self.ctx) if ids is not None else None
            return self.model.batch_loss(gather_embeddings(img, self.ctx), gather_embeddings(txt, self.ctx), gathered_ids)
        if self.gather:
            gathered_ids = gather_ids(ids, self.ctx) if ids is not None else None
            out = self.model.batch_loss(gather_embeddings(img, self.ctx), gather_embeddings(txt, self.ctx), gathered_ids)
            scores = self.model.batch_scores(img, txt)["main"]
        else:
            all_scores = self.model.batch_scores(img, txt)
            with torch.autocast(img.tokens.device.type, enabled=False):
                out = self.model.loss(all_scores, ids)
            scores = all_scores["main"]
        loss, logs = out.loss, dict(out.logs)
        if self.negatives_margin is not None:
            owner = negatives.owner.to(scores.device) if negative_txt is not None else None
            # the hinge reads each negative's score with its own caption's image only: scoring
            # it against every image of the batch ([B, M]) was most of the negatives' cost
            negative_scores = self.model.paired_scores(img[owner], negative_txt) if owner is not None else None
            term, term_logs = structural_hinge(scores, negative_scores, owner, self.negatives_margin, group_ids, ids)
            loss = loss + self.negatives_weight * term
            logs.update(term_logs)
        if verifier is not None:
            checked = verifier.training_loss(
                img, txt, scores.detach(), negatives=negative_txt,
                owner=negatives.owner.to(scores.device) if negative_txt is not None else None, image_ids=ids,
            )
            loss = loss + checked.loss
            logs.update(checked.logs)
        return LossOutput(loss, logs)

    def _encode_with_negatives(self, batch: PairBatch, negatives: NegativeTexts) -> tuple[Embeddings, Embeddings, Embeddings]:
        """The batch's images, captions and negative captions; the captions and their negatives
        go through the text side as one batch (one pass of a recurrent encoder's time steps
        instead of two), each part trimmed to its own longest text afterwards."""
        if not isinstance(batch, PairBatch):
            raise TypeError(f"a training batch is an xmatch.PairBatch (xmatch.data.collate makes one), got {type(batch).__name__}.")
        img = self.model.encode_images(batch.images, batch_size=None, progress=False)
        n, texts = len(batch.texts), [*batch.texts, *negatives.texts]
        both = self.model.encode_texts(texts, batch_size=len(texts))
        return img, both[:n].trimmed(), both[n:].trimmed()
