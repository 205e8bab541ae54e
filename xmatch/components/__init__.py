"""Built-in components. Registration happens in :mod:`xmatch.core.builtins`, in one place."""
