"""Torch kernels of the scheduling core, for engines whose state lives on the device."""

from dspark.ops.allocation import allocate_drafts_torch

__all__ = ["allocate_drafts_torch"]
