"""The MODEL argument of the command line (``xmatch eval``, ``xmatch index``): a zoo name or
bundle with its weights, or a name or spec with a weights file."""

from __future__ import annotations

from xmatch.model.factory import build
from xmatch.model.model import MatchingModel


def load_model_arg(text: str, device: str | None) -> MatchingModel:
    """Build the model a MODEL argument names: ``NAME``, ``local-dir:DIR``, ``hf-hub:ORG/NAME``
    (with their weights) or ``NAME_OR_SPEC=WEIGHTS`` (a .safetensors or original .pth file).

    Example:
        >>> load_model_arg("teran-mrsw-scenes", device="cpu")  # fetches the published weights  # doctest: +SKIP
    """
    if "=" in text:
        name, weights = text.split("=", 1)
        return build(name, checkpoint=weights, device=device)
    return build(text, pretrained=True, device=device)
