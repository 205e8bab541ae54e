"""Text encoders and their text sides (tokenizers, vocabularies)."""
