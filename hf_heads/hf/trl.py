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
from torch.utils.checkpoint import checkpoint

from .lean_forward import capture_hidden
from .peft import running_head

#: the name of the forward that ``trl.trainer.utils.add_fused_lm_head`` installs (its code object's qualified name is
#: ``add_fused_lm_head.<locals>._fused_forward``)
FUSED_FORWARD = "_fused_forward"
#: per-token fields TRL's fused output may ask for, all computed here from the head's log-probs
FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _fused_settings(value) -> Optional[Dict[str, Any]]:
    """``{"temperature", "outputs"}`` of a forward made by TRL's ``add_fused_lm_head``; None for any other value."""
    if not _from_trl(value, FUSED_FORWARD):
        return None
    func = getattr(value, "__func__", value)
    cells = dict(zip(func.__code__.co_freevars, (c.cell_contents for c in func.__closure__ or ())))
    return {"temperature": float(cells.get("temperature", 1.0)), "outputs": tuple(cells.get("outputs", FIELDS))}


def _building_trainer():
    """``(trainer, given)``: the transformers ``Trainer`` whose construction is on the call stack (TRL's trainers
    patch the model in ``__init__``), or None, and the ``ref_model`` its ``__init__`` was given (None where none)."""
    trainer_class = getattr(sys.modules.get("transformers"), "Trainer", None)
    found, given = None, None
    frame = sys._getframe(1)
    while frame is not None and trainer_class is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, trainer_class):
            found = owner
            if frame.f_code.co_name == "__init__" and frame.f_locals.get("ref_model") is not None:
                given = frame.f_locals["ref_model"]
        frame = frame.f_back
    return found, given


def _from_trl(func, name: str) -> bool:
    """Whether ``func`` is a function TRL's source defines whose qualified name contains ``name`` (the code is what
    counts: ``functools.wraps`` copies the names, not the code)."""
    code = getattr(getattr(func, "__func__", func), "__code__", None)
    return (
        code is not None
        and name in getattr(code, "co_qualname", code.co_name)
        and f"{os.sep}trl{os.sep}" in code.co_filename
    )


def keeps_own_forward(model, value) -> bool:
    """Whether setting ``model.forward = value`` is TRL's fused LM head, which the model then keeps out (its own
    forward answers ``fused_lm_head=True``). TRL patches the model while its trainer is being built, so this is
    where the options that would train something other than the head are refused, in one ``ValueError``: a head
    with an auxiliary loss, a reference model TRL rebuilt without the head. ``cast_lm_head_to_fp32`` (GRPO) is
    honoured: the head keeps its own forward, which computes in float32 already."""
    settings = _fused_settings(value)
    if settings is None:
        return False
    head = running_head(model.get_output_embeddings())
    trainer, given = _building_trainer()
    name = type(trainer).__name__ if trainer is not None else "TRL"
    if head is not None:
        if head.has_aux_loss:
            raise ValueError(
                f"{name}: the {head.head_name} head has an auxiliary loss (head.aux_loss()) that TRL's losses do not "
                f"include, so training would drop it; train this head with transformers' Trainer or your own loop "
                f"(the model's loss adds it), or pick a head without one"
            )
        if _from_trl(head.__dict__.get("forward"), "_cast_lm_head_to_fp32"):
            del head.__dict__["forward"]  # (TRL's plain F.linear over head.weight: the head's own is float32)
        _check_reference(model, head, getattr(trainer, "ref_model", None), given, name)
    model.__dict__["_trl_fused_settings"] = settings
    return True


def _check_reference(model, head, ref, given, trainer: str) -> None:
    """Refuse a reference model TRL rebuilt from ``config._name_or_path`` (GRPO, RLOO; DPO and KTO without
    ``ref_model``) that is not this head model: a ``swap_head`` in memory leaves that path at the plain base model."""
    if ref is None or ref is model or given is not None:
        return
    ref_head = running_head(ref.get_output_embeddings())
    if ref_head is not None and ref_head.head_name == head.head_name and ref_head.config == head.config:
        return
    what = f"a plain {type(ref).__name__}" if ref_head is None else f"a {ref_head.head_name} head model"
    raise ValueError(
        f"{trainer}: the reference model TRL loaded from {getattr(ref.config, '_name_or_path', '')!r} (the model's "
        f"config._name_or_path) is {what}, not this {head.head_name} head model, so its log-probs and KL would be "
        f"another model's; save this model (model.save_pretrained(DIR)) and pass the model loaded from DIR"
        + (", or pass ref_model=" if trainer in ("DPOTrainer", "KTOTrainer") else "")
    )


