"""The package version, in a module of its own so that submodules read it without importing
the package root (which imports them)."""

__version__ = "0.1.0"
