"""Component registries: one ``catalogue`` registry with entry points per kind.

Third-party packages add components without editing xmatch by declaring entry points in
the group ``xmatch_<kind>`` of their own ``pyproject.toml``::

    [project.entry-points.xmatch_poolers]
    my-pooler = "my_package.poolers:build_my_pooler"

Names are case-insensitive, duplicates raise, and an unknown name lists close matches.
xmatch's own components are registered by name and import path (``"module:attr"``,
:mod:`xmatch.core.builtins`) and imported on first use, so ``import xmatch`` loads none of
them. Each name records its origin (:meth:`Registry.origin`): ``"xmatch"`` for built-ins, the
distribution name for plugins, the registering module for registrations made at run time. A
plugin entry point that fails to load is logged, reported by :meth:`Registry.broken` and by a
lookup of its name, and leaves the other plugins of its group usable.

Example:
    >>> import xmatch
    >>> "MrSw" in xmatch.list_components("poolers")
    True
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import catalogue

from xmatch.core.errors import XmatchError
from xmatch.core.sources import PLUGINS_FILE, zoo_folder

KINDS: tuple[str, ...] = (
    "image_encoders",
    "text_encoders",
    "reasoners",
    "poolers",
    "losses",
    "models",
    "datasets",
    "proposers",
    "negatives",
    "verifiers",
)

BUILTIN = "xmatch"
"""The origin of xmatch's own components and zoo entries (registered in :mod:`xmatch.core.builtins`)."""

T = TypeVar("T")

logger = logging.getLogger(__name__)
#: held while a lookup loads names (built-ins, entry points, a lazy import): a first lookup from
#: two threads at once must not see a half-loaded registry. One lock for all registries, because
#: loading one registry's module may look up names in another.
_LOADING = threading.RLock()


