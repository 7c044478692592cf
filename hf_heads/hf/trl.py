"""TRL's trainers on head models: the head, not a plain softmax over its output embedding, is what they train.

TRL's trainers (SFT, DPO, KTO, GRPO, RLOO) call ``trl.trainer.utils.add_fused_lm_head(model)``, which replaces
``model.forward``: called with ``fused_lm_head=True`` it runs the backbone and projects the hidden states through
``model.get_output_embeddings().weight`` in its own chunked kernel, never calling the head. A head model refuses
that replacement (:func:`keeps_own_forward`, from ``HeadModelMixin.__setattr__``) and answers ``fused_lm_head=True``
itself (:func:`fused_forward`): the same output fields, from the head's distribution, memory-lean in training
(:meth:`OutputHead.token_log_probs`). A head whose auxiliary loss TRL's losses would drop (DS-Softmax) is refused
when the trainer is built, naming the trainer and what to use instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F

from .lean_forward import capture_hidden
from .peft import running_head

#: the code object's qualified name of the forward that ``trl.trainer.utils.add_fused_lm_head`` installs
FUSED_FORWARD = "add_fused_lm_head.<locals>._fused_forward"
#: per-token fields TRL's fused output may ask for, all computed here from the head's log-probs
FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _fused_settings(value) -> Optional[Dict[str, Any]]:
    """``{"temperature", "outputs"}`` of a forward made by TRL's ``add_fused_lm_head``; None for any other value."""
    func = getattr(value, "__func__", value)
    code = getattr(func, "__code__", None)  # (functools.wraps copied the names, not the code)
    if (
        code is None
        or getattr(code, "co_qualname", code.co_name) not in (FUSED_FORWARD, "_fused_forward")
        or f"{os.sep}trl{os.sep}" not in code.co_filename
    ):
        return None
    cells = dict(zip(func.__code__.co_freevars, (c.cell_contents for c in func.__closure__ or ())))
    return {"temperature": float(cells.get("temperature", 1.0)), "outputs": tuple(cells.get("outputs", FIELDS))}


def _trainer_name() -> str:
    """The class name of the transformers ``Trainer`` whose construction is on the call stack (TRL's trainers
    patch the model in ``__init__``), or ``"TRL"``."""
    trainer = getattr(sys.modules.get("transformers"), "Trainer", None)
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if trainer is not None and isinstance(owner, trainer):
            return type(owner).__name__
        frame = frame.f_back
    return "TRL"


def keeps_own_forward(model, value) -> bool:
    """Whether setting ``model.forward = value`` is TRL's fused LM head, which the model then keeps out (its own
    forward answers ``fused_lm_head=True``); a head with an auxiliary loss refuses it with a ``ValueError``."""
    settings = _fused_settings(value)
    if settings is None:
        return False
    head = running_head(model.get_output_embeddings())
    if head is not None and head.has_aux_loss:
        raise ValueError(
            f"{_trainer_name()}: the {head.head_name} head has an auxiliary loss (head.aux_loss()) that TRL's losses "
            f"do not include, so training would drop it; train this head with transformers' Trainer or your own loop "
            f"(the model's loss adds it), or pick a head without one"
        )
    model.__dict__["_trl_fused_settings"] = settings
    return True


def fused_forward(model, base_forward, args, kwargs):
    """TRL's ``fused_lm_head=True`` call answered with the head: the model runs with the head replaced by a stand-in
    that keeps the hidden states, then the head scores the next-token labels (``labels`` shifted, or
    ``shift_labels`` as given). Returns TRL's ``FusedCausalLMOutput``: ``log_probs`` (differentiable, memory-lean in
    training), the metrics TRL asked for (entropy, ``is_top1``, ...; no gradient), ``label_mask`` and ``loss`` (the
    mean NLL, or the sum over ``num_items_in_batch``, plus the head's aux loss in training)."""
    # by name: the files a saved model carries may import only torch and transformers (hf_heads/hf/remote_code.py)
    FusedCausalLMOutput = importlib.import_module("trl.trainer.utils").FusedCausalLMOutput

    settings = model.__dict__.get("_trl_fused_settings", {"temperature": 1.0, "outputs": ("log_probs",)})
    head = running_head(model.get_output_embeddings())
    kwargs = dict(kwargs)
    labels, shift_labels = kwargs.pop("labels", None), kwargs.pop("shift_labels", None)
    num_items = kwargs.pop("num_items_in_batch", None)
    if labels is None and shift_labels is None:
        raise ValueError(f"{type(model).__name__}: fused_lm_head=True needs labels (or shift_labels)")
    kwargs["use_cache"] = False
    _, hidden = capture_hidden(model, base_forward, args, kwargs)
    if shift_labels is None:
        hidden, target = hidden[:, :-1], labels[:, 1:]
    else:
        target = shift_labels
    target = target.to(hidden.device)
    mask = target != -100
    temperature = settings["temperature"]
    log_probs = head.token_log_probs(hidden, target, temperature=temperature)
    fields = {"log_probs": log_probs}
    wanted = [f for f in settings["outputs"] if f != "log_probs"]
    if wanted:
        fields.update(_metrics(head, hidden, target, mask, temperature, wanted))
    loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items is None else torch.as_tensor(num_items))
    if model.training:
        loss = loss + head.aux_loss().to(loss.dtype)
    return FusedCausalLMOutput(loss=loss, label_mask=mask, aux_loss=None, **{f: fields.get(f) for f in FIELDS})


#: TRL's per-token metrics of a chunk's log-probs ``lp`` [n, V] and targets ``t`` [n]
_METRICS = {
    "entropy": lambda lp, t: -(lp.exp() * lp).sum(-1),
    "log_sum_sq_probs": lambda lp, t: torch.logsumexp(2 * lp, dim=-1),
    "mean_logits": lambda lp, t: lp.mean(-1),
    "is_top1": lambda lp, t: lp.argmax(-1) == t,
}


@torch.no_grad()
def _metrics(head, hidden, target, mask, temperature: float, wanted) -> Dict[str, torch.Tensor]:
    """TRL's per-token metrics from the head's distribution, in chunks of the lean loss's size, 0 where ignored."""
    h = hidden[mask].reshape(-1, hidden.shape[-1])
    t = target[mask]
    parts: Dict[str, list] = {f: [] for f in wanted}
    chunk = head.lean_chunk_tokens()
    for start in range(0, h.shape[0], chunk):
        lp = head(h[start : start + chunk])
        if temperature != 1.0:
            lp = F.log_softmax(lp / temperature, dim=-1)
        for f in wanted:
            parts[f].append(_METRICS[f](lp, t[start : start + chunk]))
    out = {}
    for f in wanted:
        values = torch.cat(parts[f]) if parts[f] else h.new_zeros(0, dtype=torch.bool if f == "is_top1" else h.dtype)
        out[f] = torch.zeros(mask.shape, dtype=values.dtype, device=mask.device).masked_scatter(mask, values)
    return out
