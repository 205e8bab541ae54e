"""Size checks of a model spec, before anything is allocated.

A spec value such as ``embed_dim = 10_000_000`` would make torch try to allocate petabytes, or
overflow its size arithmetic, deep inside a component, with an error that names neither the
spec nor the value. :func:`check_model_size` builds the model once on the ``meta`` device
(shapes only: no memory is allocated and no weights are loaded), counts its parameters and
buffers, and refuses a model over :data:`MAX_MODEL_BYTES` with a
:class:`~xmatch.core.spec.SpecError` that names the spec value, the bytes it would need and the
bound. ``layers`` arguments, which set how many modules are built, are bounded first
(:data:`MAX_LAYERS`), so that the dry run itself stays quick.

Example:
    >>> from xmatch.core.spec import check_model_spec, merge
    >>> from xmatch.model.factory import assemble_model
    >>> spec = merge(xmatch.info("teran-mrsw-scenes").spec, {"image_reasoner": {"ff_dim": 10**9}})
    >>> check_model_size(check_model_spec(spec), assemble_model)
    Traceback (most recent call last):
    ...
    xmatch.core.spec.SpecError: model -> image_reasoner -> ff_dim = 1,000,000,000: the model would hold 1,026,002,314,752 parameters and buffers (3.73 TiB), more than the 16 GiB a model may take ...
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from xmatch.core.registry import get_registry
from xmatch.core.spec import COMPONENTS, SpecError, signature_of

#: the most bytes of parameters and buffers a model may take (float32: about 4.3 billion
#: parameters, some 20 times TERAN with BERT-base); a larger model is refused before it is built
MAX_MODEL_BYTES = 16 * 2**30
#: the most layers one ``layers`` argument may ask for (the deepest published text and image
#: encoders have under 200); every layer is a module the build constructs, one by one
MAX_LAYERS = 1024
#: torch's errors for a tensor whose size it cannot represent (too large, or negative)
_UNSIZABLE = re.compile(r"size calculation overflowed|negative dimension")


def check_model_size(canonical: Mapping[str, Any], assemble: Callable[[Mapping[str, Any]], nn.Module]) -> None:
    """Refuse a spec whose model would be absurdly large, before any of it is allocated.

    Args:
        canonical: a spec checked by :func:`~xmatch.core.spec.check_model_spec`.
        assemble: builds the model of such a spec (:func:`xmatch.model.factory.assemble_model`);
            called once under ``torch.device("meta")`` with every ``pretrained`` argument False.

    Raises:
        SpecError: a ``layers`` value over :data:`MAX_LAYERS`; a model over
            :data:`MAX_MODEL_BYTES`, or with a tensor torch cannot size. The message names the
            spec value (or, when no single value explains it, the component and its sizes), the
            parameters and bytes needed, and the bound.

    A spec the dry run cannot build for another reason (a missing backbone, a component that
    does not build on ``meta``) is left to the real build, which reports that itself.
    """
    sizes = list(_spec_sizes(canonical))
    for path, value in sizes:
        if path.endswith("-> layers") and value > MAX_LAYERS:
            raise SpecError(
                f"{path} = {value:,}: more than the {MAX_LAYERS:,} layers a component may have (each layer is built "
                "as a module of its own); lower it."
            )
    if torch.get_default_device().type == "meta":
        return  # already shapes only (parameter counts): nothing would be allocated
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the real build warns, once
            net = assemble(_without_weights(canonical))
    except RuntimeError as exc:
        if _UNSIZABLE.search(str(exc)):
            raise _unsizable(str(exc), sizes) from None
        return
    except Exception:  # not a size problem: the real build reports it
        return
    children = {name: _footprint(child) for name, child in net.named_children()}
    total = _footprint(net)
    if total[1] > MAX_MODEL_BYTES:
        raise _too_large(total, children, canonical, sizes)


def _without_weights(canonical: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with every component's ``pretrained`` argument False: the same shapes, and no
    download or weight file read while they are counted."""
    dry = dict(canonical)
    tables = [(key, kind) for key, kind in COMPONENTS.items() if key in dry]
    for key, kind in tables:
        dry[key] = _no_pretrained(dry[key], kind)
    dry["extra_poolers"] = {k: _no_pretrained(v, "poolers") for k, v in canonical.get("extra_poolers", {}).items()}
    return dry


def _no_pretrained(table: Mapping[str, Any], kind: str) -> dict[str, Any]:
    parameters = signature_of(get_registry(kind).get(table["name"])).parameters
    return {**table, "pretrained": False} if "pretrained" in parameters else dict(table)


