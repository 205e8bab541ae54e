"""The one place where xmatch's own components and zoo entries are registered."""

from __future__ import annotations

from xmatch import registry
from xmatch._zoo import builtin_entries
from xmatch.components.image_bottomup import BottomUpImageEncoder
from xmatch.components.image_regions_pixels import PixelRegionsImageEncoder
from xmatch.components.image_timm import TimmGridImageEncoder
from xmatch.components.losses import HingeTripletLoss, UncertaintyWeightedLoss
from xmatch.components.poolers import GlobalCosinePooler, MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler
from xmatch.components.reasoners import IdentityReasoner, TransformerReasoner
from xmatch.components.text_bert import BertTextEncoder
from xmatch.components.text_rnn import BiGRUTextEncoder, BiLSTMTextEncoder
from xmatch.data import ImageCaptionsDataset, PrecompDataset, TeranDataset
from xmatch.data.scenes import open_scenes
from xmatch.extract.proposer_boxes import BoxesProposer
from xmatch.extract.proposer_detector import TorchvisionDetector
from xmatch.extract.proposers_fixed import GridProposer, WindowsProposer

_registered = False


def register_builtins() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    registry.image_encoders.register("bottomup", BottomUpImageEncoder)
    registry.image_encoders.register("timm-grid", TimmGridImageEncoder)
    registry.image_encoders.register("pixel-regions", PixelRegionsImageEncoder)
    registry.text_encoders.register("bert", BertTextEncoder)
    registry.text_encoders.register("bigru", BiGRUTextEncoder)
    registry.text_encoders.register("bilstm", BiLSTMTextEncoder)
    registry.reasoners.register("transformer", TransformerReasoner)
    registry.reasoners.register("identity", IdentityReasoner)
    for name, pooler in (
        ("MrSw", MrSwPooler), ("MwSr", MwSrPooler), ("Symm", SymmPooler), ("MrAvgw", MrAvgwPooler),
        ("global-cosine", GlobalCosinePooler),
    ):
        registry.poolers.register(name, pooler)
    registry.losses.register("hinge", HingeTripletLoss)
    registry.losses.register("uncertainty", UncertaintyWeightedLoss)
    registry.datasets.register("teran", TeranDataset)
    registry.datasets.register("scan-precomp", PrecompDataset)
    registry.datasets.register("image-captions", ImageCaptionsDataset)
    registry.datasets.register("scenes", open_scenes)
    registry.proposers.register("grid", GridProposer)
    registry.proposers.register("windows", WindowsProposer)
    registry.proposers.register("boxes", BoxesProposer)
    registry.proposers.register("torchvision-detector", TorchvisionDetector)
    for entry in builtin_entries():
        registry.models.register(entry.name, entry)
