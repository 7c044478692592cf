"""Head models under transformers' tensor parallelism: ``from_pretrained(DIR, tp_plan="auto")`` under ``torchrun``.

The head's place in a model's plan is the style ``softmax_heads_vocab`` (:data:`STYLE`), registered with transformers
on import: its ``weight`` and ``bias`` load as DTensors placed ``Shard(0)``, each rank reading its slice of the rows;
the head's other parameters load whole on every rank; the head then computes across the ranks' slices itself
(:mod:`hf_heads.core.shard`). A head that cannot split its vocabulary (the fast heads) loads whole on every rank and
says so once. A plan that gives the head any other style is refused in one line (:func:`check_plan`).
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional


from ..core.shard import SPLIT, is_dtensor, split_parameter

#: the tensor-parallel style of a head model's head
STYLE = "softmax_heads_vocab"


def register_style() -> bool:
    """Register :data:`STYLE` with transformers; False where its tensor-parallel API (``transformers.distributed``,
    5.25) is not there (a head model then has no tensor-parallel plan, :func:`tp_plan`)."""
    try:
        from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, TensorParallelLayer
    except ImportError:
        return False
    if STYLE in ALL_PARALLEL_STYLES:
        return True

    class HeadVocabParallel(TensorParallelLayer):
        """A head's rows split over the ranks: ``weight`` and ``bias`` ``Shard(0)``, the rest whole; no forward
        hooks (the head takes plain hidden states and returns plain tensors)."""

        def shard_param(self, module, param, mesh, *, config=None, mesh_manager=None):
            meta = module._parameters.get(param)
            if param not in SPLIT or meta is None or is_dtensor(meta):
                return
            if not getattr(module, "vocab_parallel", False):
                if param == "weight":
                    warnings.warn(
                        f"{module.head_name}: this head cannot split its vocabulary over the {mesh.size()} "
                        f"tensor-parallel ranks (its structure is laid out over the ids): every rank holds and "
                        f"computes the whole head",
                        stacklevel=2,
                    )
                return
            split_parameter(module, param, mesh, src_data_rank=None)  # (each rank then loads its own rows)

        def install_forward(self, module, mesh, *, config=None, mesh_manager=None):
            return module

    ALL_PARALLEL_STYLES.register(STYLE, HeadVocabParallel())
    return True


def tp_plan(base_class: type, head_path: str) -> Optional[Dict[str, str]]:
    """The head model class's own plan: the base class's, the head at ``head_path`` given :data:`STYLE` (where
    transformers can take it; else the head is left out, whole on every rank)."""
    plan = dict(getattr(base_class, "_tp_plan", None) or {})
    if not plan:
        return None
    plan.pop(head_path, None)
    if register_style():
        plan[head_path] = STYLE
    return plan


def check_plan(model, plan: Dict[str, str], head_path: str) -> None:
    """Refuse, in one line, a resolved plan that gives the head (or a part of it) a style other than :data:`STYLE`:
    it would shard the head's parameters as a linear layer's, which the head's own math cannot run on."""
    for name, style in sorted(plan.items(), key=lambda item: len(item[0])):  # (the module before its parameters)
        if (name == head_path or name.startswith(head_path + ".")) and style != STYLE:
            head = model.get_output_embeddings()
            raise ValueError(
                f"{type(model).__name__}: tp_plan gives {name!r} the style {style!r}, but {head_path} is the "
                f"{getattr(head, 'head_name', 'output')} head; allowed: {STYLE!r} (the default with tp_plan='auto': "
                f"the head splits its vocabulary over the ranks); leave {head_path} out of your tp_plan"
            )
