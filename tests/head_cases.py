"""One table of head cases driving the generic head tests: adding a head = adding one row.

Each case gives tiny options, a slow obviously-correct reference (loops, probability space,
float64) and, where the paper has one, the degenerate setting in which the head must reduce to
a plain softmax of the same logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

from hf_heads.core.ops import piecewise_linear_increasing_reference

HIDDEN, VOCAB = 6, 11


def _softmax_probs(logits: torch.Tensor) -> torch.Tensor:
    e = torch.exp(logits - logits.max())
    return e / e.sum()


# ------------------------------------------------------------------ slow references (one token at a time)
def _mapped(head, z):
    """The options' fixed map of the logits, written out: ``c tanh(s z / c)``, or ``s z`` without a cap."""
    c = head.config
    z = c.logit_scale * z
    return z if c.logit_softcap is None else c.logit_softcap * torch.tanh(z / c.logit_softcap)


def ref_softmax(head, g):
    return torch.log(_softmax_probs(_mapped(head, head.weight @ g + _bias(head))))


def ref_sigsoftmax(head, g):
    z = _mapped(head, head.weight @ g + _bias(head))
    p = torch.exp(z) * torch.sigmoid(z)  # the paper's form; fine for the small logits of the tests
    return torch.log(p / p.sum())


def _bias(head):
    return 0.0 if head.bias is None else head.bias


def _act(head):
    return torch.tanh if head.config.context_activation == "tanh" else (lambda x: x)


def _mos_mixture(head, g, transform=lambda z: z):
    c = head.config
    prior = _softmax_probs(head.prior_proj.weight @ g)
    ctx = _act(head)(head.context_proj.weight @ g + head.context_proj.bias).view(c.num_components, -1)
    p = sum(
        prior[k] * _softmax_probs(transform(_mapped(head, head.weight @ ctx[k] + _bias(head))))
        for k in range(c.num_components)
    )
    return torch.log(p)


def ref_mos(head, g):
    return _mos_mixture(head, g)


def ref_mos_plif(head, g):
    slopes = head.plif.slopes(g.dtype)
    return _mos_mixture(head, g, lambda z: piecewise_linear_increasing_reference(z, slopes, head.plif.knot_range))


def ref_plif(head, g):
    z = _mapped(head, head.weight @ g + _bias(head))
    f = piecewise_linear_increasing_reference(z, head.plif.slopes(g.dtype), head.plif.knot_range)
    return torch.log(_softmax_probs(f))


def _tree_priors(gamma):
    """Leaf probabilities of the sigmoid tree, written out recursively (paper eq. 3)."""

    def leaves(node, depth, levels):
        if depth == levels:
            return [1.0]
        left = leaves(2 * node + 1, depth + 1, levels)
        right = leaves(2 * node + 2, depth + 1, levels)
        return [gamma[node] * p for p in left] + [(1 - gamma[node]) * p for p in right]

    levels = int(math.log2(len(gamma) + 1))
    return leaves(0, 0, levels)


def ref_mixtape(head, g):
    c = head.config
    k, s = c.num_gates, c.num_frequent
    if c.scaled_input:
        g = g / math.sqrt(c.hidden_size)
    h = _act(head)(head.context_proj.weight @ g + head.context_proj.bias).view(k, -1)
    logits = torch.empty(c.vocab_size, dtype=g.dtype)
    for x in range(c.vocab_size):
        if k == 1:
            pi = [1.0]
        else:
            u = head.shared_gate.weight @ g
            if x < s:
                gate_ctx = torch.tanh(head._gate_weight() @ g + head.gate_proj.bias).view(k - 1, -1)
                gate_logits = gate_ctx @ head.gate_embedding[x] + u + head.gate_bias[x]
            else:
                gate_logits = u
            pi = _tree_priors(torch.sigmoid(gate_logits))
        logits[x] = sum(pi[j] * (h[j] @ head.weight[x]) for j in range(k)) + (
            0.0 if head.bias is None else head.bias[x]
        )
    return torch.log(_softmax_probs(_mapped(head, logits)))


