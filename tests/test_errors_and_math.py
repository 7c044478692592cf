"""Bad input gets a ValueError naming the option, the value and what is allowed; and the
shared math (sigmoid tree, PLIF) checked on its own."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

import hf_heads
from hf_heads.core import ops

BAD_OPTIONS = [
    ("softmax", "hidden_size", 0, "integer in [1"),
    ("softmax", "vocab_size", 1, "integer in [2"),
    ("softmax", "dropout", 1.0, "[0.0, 1.0)"),
    ("softmax", "dropout", -0.1, "[0.0, 1.0)"),
    ("softmax", "embedding_size", 7, "equal to hidden_size"),
    ("softmax", "use_bias", "yes", "True or False"),
    ("mos", "num_components", 0, "integer in [1, 1024]"),
    ("mos", "num_components", 2.5, "must be an integer (got float)"),
    ("mos", "context_activation", "relu", "one of ('tanh', 'identity')"),
    ("mixtape", "identity_init", 1, "True or False"),
    ("mixtape", "num_gates", 3, "power of two"),
    ("mixtape", "num_gates", 0, "power of two"),
    ("mixtape", "frequent_fraction", 0.0, "(0.0, 1.0]"),
    ("mixtape", "frequent_fraction", 1.5, "(0.0, 1.0]"),
    ("mixtape", "gate_embedding_size", 0, "integer in [1"),
    ("mixtape", "gate_noise", -1.0, "[0.0, inf)"),
    ("mixtape", "gate_dropout", 1.0, "[0.0, 1.0)"),
    ("plif", "num_knots", 0, "integer in [1, 10000000]"),
    ("plif", "knot_range", 0.0, "(0.0, 1000000.0]"),
    ("plif", "knot_range", float("nan"), "(0.0, 1000000.0]"),
    ("mos_plif", "num_knots", 10**8, "integer in [1, 10000000]"),
    ("mos_plif", "num_components", -1, "integer in [1, 1024]"),
    ("class_softmax", "num_classes", 0, "integer in [1, 20]"),
    ("class_softmax", "num_classes", 21, "integer in [1, 20]"),
    ("class_softmax", "class_boundaries", [5, 3, 20], "strictly increasing list of class end ids in [1, 20]"),
    ("class_softmax", "class_boundaries", [5, 19], "ending at vocab_size=20"),
    ("class_softmax", "class_boundaries", [0, 20], "in [1, 20]"),
    ("class_softmax", "search_classes", 5, "integer in [1, 4]"),
    ("d_softmax", "band_fractions", [0.5, 0.6], "summing to 1"),
    ("d_softmax", "band_fractions", [0.01, 0.99], "each band holding at least one of the vocab_size=20 tokens"),
    ("d_softmax", "band_fractions", [0.0, 1.0], "fractions in (0, 1]"),
    ("d_softmax", "band_fractions", [0.1] * 10, "at most hidden_size=8 bands"),
    ("d_softmax", "band_dims", [4, 3], "summing to hidden_size=8"),
    ("d_softmax", "band_dims", [8, 0], "integers >= 1"),
    ("d_softmax", "band_dims", [1] * 8 + [0.5], "integers >= 1"),
    ("svd_softmax", "preview_rank", 9, "integer in [1, 8]"),
    ("svd_softmax", "preview_rank", 0, "integer in [1, 8]"),
    ("svd_softmax", "num_refine", 21, "integer in [1, 20]"),
    ("svd_softmax", "preview_dims", "random", "'adaptive' or 'leading'"),
    ("svd_softmax", "preview_half", 1, "True or False"),
    ("adaptive_sampling", "epsilon", 0.0, "(0.0, 1.0)"),
    ("adaptive_sampling", "delta", 1.0, "(0.0, 1.0)"),
    ("adaptive_sampling", "initial_pulls", 0, "integer in [1"),
    ("adaptive_sampling", "variance_scale", 0.0, "(0.0, inf)"),
]


@pytest.mark.parametrize("check", [hf_heads.build_head, hf_heads.check_head_options])
@pytest.mark.parametrize("name,opt,value,allowed", BAD_OPTIONS, ids=[f"{n}-{o}-{v}" for n, o, v, _ in BAD_OPTIONS])
def test_out_of_range_option_names_option_value_and_range(name, opt, value, allowed, check):
    """build_head, and check_head_options (which builds nothing), stop on the same bad options with one message."""
    kwargs = {"hidden_size": 8, "vocab_size": 20, opt: value}
    with pytest.raises(ValueError) as err:
        check(name, **kwargs)
    msg = str(err.value)
    assert name in msg and f"{opt}=" in msg and repr(value) in msg and allowed in msg, msg


def test_check_head_options_gives_the_config_build_head_builds_from_and_checks_what_needs_the_class(monkeypatch):
    import dataclasses

    for name in hf_heads.available_heads():
        checked = dataclasses.asdict(hf_heads.check_head_options(name, hidden_size=8, vocab_size=20))
        built = dataclasses.asdict(hf_heads.build_head(name, hidden_size=8, vocab_size=20).config)
        # the same options; the head fills the ones left to it (None: Mixtape's form, scaled_input)
        assert {k: v for k, v in checked.items() if v is not None} == {
            k: built[k] for k, v in checked.items() if v is not None
        }, name
        assert checked.keys() == built.keys(), name
    # a head without a context projection multiplies g itself with W: its class says so, not a trial build
    assert not hf_heads.get_head_class("softmax").projects_context and hf_heads.get_head_class("mos").projects_context
    with pytest.raises(ValueError, match="softmax: option embedding_size=4 is out of range; allowed: equal to"):
        hf_heads.check_head_options("softmax", hidden_size=8, vocab_size=20, embedding_size=4)
    assert hf_heads.check_head_options("mos", hidden_size=8, vocab_size=20, embedding_size=4).embedding_size == 4
    # and it builds nothing: no parameter is made
    monkeypatch.setattr(torch.nn, "Parameter", None)
    hf_heads.check_head_options("mixtape", hidden_size=8, vocab_size=20, num_gates=4)


def test_a_stored_spec_gets_the_defaults_of_its_version_from_the_heads_class():
    from hf_heads.core import SPEC_VERSION, versioned_options

    assert hf_heads.get_head_class("mixtape").legacy_defaults == {1: {"scaled_input": True}} and SPEC_VERSION == 2
    assert versioned_options("mixtape", {"num_gates": 4}, 1) == {"num_gates": 4, "scaled_input": True}
    assert versioned_options("mixtape", {"scaled_input": False}, 1) == {"scaled_input": False}  # given wins
    assert versioned_options("mixtape", {}, 2) == {} and versioned_options("mos", {}, 1) == {}
    assert versioned_options("not-a-head", {"a": 1}, 1) == {"a": 1}


def test_identity_init_needs_square_contexts():
    with pytest.raises(
        ValueError, match="identity_init=True needs embedding_size == hidden_size; got embedding_size=4"
    ):
        hf_heads.build_head("mos", hidden_size=8, vocab_size=20, embedding_size=4, identity_init=True)


def test_unknown_head_lists_available_heads():
    with pytest.raises(
        ValueError, match=r"unknown output head 'mixtap' \(did you mean 'mixtape'\?\); available heads: "
    ):
        hf_heads.build_head("mixtap", hidden_size=8, vocab_size=20)


def test_unknown_option_lists_allowed_options():
    with pytest.raises(
        ValueError,
        match=r"mixtape: unknown option\(s\) num_gate \(did you mean num_gates\?\); "
        r"allowed options: .*num_gates",
    ):
        hf_heads.build_head("mixtape", hidden_size=8, vocab_size=20, num_gate=4)


@pytest.fixture
def head():
    return hf_heads.build_head("mos", hidden_size=8, vocab_size=20, num_components=2)


def test_wrong_hidden_size(head):
    with pytest.raises(
        ValueError, match=re.escape("hidden has shape (3, 7); expected [..., hidden_size] with hidden_size=8")
    ):
        head(torch.randn(3, 7))
    with pytest.raises(ValueError, match="expected a floating-point tensor"):
        head(torch.ones(3, 8, dtype=torch.long))


def test_target_out_of_range_or_mismatched(head):
    h = torch.randn(2, 3, 8)
    with pytest.raises(
        ValueError, match=re.escape("target contains 20; allowed: token ids in [0, 20) or ignore_index=-100")
    ):
        head.loss(h, torch.tensor([[1, 2, 20], [0, 0, 0]]))
    with pytest.raises(ValueError, match=re.escape("target contains -1; allowed")):
        head.loss(h, torch.tensor([[1, 2, -1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=re.escape("target has shape (6,); expected (2, 3)")):
        head.loss(h, torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="target has dtype torch.float32; expected an integer tensor"):
        head.loss(h, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="reduction='avg'; allowed: 'mean', 'sum', 'none'"):
        head.loss(h, torch.zeros(2, 3, dtype=torch.long), reduction="avg")
    # ignore_index itself is fine, even when outside [0, V)
    assert torch.isfinite(head.loss(h, torch.tensor([[1, 2, -100], [0, 0, 0]])))


def test_bad_k_and_bad_projection(head):
    with pytest.raises(ValueError, match=re.escape("k=21 is out of range; allowed: an integer in [1, 20]")):
        head.topk(torch.randn(8), 21)
    with pytest.raises(
        ValueError, match=re.escape("weight has shape (20, 9); expected (vocab_size, embedding_size) = (20, 8)")
    ):
        hf_heads.build_head("mos", hidden_size=8, vocab_size=20, embedding_size=8, weight=torch.randn(20, 9))
    with pytest.raises(ValueError, match=re.escape("bias has shape (19,); expected (vocab_size,) = (20,)")):
        hf_heads.build_head("softmax", hidden_size=8, vocab_size=20, weight=torch.randn(20, 8), bias=torch.randn(19))
    with pytest.raises(ValueError, match=re.escape("cannot tie to an embedding of shape (21, 8)")):
        head.tie_weight(torch.nn.Embedding(21, 8))


def test_load_head_from_a_wrong_directory(tmp_path):
    with pytest.raises(ValueError, match="is not a directory written by save_head"):
        hf_heads.load_head(tmp_path)


# ----------------------------------------------------------------------------- sigmoid tree
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_sigmoid_tree_is_a_distribution(k):
    logits = 3 * torch.randn(5, 7, k - 1, dtype=torch.float64)
    log_pi = ops.sigmoid_tree_log_priors(logits)
    assert log_pi.shape == (5, 7, k)
    torch.testing.assert_close(log_pi.exp().sum(-1), torch.ones(5, 7, dtype=torch.float64))


def test_sigmoid_tree_k4_is_the_papers_equation_3():
    gate_logits = torch.randn(10, 3, dtype=torch.float64)
    g1, g2, g3 = torch.sigmoid(gate_logits).unbind(-1)
    paper = torch.stack([g1 * g2, g1 * (1 - g2), (1 - g1) * g3, (1 - g1) * (1 - g3)], -1)
    torch.testing.assert_close(ops.sigmoid_tree_log_priors(gate_logits).exp(), paper)


def test_sigmoid_tree_rejects_a_wrong_number_of_gates():
    with pytest.raises(ValueError, match="2\\^L - 1 gates, got 4"):
        ops.sigmoid_tree_log_priors(torch.randn(2, 4))


# ----------------------------------------------------------------------------- PLIF
def _naive_plif(z, slopes, knot_range):
    """The naive autograd form of the authors' code (gather + prefix sum), for gradients."""
    num_knots = slopes.shape[0]
    step = 2 * knot_range / num_knots
    idx = ((z + knot_range) / step).floor().clamp(0, num_knots - 1).long().detach()
    offset = torch.cumsum(slopes * step, 0) - slopes * step
    return offset[idx] + slopes[idx] * (z - (-knot_range + step * idx.to(z.dtype))) - knot_range