def _footprint(module: nn.Module) -> tuple[int, int, tuple[int, ...]]:
    """(numbers, bytes, shape of the largest tensor) of a module's parameters and buffers, a
    shared tensor counted once."""
    seen: dict[int, torch.Tensor] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(tensor), tensor)
    tensors = list(seen.values())
    largest = max(tensors, key=torch.Tensor.numel, default=None)
    return (
        sum(t.numel() for t in tensors),
        sum(t.numel() * t.element_size() for t in tensors),
        tuple(largest.shape) if largest is not None else (),
    )


def _spec_sizes(canonical: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(spec path, value) of every whole-number argument of the spec."""
    yield "model -> embed_dim", canonical["embed_dim"]
    tables = [(f"model -> {key}", canonical[key]) for key in COMPONENTS if key in canonical]
    tables += [(f"model -> extra_poolers -> {k}", v) for k, v in canonical.get("extra_poolers", {}).items()]
    for path, table in tables:
        for key, value in table.items():
            if isinstance(value, int) and not isinstance(value, bool):
                yield f"{path} -> {key}", value


def _culprit(dims: list[int], sizes: list[tuple[str, int]], prefixes: tuple[str, ...] = ("model",)) -> tuple[str, int] | None:
    """The spec value behind a tensor of sizes ``dims``, among the values whose path starts with
    one of ``prefixes``: a negative one among the sizes, else the largest value within a factor of
    8 of the largest size (a layer is often a small multiple of its width: 3 x embed_dim for
    attention, 3 x hidden_dim for a GRU, feature_dim + 5 box features); None when none is."""
    candidates = [(p, v) for p, v in sizes if p.startswith(prefixes)]
    negative = [(p, v) for p, v in candidates if v < 0 and v in dims]
    if negative:
        return negative[0]
    largest = max((abs(d) for d in dims), default=0)
    near = [(p, v) for p, v in candidates if 0 < v <= largest and v * 8 >= largest]
    return max(near, key=lambda pv: pv[1], default=None)


def _unsizable(message: str, sizes: list[tuple[str, int]]) -> SpecError:
    first = message.strip().splitlines()[0] if message.strip() else "RuntimeError"
    found = _culprit([int(n) for n in re.findall(r"-?\d+", first)], sizes)
    where = f"{found[0]} = {found[1]:,}" if found else "model"
    return SpecError(
        f"{where}: torch cannot size a tensor of this model ({first}); a size is a positive whole number, and "
        f"a model may take at most {_bytes(MAX_MODEL_BYTES)} (xmatch.model.sizes.MAX_MODEL_BYTES)."
    )


def _too_large(
    total: tuple[int, int, tuple[int, ...]],
    children: Mapping[str, tuple[int, int, tuple[int, ...]]],
    canonical: Mapping[str, Any],
    sizes: list[tuple[str, int]],
) -> SpecError:
    name, (count, size, shape) = max(children.items(), key=lambda item: item[1][1])
    key = name if name in canonical else "embed_dim"  # the projections are sized by embed_dim
    table = canonical.get(key)
    label = f"model -> {key}" + (f" ({table['name']})" if isinstance(table, Mapping) and "name" in table else "")
    # reasoners and the verifier are as wide as embed_dim (their injected dim), and so are the projections
    widened = key == "embed_dim" or key.endswith("_reasoner") or key == "verifier"
    prefixes = (f"model -> {key} ->", "model -> embed_dim") if widened else (f"model -> {key} ->",)
    found = _culprit(list(shape), sizes, prefixes)
    own = ", ".join(f"{p.rsplit(' -> ', 1)[-1]} = {v:,}" for p, v in sizes if p.startswith(prefixes))
    where = f"{found[0]} = {found[1]:,}" if found else f"{label} with {own or 'sizes from its source'}"
    largest = " x ".join(f"{d:,}" for d in shape) or "a scalar"
    return SpecError(
        f"{where}: the model would hold {total[0]:,} parameters and buffers ({_bytes(total[1])}), more than the "
        f"{_bytes(MAX_MODEL_BYTES)} a model may take (xmatch.model.sizes.MAX_MODEL_BYTES); {label} alone holds "
        f"{count:,} ({_bytes(size)}), its largest tensor {largest}. Lower it."
    )


def _bytes(n: int) -> str:
    """``17179869184`` -> ``'16 GiB'``."""
    value, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if value < 1024 or unit == "YiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}" if unit != "bytes" else f"{n:,} bytes"
