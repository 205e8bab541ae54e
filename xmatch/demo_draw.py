"""Moved: the demo's drawings is :mod:`xmatch.demo.draw`; its names still import from here, with a
DeprecationWarning."""

from xmatch.deprecation import moved_names

__getattr__ = moved_names(__name__, "xmatch.demo.draw")