class RegistryError(XmatchError, KeyError):
    """An unknown, duplicate or broken registry entry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


_KINDS_TAKEN: set[str] = set()


class Registry:
    """A case-insensitive registry of one component kind, backed by its own ``catalogue``
    namespace ``("xmatch", kind)``; one registry per kind.

    Args:
        kind: the component kind, e.g. ``"poolers"``; the entry-point group is
            ``xmatch_<kind>``.

    Raises:
        RegistryError: a registry of ``kind`` exists already (use :func:`get_registry`).

    Example:
        >>> reg = Registry("gadgets")
        >>> @reg.register("Max")
        ... def build_max(): ...
        >>> reg.get("max") is build_max
        True
        >>> reg.register_lazy("sum", "builtins:sum", origin=BUILTIN)
        >>> reg.get("SUM") is sum
        True
    """

    def __init__(self, kind: str) -> None:
        if kind in _KINDS_TAKEN:
            raise RegistryError(
                f"a registry of {kind!r} exists already; use xmatch.core.registry.get_registry({kind!r})."
            )
        _KINDS_TAKEN.add(kind)
        self.kind = kind
        self._catalogue = catalogue.create("xmatch", kind, entry_points=False)
        self.entry_point_group = f"xmatch_{kind}"
        self._lazy: dict[str, str] = {}  # lower-case -> "module:attr", imported on first lookup
        self._builtin_loaders: list[Callable[[], None]] = []
        self._names: dict[str, str] = {}  # lower-case -> registered spelling
        self._origin: dict[str, str] = {}  # lower-case -> BUILTIN, a distribution or a module
        self._broken: dict[str, str] = {}  # lower-case entry-point name -> why it was not registered
        self._entry_points_loaded = False

    def register(self, name: str, obj: T | None = None, *, origin: str | None = None) -> Any:
        """Register ``obj`` under ``name`` (usable as a decorator).

        Args:
            name: the registered spelling; lookups ignore case.
            obj: what to register; without it, ``register`` returns a decorator.
            origin: who registers it (see :meth:`origin`); by default the module defining
                ``obj``, marked as registered at run time.

        Raises:
            RegistryError: if the name (case-insensitively) is already taken.
        """

        def do_register(target: T) -> T:
            self._claim(name, origin or _runtime_origin(target))
            self._catalogue.register(name, func=target)
            return target

        if obj is not None:
            return do_register(obj)
        return do_register

    def register_lazy(self, name: str, target: str, *, origin: str) -> None:
        """Register the object at ``target`` (``"package.module:attr"``) under ``name``,
        imported on its first lookup.

        Raises:
            RegistryError: if the name (case-insensitively) is already taken.
        """
        self._claim(name, origin)
        self._lazy[name.lower()] = target

    def add_builtin_loader(self, load: Callable[[], None]) -> None:
        """Call ``load`` (which registers names) before this registry's first lookup: for
        built-ins read from data, such as the zoo's entries."""
        self._builtin_loaders.append(load)

    def _claim(self, name: str, origin: str) -> None:
        key = name.lower()
        if key in self._names:
            raise RegistryError(
                f"{self.kind}: the name '{name}' is already registered "
                f"(as '{self._names[key]}' by {self._origin[key]}); choose another name."
            )
        self._names[key] = name
        self._origin[key] = origin

    def _load_builtins(self) -> None:
        with _LOADING:
            while self._builtin_loaders:
                self._builtin_loaders.pop(0)()

    def get(self, name: str) -> Any:
        """Return the object registered as ``name`` (case-insensitive).

        Raises:
            RegistryError: unknown name (with close matches and the plugin to install), or a
                plugin entry point of that name that failed to load (with the reason).
        """
        if not isinstance(name, str):
            raise RegistryError(f"{self.kind}: a component name must be a string, got {name!r}.")
        key = name.lower()
        with _LOADING:
            self._load_builtins()
            if key not in self._names:
                self._load_entry_points()
            if key not in self._names:
                raise RegistryError(self._broken.get(key) or self._unknown_message(name))
            if key in self._lazy:
                module, _, attr = self._lazy[key].partition(":")
                self._catalogue.register(self._names[key], func=getattr(importlib.import_module(module), attr))
                del self._lazy[key]
        return self._catalogue.get(self._names[key])

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        self._load_builtins()
        self._load_entry_points()
        return name.lower() in self._names

    def names(self) -> list[str]:
        """All registered names, sorted case-insensitively."""
        self._load_builtins()
        self._load_entry_points()
        return sorted(self._names.values(), key=str.lower)

    def parameter_names(self, name: str) -> tuple[str, ...]:
        """The parameter names of the builder registered as ``name``, without importing it
        when it has not been imported yet: a built-in registered lazily, or a plugin's entry
        point not loaded yet, is read from its module's source (its ``def``), so a card can ask
        what a component takes without importing torch. A builder already imported (or
        registered at run time) is inspected.

        Raises:
            RegistryError: unknown name (as :meth:`get`).

        Example:
            >>> import xmatch
            >>> "vocab" in xmatch.core.registry.get_registry("text_encoders").parameter_names("bigru")
            True
        """
        key = name.lower() if isinstance(name, str) else name
        self._load_builtins()
        target = self._lazy.get(key) if isinstance(key, str) else None
        if target is None and isinstance(key, str) and key not in self._names and not self._entry_points_loaded:
            # a plugin's component: its entry point names the builder, read without loading the plugin
            target = next((ep.value for ep in importlib.metadata.entry_points(group=self.entry_point_group)
                           if ep.name.lower() == key and ":" in ep.value), None)
        if target is not None:
            module, _, attr = target.partition(":")
            found = _source_parameters(module, attr)
            if found is not None:
                return found
        return tuple(inspect.signature(self.get(name)).parameters)

    def declared_names(self) -> list[str]:
        """The names :meth:`names` gives, without importing anything: the registered names and
        those of the installed plugins' entry points, not loaded (one that would fail to load
        is listed all the same), sorted case-insensitively. For a command line's help, which
        must not import torch.

        Example:
            >>> import xmatch
            >>> "selective-search" in xmatch.core.registry.proposers.declared_names()
            True
        """
        self._load_builtins()
        names = dict(self._names)
        if not self._entry_points_loaded:  # once loaded, they are in _names (or broken)
            for ep in importlib.metadata.entry_points(group=self.entry_point_group):
                names.setdefault(ep.name.lower(), ep.name)
        return sorted(names.values(), key=str.lower)

    def canonical(self, name: str) -> str:
        """The registered spelling of ``name``."""
        self.get(name)
        return self._names[name.lower()]

    def origin(self, name: str) -> str:
        """Who registered ``name``: ``"xmatch"`` (:data:`BUILTIN`) for a built-in, the
        distribution name for a plugin's entry point, ``"MODULE (registered at run time)"``
        for a registration made by calling :meth:`register` or a ``register_*`` decorator.

        Example:
            >>> import xmatch
            >>> xmatch.core.registry.poolers.origin("MrSw")
            'xmatch'
        """
        self.get(name)
        return self._origin[name.lower()]

    def is_builtin(self, name: str) -> bool:
        """Whether ``name`` is one of xmatch's own registrations (not a plugin's, not one made
        at run time).

        Example:
            >>> import xmatch
            >>> xmatch.core.registry.poolers.is_builtin("mrsw")
            True
        """
        return self.origin(name) == BUILTIN

    def broken(self) -> dict[str, str]:
        """The plugin entry points of this kind that were not registered, by name, with why:
        the import failed, or the name clashes with one already registered. The other entry
        points of the group are registered all the same.

        Example:
            >>> import xmatch
            >>> xmatch.core.registry.poolers.broken()  # the installed plugins all load
            {}

            A plugin whose import fails shows as
            ``{'my-pooler': "poolers: the entry point 'my-pooler = my_pkg:Pooler' of my-pkg ... failed to load: ..."}``.
        """
        self._load_entry_points()
        return dict(self._broken)

    def _load_entry_points(self) -> None:
        with _LOADING:
            if self._entry_points_loaded:
                return
            self._load_builtins()  # a built-in keeps its name against a plugin's entry point
            self._entry_points_loaded = True
            for ep in importlib.metadata.entry_points(group=self.entry_point_group):
                dist = ep.dist.name if ep.dist is not None else ep.value
                key = ep.name.lower()
                if key in self._names:
                    if self._origin[key] != dist:  # the name keeps its first owner: a built-in, when it is one
                        self._report_broken(ep.name, (
                            f"{self.kind}: entry point '{ep.name}' of {dist} clashes with the name registered "
                            f"by {self._origin[key]}, which keeps it; one of the two packages must rename it."
                        ))
                    continue
                try:
                    obj = ep.load()
                except Exception as exc:  # a broken plugin must not hide the others
                    self._report_broken(ep.name, (
                        f"{self.kind}: the entry point '{ep.name} = {ep.value}' of {dist} "
                        f"(group {self.entry_point_group}) failed to load: {type(exc).__name__}: {exc}. "
                        f"Reinstall or fix {dist}, or uninstall it."
                    ))
                    continue
                self.register(ep.name, obj, origin=dist)

    def _report_broken(self, name: str, message: str) -> None:
        self._broken[name.lower()] = message
        logger.warning("%s", message)

    @contextlib.contextmanager
    def restored(self) -> Iterator[Registry]:
        """Forget every registration made inside the block when it ends (for tests that
        register throwaway components or zoo entries).

        Example:
            >>> import xmatch
            >>> with xmatch.core.registry.poolers.restored() as poolers:
            ...     _ = poolers.register("throwaway", object)
            ...     "throwaway" in poolers
            True
            >>> "throwaway" in xmatch.core.registry.poolers
            False
        """
        self._load_builtins()
        saved = (dict(self._names), dict(self._origin), dict(self._lazy), dict(self._broken), self._entry_points_loaded)
        try:
            yield self
        finally:
            self._names, self._origin, self._lazy, self._broken, self._entry_points_loaded = saved

    def refresh_entry_points(self) -> None:
        """Look for newly installed plugin distributions on the next lookup (and try the
        broken entry points again)."""
        self._entry_points_loaded = False
        self._broken.clear()

    def _unknown_message(self, name: str) -> str:
        known = self.names()
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.5)
        close = [self._names[c] for c in close]
        msg = f"unknown {self.kind[:-1].replace('_', ' ')} '{name}'."
        if close:
            msg += f" Did you mean: {', '.join(repr(c) for c in close)}?"
        msg += f" Available: {', '.join(known) or 'none'}."
        for prefix, package in known_plugins().items():
            if name.lower().startswith(prefix):
                msg += f" '{name}' may come from the plugin {package}: pip install {package}."
                break
        else:
            msg += (
                f" Components from plugins appear once their distribution is installed "
                f"(entry-point group {self.entry_point_group})."
            )
        if self._broken:
            msg += (
                f" {len(self._broken)} plugin entry point(s) of this group failed to load "
                f"({', '.join(sorted(self._broken))}): see xmatch.core.registry.get_registry('{self.kind}').broken()."
            )
        return msg


