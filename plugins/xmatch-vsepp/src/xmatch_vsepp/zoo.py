"""VSE++ zoo entries: data in ``zoo.toml``, one entry point per entry (``xmatch_models``).

Each entry point names one of the :class:`xmatch.ZooEntry` objects below, read by
:func:`xmatch.plugin.zoo_entries_from_toml` (an entry may name a ``base`` entry and ``overrides`` of
its spec; the paper's figures, weights and parameter count are never inherited).

Example:
    >>> vsepp_precomp_coco.spec["pooler"]["name"]
    'global-cosine'
"""

from __future__ import annotations

from xmatch import zoo_entries_from_toml

ENTRIES = zoo_entries_from_toml(__package__, "zoo.toml")

vsepp_precomp_coco = ENTRIES["vsepp-precomp-coco"]
vsepp_precomp_f30k = ENTRIES["vsepp-precomp-f30k"]
vsepp_vse0_precomp_coco = ENTRIES["vsepp-vse0-precomp-coco"]
vsepp_vse0_precomp_f30k = ENTRIES["vsepp-vse0-precomp-f30k"]
vsepp_order0_precomp_coco = ENTRIES["vsepp-order0-precomp-coco"]
vsepp_order0_precomp_f30k = ENTRIES["vsepp-order0-precomp-f30k"]
vsepp_orderpp_precomp_coco = ENTRIES["vsepp-orderpp-precomp-coco"]
vsepp_orderpp_precomp_f30k = ENTRIES["vsepp-orderpp-precomp-f30k"]
vsepp_vgg19_coco = ENTRIES["vsepp-vgg19-coco"]
vsepp_vgg19_f30k = ENTRIES["vsepp-vgg19-f30k"]
vsepp_resnet152_coco = ENTRIES["vsepp-resnet152-coco"]
vsepp_resnet152_f30k = ENTRIES["vsepp-resnet152-f30k"]