def ref_ds_softmax(head, g):
    """Top-1 expert of softmax(W_gate g) (dead experts excluded); its gate value scales its logits;
    softmax over the expert's surviving classes, -inf (probability 0) elsewhere (evaluation mode)."""
    alive = head.mask.any(1)
    gate_logits = (head.gate.weight @ g).masked_fill(~alive, float("-inf"))
    probs = _softmax_probs(gate_logits)
    e = int(torch.argmax(probs))
    z = probs[e] * (head.weight[e] @ g + (0.0 if head.bias is None else head.bias[e]))
    out = torch.full_like(z, float("-inf"))
    keep = head.mask[e]
    out[keep] = torch.log(_softmax_probs(z[keep]))
    return out


def ref_class_softmax(head, g):
    """p(x) = p(class of x) * p(x | its class): a softmax over the classes, one over each class's tokens."""
    c = head.config
    class_bias = 0.0 if head.class_proj.bias is None else head.class_proj.bias
    p_class = _softmax_probs(head.class_proj.weight @ g + class_bias)
    out = torch.empty(c.vocab_size, dtype=g.dtype)
    start = 0
    for k, end in enumerate(c.class_boundaries):
        z = torch.stack([head.weight[x] @ g + (0.0 if head.bias is None else head.bias[x]) for x in range(start, end)])
        p_word = _softmax_probs(z)
        for x in range(start, end):
            out[x] = torch.log(p_class[k] * p_word[x - start])
        start = end
    return out


def ref_d_softmax(head, g):
    """Band i's tokens (consecutive ids) get logits from band i's segment of g (consecutive dims) only;
    one softmax over every logit."""
    c = head.config
    logits = torch.empty(c.vocab_size, dtype=g.dtype)
    row = col = 0
    for w, dim in zip(head.band_weights, c.band_dims):
        for x in range(w.shape[0]):
            bias = 0.0 if head.bias is None else head.bias[row + x]
            logits[row + x] = sum(w[x, j] * g[col + j] for j in range(dim)) + bias
        row, col = row + w.shape[0], col + dim
    assert (row, col) == (c.vocab_size, c.hidden_size)
    return torch.log(_softmax_probs(logits))


def ref_svd_softmax(head, g):
    """SVD-softmax as the paper draws it, one query, float64: W = U S V^T; preview with the chosen rotated
    dimensions; the num_refine best preview logits replaced by exact ones; one softmax."""
    c = head.config
    w, g = head.weight.detach().double(), g.detach().double()
    b = 0.0 if head.bias is None else head.bias.detach().double()
    u, s, vt = torch.linalg.svd(w, full_matrices=False)
    z = vt @ g
    if c.preview_dims == "leading":
        dims = list(range(c.preview_rank))
    else:
        dims = sorted(range(len(s)), key=lambda j: -float(s[j] * abs(z[j])))[: c.preview_rank]
    logits = sum(u[:, j] * s[j] * z[j] for j in dims) + b
    for x in sorted(range(c.vocab_size), key=lambda x: -float(logits[x]))[: c.num_refine]:
        logits[x] = w[x] @ g + (0.0 if head.bias is None else b[x])
    return torch.log(_softmax_probs(logits))


# ------------------------------------------------------------------ degenerate cases -> plain softmax
def _softmax_like(head, weight, bias):
    import hf_heads

    return (
        hf_heads.build_head(
            "softmax",
            hidden_size=weight.shape[1],
            vocab_size=weight.shape[0],
            weight=weight,
            bias=bias,
            use_bias=bias is not None,
            logit_scale=head.config.logit_scale,
            logit_softcap=head.config.logit_softcap,
        )
        .to(weight.dtype)
        .eval()
    )


def _reset_plif(head):
    plif = getattr(head, "plif", None)
    if plif is not None:
        with torch.no_grad():
            plif.slope_params.fill_(math.log(math.e - 1.0))  # the identity start


