"""Moved: parameter counting is :mod:`xmatch.parameter_counts` (its names still import from
here, with a DeprecationWarning); rewriting the counts in ``zoo/*.toml`` is the repository's
``tools/zoo_params.py``."""

from xmatch.deprecation import moved_names

__getattr__ = moved_names(__name__, "xmatch.parameter_counts")
