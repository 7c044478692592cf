"""DS-Softmax (Liao et al. 2019, "Doubly Sparse Softmax"): a sparse mixture of sparse experts.

E experts, each a copy of the output embedding W (V x d) with a class mask m_e. A gate picks one
expert per token (top-1 of ``softmax(g W_gate)``, with learned Gaussian noise in training) and the
logits are ``g_top * (W_e g + b_e)`` over the expert's classes. Training adds group lasso on every
expert's class rows, an expert-level lasso and a load-balancing loss (``aux_loss``); pruning removes
class rows whose norm falls under a cutoff, for good, on a schedule the head counts itself. At
inference the head computes only the chosen expert's surviving classes: ``topk`` never touches the
rest, and ``forward`` returns full log-probs with ``-inf`` outside the chosen expert.

Facts from the authors' TensorFlow code kept here: noise std ``softplus(g W_noise) + 0.01``
in training only; importance loss ``coef * cv^2`` of the per-expert sums of the (top-1) gate values;
group norm ``sqrt(mean_d W_e[v]^2)`` with an epsilon inside the sqrt (pruned rows are exactly 0);
pruned classes keep logit 0 in training (``(x W_e) * m_e``) and are skipped at inference.
"""

from __future__ import annotations

import math

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import functional
from ..core import HeadConfig, OutputHead, check_bool, check_float, check_int, check_option, option, register_head

_NORM_EPS = 1e-12  # inside the sqrt of the group norms: sqrt'(0) is infinite


@dataclass
class DSSoftmaxConfig(HeadConfig):
    """Options of :class:`DSSoftmaxHead`."""

    num_experts: int = option(8, "number E of experts, each a masked copy of the output embedding (paper: 64)")
    group_lasso: float = option(
        0.002,
        "coefficient of the class-level group lasso sum_e sum_v sqrt(mean_d W_e[v]^2) (authors: 0.002-0.005). "
        "Each class row's share of the cross-entropy gradient shrinks like 1/V, so scale it like 1/V: "
        "about 10/V pruned cleanly here (studies/fast_softmax/ds_softmax.py)",
    )
    expert_lasso: float = option(
        0.002, "coefficient of the expert-level lasso sum_e sqrt(mean W_e^2), which lets whole experts die"
    )
    balance: float = option(
        10.0, "coefficient of the load-balancing loss cv^2 of the per-expert gate sums (authors: 10-30)"
    )
    prune_cutoff: float = option(
        0.03,
        "a class row W_e[v] whose norm sqrt(mean_d W_e[v]^2) falls under this is removed from expert e "
        "for good (0 disables pruning)",
    )
    prune_start: int = option(1000, "training steps (forward passes in training mode) before the first pruning")
    prune_interval: int = option(100, "training steps between prunings")
    min_experts_per_class: int = option(
        1,
        "pruning never leaves a class in fewer experts than this, so every token stays reachable "
        "(0: the paper's rule, a class may vanish from every expert)",
    )
    gate_noise: bool = option(True, "noisy top-1 gating in training (noise std softplus(g W_noise) + 0.01)")

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.head_name
        check_int(n, "num_experts", self.num_experts, 1, 4096)
        for name in ("group_lasso", "expert_lasso", "balance"):
            check_float(n, name, getattr(self, name), 0.0, float("inf"))
        check_float(n, "prune_cutoff", self.prune_cutoff, 0.0, float("inf"))
        check_int(n, "prune_start", self.prune_start, 0)
        check_int(n, "prune_interval", self.prune_interval, 1)
        check_int(n, "min_experts_per_class", self.min_experts_per_class, 0, self.num_experts)
        check_bool(n, "gate_noise", self.gate_noise)


