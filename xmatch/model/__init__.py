"""Typed inputs and records, embeddings, the matching model and the factory that builds it."""
