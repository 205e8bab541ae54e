"""Converters from the original research checkpoints to xmatch models."""

from xmatch.convert.teran_original import (
    convert_state_dict,
    load_original_checkpoint,
    spec_from_original_config,
)

__all__ = ["convert_state_dict", "load_original_checkpoint", "spec_from_original_config"]