@register_head("ds_softmax")
class DSSoftmaxHead(OutputHead):
    """``p(x | g) = softmax_{x in C_e}( g_e (W_e g + b_e)_x )`` with ``e = argmax softmax(W_gate g)``.

    Parameters: ``weight`` (E x V x d: one output embedding per expert, all started from the same
    V x d matrix, or from ``weight=`` / ``init_from_projection``), ``bias`` (E x V), ``gate`` (d -> E)
    and ``noise`` (d -> E). Buffers (saved with the weights): ``mask`` (E x V, True = class kept)
    and ``num_steps`` (training steps seen, which drives pruning).

    * training: noisy top-1 routing, pruned classes get logit 0 (the authors' ``(x W_e) * m_e``),
      ``aux_loss()`` = balance * cv^2(gate sums of the last training call) + group_lasso * class-level
      group lasso + expert_lasso * expert-level lasso; every ``prune_interval`` steps from
      ``prune_start`` on, :meth:`prune` runs by itself.
    * evaluation: classes outside the chosen expert have log-prob ``-inf``; :meth:`topk` computes
      only the chosen expert's surviving classes.

    The output embedding cannot be tied to an input embedding (there are E copies of it): build the
    head from the embedding instead (``weight=``), which every expert copies.
    """

    config_class = DSSoftmaxConfig
    has_aux_loss = True  # load balance, group lasso and expert lasso (aux_losses)
    lean_loss = False  # its training forward records routing for the aux loss and counts pruning steps
    paper = "Liao et al. 2019, Doubly Sparse Softmax (DS-Softmax)"
    #: one expert: its gate value is 1 and its logits are W g + b
    pretrained_start = {"num_experts": 1}
    pretrained_start_gap = (
        "one expert is the model's softmax; with more (start='nearest'), every expert starts as a copy of W and b but "
        "the chosen expert's logits are multiplied by its gate value, below 1 (the model's softmax at a higher "
        "temperature; init_gate_from_hidden starts the gate from hidden states)"
    )
    purpose = "fast"
    can_tie = False

    def __init__(self, config: DSSoftmaxConfig):
        super().__init__(config)
        c = config
        base = self.weight.detach()
        self.weight = nn.Parameter(base.unsqueeze(0).repeat(c.num_experts, 1, 1))
        self.bias = nn.Parameter(torch.zeros(c.num_experts, c.vocab_size)) if c.use_bias else None
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.noise = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        nn.init.zeros_(self.noise.weight)
        self.register_buffer("mask", torch.ones(c.num_experts, c.vocab_size, dtype=torch.bool))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.long))
        # routing counts since the last pruning (for sparsity_report), not saved; a plain tensor made on first
        # use, not a buffer: transformers leaves non-persistent buffers uninitialised when it loads a model
        self._routed: Optional[torch.Tensor] = None
        self._importance: Optional[torch.Tensor] = None
        self._routed_one = [0] * c.num_experts  # batch-1 routing counts, added to `routed` when read

    def _resize_rows(self, keep, rows, bias_rows):
        """Every expert keeps the first ``keep`` classes (pruned ones stay pruned) and gets the new classes'
        rows, unpruned: a new token is in every expert until training prunes it."""
        e = self.config.num_experts
        self.weight = nn.Parameter(
            torch.cat([self.weight[:, :keep], rows.expand(e, -1, -1)], 1), requires_grad=self.weight.requires_grad
        )
        if self.bias is not None:
            self.bias = nn.Parameter(
                torch.cat([self.bias[:, :keep], bias_rows.expand(e, -1)], 1), requires_grad=self.bias.requires_grad
            )
        self.mask = torch.cat([self.mask[:, :keep], self.mask.new_ones(e, rows.shape[0])], 1)
        self._routed = self._importance = None  # per-class statistics of the old vocabulary

    def tie_weight(self, embedding: nn.Module) -> None:
        raise ValueError(
            f"{self.head_name}: the output embedding cannot be tied to the input embedding: the head keeps "
            f"num_experts={self.config.num_experts} separate masked copies of it. Build the head untied, "
            f"started from the embedding (weight=embedding.weight); in fairseq leave out "
            f"--share-decoder-input-output-embed / --share-all-embeddings"
        )

    @torch.no_grad()
    def init_gate_from_hidden(
        self, hidden: torch.Tensor, iters: int = 20, sharpness: float = 20.0, seed: int = 0, restarts: int = 4
    ) -> torch.Tensor:
        """Start the routing at spherical k-means clusters of ``hidden`` (not in the paper; our addition).

        The gate has no bias, so ``argmax_e W_gate[e] . g`` with unit-norm rows is exactly the nearest
        centroid in cosine distance: the rows become the E centroids, scaled by ``sharpness / mean |g|`` so
        that the chosen gate value starts near 1. Why: with a fresh gate every ``g_top`` is about 1/E,
        which divides the logits of an expert copied from a trained softmax by E; and random routing
        has to be unlearned before pruning can find structure. The best of ``restarts`` k-means runs
        (k-means++ seeding; highest total cosine to the centroids) is kept. Returns the cluster of every row.
        """
        c = self.config
        h = self._flat_hidden(hidden).float()
        check_option(
            self.head_name,
            "hidden rows",
            h.shape[0],
            h.shape[0] >= c.num_experts,
            f"at least num_experts={c.num_experts} rows to cluster",
        )
        u = F.normalize(h, dim=-1)
        g = torch.Generator().manual_seed(seed)
        best, best_score = None, -float("inf")
        for _ in range(max(1, restarts)):
            cent = _kmeans_pp(u, c.num_experts, g)
            for _ in range(iters):
                assign = (u @ cent.T).argmax(1)
                new = torch.zeros_like(cent).index_add_(0, assign, u)
                empty = new.norm(dim=1) == 0
                if bool(empty.any()):  # re-seed empty clusters at random rows
                    new[empty] = u[torch.randint(0, u.shape[0], (int(empty.sum()),), generator=g).to(u.device)]
                cent = F.normalize(new, dim=-1)
            score = float((u @ cent.T).max(1).values.sum())
            if score > best_score:
                best, best_score = cent, score
        self.gate.weight.copy_(best * (sharpness / h.norm(dim=1).mean()))
        return (u @ best.T).argmax(1)

    # -- routing ----------------------------------------------------------------------
    def dead_experts(self) -> Optional[torch.Tensor]:
        """Bool ``[E]``: experts left with no class (never chosen); ``None`` when every expert lives."""

        def build():
            dead = ~self.mask.any(dim=1)
            return dead if functional.values_known(dead) and bool(dead.any()) else None

        return self._cached("dead", (self.mask,), build)

    def _route(self, hidden: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Top-1 expert ``[N]`` and its gate value ``g_top`` ``[N]`` (float32). In training with grad
        enabled this is one training step: it counts, may prune, and records the gate sums."""
        training = self.training and torch.is_grad_enabled()
        if training:
            self._count_step()
        logits = functional.linear_full_precision(hidden, self.gate.weight)
        if self.training and self.config.gate_noise:
            std = F.softplus(functional.linear_full_precision(hidden, self.noise.weight)) + 0.01
            logits = logits + torch.randn_like(logits) * std
        dead = self.dead_experts()
        if dead is not None:
            logits = logits.masked_fill(dead, float("-inf"))
        gate, expert = torch.softmax(logits, dim=-1).max(dim=-1)
        # one-hot sums, not index_add / bincount: the same bits on every run on a GPU (no atomic float adds), and
        # they run on the meta device
        chosen = expert[:, None] == torch.arange(self.config.num_experts, device=expert.device)
        if training:
            self._importance = (chosen.to(gate.dtype) * gate[:, None]).sum(0)
        counts = chosen.detach().sum(0)
        self._routed = counts if self._routed is None or self._routed.device != counts.device else self._routed + counts
        return expert, gate

    def _per_expert(self):
        """``(weights, biases)``: the experts' parameters as per-expert views. ``unbind`` has one
        backward for all experts (indexing ``weight[e]`` per expert would allocate a full E x V x d
        gradient for every expert used)."""
        ws = self.weight.unbind(0)
        bs = [None] * len(ws) if self.bias is None else self.bias.unbind(0)
        return ws, bs

    # -- training-mode logits (every class; pruned ones at 0) ------------------------
    def _dense_logits(self, hidden: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden)
        order, groups = functional.group_rows(expert)
        xs, gs = x[order], gate[order]
        ws, bs = self._per_expert()
        parts = []
        for e, lo, hi in groups:
            z = functional.linear_full_precision(xs[lo:hi], ws[e], bs[e]) * self.mask[e].to(xs.dtype)
            parts.append(z * gs[lo:hi, None])
        return torch.cat(parts)[torch.argsort(order)]

    # -- inference (only the surviving classes) ------------------------------------------
    def expert_tables(self) -> List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """Per expert: ``(class ids [n_e], W_e rows [n_e, d], b_e [n_e] or None)`` of its surviving
        classes, contiguous, float32 (float64 for a float64 head): what inference reads. Cached until
        the weights or masks change."""
        return self._inference_tables()[0]

    def _inference_tables(self):
        """``(expert tables, gate weights, dead experts)`` in the compute dtype, cached together (one
        cache check per inference call)."""

        def build():
            dt = functional.compute_dtype(self.weight)
            tables = []
            for e in range(self.config.num_experts):
                idx = self.mask[e].nonzero().squeeze(1)
                b = None if self.bias is None else self.bias[e, idx].to(dt).contiguous()
                tables.append((idx, self.weight[e, idx].to(dt).contiguous(), b))
            return tables, self.gate.weight.to(dt).contiguous(), self.dead_experts()

        return self._cached("tables", (self.weight, self.bias, self.mask, self.gate.weight), build)

    def _expert_log_probs(self, x: torch.Tensor, gate: torch.Tensor, e: int, ws, bs):
        """``(class ids, log-probs [n, n_e])`` of expert ``e`` for rows ``x``, from the parameters ``ws``,
        ``bs`` (:meth:`_per_expert`), so gradients reach them."""
        idx = self.mask[e].nonzero().squeeze(1)
        b = None if bs[e] is None else bs[e][idx]
        return idx, torch.log_softmax(functional.linear_full_precision(x, ws[e][idx], b) * gate[:, None], dim=-1)

    def _sparse_topk(self, h: torch.Tensor, k: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The inference fast path (no grad, evaluation mode): route, then score only the chosen
        expert's surviving classes. ``None`` where a chosen expert keeps fewer than ``k`` classes."""
        tables, gate_weight, dead = self._inference_tables()
        if h.shape[0] == 1:
            return self._sparse_topk_one(h[0], k, tables, gate_weight, dead)
        with torch.no_grad(), functional.autocast_off(h):
            expert, gate = self._route(h)
            order, groups = functional.group_rows(expert)
            if any(tables[e][0].numel() < k for e, _, _ in groups):
                return None
            lp_out = h.new_empty(h.shape[0], k)
            idx_out = torch.empty(h.shape[0], k, dtype=torch.long, device=h.device)
            for e, lo, hi in groups:
                rows = order[lo:hi]
                idx, w, b = tables[e]
                lp = torch.log_softmax(
                    F.linear(h[rows], w.to(h.dtype), None if b is None else b.to(h.dtype)) * gate[rows, None], dim=-1
                )
                lp_out[rows], pos = lp.topk(k, dim=-1)
                idx_out[rows] = idx[pos]
        return lp_out, idx_out

    def _sparse_topk_one(
        self, x: torch.Tensor, k: int, tables, gate_weight: torch.Tensor, dead: Optional[torch.Tensor]
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """Batch 1 (``x`` ``[d]``): :meth:`_route` inlined and every per-call op that a single query can skip
        left out (no grouping, no dtype casts where the dtypes already agree, the gate folded into the
        expert's matrix-vector product as a Python number): at batch 1 the cost of a call is its op count as
        much as the expert's size."""
        if gate_weight.dtype != x.dtype:
            gate_weight = gate_weight.to(x.dtype)
        gate_logits = torch.mv(gate_weight, x)
        if dead is not None:
            gate_logits = gate_logits.masked_fill(dead, float("-inf"))
        gate, e = torch.softmax(gate_logits, 0).max(0)
        e = int(e)
        idx, w, b = tables[e]
        if idx.numel() < k:
            return None  # forward() routes (and counts) this query
        self._routed_one[e] += 1  # a Python counter: cheaper than a tensor op at batch 1
        if w.dtype != x.dtype:
            w, b = w.to(x.dtype), None if b is None else b.to(x.dtype)
        g = float(gate)
        z = torch.mv(w, x).mul_(g) if b is None else torch.addmv(b, w, x, beta=g, alpha=g)  # g (W_e x + b_e)
        top, pos = torch.log_softmax(z, 0).topk(k)
        return top, idx[pos]

    # -- the head interface -------------------------------------------------------------
    def log_probs_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        expert, gate = self._route(hidden)
        if self.training:
            return torch.log_softmax(self._dense_logits(hidden, expert, gate), dim=-1)
        order, groups = functional.group_rows(expert)
        ws, bs = self._per_expert()
        out = hidden.new_full((hidden.shape[0], self.config.vocab_size), float("-inf"))
        for e, lo, hi in groups:
            rows = order[lo:hi]
            idx, lp = self._expert_log_probs(hidden[rows], gate[rows], e, ws, bs)
            out = out.index_put((rows[:, None], idx[None, :]), lp)
        return out

    def nll_2d(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Training: the dense logits' cross-entropy. Evaluation: the chosen expert's log-softmax at the target, an
        ``[n, n_e]`` block per expert (no ``[N, V]`` tensor); a target the expert pruned has NLL ``inf``."""
        expert, gate = self._route(hidden)
        if self.training:
            return F.cross_entropy(self._dense_logits(hidden, expert, gate), target, reduction="none")
        order, groups = functional.group_rows(expert)
        ws, bs = self._per_expert()
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        out = torch.full((hidden.shape[0],), math.inf, dtype=dtype, device=hidden.device)
        pos = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=hidden.device)  # id -> column
        for e, lo, hi in groups:
            rows = order[lo:hi]
            idx, lp = self._expert_log_probs(hidden[rows], gate[rows], e, ws, bs)
            pos[idx] = torch.arange(len(idx), device=pos.device)
            col = pos[target[rows]]
            nll = -lp.gather(1, col.clamp(min=0)[:, None]).squeeze(1)
            out = out.index_put((rows,), torch.where(col >= 0, nll, math.inf).to(dtype))
            pos[idx] = -1
        return out

    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """In evaluation mode without gradients, computes only the chosen expert's surviving classes
        (if an expert keeps fewer than ``k`` classes, the rest come out at ``-inf`` as in ``forward``)."""
        check_int(self.head_name, "k", k, 1, self.config.vocab_size)
        if not self.training and not (torch.is_grad_enabled() and hidden.requires_grad):
            # the inference tables carry no autograd history, so no graph is built here
            out = self._sparse_topk(self._flat_hidden(hidden), k)
            if out is not None:
                shape = (*hidden.shape[:-1], k)
                return out[0].view(shape), out[1].view(shape)  # batch 1: [k] -> [..., k]
        return super().topk(hidden, k)

    # -- regularisers -------------------------------------------------------------------
    def class_norms(self) -> torch.Tensor:
        """``[E, V]``: ``sqrt(mean_d W_e[v]^2 + eps)`` of every class row (with its bias entry, if any),
        0 for pruned rows."""
        sq = torch.linalg.vector_norm(self.weight.float(), dim=-1).pow(2)  # one fused pass over E x V x d
        d = self.weight.shape[-1]
        if self.bias is not None:
            sq, d = sq + self.bias.float().pow(2), d + 1
        return torch.sqrt(sq / d + _NORM_EPS) * self.mask

    def aux_losses(self) -> Dict[str, torch.Tensor]:
        """The three regularisers, unweighted: ``balance`` (cv^2 of the gate sums of the last training
        call, 0 when there was none), ``group_lasso`` and ``expert_lasso``."""
        zero = self.weight.new_zeros((), dtype=torch.float32)
        imp = self._importance
        balance = zero if imp is None or imp.numel() < 2 else imp.var(unbiased=False) / (imp.mean() ** 2 + 1e-10)
        norms = self.class_norms()
        expert = torch.sqrt(norms.pow(2).sum(-1) / self.config.vocab_size + _NORM_EPS)  # norms: 0 if pruned
        return {"balance": balance.float(), "group_lasso": norms.sum(), "expert_lasso": expert.sum()}

    def aux_loss(self) -> torch.Tensor:
        c = self.config
        if not (c.balance or c.group_lasso or c.expert_lasso):
            return super().aux_loss()
        parts = self.aux_losses()
        return (
            c.balance * parts["balance"] + c.group_lasso * parts["group_lasso"] + c.expert_lasso * parts["expert_lasso"]
        )

    # -- pruning ---------------------------------------------------------------------------
    def _count_step(self) -> None:
        self.num_steps += 1
        c, s = self.config, int(self.num_steps)
        if c.prune_cutoff > 0 and s >= c.prune_start and (s - c.prune_start) % c.prune_interval == 0:
            self.prune()

    @torch.no_grad()
    def prune(self, cutoff: Optional[float] = None) -> int:
        """Remove, for good, every class row whose norm (see :meth:`class_norms`) is under ``cutoff``
        (default: the ``prune_cutoff`` option); returns how many rows were removed. A class keeps its
        ``min_experts_per_class`` strongest experts whatever their norms. Runs by itself during
        training; call it directly to prune by hand."""
        cutoff = self.config.prune_cutoff if cutoff is None else cutoff
        norms = self.class_norms()
        drop = self.mask & (norms < cutoff)
        m = self.config.min_experts_per_class
        if m:  # protect each class's m strongest surviving experts
            rank = norms.masked_fill(~self.mask, -1.0).argsort(dim=0, descending=True).argsort(dim=0)
            drop &= rank >= m
        removed = int(drop.sum())
        if removed:
            self.mask &= ~drop
            self.weight.masked_fill_(drop[..., None], 0.0)
            if self.bias is not None:
                self.bias.masked_fill_(drop, 0.0)
            self._routed = None
            self._routed_one = [0] * self.config.num_experts
        return removed

    def sparsity_report(self, hidden: Optional[torch.Tensor] = None) -> Dict[str, object]:
        """How sparse the head is.

        ``classes_per_expert`` (surviving classes of each expert), ``expert_usage`` (fraction of queries
        routed to each expert: of ``hidden`` when given, else of every query routed since the last
        pruning, uniform when there was none), ``expected_classes_computed`` (classes per query,
        averaged over how often each expert is chosen), ``flops_reduction`` (``V d`` of a full softmax
        over the ``E d + expected_classes_computed * d`` multiplications of DS-Softmax's top-1).
        """
        c = self.config
        if hidden is not None:
            with torch.no_grad():
                was = self.training
                self.eval()
                expert, _ = self._route(self._flat_hidden(hidden))
                self.train(was)
            counts = torch.bincount(expert, minlength=c.num_experts).float()
        else:
            counts = torch.tensor(self._routed_one, dtype=torch.float32)
            if self._routed is not None:
                counts += self._routed.float().cpu()
        usage = counts / counts.sum() if counts.sum() > 0 else torch.full((c.num_experts,), 1.0 / c.num_experts)
        per_expert = self.mask.sum(dim=1).cpu()
        expected = float((usage.cpu() * per_expert).sum())
        d = c.embedding_size
        return {
            "num_experts": c.num_experts,
            "vocab_size": c.vocab_size,
            "classes_per_expert": per_expert.tolist(),
            "expert_usage": usage.cpu().tolist(),
            "expected_classes_computed": expected,
            "flops_reduction": c.vocab_size * d / (c.num_experts * c.hidden_size + expected * d),
            "num_steps": int(self.num_steps),
        }


def _kmeans_pp(u: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """k-means++ seeding on unit rows ``u``: each next centroid drawn with probability ~ (1 - cos)^2
    to the nearest one already chosen."""
    first = int(torch.randint(0, u.shape[0], (1,), generator=g))
    cent = [u[first]]
    dist = (1 - u @ u[first]).clamp_min(0) ** 2
    for _ in range(1, k):
        p = dist / dist.sum() if float(dist.sum()) > 0 else torch.full_like(dist, 1 / len(dist))
        nxt = int(torch.multinomial(p.cpu(), 1, generator=g))
        cent.append(u[nxt])
        dist = torch.minimum(dist, (1 - u @ u[nxt]).clamp_min(0) ** 2)
    return torch.stack(cent)


@torch.no_grad()
def mitosis(head: DSSoftmaxHead, num_experts: int, noise: float = 1e-3) -> DSSoftmaxHead:
    """Grow a trained DS-Softmax head to ``num_experts`` (a multiple of its E) by cloning each expert.

    Every expert (its weights, bias and mask) and its gate row are copied ``num_experts / E`` times;
    ``noise`` (relative to the gate weights' std) breaks the ties between clones. The clones of an
    expert share its gate value (``f`` equal gate logits get ``g / f`` each), so their weights and
    biases are multiplied by ``f``: at ``noise=0`` the new head's log-probs equal the old one's. The
    step counter carries over, so the pruning schedule continues. Train a small E first, then grow:
    the paper's way to train many experts with less memory.
    """
    if not isinstance(head, DSSoftmaxHead):
        raise ValueError(f"mitosis: expected a DSSoftmaxHead, got {type(head).__name__}")
    old_e = head.config.num_experts
    ok = isinstance(num_experts, int) and num_experts >= old_e and num_experts % old_e == 0
    check_option(head.head_name, "num_experts", num_experts, ok, f"a multiple of the current num_experts={old_e}")
    f = num_experts // old_e
    new = DSSoftmaxHead(dataclasses.replace(head.config, num_experts=num_experts))
    new = new.to(device=head.weight.device, dtype=head.weight.dtype)
    new.weight.copy_(head.weight.repeat_interleave(f, dim=0) * f)
    if head.bias is not None:
        new.bias.copy_(head.bias.repeat_interleave(f, dim=0) * f)
    gate = head.gate.weight.repeat_interleave(f, dim=0)
    new.gate.weight.copy_(gate + noise * gate.std() * torch.randn_like(gate))
    new.noise.weight.copy_(head.noise.weight.repeat_interleave(f, dim=0))
    new.mask.copy_(head.mask.repeat_interleave(f, dim=0))
    new.num_steps.copy_(head.num_steps)
    return new.train(head.training)
