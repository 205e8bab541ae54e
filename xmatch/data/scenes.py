"""Moved: the scenes benchmark's dataset is :mod:`xmatch.scenes.dataset`; its names still import from here, with a
DeprecationWarning."""

from xmatch.deprecation import moved_names

__getattr__ = moved_names(__name__, "xmatch.scenes.dataset")
