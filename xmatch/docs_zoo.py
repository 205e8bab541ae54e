"""Print ``docs/zoo.md`` from the registered zoo entries: ``python -m xmatch.docs_zoo``."""

from __future__ import annotations


def render() -> str:
    import xmatch
    from xmatch._zoo import zoo_markdown

    return zoo_markdown([xmatch.info(name) for name in xmatch.list_models() if xmatch.registry.models.origin(name) == "xmatch"])


if __name__ == "__main__":
    print(render(), end="")
