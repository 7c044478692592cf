"""Mixture of Softmaxes (Yang et al. 2018, "Breaking the softmax bottleneck")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..core import functional, ops, shard
from ..core import lean
from ..core import check_int, option, register_head
from .contexts import ContextConfig, ContextHead


@dataclass
class MoSConfig(ContextConfig):
    """Options of :class:`MoSHead`."""

    num_components: int = option(15, "number K of softmax components (paper: 15 on PTB/WT2, 7 on 1B, 9 for MT)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.head_name, "num_components", self.num_components, 1, 1024)


@register_head("mos")
class MoSHead(ContextHead):
    """``log p(x|g) = logsumexp_k( log pi_k + log_softmax(W h_k + b)_x )``.

    ``pi = softmax(P g)`` (P: d1 -> K, no bias), ``h_k = dropout(tanh(H_k g + c_k))`` (H: d1 -> K*d),
    one output embedding W shared by the components, as in zihangdai/mos. The original mixes
    probabilities and takes ``log(p + 1e-8)``; this head mixes in log space (exact, no floor).
    With K = 1 it is a softmax over ``tanh(H g + c)``. With ``context_activation="identity"`` and
    ``identity_init=True`` every component starts equal to ``softmax(W g + b)``, so the head starts as the
    softmax it was built from.
    """

    config_class = MoSConfig
    paper = "Yang et al. 2018, Breaking the softmax bottleneck"
    applies_logit_map = True  # on every component's logits, before its softmax
    row_kernels = True  # the K rows of a token coupled through their [n, K] responsibilities
    vocab_parallel = True

    def __init__(self, config: MoSConfig):
        super().__init__(config)
        self.lean_width = 2 * config.num_components  # K logit vectors per token and their log-softmaxes
        self.lean_rows = self.lean_softmax_rows = config.num_components
        c = config
        self._build_contexts(c.num_components)
        self.prior_proj = nn.Linear(c.hidden_size, c.num_components, bias=False)
        if c.identity_init:
            self.init_contexts_as_identity()

    def component_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-component score transform before the softmax, after the options' fixed map (identity; MoS-PLIF
        deforms it)."""
        return logits

    def lean_component_scores(self, logits: torch.Tensor, grads):
        """``(component_scores(logits), back)`` for the lean loss (see ``LinearScoresHead.lean_score_transform``)."""
        return logits, None

    def _component_scores(self, context: torch.Tensor) -> torch.Tensor:
        """A component's pre-softmax scores ``f(m(W h_k + b))`` for its contexts ``[N, d]``."""
        return self.component_scores(self.logit_map(self._output_logits(context)))

    def _contexts_and_log_priors(self, hidden: torch.Tensor):
        log_prior = torch.log_softmax(functional.linear_full_precision(hidden, self.prior_proj.weight), dim=-1)
        return self.contexts(hidden), log_prior

    def log_probs_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx, log_prior = self._contexts_and_log_priors(hidden)
        vs = self.vocab_shard
        log_prior = shard.enter(log_prior, vs)  # added to this rank's slice of each component
        parts = [
            shard.log_softmax(self._component_scores(ctx[:, k]), vs) + log_prior[:, k, None]
            for k in range(self.config.num_components)
        ]
        return torch.logsumexp(torch.stack(parts, dim=1), dim=1)

    def nll_2d(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ctx, log_prior = self._contexts_and_log_priors(hidden)
        parts = []
        for k in range(self.config.num_components):
            s = self._component_scores(ctx[:, k])
            parts.append(-shard.cross_entropy(s, target, self.vocab_shard))
        return -torch.logsumexp(torch.stack(parts, dim=1) + log_prior, dim=1)

    def lean_nll_chunk(self, hidden, target, grads, label_smoothing=0.0, triton=False):
        if label_smoothing:  # needs the mixture's log-probs of every id: autograd on the chunk (also for triton)
            return super().lean_nll_chunk(hidden, target, grads, label_smoothing)
        with torch.enable_grad():
            ctx, log_prior = self._contexts_and_log_priors(hidden)
        loss, nll, grad_ctx, grad_prior, _ = ops.softmax_rows(
            self.weight,
            self.bias,
            ctx.detach(),
            target,
            **self._output_grads(grads),
            log_prior=log_prior.detach(),
            transform=lambda z: self.lean_logit_map(z, lambda y: self.lean_component_scores(y, grads)),
            row_map=self.row_map(grads) if triton else None,
        )
        return loss.sum(), nll.sum(), lean.backprop([ctx, log_prior], [grad_ctx, grad_prior], hidden, grads)
