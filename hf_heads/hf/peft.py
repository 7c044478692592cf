"""PEFT: the head that a (possibly PEFT-wrapped) output layer runs."""

from __future__ import annotations

from typing import Optional

from torch import nn

from ..core import OutputHead


def running_head(module: Optional[nn.Module]) -> Optional[OutputHead]:
    """The head that the output layer ``module`` runs: ``module`` itself, or, when PEFT wrapped it
    (``modules_to_save=["lm_head"]``: a ``ModulesToSaveWrapper`` holding the original and a trainable copy
    per adapter), the copy of the active adapter (the original with adapters disabled); None if no head."""
    if isinstance(module, OutputHead):
        return module
    original = getattr(module, "original_module", None)
    if not isinstance(original, OutputHead):
        return None
    if type(module).__name__ == "TrainableTokensWrapper":  # (by name: the saved model's code imports no peft)
        raise ValueError(
            f"PEFT's trainable_token_indices wrapped the {original.head_name} head (lm_head) in a "
            f"TrainableTokensWrapper, which cannot run a head; train the head with modules_to_save=['lm_head'] "
            f"instead"
        )
    active = list(getattr(module, "active_adapters", None) or [])
    copies = getattr(module, "modules_to_save", None) or {}
    if getattr(module, "disable_adapters", False) or not active or active[0] not in copies:
        return original
    copy = running_head(copies[active[0]])
    if copy is None:  # PEFT's ensure_weight_tying=True puts a plain nn.Linear sharing the tied weight there
        raise ValueError(
            f"PEFT replaced the {original.head_name} head by a plain {type(copies[active[0]]).__name__} for adapter "
            f"{active[0]!r} (modules_to_save with ensure_weight_tying=True), so the model would no longer run the "
            f"head; "
            f"use ensure_weight_tying=False (PEFT's default) to train a copy of the head"
        )
    return copy
