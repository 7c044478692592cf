"""Context vectors ``h_k = act(H_k g + c_k)``, shared by the heads that mix K of them (MoS, Mixtape)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..core import functional
from ..core import HeadConfig, OutputHead, check_bool, check_option, option

CONTEXT_ACTIVATIONS = ("tanh", "identity")


@dataclass
class ContextConfig(HeadConfig):
    """Options of heads built on K context vectors."""

    context_activation: str = option(
        "tanh", "activation of the context vectors h_k = act(H_k g + c_k): 'tanh' (the papers) or 'identity'"
    )
    identity_init: bool = option(
        False,
        "start every H_k at the identity and c_k at 0 (needs embedding_size == hidden_size). Alone it does not "
        "start the head at the model it replaces: the contexts still pass through tanh (h_k = tanh(g)) unless "
        "context_activation='identity' too; start='pretrained' sets both, and then every h_k = g at the start",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.head_name
        check_option(
            n,
            "context_activation",
            self.context_activation,
            self.context_activation in CONTEXT_ACTIVATIONS,
            f"one of {CONTEXT_ACTIVATIONS}",
        )
        check_bool(n, "identity_init", self.identity_init)
        if self.identity_init and self.embedding_size != self.hidden_size:
            raise ValueError(
                f"{n}: option identity_init=True needs embedding_size == hidden_size; got "
                f"embedding_size={self.embedding_size}, hidden_size={self.hidden_size}"
            )


class ContextHead(OutputHead):
    """A head with ``num_contexts`` context vectors of size d from g (``self.context_proj``)."""

    projects_context = True
    #: every h_k = g: the identity contexts, with no tanh (the mixture's priors and gates then do not matter)
    pretrained_start = {"context_activation": "identity", "identity_init": True}
    #: g is multiplied by this before H_k (Mixtape scales by d1^-1/2, MoS does not)
    context_input_scale = 1.0

    def _build_contexts(self, num_contexts: int) -> None:
        c = self.config
        self.num_contexts = num_contexts
        self.context_proj = nn.Linear(c.hidden_size, num_contexts * c.embedding_size)

    @torch.no_grad()
    def init_contexts_as_identity(self) -> None:
        """H_k = I / context_input_scale and c_k = 0 for every k, so H_k (scale g) + c_k = g."""
        d = self.config.hidden_size
        eye = torch.eye(d, dtype=self.context_proj.weight.dtype) / self.context_input_scale
        self.context_proj.weight.copy_(eye.repeat(self.num_contexts, 1))
        self.context_proj.bias.zero_()

    def contexts(self, scaled_hidden: torch.Tensor) -> torch.Tensor:
        """``[N, K, d]`` context vectors (after dropout) from hidden states already multiplied by
        ``context_input_scale``."""
        c = self.config
        h = functional.linear_full_precision(scaled_hidden, self.context_proj.weight, self.context_proj.bias)
        if c.context_activation == "tanh":
            h = torch.tanh(h)
        return self.dropout(h.view(-1, self.num_contexts, c.embedding_size))
