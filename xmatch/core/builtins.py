"""The one place where xmatch's own components and zoo entries are registered."""

from __future__ import annotations

from xmatch.core import registry
from xmatch.core.zoo import builtin_entries
from xmatch.components.image.bottomup import BottomUpImageEncoder
from xmatch.regions.image_encoder import PixelRegionsImageEncoder
from xmatch.components.image.timm_grid import TimmGridImageEncoder
from xmatch.components.losses import HingeTripletLoss, UncertaintyWeightedLoss
from xmatch.components.poolers import GlobalCosinePooler, MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler
from xmatch.components.reasoners import IdentityReasoner, TransformerReasoner
from xmatch.components.text.bert import BertTextEncoder
from xmatch.components.text.rnn import BiGRUTextEncoder, BiLSTMTextEncoder
from xmatch.data import ImageCaptionsDataset, PrecompDataset, TeranDataset
from xmatch.scenes.dataset import open_scenes
from xmatch.regions.proposer_boxes import BoxesProposer
from xmatch.regions.proposer_detector import TorchvisionDetector
from xmatch.regions.proposers_fixed import GridProposer, WindowsProposer
from xmatch.core.registry import BUILTIN

_registered = False


def register_builtins() -> None:
    """Register xmatch's own components and zoo entries, with the origin ``"xmatch"``
    (:data:`xmatch.core.registry.BUILTIN`); calling it again does nothing."""
    global _registered
    if _registered:
        return
    _registered = True
    registry.image_encoders.register("bottomup", BottomUpImageEncoder, origin=BUILTIN)
    registry.image_encoders.register("timm-grid", TimmGridImageEncoder, origin=BUILTIN)
    registry.image_encoders.register("pixel-regions", PixelRegionsImageEncoder, origin=BUILTIN)
    registry.text_encoders.register("bert", BertTextEncoder, origin=BUILTIN)
    registry.text_encoders.register("bigru", BiGRUTextEncoder, origin=BUILTIN)
    registry.text_encoders.register("bilstm", BiLSTMTextEncoder, origin=BUILTIN)
    registry.reasoners.register("transformer", TransformerReasoner, origin=BUILTIN)
    registry.reasoners.register("identity", IdentityReasoner, origin=BUILTIN)
    for name, pooler in (
        ("MrSw", MrSwPooler), ("MwSr", MwSrPooler), ("Symm", SymmPooler), ("MrAvgw", MrAvgwPooler),
        ("global-cosine", GlobalCosinePooler),
    ):
        registry.poolers.register(name, pooler, origin=BUILTIN)
    registry.losses.register("hinge", HingeTripletLoss, origin=BUILTIN)
    registry.losses.register("uncertainty", UncertaintyWeightedLoss, origin=BUILTIN)
    registry.datasets.register("teran", TeranDataset, origin=BUILTIN)
    registry.datasets.register("scan-precomp", PrecompDataset, origin=BUILTIN)
    registry.datasets.register("image-captions", ImageCaptionsDataset, origin=BUILTIN)
    registry.datasets.register("scenes", open_scenes, origin=BUILTIN)
    registry.proposers.register("grid", GridProposer, origin=BUILTIN)
    registry.proposers.register("windows", WindowsProposer, origin=BUILTIN)
    registry.proposers.register("boxes", BoxesProposer, origin=BUILTIN)
    registry.proposers.register("torchvision-detector", TorchvisionDetector, origin=BUILTIN)
    for entry in builtin_entries():
        registry.models.register(entry.name, entry, origin=BUILTIN)