def test_plif_matches_reference_inside_and_outside_the_range():
    slopes = torch.rand(50, dtype=torch.float64) + 0.1
    z = torch.linspace(-8, 8, 401, dtype=torch.float64)  # R = 3: both extrapolation sides
    torch.testing.assert_close(
        ops.piecewise_linear_increasing(z, slopes, 3.0), ops.piecewise_linear_increasing_reference(z, slopes, 3.0)
    )
    f = ops.piecewise_linear_increasing(z, slopes, 3.0)
    assert (f.diff() > 0).all()  # monotone increasing


def test_plif_gradients_match_the_naive_form_and_gradcheck():
    slopes = (torch.rand(9, dtype=torch.float64) + 0.2).requires_grad_()
    z = (3 * torch.randn(4, 6, dtype=torch.float64)).requires_grad_()
    w = torch.randn(4, 6, dtype=torch.float64)
    ours = torch.autograd.grad((ops.piecewise_linear_increasing(z, slopes, 2.0) * w).sum(), (z, slopes))
    naive = torch.autograd.grad((_naive_plif(z, slopes, 2.0) * w).sum(), (z, slopes))
    for a, b in zip(ours, naive):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda zz, ss: ops.piecewise_linear_increasing(zz, ss, 2.0), (z, slopes))


