"""Mixtape (Yang, Luong, Salakhutdinov & Le, NeurIPS 2019, "Mixtape: breaking the softmax bottleneck
efficiently"), eqs. 2-6."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..core import functional, ops, shard
from ..core import lean
from ..core import (
    SingleSoftmaxHead,
    check_bool,
    check_float,
    check_int,
    check_option,
    check_type,
    option,
    register_head,
)
from .contexts import ContextConfig, ContextHead


@dataclass
class MixtapeConfig(ContextConfig):
    """Options of :class:`MixtapeHead` (paper symbols in brackets)."""

    num_gates: int = option(4, "number of gates / context vectors [K], a power of two (paper: 4)")
    frequent_fraction: float = option(
        0.1,
        "fraction of the vocabulary, the most frequent token ids, with their own gate priors "
        "[r = S/V]; the rest share one gate (paper: 0.1 for LM, 0.5 for MT). Token ids must be "
        "ordered by frequency, most frequent first (fairseq dictionaries are)",
    )
    gate_embedding_size: int = option(64, "size of the gate embeddings v_x and of tanh(U_k g) [d2]")
    gate_noise: float = option(0.1, "std of the Gaussian noise on the gate pre-activations in training")
    gate_dropout: float = option(0.0, "dropout on tanh(U_k g) (paper: 0.15-0.2 for MT)")
    gate_weight_norm: bool = option(False, "weight-normalise the rows of U_k with a constant scale (paper: on for LM)")
    scaled_input: Optional[bool] = option(
        None,
        "the form of H_k, U_k, u_k. False: torch's nn.Linear form (g as is). True: Mesh TensorFlow's, made for "
        "Adafactor (g scaled by d1^-1/2, unit-variance weights): the same function at initialisation, moved about "
        "sqrt(d1) times more slowly by Adam. None: False, or the form kept with saved weights (docs/heads.md)",
        shown="False; True for weights saved before head spec version 2",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        head = self.head_name
        gates = self.num_gates
        check_type(head, "num_gates", gates, isinstance(gates, int) and not isinstance(gates, bool), "an integer")
        power_of_two = 1 <= gates <= 1024 and (gates & (gates - 1)) == 0
        check_option(head, "num_gates", gates, power_of_two, "a power of two in [1, 1024] (1, 2, 4, 8, ...)")
        check_float(head, "frequent_fraction", self.frequent_fraction, 0.0, 1.0, lo_open=True)
        check_int(head, "gate_embedding_size", self.gate_embedding_size, 1)
        check_float(head, "gate_noise", self.gate_noise, 0.0, math.inf, hi_open=True)
        check_float(head, "gate_dropout", self.gate_dropout, 0.0, 1.0, hi_open=True)
        check_bool(head, "gate_weight_norm", self.gate_weight_norm)
        if self.scaled_input is not None:
            check_bool(head, "scaled_input", self.scaled_input)

    @property
    def num_frequent(self) -> int:
        """S = round(r V), at least 1: how many token ids get their own gate priors."""
        return max(1, min(self.vocab_size, round(self.frequent_fraction * self.vocab_size)))


#: the form of a new Mixtape head's projections when ``scaled_input`` is not given (SPEC_VERSION 2), and the one of
#: weights saved before the form was kept with them (the default until then, as ``MixtapeHead.legacy_defaults``
#: records it for specs of version 1)
SCALED_DEFAULT = False
LEGACY_SCALED = True


@register_head("mixtape")
class MixtapeHead(ContextHead, SingleSoftmaxHead):
    """Logit-space vector gating with a sigmoid tree and gate sharing.

    With ``g' = g / sqrt(d1)`` (as in Mesh-TensorFlow's ``Mixtape``; ``scaled_input=False``: ``g' = g`` with
    H_k, U_k, u_k drawn ``sqrt(d1)`` times smaller, the same function, a different pace under Adam or SGD):

    * contexts (eq. 5): ``h_k = dropout(tanh(H_k g' + c_k))``, k = 1..K;
    * gate pre-activations (eq. 4) for the S most frequent ids x < S:
      ``l_{x,k} = v_x . dropout(tanh(U_k g' + a_k)) + u_k . g' + b_{x,k}``, and for every other id the
      shared ``l_k = u_k . g'`` (eq. 6), k = 1..K-1, plus N(0, gate_noise^2) in training;
    * priors (eq. 3): a sigmoid tree turns the K-1 gates into K priors ``pi_{x,k}``;
    * logits (eq. 2): ``z_x = sum_k pi_{x,k} h_k . w_x + b_x``, then one softmax.

    For the shared ids the mixture is taken before the product, ``(sum_k pi_k h_k) . w_x``, so the
    K x N x V tensor of component logits is only built for the S frequent ids.

    With ``context_activation="identity"`` and ``identity_init=True`` every ``h_k = g`` at the start,
    so ``z = W g + b`` whatever the gates: the head starts as the softmax it was built from.
    """

    config_class = MixtapeConfig
    paper = "Yang et al. 2019, Mixtape: breaking the softmax bottleneck efficiently"
    applies_logit_map = True  # on the gated logits, before the one softmax
    row_kernels = True  # the softmax rows, and the frequent ids' sigmoid tree (ops.triton_rows.tree_mix)
    uses_frequency_order = True  # the S most frequent ids (frequency_order[:S]) have their own gates
    vocab_parallel = True  # a slice's frequent ids take their gate rows by frequency rank (_gated_logits_on_slice)
    optional_state_keys = ("scaled_form",)  # the form of the projections, kept with the weights since spec version 2
    legacy_defaults = {1: {"scaled_input": LEGACY_SCALED}}  # version 2 made torch's nn.Linear form the default

    def __init__(self, config: MixtapeConfig):
        super().__init__(config)
        c = config
        k, d1, d2, s = c.num_gates, c.hidden_size, c.gate_embedding_size, c.num_frequent
        self._form_given = c.scaled_input is not None  # else the form follows the weights loaded (_load_form)
        # the form these weights were trained in, kept with them: 1.0 scaled, 0.0 not (see _load_form)
        self.register_buffer("scaled_form", torch.tensor(0.0))
        self._set_form(c.scaled_input if self._form_given else SCALED_DEFAULT)
        self._register_load_state_dict_pre_hook(self._load_form)
        self._build_contexts(k)  # H_k, c_k
        self.gate_proj = nn.Linear(d1, (k - 1) * d2)  # U_k, a_k
        self.shared_gate = nn.Linear(d1, k - 1, bias=False)  # u_k
        self.gate_embedding = nn.Parameter(torch.empty(s, d2))  # v_x
        self.gate_bias = nn.Parameter(torch.zeros(s, k - 1))  # b_{x,k}
        self.gate_dropout = nn.Dropout(c.gate_dropout)
        for lin in (self.context_proj, self.gate_proj, self.shared_gate):
            # unit variance for the input scaled by d1^-1/2; scaled_input=False: the same function (same draws)
            nn.init.normal_(lin.weight, std=1.0 if c.scaled_input else d1**-0.5)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        nn.init.normal_(self.gate_embedding, std=d2**-0.5)
        if c.identity_init:
            self.init_contexts_as_identity()

    def init_optional_state(self) -> None:
        self.scaled_form.fill_(float(self.config.scaled_input))

    def _set_form(self, scaled: bool) -> None:
        self.config.scaled_input = scaled
        self.context_input_scale = self.config.hidden_size**-0.5 if scaled else 1.0
        self.init_optional_state()

    def _load_form(self, state_dict, prefix, *args) -> None:
        """Before weights load: take the form they were trained in. A state dict without ``scaled_form`` was saved
        before the form was kept, when ``scaled_input`` defaulted to True: it loads in the form its option gives,
        scaled where none was given. A given option that disagrees with a kept form is an error."""
        key = prefix + "scaled_form"
        if key in state_dict:
            stored = bool(state_dict[key])
        else:
            stored = self.config.scaled_input if self._form_given else LEGACY_SCALED
        if stored != self.config.scaled_input:
            if self._form_given:
                raise ValueError(
                    f"{self.head_name}: scaled_input={self.config.scaled_input} was given, but these "
                    f"weights were trained with scaled_input={stored}; leave the option out (the "
                    f"weights' form is used) or give scaled_input={stored}"
                )
            self._set_form(stored)
        state_dict[key] = self.scaled_form.detach().clone()

    def check_resize_vocab(self, new_size: int) -> None:
        super().check_resize_vocab(new_size)
        s = self.config.num_frequent
        check_option(
            self.head_name,
            "new vocabulary size",
            new_size,
            new_size >= s,
            f"at least the {s} frequent ids that have their own gates (num_frequent)",
        )
        # gate embeddings/biases are rows by frequency rank: dropping a frequent id would hand its gate to another
        top = int(self.frequency_order[:s].max())
        check_option(
            self.head_name,
            "new vocabulary size",
            new_size,
            new_size > top,
            f"at least {top + 1}: shrinking would remove frequent id {top}, which has its own gate "
            f"(frequency_order[:{s}]); rebuild the head (hf_heads.swap_head / build_head) instead",
        )

    def _resize_rows(self, keep, rows, bias_rows):
        """New ids are rare: they share the shared gate; the frequent ids (and so the gate parameters) stay, with
        ``frequent_fraction`` set so that ``round(r V)`` is still their number."""
        s = self.config.num_frequent
        super()._resize_rows(keep, rows, bias_rows)
        self.config.frequent_fraction = s / (keep + rows.shape[0])

    def frequent_ids(self):
        """The ids with their own gates, ``frequency_order[:S]``; None when they are ``0..S-1`` (ids sorted by
        frequency, as in fairseq dictionaries), where the frequent logits are a prefix of the output."""

        def build():
            ids = self.frequency_order[: self.config.num_frequent]
            if not functional.values_known(ids) or bool((ids == torch.arange(len(ids), device=ids.device)).all()):
                return None
            return ids.clone()

        return self._cached("frequent_ids", [self.frequency_order], build)

    def _frequent_rows(self, t, dtype):
        """The frequent ids' rows of ``t`` (W or b) in ``dtype``."""
        ids = self.frequent_ids()
        return (t[: self.config.num_frequent] if ids is None else t.index_select(0, ids)).to(dtype)

    def _gate_weight(self) -> torch.Tensor:
        w = self.gate_proj.weight
        if self.config.gate_weight_norm:
            # rows kept at their expected norm at initialisation (constant scale): sqrt(d1), or 1 unscaled
            norm = math.sqrt(w.shape[1]) if self.config.scaled_input else 1.0
            w = w * (norm / w.norm(dim=1, keepdim=True).clamp_min(1e-12))
        return w

    def _noisy(self, gate_logits: torch.Tensor, rank: Optional[int] = None) -> torch.Tensor:
        """``gate_logits`` with the training noise; with ``rank`` (the gates of a vocabulary slice's frequent ids, whose
        number differs per rank) drawn from a generator seeded by one draw every rank makes alike, plus the rank."""
        if not (self.training and self.config.gate_noise > 0):
            return gate_logits
        if rank is None:
            noise = torch.randn_like(gate_logits)
        else:
            generator = torch.Generator(gate_logits.device).manual_seed(int(torch.randint(2**62, ())) + rank)
            noise = torch.randn(
                gate_logits.shape, generator=generator, device=gate_logits.device, dtype=gate_logits.dtype
            )
        return gate_logits + self.config.gate_noise * noise

    def _gate_inputs(self, hidden: torch.Tensor):
        """``(ctx, shared, gate_ctx, m)``: the contexts ``[N, K, d]``, the shared gate pre-activations
        ``u_k . g'`` ``[N, K-1]``, the gate contexts ``dropout(tanh(U_k g' + a_k))`` ``[N, K-1, d2]`` and the
        shared-prior mixture of the contexts ``m = sum_k pi_k h_k`` ``[N, d]`` (whose product with ``W[S:]``
        gives the logits of the ids without their own gates). With one gate: ``(ctx, None, None, h_1)``."""
        c = self.config
        k = c.num_gates
        g = hidden * self.context_input_scale
        ctx = self.contexts(g)
        if k == 1:
            return ctx, None, None, ctx[:, 0]
        shared = functional.linear_full_precision(g, self.shared_gate.weight)
        gate_ctx = torch.tanh(functional.linear_full_precision(g, self._gate_weight(), self.gate_proj.bias))
        gate_ctx = self.gate_dropout(gate_ctx.view(-1, k - 1, c.gate_embedding_size))
        # one shared prior -> mix the contexts first (scalar mixture)
        shared_prior = ops.sigmoid_tree_log_priors(self._noisy(shared)).exp()  # [N, K]
        return ctx, shared, gate_ctx, torch.einsum("nk,nkd->nd", shared_prior, ctx)

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 scores ``m(z)`` ``[N, V]``: the gated logits under the options' fixed map (one softmax of these
        gives the distribution)."""
        return self.logit_map(self._gated_logits(hidden))

    def _gated_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 Mixtape logits ``z`` ``[N, V]``."""
        if self.vocab_shard is not None:
            return self._gated_logits_on_slice(hidden, self.vocab_shard)
        c = self.config
        s = c.num_frequent
        ctx, shared, gate_ctx, mixed = self._gate_inputs(hidden)
        if shared is None:
            return self._output_logits(mixed)
        # frequent ids: own gate priors -> vector gating in logit space
        dt = ctx.dtype
        bias = None if self.bias is None else self._frequent_rows(self.bias, dt)
        freq_logits = self._frequent_logits(
            ctx, shared, gate_ctx, self.gate_embedding, self.gate_bias, self._frequent_rows(self.weight, dt), bias
        )
        ids = self.frequent_ids()
        if ids is not None:  # frequent ids anywhere in the vocabulary: shared logits for all, then theirs
            return self._output_logits(mixed).index_copy(1, ids, freq_logits)
        if s == c.vocab_size:
            return freq_logits
        return torch.cat([freq_logits, self._output_logits(mixed, slice(s, None))], dim=-1)

    def _gated_logits_on_slice(self, hidden: torch.Tensor, vs: shard.VocabShard) -> torch.Tensor:
        """:meth:`_gated_logits` on this rank's slice of the vocabulary ``[N, width]``. The gate parameters stay whole
        on every rank: each rank takes the rows of the frequent ids in its slice, by their frequency rank (they are
        S x d2, small beside the slice's rows of W; a rank's frequent ids may be any, or none)."""
        ctx, shared, gate_ctx, mixed = self._gate_inputs(hidden)
        logits = self._output_logits(mixed)  # every id's shared-prior logit; the frequent ids' are replaced below
        if shared is None:
            return logits
        order = self.frequency_order[: self.config.num_frequent]
        ranks = ((order >= vs.start) & (order < vs.stop)).nonzero().squeeze(1)  # (rank-dependent sizes from here)
        local = order[ranks] - vs.start
        gate_ctx, shared, ctx = (shard.enter(t, vs) for t in (gate_ctx, shared, ctx))
        gate_embedding, gate_bias = (shard.enter(p, vs)[ranks] for p in (self.gate_embedding, self.gate_bias))
        bias = None if self.bias is None else self.bias[local]
        freq_logits = self._frequent_logits(
            ctx, shared, gate_ctx, gate_embedding, gate_bias, self.weight[local], bias, vs.rank
        )
        return logits.index_copy(1, local, freq_logits)

    def _frequent_logits(self, ctx, shared, gate_ctx, gate_embedding, gate_bias, weight, bias, rank=None):
        """The gated logits ``[N, S']`` of S' frequent ids, from their rows of the gate parameters (``gate_embedding``
        ``[S', d2]``, ``gate_bias`` ``[S', K - 1]``), of W and of b (None: no bias): each id's own gate priors mix
        the K components' logits (vector gating in logit space). ``rank``: the ids of a vocabulary slice
        (:meth:`_noisy`)."""
        dt = ctx.dtype
        gates = torch.einsum("nke,se->nsk", gate_ctx, gate_embedding.to(dt))
        gates = self._noisy(gates + shared[:, None, :] + gate_bias.to(dt), rank)
        prior = ops.sigmoid_tree_log_priors(gates).exp()  # [N, S', K]
        logits = (prior * torch.einsum("nkd,sd->nsk", ctx, weight.to(dt))).sum(-1)
        return logits if bias is None else logits + bias.to(dt)

    @property
    def lean_width(self) -> int:
        """V-wide tensors per token of a lean chunk: the softmax's two, plus the frequent ids' ``[n, S]`` tensors of
        :meth:`_lean_frequent_logits` at its backward's peak (K component logits, K - 1 gate sigmoids, K - 1 tree
        values, K - 1 gate gradients, about 2K value gradients: 6K - 3 of them), counted in units of V. With a large
        frequent set (S = V / 2, as the MT tables) they outweigh the softmax, so the chunks shrink to match."""
        c = self.config
        if c.num_gates == 1:
            return 2
        return 2 + math.ceil((6 * c.num_gates - 3) * c.num_frequent / c.vocab_size)

    @property
    def lean_rows(self) -> int:
        """Rows per token of the frequent ids' matrix products (``[n K, d] x [d, S]``): K."""
        return self.config.num_gates

    def lean_nll_chunk(self, hidden, target, grads, label_smoothing=0.0, triton=False):
        """Memory-lean chunk: the contexts and gate inputs (O(n K d)) under autograd; the frequent ids' gated
        logits (:meth:`_lean_frequent_logits`) and the V-wide softmax with hand-written gradients."""
        with torch.enable_grad():
            ctx, shared, gate_ctx, mixed = self._gate_inputs(hidden)
        small = [] if shared is None else [ctx, gate_ctx, shared]  # one gate: a plain softmax over h_1
        freq, back = (None, None)
        if small:
            freq, back = self._lean_frequent_logits(*(t.detach() for t in small), grads, triton=triton)
        loss, nll, grad_mixed, _, grad_freq = ops.softmax_rows(
            self.weight,
            self.bias,
            mixed.detach()[:, None],
            target,
            **self._output_grads(grads),
            prefix=freq,
            prefix_ids=self.frequent_ids(),
            transform=self.lean_logit_map,
            row_map=self.row_map(grads) if triton else None,
            label_smoothing=label_smoothing,
        )
        outputs, grad_outputs = [mixed], [grad_mixed[:, 0]]
        if small:
            outputs += small
            grad_outputs += back(grad_freq)
        return loss.sum(), nll.sum(), lean.backprop(outputs, grad_outputs, hidden, grads)

    def _lean_frequent_logits(self, ctx, gate_ctx, shared, grads, triton: bool = False):
        """``(z[:, :S], back)``, forward and backward by hand: component logits ``h_k . w_x`` and gate
        pre-activations as two matrix products ``[n K, .] x [., S]``, the sigmoid tree as nested lerps
        (``node = right + sigmoid(l) (left - right)``, which is ``sum_k pi_k h_k . w_x``), no K x n x S
        temporaries beyond the saved ones; with ``triton``, the gates' sums, the tree and the bias in the kernels of
        :func:`hf_heads.core.ops.triton_rows.tree_mix`, which save nothing. ``back(grad_z)`` adds the gradients of
        W[:S], b[:S], the gate embeddings and biases to ``grads`` and returns those of ``(ctx, gate_ctx, shared)``."""
        c = self.config
        n, k, d = ctx.shape
        s, d2 = c.num_frequent, c.gate_embedding_size
        w = self._frequent_rows(self.weight, ctx.dtype)
        ids = self.frequent_ids()
        v = self.gate_embedding.to(ctx.dtype)
        comp = (ctx.reshape(n * k, d) @ w.t()).view(n, k, s)
        gates = (gate_ctx.reshape(n * (k - 1), d2) @ v.t()).view(n, k - 1, s)
        noise = self.training and c.gate_noise > 0
        bias = None if self.bias is None else self._frequent_rows(self.bias, ctx.dtype)
        triton = triton and k <= ops.triton_rows.TREE_MAX_GATES
        if triton:  # the gates' sums, the tree and the bias in one kernel; its backward recomputes the priors
            if noise:
                gates.add_(torch.randn_like(gates), alpha=c.gate_noise)
            gate_bias = self.gate_bias.to(ctx.dtype)
            z = ops.triton_rows.tree_mix(comp, gates, shared, gate_bias, bias)
        else:
            gates += shared[:, :, None]
            gates += self.gate_bias.to(ctx.dtype).t()
            if noise:
                gates.add_(torch.randn_like(gates), alpha=c.gate_noise)
            z, tree = ops.sigmoid_tree_mix(comp, gates)
            if bias is not None:
                z = z + bias

        def back(grad_z):
            if triton:
                grad_comp, grad_gates = ops.triton_rows.tree_mix_backward(comp, gates, shared, gate_bias, grad_z)
            else:
                grad_comp, grad_gates = ops.sigmoid_tree_mix_backward(tree, grad_z)
            grad_comp = grad_comp.view(n * k, s)
            grad_gates_2d = grad_gates.view(n * (k - 1), s)
            if self.weight in grads:
                if ids is None:
                    grads[self.weight][:s].addmm_(grad_comp.t(), ctx.reshape(n * k, d))
                else:
                    grads[self.weight].index_add_(0, ids, grad_comp.t() @ ctx.reshape(n * k, d))
            if self.bias is not None and self.bias in grads:
                if ids is None:
                    grads[self.bias][:s] += grad_z.sum(0)
                else:
                    grads[self.bias].index_add_(0, ids, grad_z.sum(0))
            if self.gate_embedding in grads:
                grads[self.gate_embedding].addmm_(grad_gates_2d.t(), gate_ctx.reshape(n * (k - 1), d2))
            if self.gate_bias in grads:
                grads[self.gate_bias] += grad_gates.sum(0).t()
            return [(grad_comp @ w).view(n, k, d), (grad_gates_2d @ v).view(n, k - 1, d2), grad_gates.sum(2)]

        return z, back