def degenerate_mos(head, hidden):
    """K = 1 (built so by the case), PLIF (if any) at its identity start: a softmax over tanh(H g + c)."""
    _reset_plif(head)
    ctx = torch.tanh(hidden @ head.context_proj.weight.T + head.context_proj.bias)
    return _softmax_like(head, head.weight, head.bias)(ctx)


def degenerate_mixtape(head, hidden):
    """All gate parameters 0 -> every prior 1/K -> a softmax over the mean context."""
    with torch.no_grad():
        for p in (
            head.gate_proj.weight,
            head.gate_proj.bias,
            head.shared_gate.weight,
            head.gate_embedding,
            head.gate_bias,
        ):
            p.zero_()
    c = head.config
    g = hidden / math.sqrt(c.hidden_size) if c.scaled_input else hidden
    ctx = torch.tanh(g @ head.context_proj.weight.T + head.context_proj.bias)
    mean_ctx = ctx.view(*ctx.shape[:-1], c.num_gates, -1).mean(-2)
    return _softmax_like(head, head.weight, head.bias)(mean_ctx)


def degenerate_identity_start(head, hidden):
    """identity_init + identity contexts: every h_k = g, so MoS / Mixtape equal the softmax of W g + b
    whatever the priors and gates (and PLIF, if any, at its identity start)."""
    _reset_plif(head)
    head.init_contexts_as_identity()
    return _softmax_like(head, head.weight, head.bias)(hidden)


def degenerate_plif(head, hidden):
    """At initialisation f is the identity: the head is a softmax of the same logits."""
    _reset_plif(head)
    return _softmax_like(head, head.weight, head.bias)(hidden)


def degenerate_ds_softmax(head, hidden):
    """One expert (built so by the case): its gate value is 1, so the head is a plain softmax."""
    return _softmax_like(head, head.weight[0], None if head.bias is None else head.bias[0])(hidden)


def degenerate_class_softmax(head, hidden):
    """One class (built so by the case): p(class) = 1, so the head is a plain softmax of W g + b."""
    return _softmax_like(head, head.weight, head.bias)(hidden)


def degenerate_d_softmax(head, hidden):
    """One band of every token and all of g (built so by the case): a plain softmax of W_1 g + b."""
    return _softmax_like(head, head.band_weights[0], head.bias)(hidden)


# ------------------------------------------------------------------ what a head keeps of a projection it starts from
def kept_whole(head, weight):
    """``(the head's copy, what it must equal)``: most heads keep the V x d projection as it is (DS-Softmax
    keeps one copy per expert)."""
    return head.weight.detach(), weight.expand_as(head.weight)


def kept_d_softmax_blocks(head, weight):
    """D-Softmax keeps, for every band, the block of its rows (tokens) and its columns (segment of g)."""
    expected = torch.zeros_like(weight)
    row = col = 0
    for size, dim in zip([len(w) for w in head.band_weights], head.config.band_dims):
        expected[row : row + size, col : col + dim] = weight[row : row + size, col : col + dim]
        row, col = row + size, col + dim
    return head.dense_weight().detach(), expected


def degenerate_full_preview(head, hidden):
    """SVD-softmax whose preview uses every rotated dimension (built so by the case) is exact: W g = U S V^T g."""
    return _softmax_like(head, head.weight, head.bias)(hidden)


# ------------------------------------------------------------------ the table
@dataclass
class HeadCase:
    name: str
    options: Dict = field(default_factory=dict)
    reference: Optional[Callable] = None
    degenerate: Optional[Callable] = None  # (head, hidden) -> expected log-probs; may edit head
    degenerate_options: Dict = field(default_factory=dict)
    id: str = ""
    ties: bool = True  # the output embedding can be shared with an input embedding
    # evaluation mode approximates the training-mode softmax (SVD-softmax): gradients are checked in
    # training mode, the evaluation path against its own slow reference
    approximate: bool = False
    has_aux: bool = False  # aux_loss() is a real regulariser (else it must be 0)
    # (head, the V x d projection it was built from) -> (what it kept of it, what that must equal)
    kept_projection: Callable = kept_whole

    def __post_init__(self):
        self.id = self.id or self.name