def test_plif_with_a_million_knots_is_exact_and_identity_at_init():
    plif_head = hf_heads.build_head("plif", hidden_size=8, vocab_size=30, num_knots=1_000_000, knot_range=20.0)
    z = torch.tensor([-25.0, -20.0, -3.3, 0.0, 1e-4, 7.25, 19.99, 30.0], dtype=torch.float64)
    slopes = plif_head.plif.slopes(torch.float64)  # 1 up to the float32 rounding of log(e - 1)
    torch.testing.assert_close(ops.piecewise_linear_increasing(z, slopes, 20.0), z, rtol=0, atol=1e-6)
    with torch.no_grad():
        plif_head.plif.slope_params.copy_(torch.randn(1_000_000))
    slopes = plif_head.plif.slopes(torch.float64)
    torch.testing.assert_close(
        ops.piecewise_linear_increasing(z, slopes, 20.0),
        ops.piecewise_linear_increasing_reference(z, slopes, 20.0),
        rtol=1e-9,
        atol=1e-6,
    )


# ----------------------------------------------------------------------------- Mixtape specifics
def _mixtape(**kw):
    return hf_heads.build_head("mixtape", hidden_size=8, vocab_size=30, gate_embedding_size=4, **kw)


def test_mixtape_gate_noise_only_in_training():
    head = _mixtape(gate_noise=0.5)
    h = torch.randn(5, 8)
    head.eval()
    assert torch.equal(head(h), head(h))
    head.train()
    assert not torch.allclose(head(h), head(h))
    head_quiet = _mixtape(gate_noise=0.0).train()
    assert torch.equal(head_quiet(h), head_quiet(h))


