"""Moved: the scenes benchmark's region features is :mod:`xmatch.scenes.features`; its names still import from here, with a
DeprecationWarning."""

from xmatch.deprecation import moved_names

__getattr__ = moved_names(__name__, "xmatch.scenes.features")
