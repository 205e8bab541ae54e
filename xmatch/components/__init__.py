"""Built-in components. Registration happens in :mod:`xmatch._builtins`, in one place."""
