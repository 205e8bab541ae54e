"""Guards shared by the generated worlds (``scenes``, ``tabletop``, ``signs``): where a world is
cached, and whether a set may be generated into a folder the user named."""

from __future__ import annotations

from pathlib import Path


def world_cache(world: str) -> Path:
    """The default cache folder of a generated world: ``<XMATCH_HOME>/datasets/<world>``.

    Example:
        >>> world_cache("signs").parts[-2:]
        ('datasets', 'signs')
    """
    from xmatch.io.hub import cache_dir

    return cache_dir() / "datasets" / world


def check_may_generate(
    world: str, base: Path, folder: Path, generate: bool | None, explicit: bool, what: str = "sets", hint: str = ""
) -> None:
    """Refuse to generate ``folder`` inside ``base`` unless allowed: ``generate=True``; or
    ``None`` with the cache (no ``root`` given), an empty folder, or one that already holds sets
    of this world (``<world>-*``). Anything else would fill a folder of the user's with pictures.

    Raises:
        FileNotFoundError: naming the folder, what it holds, and the ways out.

    Example:
        >>> check_may_generate("signs", Path("nowhere"), Path("nowhere/signs-tiny"), None, explicit=False)
    """
    if generate is True or (generate is None and not explicit):
        return
    if generate is None:
        entries = [p.name for p in base.iterdir()] if base.is_dir() else None
        if entries is not None and (not entries or any(n.startswith(f"{world}-") for n in entries)):
            return
        found = "does not exist" if entries is None else f"holds no {what}"
    else:
        found = "does not hold this set and generate=false"
    raise FileNotFoundError(
        f"no {world} data at {base}: the folder {found} (looked for {folder.name}). Check the path; leave --data "
        f"out to use the cache ({world_cache(world)}{hint}); or generate the set there with --data-option "
        "generate=true (generate=True)."
    )
