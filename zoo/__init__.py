"""xmatch zoo entries (TOML data, shipped inside the wheel as ``xmatch.zoo``)."""