def refuse_weight_readers(model) -> None:
    """Refuse, when it is built, a TRL trainer whose loss reads the output layer's ``weight`` and never runs the
    head (``DistillationTrainer``: a plain softmax over that matrix). It tags the model in ``__init__``."""
    trainer, _ = _building_trainer()
    head = running_head(model.get_output_embeddings())
    if trainer is None or head is None:
        return
    reader = next((c for c in type(trainer).__mro__ if c.__name__ in WEIGHT_READERS), None)
    if reader is not None and reader.__module__.startswith("trl."):
        raise ValueError(
            f"{type(trainer).__name__}: its loss reads the output layer's weight directly and never runs the "
            f"{head.head_name} head, so it would train a plain softmax over that matrix; distil with your own loop "
            f"on the models' log-probs (a head model's logits are its head's log-probs)"
        )


#: TRL trainers whose loss reads ``get_output_embeddings().weight`` instead of running the output layer
WEIGHT_READERS = ("DistillationTrainer",)


def fused_forward(model, base_forward, args, kwargs):
    """TRL's ``fused_lm_head=True`` call answered with the head: the model runs with the head replaced by a stand-in
    that keeps the hidden states, then the head scores the next-token labels (``labels`` shifted, or
    ``shift_labels`` as given). Returns TRL's ``FusedCausalLMOutput``: ``log_probs`` (differentiable, memory-lean in
    training), the metrics TRL asked for (:func:`_metrics`: the entropy with its gradient, ``is_top1``, ... without),
    ``label_mask``, ``loss`` (the mean NLL, or the sum over ``num_items_in_batch``, plus the head's aux loss in
    training) and ``aux_loss`` (a mixture-of-experts trunk's router loss)."""
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
    base_out, hidden = capture_hidden(model, base_forward, args, kwargs)
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
    aux_loss = getattr(base_out, "aux_loss", None)  # a mixture-of-experts trunk's router loss (TRL adds it)
    return FusedCausalLMOutput(loss=loss, label_mask=mask, aux_loss=aux_loss, **{f: fields.get(f) for f in FIELDS})


def _entropy(lp: torch.Tensor) -> torch.Tensor:
    return -(lp.exp() * lp).sum(-1)


#: TRL's per-token metrics of a chunk's log-probs ``lp`` [n, V] and targets ``t`` [n]
_METRICS = {
    "entropy": lambda lp, t: _entropy(lp),
    "log_sum_sq_probs": lambda lp, t: torch.logsumexp(2 * lp, dim=-1),
    "mean_logits": lambda lp, t: lp.mean(-1),
    "is_top1": lambda lp, t: lp.argmax(-1) == t,
}


def _metrics(head, hidden, target, mask, temperature: float, wanted) -> Dict[str, torch.Tensor]:
    """TRL's per-token metrics from the head's distribution, in chunks of the lean loss's size, 0 where ignored. The
    entropy keeps its gradient where autograd records (GRPO's ``entropy_coef`` adds it to the loss), each chunk
    under ``torch.utils.checkpoint`` (no ``[tokens, V]`` tensor kept); the other metrics have none, as TRL's."""

    def log_probs(x):
        lp = head(x)
        return lp if temperature == 1.0 else F.log_softmax(lp / temperature, dim=-1)

    h = hidden[mask].reshape(-1, hidden.shape[-1])
    t = target[mask]
    parts: Dict[str, list] = {f: [] for f in wanted}
    with_grad = ["entropy"] if "entropy" in wanted and torch.is_grad_enabled() else []
    without = [f for f in wanted if f not in with_grad]
    chunk = head.lean_chunk_tokens()
    for start in range(0, h.shape[0], chunk):
        x = h[start : start + chunk]
        if with_grad:
            parts["entropy"].append(checkpoint(lambda x: _entropy(log_probs(x)), x, use_reentrant=False))
        if without:
            with torch.no_grad():
                lp = log_probs(x)
                for f in without:
                    parts[f].append(_METRICS[f](lp, t[start : start + chunk]))
    out = {}
    for f in wanted:
        values = torch.cat(parts[f]) if parts[f] else h.new_zeros(0, dtype=torch.bool if f == "is_top1" else h.dtype)
        out[f] = torch.zeros(mask.shape, dtype=values.dtype, device=mask.device).masked_scatter(mask, values)
    return out
