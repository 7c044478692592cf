"""The "more parameters" control of the head-upgrade study (the bottleneck map page's control (b)): a residual MLP
before the pretrained softmax with as many parameters as MoS-K adds, which adds parameters but not rank.
``python -m studies.head_upgrade --residual-mlp mos-3`` trains it (:class:`ResidualMLPControl` adds the option to
``softmax-heads upgrade``); it is a control to score, not a head a model saves, so it lives with the study, not in
the library."""

from __future__ import annotations

import torch
from torch import nn

from hf_heads.cli.upgrade import Extension
from hf_heads.core import OutputHead


class ResidualMLP(nn.Module):
    """``head(g + U2 tanh(U1 g + c1) + c2)``: a residual MLP of ``size`` units on the hidden state before ``head``,
    ``U2`` and ``c2`` starting at 0 (so the start is ``head`` itself). The control for "more parameters" against
    "higher rank": over a softmax it adds parameters, not rank (its log-probabilities still span at most d + 2
    dimensions). Trains with :func:`train_head_on_states` like a head; not a head a model can save."""

    def __init__(self, head: OutputHead, size: int):
        super().__init__()
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"ResidualMLP: size={size!r}; allowed: an integer >= 1")
        d = head.config.hidden_size
        self.head, self.up, self.down = head, nn.Linear(d, size), nn.Linear(size, d)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def forward(self, hidden):
        return self.head(self.adapt(hidden))

    def adapt(self, hidden):
        return hidden + self.down(torch.tanh(self.up(hidden)))

    def loss(self, hidden, target, reduction: str = "mean"):
        return self.head.loss(self.adapt(hidden), target, reduction=reduction)

    def aux_loss(self):
        return self.head.aux_loss()


def mlp_size_matching(hidden_size: int, added: int) -> int:
    """Units of a :class:`ResidualMLP` on ``hidden_size`` whose parameters (``2 d m + m + d``) come nearest ``added``
    (e.g. what MoS-K adds over a softmax: ``K d^2 + 2 K d``)."""
    return max(1, round((added - hidden_size) / (2 * hidden_size + 1)))


class ResidualMLPControl(Extension):
    """``--residual-mlp UNITS | mos-K`` for ``softmax-heads upgrade`` (:class:`hf_heads.cli.upgrade.Extension`): the
    new head trains behind a :class:`ResidualMLP` of that many units, or of as many parameters as MoS-K adds to a
    softmax (``K d^2 + 2 K d``); ``results.json`` records its units (``residual_mlp``, None without the option)."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--residual-mlp",
            default=None,
            help="the 'more parameters' control: a residual MLP of this many units before the head (its output "
            "layer starts at 0), or 'mos-K' for as many parameters as MoS-K adds to a softmax; a control to score, "
            "not a model to save (needs --no-save)",
        )

    def check(self, args, parser):
        text = args.residual_mlp
        if text is None:
            return
        if not (text.isdigit() and int(text) > 0) and not (
            text.startswith("mos-") and text[4:].isdigit() and int(text[4:]) > 1
        ):
            parser.error(f"--residual-mlp {text!r}: allowed: a number of units >= 1, or mos-K (K >= 2)")
        if not args.no_save:
            parser.error("--residual-mlp makes a control whose model cannot be saved as a head: add --no-save")

    def wrap(self, head, args, log):
        if args.residual_mlp is None:
            return head
        d = head.config.hidden_size
        text = args.residual_mlp
        size = mlp_size_matching(d, int(text[4:]) * (d * d + 2 * d)) if text.startswith("mos-") else int(text)
        control = ResidualMLP(head, size)
        added = sum(p.numel() for p in control.parameters()) - sum(p.numel() for p in head.parameters())
        log(f"the control: a residual MLP of {size} units before the {args.head} head ({added:,} parameters added)")
        return control

    def record(self, trained):
        return {"residual_mlp": trained.up.out_features if isinstance(trained, ResidualMLP) else None}
