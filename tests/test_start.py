"""``start``: one word for "start the head at the model it replaces" (hf_heads.core.start), for every head."""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_heads
from head_cases import HEAD_CASES

#: options that make each head buildable on a small vocabulary (its other options at their defaults)
SMALL = {case.name: case.options for case in reversed(HEAD_CASES)}
V, D = 40, 8


def _projection():
    torch.manual_seed(0)
    return torch.randn(V, D), torch.randn(V) * 0.1, torch.randn(6, D)


@pytest.mark.parametrize("name", hf_heads.available_heads())
def test_pretrained_start_is_exact_or_refused_and_nearest_warns(name):
    """start='pretrained': the head's log-probs equal softmax(W g + b) (1e-5) where its class says it has an exact
    start, in the mode it is exact in; refused with the reason otherwise, and 'nearest' builds it with a warning."""
    weight, bias, hidden = _projection()
    model = torch.log_softmax(hidden @ weight.T + bias, dim=-1)
    exact = hf_heads.get_head_class(name).pretrained_start or {}
    options = {k: v for k, v in SMALL[name].items() if k not in ("context_activation", "identity_init", *exact)}
    options.pop("embedding_size", None)
    if name == "svd_softmax":
        options["num_refine"] = 4  # fewer than V: its evaluation preview approximates (with V it would refine all)
    if hf_heads.has_exact_start(name):
        head = hf_heads.build_head(name, D, V, weight=weight, bias=bias, start="pretrained", **options).eval()
        with torch.no_grad():
            torch.testing.assert_close(head(hidden), model, rtol=0, atol=1e-5)
        for key, value in hf_heads.get_head_class(name).pretrained_start.items():
            assert getattr(head.config, key) == value
        return
    with pytest.raises(ValueError, match=f"build_head: start='pretrained': the {name} head has no start that equals"):
        hf_heads.build_head(name, D, V, weight=weight, bias=bias, start="pretrained", **options)
    with pytest.warns(UserWarning, match=f"start='nearest': the {name} head does not start as the model"):
        head = hf_heads.build_head(name, D, V, weight=weight, bias=bias, start="nearest", **options)
    head.eval()
    with torch.no_grad():
        assert (head(hidden) - model).abs().max() > 1e-3  # the nearest start is not the model: the warning was due


def test_identity_init_alone_is_not_the_model_and_options_are_not_overridden():
    """identity_init=True keeps tanh contexts (not the model); start='pretrained' does not silently override an option
    the user gave otherwise; None leaves options as given; an unknown start names the choices."""
    weight, bias, hidden = _projection()
    model = torch.log_softmax(hidden @ weight.T + bias, dim=-1)
    head = hf_heads.build_head("mos", D, V, weight=weight, bias=bias, num_components=2, identity_init=True).eval()
    with torch.no_grad():
        assert (head(hidden) - model).abs().max() > 1e-2
    with pytest.raises(ValueError, match="sets the mos option context_activation='identity'.*give.*'tanh'"):
        hf_heads.build_head("mos", D, V, weight=weight, start="pretrained", context_activation="tanh")
    assert hf_heads.start_options("mos", None, {"num_components": 2}) == {"num_components": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact head's 'nearest' is its exact start, no warning
        assert hf_heads.start_options("mixtape", "nearest", {})["context_activation"] == "identity"
    with pytest.raises(ValueError, match=r"start='pretrain' is not a start \(did you mean 'pretrained'\?\)"):
        hf_heads.start_options("mos", "pretrain", {})


def test_convert_head_takes_start():
    """convert_head(..., start='pretrained') on an nn.Linear: a MoS that starts as the Linear's softmax."""
    weight, bias, hidden = _projection()
    linear = torch.nn.Linear(D, V)
    with torch.no_grad():
        linear.weight.copy_(weight), linear.bias.copy_(bias)
    head = hf_heads.convert_head(linear, "mos", start="pretrained", num_components=3).eval()
    with torch.no_grad():
        torch.testing.assert_close(head(hidden), torch.log_softmax(linear(hidden), -1), rtol=0, atol=1e-5)
