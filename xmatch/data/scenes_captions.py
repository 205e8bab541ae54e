"""Moved: the scenes benchmark's caption grammar is :mod:`xmatch.scenes.captions`; its names still import from here, with a
DeprecationWarning."""

from xmatch.deprecation import moved_names

__getattr__ = moved_names(__name__, "xmatch.scenes.captions")