@pytest.mark.parametrize("scaled", [True, False])
def test_mixtape_weight_norm_keeps_gate_rows_at_constant_norm(scaled):
    head = _mixtape(gate_weight_norm=True, scaled_input=scaled)
    with torch.no_grad():
        head.gate_proj.weight.mul_(torch.rand(head.gate_proj.weight.shape[0], 1) * 10)
    norms = head._gate_weight().norm(dim=1)
    # the norm the rows have at initialisation: sqrt(d1) for unit-variance draws, 1 for nn.Linear's d1^-1/2
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(8) if scaled else 1.0))


def test_mixtape_unscaled_input_is_the_same_function_with_weights_sqrt_d_smaller():
    h = torch.randn(5, 8)
    heads = {}
    for scaled in (True, False):
        torch.manual_seed(3)
        heads[scaled] = _mixtape(scaled_input=scaled, gate_weight_norm=True).eval()
    mesh, plain = heads[True], heads[False]
    for name in ("context_proj", "gate_proj", "shared_gate"):
        torch.testing.assert_close(getattr(plain, name).weight, getattr(mesh, name).weight / math.sqrt(8))
    torch.testing.assert_close(plain.scores_2d(h), mesh.scores_2d(h))
    norms = plain._gate_weight().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))
    # one SGD step moves the unscaled head's output further: its weights are d1 = 8 times as sensitive
    moved = {}
    for scaled, head in heads.items():
        head.train()
        head.config.gate_noise = 0.0
        loss = head.scores_2d(h).logsumexp(-1).sum()
        loss.backward()
        with torch.no_grad():
            before = head.eval().scores_2d(h)
            head.context_proj.weight.sub_(0.1 * head.context_proj.weight.grad)
            moved[scaled] = (head.scores_2d(h) - before).abs().sum()
    assert moved[False] > 4 * moved[True]


def test_mixtape_form_is_kept_with_the_weights_and_old_weights_load_scaled():
    """Since spec version 2 a new Mixtape head is in the nn.Linear form; the form is saved with its weights
    (``scaled_form``), and a state dict saved before (no entry; the default was scaled then) loads scaled unless
    scaled_input is given."""
    h = torch.randn(5, 8)
    assert _mixtape().config.scaled_input is False and float(_mixtape().scaled_form) == 0.0
    torch.manual_seed(0)
    scaled = _mixtape(scaled_input=True).eval()
    state = scaled.state_dict()
    assert float(state["scaled_form"]) == 1.0
    old = {k: v for k, v in state.items() if k != "scaled_form"}  # as saved by 0.1.0
    for saved in (state, old):
        head = _mixtape().eval()
        head.load_state_dict(saved)
        assert head.config.scaled_input is True and head.context_input_scale == 8**-0.5
        torch.testing.assert_close(head(h), scaled(h))
        assert float(head.state_dict()["scaled_form"]) == 1.0  # saved again: the form goes with the weights
    given = _mixtape(scaled_input=False).eval()
    given.load_state_dict(old)  # an old state dict whose form its user states: taken as given
    assert given.config.scaled_input is False
    with pytest.raises(
        ValueError,
        match=r"scaled_input=False was given, but these weights were trained with "
        r"scaled_input=True",
    ):
        _mixtape(scaled_input=False).load_state_dict(state)
    torch.manual_seed(0)
    plain = _mixtape().eval()
    head = _mixtape(scaled_input=None).eval()
    head.load_state_dict(plain.state_dict())
    assert head.config.scaled_input is False
    torch.testing.assert_close(head(h), plain(h))


