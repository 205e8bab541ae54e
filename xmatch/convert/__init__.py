"""Converters from the original research checkpoints to xmatch models."""

from xmatch.convert.teran_original import (
    check_fits,
    convert_state_dict,
    load_original_checkpoint,
    original_family,
    spec_from_original_config,
)

__all__ = ["check_fits", "convert_state_dict", "load_original_checkpoint", "original_family", "spec_from_original_config"]