#: a Mixtape started as the softmax it is built from (identity contexts)
MIXTAPE_IDENTITY = {
    "num_gates": 4,
    "frequent_fraction": 0.5,
    "gate_embedding_size": 3,
    "context_activation": "identity",
    "identity_init": True,
}
HEAD_CASES = [
    HeadCase("softmax", {}, ref_softmax),
    HeadCase("softmax", {"use_bias": False}, ref_softmax, id="softmax-nobias"),
    HeadCase("sigsoftmax", {}, ref_sigsoftmax),
    HeadCase("mos", {"num_components": 3, "embedding_size": 5}, ref_mos, degenerate_mos, {"num_components": 1}),
    HeadCase(
        "mixtape", {"num_gates": 4, "frequent_fraction": 0.5, "gate_embedding_size": 3}, ref_mixtape, degenerate_mixtape
    ),
    HeadCase(
        "mixtape",
        {
            "num_gates": 8,
            "frequent_fraction": 0.3,
            "gate_embedding_size": 2,
            "gate_weight_norm": True,
            "embedding_size": 4,
        },
        ref_mixtape,
        id="mixtape-k8-wn",
    ),
    HeadCase(
        "mixtape",
        {"num_gates": 2, "frequent_fraction": 1.0, "gate_embedding_size": 3},
        ref_mixtape,
        id="mixtape-k2-allfrequent",
    ),
    HeadCase(
        "mixtape",
        {
            "num_gates": 4,
            "frequent_fraction": 0.5,
            "gate_embedding_size": 3,
            "gate_weight_norm": True,
            "scaled_input": False,
        },
        ref_mixtape,
        degenerate_mixtape,
        id="mixtape-unscaled-wn",
    ),
    HeadCase(
        "mos",
        {"num_components": 3, "context_activation": "identity", "identity_init": True},
        ref_mos,
        degenerate_identity_start,
        id="mos-identity-start",
    ),
    HeadCase("mixtape", MIXTAPE_IDENTITY, ref_mixtape, degenerate_identity_start, id="mixtape-identity-start"),
    HeadCase("plif", {"num_knots": 16, "knot_range": 2.0}, ref_plif, degenerate_plif),
    HeadCase(
        "mos_plif",
        {"num_components": 2, "num_knots": 16, "knot_range": 2.0},
        ref_mos_plif,
        degenerate_mos,
        {"num_components": 1},
    ),
    HeadCase(
        "mos_plif",
        {
            "num_components": 2,
            "num_knots": 16,
            "knot_range": 2.0,
            "context_activation": "identity",
            "identity_init": True,
        },
        ref_mos_plif,
        degenerate_identity_start,
        id="mos_plif-identity-start",
    ),
    HeadCase(
        "ds_softmax",
        {"num_experts": 3},
        ref_ds_softmax,
        degenerate_ds_softmax,
        {"num_experts": 1},
        ties=False,
        has_aux=True,
    ),
    HeadCase(
        "ds_softmax",
        {"num_experts": 4, "use_bias": False, "gate_noise": False},
        ref_ds_softmax,
        ties=False,
        has_aux=True,
        id="ds_softmax-nobias",
    ),
    HeadCase("class_softmax", {"num_classes": 3}, ref_class_softmax, degenerate_class_softmax, {"num_classes": 1}),
    HeadCase(
        "class_softmax",
        {"class_boundaries": [2, 3, 7, 11], "use_bias": False},
        ref_class_softmax,
        id="class_softmax-boundaries-nobias",
    ),
    HeadCase(
        "d_softmax",
        {},
        ref_d_softmax,
        degenerate_d_softmax,
        {"band_fractions": [1.0], "band_dims": [HIDDEN]},
        ties=False,
        kept_projection=kept_d_softmax_blocks,
    ),
    HeadCase(
        "d_softmax",
        {"band_fractions": [0.3, 0.7], "band_dims": [4, 2], "use_bias": False},
        ref_d_softmax,
        ties=False,
        kept_projection=kept_d_softmax_blocks,
        id="d_softmax-2bands-nobias",
    ),
    HeadCase(
        "svd_softmax",
        {"preview_rank": 2, "num_refine": 4},
        ref_svd_softmax,
        degenerate_full_preview,
        {"preview_rank": HIDDEN},
        approximate=True,
    ),
    HeadCase(
        "svd_softmax",
        {"preview_rank": 3, "num_refine": 5, "preview_dims": "leading", "use_bias": False, "preview_half": False},
        ref_svd_softmax,
        approximate=True,
        id="svd_softmax-leading-nobias",
    ),
    # the bandit serves topk only; with d <= initial_pulls it reads every coordinate, so topk is exact here
    # (tests/test_fast_heads.py checks the sampling itself at larger d)
    HeadCase("adaptive_sampling", {}, ref_softmax),
    # a fixed scale / soft-cap of the logits before the softmax(es), as swap_head moves it from a model (Gemma 2's cap,
    # Cohere's scale): on each component's logits (MoS), on the gated logits (Mixtape), before PLIF's f
    HeadCase("softmax", {"logit_scale": 1.3, "logit_softcap": 1.5}, ref_softmax, id="softmax-capped"),
    HeadCase("softmax", {"logit_scale": 0.25}, ref_softmax, id="softmax-scaled"),
    HeadCase("softmax", {"logit_scale": 3.0, "logit_softcap": 1.0}, ref_softmax, id="softmax-saturated"),  # tanh ~ 1
    HeadCase("sigsoftmax", {"logit_softcap": 1.5}, ref_sigsoftmax, id="sigsoftmax-capped"),
    HeadCase(
        "plif", {"num_knots": 16, "knot_range": 2.0, "logit_softcap": 1.5}, ref_plif, degenerate_plif, id="plif-capped"
    ),
    HeadCase(
        "mos",
        {"num_components": 3, "context_activation": "identity", "identity_init": True, "logit_softcap": 1.5},
        ref_mos,
        degenerate_identity_start,
        id="mos-capped-identity-start",
    ),
    HeadCase(
        "mos_plif",
        {"num_components": 2, "num_knots": 16, "knot_range": 2.0, "logit_scale": 0.7, "logit_softcap": 1.5},
        ref_mos_plif,
        degenerate_mos,
        {"num_components": 1},
        id="mos_plif-capped",
    ),
    HeadCase(
        "mixtape",
        {**MIXTAPE_IDENTITY, "logit_scale": 1.3, "logit_softcap": 1.5},
        ref_mixtape,
        degenerate_identity_start,
        id="mixtape-capped-identity-start",
    ),
]


def build_case(case: HeadCase, dtype=torch.float32, seed=0, **extra):
    """Build the case's head, seeded, in eval mode (``randomise`` moves it off its initial values)."""
    import hf_heads

    torch.manual_seed(seed)
    head = hf_heads.build_head(case.name, hidden_size=HIDDEN, vocab_size=VOCAB, **{**case.options, **extra})
    return head.to(dtype).eval()


def quiet(case: HeadCase, dtype=torch.float32):
    """The case's head with its randomness off (no gate noise), perturbed off its initial values (:func:`randomise`)."""
    import hf_heads

    fields = hf_heads.get_head_class(case.name).config_class.__dataclass_fields__
    extra = {"gate_noise": type(fields["gate_noise"].default)(0)} if "gate_noise" in fields else {}
    return randomise(build_case(case, dtype=dtype, **extra))


def randomise(head, scale=0.5):
    """Perturb every parameter, so nothing sits at a trivial value (PLIF's identity start, zero
    gate biases) that could hide a bug."""
    with torch.no_grad():
        for p in head.parameters():
            p.add_(scale * torch.randn_like(p))
    return head
