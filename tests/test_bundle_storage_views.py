"""A model whose weights are views into one flat buffer (cuDNN's RNN layout on a GPU) saves and
loads: the GPU run of the scenes sweep failed on it (safetensors refuses such views)."""

from __future__ import annotations

import torch

import xmatch


def flatten_like_cudnn(rnn: torch.nn.RNNBase) -> None:
    """Make every weight of ``rnn`` a view into one flat buffer, as cuDNN does on a GPU."""
    weights = [getattr(rnn, name) for name in rnn._flat_weights_names]
    flat = torch.cat([w.detach().reshape(-1) for w in weights])
    offset = 0
    for w in weights:
        w.data = flat[offset : offset + w.numel()].view_as(w)
        offset += w.numel()


def test_a_bigru_with_flat_weights_saves_and_loads(tmp_path) -> None:
    torch.manual_seed(0)
    model = xmatch.build("teran-mrsw-scenes", pretrained=False).eval()
    flatten_like_cudnn(model.text_encoder.rnn)
    shared = {w.untyped_storage().data_ptr() for w in model.text_encoder.rnn.parameters()}
    assert len(shared) == 1  # the layout that failed
    for dtype in (None, torch.float16):
        folder = xmatch.save_pretrained(model, tmp_path / str(dtype), dtype=dtype)
        loaded = xmatch.build(f"local-dir:{folder}", pretrained=True).eval()
        for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
            expected = a if dtype is None else a.to(dtype).to(a.dtype)
            assert torch.equal(expected, b), name
    # the caller's model keeps its layout
    assert len({w.untyped_storage().data_ptr() for w in model.text_encoder.rnn.parameters()}) == 1