@functools.cache
def known_plugins() -> dict[str, str]:
    """``{name prefix: distribution}`` of the plugins listed in the zoo folder's ``plugins.toml``.

    Example:
        >>> known_plugins()["scan"]
        'xmatch-scan'
    """
    tables = tomllib.loads((zoo_folder() / PLUGINS_FILE).read_text(encoding="utf-8"))
    return {prefix: distribution for distribution, table in tables.items() for prefix in table["prefixes"]}


def _runtime_origin(target: Any) -> str:
    """``"MODULE (registered at run time)"``: the module defining a registered class or
    function (a data object, such as a zoo entry, does not know where it was made)."""
    module = target.__module__ if inspect.isclass(target) or inspect.isroutine(target) else None
    return f"{module} (registered at run time)" if module else "registered at run time"


image_encoders = Registry("image_encoders")
text_encoders = Registry("text_encoders")
reasoners = Registry("reasoners")
poolers = Registry("poolers")
losses = Registry("losses")
models = Registry("models")
datasets = Registry("datasets")
proposers = Registry("proposers")
verifiers = Registry("verifiers")
negatives = Registry("negatives")

REGISTRIES: dict[str, Registry] = {
    "image_encoders": image_encoders,
    "text_encoders": text_encoders,
    "reasoners": reasoners,
    "poolers": poolers,
    "losses": losses,
    "models": models,
    "datasets": datasets,
    "proposers": proposers,
    "negatives": negatives,
    "verifiers": verifiers,
}


