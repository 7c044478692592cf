"""Adaptive sampling (AdaptiveSoftmax, Baharav et al. 2024): top-k of a trained softmax by a bandit.

Every token ``i`` is an arm whose mean is its logit ``mu_i = W_i . g + b_i``. A *pull* multiplies one
coordinate ``W_ij g_j``. Coordinates are drawn without replacement, by importance
``q_j ∝ |g_j| sum_i |W_ij|`` (a Gumbel-top ordering, the same order for every arm), and an arm that
has seen the first ``n`` coordinates of the order estimates its logit with the Horvitz-Thompson sum
``sum_j W_ij g_j / pi_j`` (``pi_j`` the inclusion probability of coordinate ``j`` given the
threshold of the ``(n+1)``-th key), whose variance estimate is ``sum_j (W_ij g_j)^2 (1 - pi_j) / pi_j^2``.

1. *Best arms* (successive elimination, delta/2): all arms get ``initial_pulls`` coordinates; arms
   whose upper confidence bound falls under the k-th best lower bound are dropped; survivors get
   twice as many coordinates, until k arms remain or every coordinate has been used. Confidence
   radius ``sqrt(2 var log(6 V log d / delta))`` (from the authors' code).
2. The k winners get their exact logits (the rest of their coordinates).
3. *Partition function* (delta/2): ``Z = sum_i exp(mu_i)`` from the exact logits where known and the
   estimates elsewhere; while ``sqrt(2 log(4 / delta) sum_i exp(2 mu_i) var_i)`` (the normal
   approximation of Z's error) exceeds ``epsilon / 2 * Z``, the arms that contribute most of that
   variance get their exact logits (doubling how many each time).

The output is ``log p_i = mu_i - log Z`` for the k winners: with probability ``1 - delta`` the top-1
is right and its probability is within a factor ``1 +- epsilon``. The figure of merit is the number
of coordinate multiplications against ``V d`` (a full matrix-vector product); ``head.last_stats``
has it after every ``topk`` call. ``head(hidden)`` and the loss are the exact softmax: a full
distribution needs every logit, and training is a plain softmax (the head has ``weight`` and
``bias`` and can be tied like one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Tuple

import torch

from ..core import functional
from ..core import HeadConfig, SingleSoftmaxHead, check_float, check_int, option, register_head


@dataclass
class AdaptiveSamplingConfig(HeadConfig):
    """Options of :class:`AdaptiveSamplingHead`."""

    epsilon: float = option(0.3, "PAC epsilon: multiplicative error allowed on the returned probabilities")
    delta: float = option(0.1, "PAC delta: probability that the top-k or a probability is wrong")
    initial_pulls: int = option(16, "coordinates every token gets in the first elimination round")
    variance_scale: float = option(
        1.0,
        "multiplies the variance estimates of the elimination rounds (the authors' 'fudge factor'; "
        "< 1 eliminates sooner, trading guarantee for speed; fit it with calibrate())",
    )
    seed: int = option(0, "seed of the coordinate sampling (the head's own generator, reproducible)")

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.head_name
        check_float(n, "epsilon", self.epsilon, 0.0, 1.0, lo_open=True, hi_open=True)
        check_float(n, "delta", self.delta, 0.0, 1.0, lo_open=True, hi_open=True)
        check_int(n, "initial_pulls", self.initial_pulls, 1)
        check_float(n, "variance_scale", self.variance_scale, 0.0, math.inf, lo_open=True, hi_open=True)
        check_int(n, "seed", self.seed, 0)


@register_head("adaptive_sampling")
class AdaptiveSamplingHead(SingleSoftmaxHead):
    """A softmax whose :meth:`topk` is the AdaptiveSoftmax bandit estimator (module docstring).

    After each ``topk`` call ``head.last_stats`` holds, averaged over the queries of the call:
    ``multiplications`` (coordinate multiplications), ``budget`` (``V d``), ``rounds``,
    ``exact_arms`` (tokens whose logit was computed in full) and ``pulls_per_arm``.
    """

    config_class = AdaptiveSamplingConfig
    paper = "Baharav et al. 2024, Adaptive sampling for efficient softmax approximation (NeurIPS)"
    pretrained_start_gap = "head(hidden) and the loss are exact; topk is the bandit's approximation, by design"
    purpose = "fast"
    is_linear_softmax = True

    def __init__(self, config: AdaptiveSamplingConfig):
        super().__init__(config)
        self._generator = torch.Generator().manual_seed(config.seed)

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._output_logits(self.dropout(hidden))

    def sampling_tables(self, dtype: torch.dtype = torch.float32):
        """``(Wt, atom_weights, b)``: ``W^T`` (d x V, a coordinate's row for every arm is contiguous),
        ``sum_i |W_ij|`` per coordinate, and the bias; cached until ``weight`` / ``bias`` change."""

        def build():
            w = self.weight.detach().to(dtype)
            b = None if self.bias is None else self.bias.detach().to(dtype)
            return w.T.contiguous(), w.abs().sum(0), b

        return self._cached(f"sampling-{dtype}", (self.weight, self.bias), build)

    @torch.no_grad()
    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        check_int(self.head_name, "k", k, 1, self.config.vocab_size)
        h = self._flat_hidden(hidden)
        lps, idxs, stats = [], [], []
        with functional.autocast_off(h):
            for g in h:
                lp, idx, st = self._bandit_topk(g, k)
                lps.append(lp)
                idxs.append(idx)
                stats.append(st)
        self.last_stats = {key: sum(s[key] for s in stats) / len(stats) for key in stats[0]}
        self.last_stats["budget"] = self.config.vocab_size * self.config.embedding_size
        shape = (*hidden.shape[:-1], k)
        return torch.stack(lps).view(shape), torch.stack(idxs).view(shape)

    @torch.no_grad()
    def success_rate(self, hidden: torch.Tensor) -> Dict[str, float]:
        """The paper's success criterion on queries ``hidden`` [N, d]: the top-1 token is right and its
        probability is within a factor ``1 +- epsilon`` of the exact one. Returns ``success``,
        ``top1`` (agreement alone) and ``gain`` (``V d`` / mean multiplications)."""
        h = self._flat_hidden(hidden)
        exact = torch.log_softmax(self.scores_2d(h), dim=-1).max(dim=-1)
        lp, idx = self.topk(h, 1)
        right = idx[:, 0] == exact.indices
        close = (lp[:, 0] - exact.values).exp().sub(1).abs() <= self.config.epsilon
        return {
            "success": float((right & close).float().mean()),
            "top1": float(right.float().mean()),
            "gain": self.last_stats["budget"] / self.last_stats["multiplications"],
        }

    @torch.no_grad()
    def calibrate(self, hidden: torch.Tensor, steps: int = 8) -> Dict[str, float]:
        """Fit ``variance_scale`` on calibration queries ``hidden`` [N, d], a simpler form of the authors'
        ``tune_fudge_factors`` (which fits a second factor for the partition function's step too; this
        head's step 3 keeps the unscaled variance): a bisection on ``log10(variance_scale)`` in [-3, 0] for the
        smallest scale whose success rate (:meth:`success_rate`) is still at least ``1 - delta``. Sets the
        option and returns ``{"variance_scale", "success", "top1", "gain"}`` measured at it. Calibrate
        on queries you do not evaluate on; the guarantee then holds empirically, not by the bound."""
        lo, hi = -3.0, 0.0
        self.config.variance_scale = 1.0
        best = self.success_rate(hidden)
        for _ in range(steps):
            mid = (lo + hi) / 2
            self.config.variance_scale = 10**mid
            got = self.success_rate(hidden)
            if got["success"] >= 1 - self.config.delta:
                hi, best = mid, got
            else:
                lo = mid
        self.config.variance_scale = 10**hi
        return {"variance_scale": self.config.variance_scale, **best}

    def _bandit_topk(self, g: torch.Tensor, k: int):
        """One query: ``(log_probs [k], indices [k], stats)``: the coordinates drawn (:meth:`_coordinate_order`), the
        arms eliminated round by round (:meth:`_eliminate`, steps 1), then the winners' exact logits and the exact
        logits that the partition function needs (:meth:`_winners`, steps 2 and 3)."""
        c = self.config
        wt, atom_weights, bias = self.sampling_tables(g.dtype)
        drawn = self._coordinate_order(g, atom_weights)
        if drawn is None:  # g = 0 (or W = 0): every logit is its bias
            logits = g.new_zeros(c.vocab_size) if bias is None else bias.clone()
            top, idx = logits.topk(k)
            stats = {"multiplications": float(c.embedding_size), "rounds": 0.0, "exact_arms": float(c.vocab_size)}
            return top - torch.logsumexp(logits, 0), idx, {**stats, "pulls_per_arm": 0.0}
        arms = _Arms(g, wt, bias, *drawn)
        survivors, rounds, pulls = self._eliminate(arms, k)
        log_probs, winners, exact, made_exact = self._winners(arms, survivors, k)
        stats = {
            "multiplications": float(c.embedding_size + pulls + exact),  # the importance weights' d, then the pulls
            "rounds": float(rounds),
            "exact_arms": float(made_exact),
            "pulls_per_arm": float(arms.pulled.double().mean()),
        }
        return log_probs, winners, stats

    def _coordinate_order(self, g: torch.Tensor, atom_weights: torch.Tensor):
        """The coordinates in a Gumbel-top order without replacement, proportional to ``q_j = |g_j| sum_i |W_ij|``:
        ``(order, keys, log_q)`` of the coordinates with ``q_j > 0``, or None when there is none."""
        q = g.abs() * atom_weights
        usable = int((q > 0).sum())
        if usable == 0:
            return None
        log_q = torch.log(q / q.sum())
        # drawn on the CPU (the head's generator: the same draws on every device), then moved to g's device
        d = self.config.embedding_size
        u = torch.rand(d, generator=self._generator, dtype=torch.float64).to(g.device, g.dtype).clamp_(1e-12, 1 - 1e-12)
        keys, order = (log_q - torch.log(-torch.log(u))).sort(descending=True)
        return order[:usable], keys[:usable], log_q[order[:usable]]

    def _eliminate(self, arms: "_Arms", k: int):
        """Step 1, successive elimination: every arm gets ``initial_pulls`` coordinates, then the arms whose upper
        bound falls under the k-th best lower bound go and the others get twice as many, until at most k remain or
        every coordinate is used. Returns ``(the surviving arms, rounds, multiplications)``."""
        c, g, wt, order, usable = self.config, arms.g, arms.wt, arms.order, arms.usable
        bound = math.sqrt(2.0 * math.log(6.0 * c.vocab_size * math.log(max(c.embedding_size, 3)) / (c.delta / 2)))
        alive = torch.arange(c.vocab_size, device=g.device)
        n = min(c.initial_pulls, usable)
        products = (wt.index_select(0, order[:n]) * g[order[:n], None]).T.contiguous()  # [arms, n]
        mults, rounds = n * c.vocab_size, 0
        while True:
            rounds += 1
            inv_pi, var_w = arms.weights(n)
            est = products @ inv_pi
            if arms.bias is not None:
                est = est + arms.bias[alive]
            var = (products * products) @ var_w
            arms.est[alive], arms.var[alive], arms.pulled[alive] = est, var, n
            if len(alive) <= k or n >= usable:
                break
            radius = bound * (c.variance_scale * var).sqrt()
            kth_lower = (est - radius).topk(k).values[-1]
            keep = (est + radius >= kth_lower).nonzero().squeeze(1)
            alive, products = alive[keep], products.index_select(0, keep)
            if len(alive) <= k:
                break
            n_next = min(2 * n, usable)
            cols = order[n:n_next]
            fresh = (wt.index_select(0, cols).index_select(1, alive) * g[cols, None]).T
            products = torch.cat([products, fresh], dim=1)
            mults += (n_next - n) * len(alive)
            n = n_next
        return alive, rounds, mults

    def _winners(self, arms: "_Arms", alive: torch.Tensor, k: int):
        """Steps 2 and 3: the k best survivors (and, with fewer than k, the best of the rest by estimate) get their
        exact logits; then, while the normal bound on Z's error exceeds ``epsilon / 2 * Z``, the arms carrying most
        of its variance get theirs (twice as many each time). Returns ``(log-probs, winners, multiplications, arms
        made exact)``, the winners in descending order."""
        c, est_all, var_all = self.config, arms.est, arms.var
        winners = alive[est_all[alive].topk(min(k, len(alive))).indices]
        if len(winners) < k:  # fewer survivors than k (k close to V): the best of the rest by estimate
            rest = est_all.clone()
            rest[winners] = -float("inf")
            winners = torch.cat([winners, rest.topk(k - len(winners)).indices])
        mults, exact_arms = arms.make_exact(winners)
        z_bound, chunk = math.sqrt(2.0 * math.log(4.0 / c.delta)), max(16, k)
        while True:
            top = est_all.max()
            contrib = torch.exp(2 * (est_all - top)) * var_all  # exp(2 mu) var, scaled by exp(-2 top)
            z = torch.exp(est_all - top).sum()
            if z_bound * contrib.sum().sqrt() <= 0.5 * c.epsilon * z or not bool((var_all > 0).any()):
                break
            done, count = arms.make_exact(contrib.topk(min(chunk, c.vocab_size)).indices)
            mults, exact_arms = mults + done, exact_arms + count
            chunk *= 2
        winners = winners[est_all[winners].argsort(descending=True)]
        return est_all[winners] - (top + torch.log(z)), winners, mults, exact_arms

    def extra_repr(self) -> str:
        c = self.config
        return f"{super().extra_repr()}, epsilon={c.epsilon}, delta={c.delta}"


class _Arms:
    """One query's arms: the coordinates in their drawn order (``order``, their Gumbel ``keys`` and log-importances
    ``log_q``; the first ``usable`` with ``q_j > 0``), and per arm its logit's estimate, the estimate's variance and
    the coordinates it has pulled (``usable``: exact)."""

    def __init__(self, g, wt, bias, order, keys, log_q):
        self.g, self.wt, self.bias = g, wt, bias
        self.order, self.keys, self.log_q, self.usable = order, keys, log_q, len(order)
        vocab = wt.shape[1]
        self.est, self.var = g.new_zeros(vocab), g.new_zeros(vocab)
        self.pulled = torch.zeros(vocab, dtype=torch.long, device=g.device)

    def weights(self, n: int):
        """``1 / pi_j`` and ``(1 - pi_j) / pi_j^2`` for the first ``n`` coordinates of the order."""
        if n >= self.usable:
            return self.g.new_ones(n), self.g.new_zeros(n)
        pi = -torch.expm1(-torch.exp(self.log_q[:n] - self.keys[n]))
        pi = pi.clamp_min(1e-30)
        return 1.0 / pi, (1.0 - pi) / pi**2

    def make_exact(self, which: torch.Tensor) -> Tuple[int, int]:
        """Exact logits for the arms ``which`` not yet exact; returns (multiplications, arms made exact)."""
        which = which[self.pulled[which] < self.usable]
        if len(which) == 0:
            return 0, 0
        self.est[which] = self.g @ self.wt[:, which] + (0 if self.bias is None else self.bias[which])
        self.var[which] = 0
        done = int((self.usable - self.pulled[which]).sum())
        self.pulled[which] = self.usable
        return done, len(which)
