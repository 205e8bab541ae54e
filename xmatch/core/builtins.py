"""The one place where xmatch's own components and zoo entries are registered.

Components are registered by import path and imported on first use (``import xmatch`` loads
none of them); the zoo's entries are read from its TOML files on the first lookup of a model.
"""

from __future__ import annotations

from xmatch.core import registry
from xmatch.core.registry import BUILTIN
from xmatch.core.zoo import builtin_entries

#: kind -> {registered name: "module:attr"}
BUILTINS: dict[str, dict[str, str]] = {
    "image_encoders": {
        "bottomup": "xmatch.components.image.bottomup:BottomUpImageEncoder",
        "timm-grid": "xmatch.components.image.timm_grid:TimmGridImageEncoder",
        "pixel-regions": "xmatch.regions.image_encoder:PixelRegionsImageEncoder",
        "clip-vision": "xmatch.components.image.clip:ClipImageEncoder",
        "siglip-vision": "xmatch.components.image.clip:SiglipImageEncoder",
    },
    "text_encoders": {
        "bert": "xmatch.components.text.bert:BertTextEncoder",
        "bigru": "xmatch.components.text.rnn:BiGRUTextEncoder",
        "bilstm": "xmatch.components.text.rnn:BiLSTMTextEncoder",
        "clip-text": "xmatch.components.text.clip:ClipTextEncoder",
        "siglip-text": "xmatch.components.text.clip:SiglipTextEncoder",
    },
    "reasoners": {
        "transformer": "xmatch.components.reasoners:TransformerReasoner",
        "identity": "xmatch.components.reasoners:IdentityReasoner",
    },
    "poolers": {
        "MrSw": "xmatch.components.poolers:MrSwPooler",
        "MwSr": "xmatch.components.poolers:MwSrPooler",
        "Symm": "xmatch.components.poolers:SymmPooler",
        "MrAvgw": "xmatch.components.poolers:MrAvgwPooler",
        "global-cosine": "xmatch.components.poolers:GlobalCosinePooler",
    },
    "losses": {
        "hinge": "xmatch.components.losses:HingeTripletLoss",
        "uncertainty": "xmatch.components.losses:UncertaintyWeightedLoss",
        "infonce": "xmatch.components.losses:InfoNCELoss",
        "sigmoid": "xmatch.components.losses:SigmoidLoss",
    },
    "datasets": {
        "teran": "xmatch.data.teran:TeranDataset",
        "scan-precomp": "xmatch.data.precomp:PrecompDataset",
        "image-captions": "xmatch.data.image_captions:ImageCaptionsDataset",
        "webdataset": "xmatch.data.webdataset:WebDataset",
        "scenes": "xmatch.scenes.dataset:open_scenes",
        "tabletop": "xmatch.tabletop.dataset:open_tabletop",
        "signs": "xmatch.signs.dataset:open_signs",
    },
    "proposers": {
        "grid": "xmatch.regions.proposers_fixed:GridProposer",
        "windows": "xmatch.regions.proposers_fixed:WindowsProposer",
        "boxes": "xmatch.regions.proposer_boxes:BoxesProposer",
        "torchvision-detector": "xmatch.regions.proposer_detector:TorchvisionDetector",
        "selective-search": "xmatch.regions.proposer_segments:SelectiveSearchProposer",
    },
    "negatives": {
        "swap-roles": "xmatch.train.negatives:SwapRoles",
        "swap-attributes": "xmatch.train.negatives:SwapBoundAttributes",
        "replace-relation": "xmatch.train.negatives:ReplaceRelation",
        "change-count": "xmatch.train.negatives:ChangeCount",
    },
    "verifiers": {
        "cross-attention": "xmatch.components.verifier:CrossAttentionVerifier",
        "grounded": "xmatch.components.verifier_grounded:GroundedVerifier",
    },
}

_registered = False


def register_builtins() -> None:
    """Register xmatch's own components and zoo entries, with the origin ``"xmatch"``
    (:data:`xmatch.core.registry.BUILTIN`); calling it again does nothing."""
    global _registered
    if _registered:
        return
    _registered = True
    for kind, names in BUILTINS.items():
        for name, target in names.items():
            registry.get_registry(kind).register_lazy(name, target, origin=BUILTIN)
    registry.models.add_builtin_loader(_register_zoo_entries)


def _register_zoo_entries() -> None:
    for entry in builtin_entries():
        registry.models.register(entry.name, entry, origin=BUILTIN)
