"""Files in and out: the download cache, bundles, safe loading, atomic writes, run folders."""