def get_registry(kind: str) -> Registry:
    """The registry of ``kind`` (one of :data:`KINDS`)."""
    try:
        return REGISTRIES[kind]
    except KeyError:
        raise RegistryError(f"unknown component kind '{kind}'; kinds: {', '.join(KINDS)}.") from None


def _decorator(registry: Registry) -> Callable[[str], Callable[[T], T]]:
    def register(name: str) -> Callable[[T], T]:
        return registry.register(name)

    register.__doc__ = f"Register a builder in the ``{registry.kind}`` registry under ``name``."
    return register


register_image_encoder = _decorator(image_encoders)
register_text_encoder = _decorator(text_encoders)
register_reasoner = _decorator(reasoners)
register_pooler = _decorator(poolers)
register_loss = _decorator(losses)
register_model = _decorator(models)
register_dataset = _decorator(datasets)
register_proposer = _decorator(proposers)
register_verifier = _decorator(verifiers)
register_negative = _decorator(negatives)


def _source_parameters(module: str, attr: str) -> tuple[str, ...] | None:
    """The parameter names of the function (or class ``__init__``, without ``self``) ``attr``
    defined at the top of ``module``'s source, read without importing it; None when the
    source cannot be found or does not define it plainly."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    defined = {node.name: node for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    node = defined.get(attr)
    while isinstance(node, ast.ClassDef):
        init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
        if init is not None:
            return _argument_names(init.args)[1:]
        # an inherited __init__: followed through the module's own first base class only
        base = node.bases[0] if node.bases else None
        node = defined.get(base.id) if isinstance(base, ast.Name) else None
    return _argument_names(node.args) if node is not None else None


def _argument_names(args: ast.arguments) -> tuple[str, ...]:
    named = [*args.posonlyargs, *args.args]
    extra = [args.vararg] if args.vararg else []
    return tuple(a.arg for a in [*named, *extra, *args.kwonlyargs, *([args.kwarg] if args.kwarg else [])])
