"""A direct per-caption loop that mirrors the original kuanghuei/SCAN ``model.py`` (``l2norm``,
``func_attention``, ``cosine_similarity``, ``xattn_score_t2i``, ``xattn_score_i2t``), ported
to current PyTorch for the tests. Two crashes of the original are fixed the obvious way and
marked: the undefined ``l1norm_d`` and the ``.squeeze()`` that drops the image axis."""

from __future__ import annotations

import torch
from torch import nn


def l1norm(X, dim, eps=1e-8):
    norm = torch.abs(X).sum(dim=dim, keepdim=True) + eps
    return torch.div(X, norm)


def l2norm(X, dim, eps=1e-8):
    norm = torch.pow(X, 2).sum(dim=dim, keepdim=True).sqrt() + eps
    return torch.div(X, norm)


def func_attention(query, context, raw_feature_norm, smooth, eps=1e-8):
    batch_size_q, queryL = query.size(0), query.size(1)
    batch_size, sourceL = context.size(0), context.size(1)
    queryT = torch.transpose(query, 1, 2)
    attn = torch.bmm(context, queryT)
    if raw_feature_norm == "softmax":
        attn = attn.view(batch_size * sourceL, queryL)
        attn = nn.Softmax(dim=1)(attn)
        attn = attn.view(batch_size, sourceL, queryL)
    elif raw_feature_norm == "l2norm":
        attn = l2norm(attn, 2)
    elif raw_feature_norm == "clipped_l2norm":
        attn = nn.LeakyReLU(0.1)(attn)
        attn = l2norm(attn, 2)
    elif raw_feature_norm == "l1norm":
        attn = l1norm(attn, 2)  # original: l1norm_d (undefined)
    elif raw_feature_norm == "clipped_l1norm":
        attn = nn.LeakyReLU(0.1)(attn)
        attn = l1norm(attn, 2)  # original: l1norm_d (undefined)
    elif raw_feature_norm == "clipped":
        attn = nn.LeakyReLU(0.1)(attn)
    elif raw_feature_norm == "no_norm":
        pass
    else:
        raise ValueError("unknown first norm type:", raw_feature_norm)
    attn = torch.transpose(attn, 1, 2).contiguous()
    attn = attn.view(batch_size * queryL, sourceL)
    attn = nn.Softmax(dim=1)(attn * smooth)
    attn = attn.view(batch_size, queryL, sourceL)
    attnT = torch.transpose(attn, 1, 2).contiguous()
    contextT = torch.transpose(context, 1, 2)
    weightedContext = torch.bmm(contextT, attnT)
    weightedContext = torch.transpose(weightedContext, 1, 2)
    return weightedContext, attnT


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    w12 = torch.sum(x1 * x2, dim)
    w1 = torch.norm(x1, 2, dim)
    w2 = torch.norm(x2, 2, dim)
    return w12 / (w1 * w2).clamp(min=eps)  # original: .squeeze() (drops the image axis of 1 image)


def _aggregate(row_sim, agg_func, lambda_lse):
    if agg_func == "LogSumExp":
        row_sim = row_sim.mul(lambda_lse).exp()
        row_sim = row_sim.sum(dim=1, keepdim=True)
        return torch.log(row_sim) / lambda_lse
    if agg_func == "Max":
        return row_sim.max(dim=1, keepdim=True)[0]
    if agg_func == "Sum":
        return row_sim.sum(dim=1, keepdim=True)
    if agg_func == "Mean":
        return row_sim.mean(dim=1, keepdim=True)
    raise ValueError("unknown aggfunc: {}".format(agg_func))


def xattn_score(images, captions, cap_lens, direction, lambda_softmax, agg_func, lambda_lse, raw_feature_norm):
    """``xattn_score_t2i`` / ``xattn_score_i2t``: images ``[n_image, R, d]`` (every region
    real, as in the original), captions ``[n_caption, L, d]`` with ``cap_lens``."""
    similarities = []
    n_image = images.size(0)
    n_caption = captions.size(0)
    for i in range(n_caption):
        n_word = int(cap_lens[i])
        cap_i = captions[i, :n_word, :].unsqueeze(0).contiguous()
        cap_i_expand = cap_i.repeat(n_image, 1, 1)
        if direction == "t2i":
            weiContext, attn = func_attention(cap_i_expand, images, raw_feature_norm, smooth=lambda_softmax)
            row_sim = cosine_similarity(cap_i_expand, weiContext, dim=2)
        else:
            weiContext, attn = func_attention(images, cap_i_expand, raw_feature_norm, smooth=lambda_softmax)
            row_sim = cosine_similarity(images, weiContext, dim=2)
        similarities.append(_aggregate(row_sim, agg_func, lambda_lse))
    return torch.cat(similarities, 1)


def ragged_xattn_score(images, region_lens, captions, cap_lens, direction, lambda_softmax, agg_func, lambda_lse, raw_feature_norm):
    """The same, one image at a time with only its real regions (for padded region sets)."""
    rows = [
        xattn_score(images[k : k + 1, : int(region_lens[k])], captions, cap_lens, direction,
                    lambda_softmax, agg_func, lambda_lse, raw_feature_norm)
        for k in range(images.size(0))
    ]
    return torch.cat(rows, 0)