def test_mixtape_frequent_count_and_shared_gate_for_the_rest():
    head = _mixtape(frequent_fraction=0.2).eval()
    assert head.config.num_frequent == 6 and head.gate_embedding.shape == (6, 4)
    # changing a frequent token's own gate embedding moves only that token's logit
    h = torch.randn(3, 8)
    before = head.scores_2d(h)
    with torch.no_grad():
        head.gate_embedding[2].add_(1.0)
    diff = (head.scores_2d(h) - before).abs().amax(0)
    assert diff[2] > 0 and diff[torch.arange(30) != 2].max() == 0


@pytest.mark.parametrize(
    "name,option,value,expected",
    [
        ("mixtape", "num_gates", "4", "must be an integer (got str)"),
        ("mixtape", "frequent_fraction", "0.5", "must be a number (got str)"),
        ("mixtape", "gate_weight_norm", "false", "must be True or False (got str)"),
        ("mos", "num_components", 2.0, "must be an integer (got float)"),
        ("mos", "identity_init", 1, "must be True or False (got int)"),
        ("plif", "num_knots", True, "must be an integer (got bool)"),
        ("softmax", "use_bias", "yes", "must be True or False (got str)"),
        ("svd_softmax", "preview_half", None, "must be True or False (got NoneType)"),
    ],
)
def test_a_value_of_the_wrong_type_says_so(name, option, value, expected):
    with pytest.raises(ValueError) as e:
        hf_heads.build_head(name, hidden_size=8, vocab_size=20, **{option: value})
    assert f"{name}: option {option}={value!r} {expected}" == str(e.value)


def test_a_misspelt_option_suggests_the_nearest_name():
    with pytest.raises(ValueError, match=r"unknown option\(s\) num_gate \(did you mean num_gates\?\); allowed"):
        hf_heads.build_head("mixtape", hidden_size=8, vocab_size=20, num_gate=4)
    with pytest.raises(ValueError, match=r"unknown option\(s\) zzz; allowed"):  # nothing near: no guess
        hf_heads.build_head("mixtape", hidden_size=8, vocab_size=20, zzz=4)


def test_has_aux_loss_marks_exactly_the_heads_with_a_regulariser():
    """What adapters read to refuse training paths that would drop the aux loss (fairseq's stock criteria)."""
    for name in hf_heads.available_heads():
        head = hf_heads.build_head(name, hidden_size=8, vocab_size=20).train()
        head.loss(torch.randn(6, 8), torch.randint(0, 20, (6,)))
        assert head.has_aux_loss == bool(head.aux_loss() != 0), name


def test_recipes_set_the_shared_machine_openmp_default_only_before_torch():
    """The recipes (``python -m recipes.NAME``) set OMP_WAIT_POLICY=PASSIVE when they load before torch and the
    variable is unset; never over a user's value, never once torch is loaded (OpenMP read it already)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import {0}, os; print(os.environ.get('OMP_WAIT_POLICY'))"
    run = lambda mods, **extra: subprocess.run(
        [sys.executable, "-c", code.format(mods)], capture_output=True, text=True, env={**env, **extra}
    ).stdout.strip()
    assert run("recipes") == "PASSIVE"
    assert run("recipes", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert run("torch, recipes") == "None"


@pytest.mark.parametrize("package", ["hf_heads", "hf_heads.hf", "fairseq_plugin"])
def test_importing_the_library_changes_nothing_in_the_process(package):
    """``import hf_heads`` (and its adapters) defines and registers, nothing else: the environment is as it was
    (no OMP_WAIT_POLICY, nothing torch's dynamo sets when it loads) and no installed module is hidden (an entry
    ``sys.modules[name] = None``, which makes ``import name`` fail)."""
    import subprocess
    import sys

    pytest.importorskip(
        package.split(".")[0] if package != "fairseq_plugin" else "fairseq",
        reason="the adapter's library is not installed: run `make install`",
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = (
        "import json, os, sys; before = dict(os.environ); import {0}; "
        "print(json.dumps([sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)),"
        " sorted(k for k, m in sys.modules.items() if m is None)]))"
    ).format(package)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    changed, hidden = json.loads(out.stdout.strip().splitlines()[-1])
    assert changed == [] and hidden == []
