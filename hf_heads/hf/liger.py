"""Liger Kernel on head models: its fused linear cross-entropy never runs the head, so a head model keeps its own loss.

Liger's ``apply_liger_kernel_to_<family>(fused_linear_cross_entropy=True)`` replaces the model's forward by one that,
given labels in training, projects the hidden states through ``lm_head.weight`` in a fused kernel: a plain softmax
over the head's output embedding, not the head. Both ways of applying it are answered here:

* ``apply_liger_kernel_to_llama(model=model)`` sets ``model.forward``: a head model keeps its own forward
  (:func:`keeps_own_forward`, from ``HeadModelMixin.__setattr__``), whose training loss is the head's memory-lean
  loss (no ``[tokens, V]`` tensor either); Liger's layer kernels (RMSNorm, RoPE, SwiGLU, ...) stay applied;
* ``apply_liger_kernel_to_llama()`` without a model patches ``LlamaForCausalLM.forward`` for every later model: a
  head model class built on it is refused (:func:`check_base_forward`), naming the fix.

``Trainer(use_liger_kernel=True)`` and TRL's ``use_liger_kernel`` apply Liger by ``config.model_type``, which for a
head model is ``softmax-heads``, a type Liger does not know: they apply nothing (Liger logs it).
"""

from __future__ import annotations

import warnings


def _from_liger(value) -> bool:
    return (getattr(getattr(value, "__func__", value), "__module__", None) or "").startswith("liger_kernel.")


def keeps_own_forward(model, value) -> bool:
    """Whether setting ``model.forward = value`` is Liger's fused-linear-cross-entropy forward, which the head model
    then keeps out (warning once), training the head with its own loss instead."""
    if not _from_liger(value):
        return False
    head = model.get_output_embeddings()
    warnings.warn(
        f"{type(model).__name__}: Liger's fused linear cross-entropy was not installed: it projects with "
        f"lm_head.weight and would not run the {getattr(head, 'head_name', 'output')} head; the head's own "
        f"memory-lean loss runs instead (Liger's other kernels stay applied)",
        stacklevel=3,
    )
    return True


def check_base_forward(base_model_class: type) -> None:
    """Refuse a head model class on a model class whose forward Liger replaced (``apply_liger_kernel_to_*()``
    without ``model=``)."""
    if _from_liger(base_model_class.forward):
        raise ValueError(
            f"{base_model_class.__name__}.forward is Liger's fused linear cross-entropy forward "
            f"(liger_kernel's apply_liger_kernel_to_*() without model=), which projects with lm_head.weight and "
            f"never runs an output head; apply Liger with fused_linear_cross_entropy=False, or after building the "
            f"model with apply_liger_kernel_to_<family>(model=model) (the head's own lean loss then replaces it)"
        )
