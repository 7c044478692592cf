"""The check that a TRL trainer scores tokens with the head: its own per-token log-probs against the head's on the same
batch (tests/test_trl.py's audit runs it for every trainer and option).

The reference is slow and plain: the trunk's last hidden states (``output_hidden_states``), then the head's class
``forward`` (never an instance's replacement, as ``cast_lm_head_to_fp32`` installs) over the whole vocabulary, at
the trainer's temperature, gathered at each next token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import hf_heads


def head_log_probs(model, input_ids, attention_mask, temperature: float = 1.0):
    """``(reference, forward)``: the head's log-probs ``[B, L - 1, V]`` of each next token (eval mode, no dropout),
    at ``temperature``, and what the model's plain forward gives as its logits (``generate`` samples from them)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            head = hf_heads.output_head(model)
            lp = type(head).forward(head, out.hidden_states[-1][:, :-1].float())
    finally:
        model.train(was_training)
    return F.log_softmax(lp / temperature, dim=-1), out.logits[:, :-1].float()


def trainer_token_log_probs(trainer, model, input_ids, attention_mask, completion: int):
    """``(log_probs, entropy)``, each ``[B, completion]`` (entropy None where the trainer has none): the trainer's own
    per-token log-probs of the last ``completion`` tokens, as its loss gets them. GRPO's and RLOO's come from their
    ``_get_per_token_logps_and_entropies``; SFT's, DPO's and KTO's from the fused call their losses make,
    ``model(..., labels=..., fused_lm_head=True).log_probs``. ``model``: the trainer's policy or its reference."""
    with torch.no_grad():
        if hasattr(trainer, "_get_per_token_logps_and_entropies"):
            return trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion, compute_entropy=model is trainer.model
            )[:2]  # (TRL asks the reference model for log-probs only)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -completion:], None


def assert_trainer_scores_with_the_head(
    trainer, input_ids, completion: int = 4, temperature: float = 1.0, model=None
) -> None:
    """The trainer's per-token log-probs of the last ``completion`` tokens of ``input_ids`` equal the head's within
    1e-5 (float32): what would differ if anything in the trainer bypassed the head. ``model``: the trainer's
    reference model instead of its policy."""
    model = trainer.model if model is None else model
    mask = torch.ones_like(input_ids)
    got, entropy = trainer_token_log_probs(trainer, model, input_ids, mask, completion)
    lp, logits = head_log_probs(model, input_ids, mask, temperature)
    want = lp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)[:, -completion:]
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"TRL's log-probs: {m}")
    if entropy is not None:  # (GRPO and RLOO: its mask of high-entropy tokens, its entropy bonus and metric)
        want = -(lp.exp() * lp).sum(-1)[:, -completion:]
        torch.testing.assert_close(entropy.float(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"TRL's entropy: {m}")
    at_one = F.log_softmax(lp * temperature, dim=-1)  # (the plain forward is at temperature 1)
    torch.testing.assert_close(F.log_softmax(logits, -1), at_one, rtol=1e-5, atol=1e-5, msg=lambda m: f"logits: {m}")
