"""torch.compile: every head trains in a compiled HF model and in a compiled loss function, with the losses and
gradients of eager mode. The memory-lean loss runs autograd inside a custom autograd.Function; dynamo breaks the
graph around it, so that part runs eagerly; the reference loss (padding included) compiles as one graph.

aot_eager (dynamo + AOTAutograd, no code generation) runs for every head in the default run; inductor (the default
backend, which compiles C++ here, 20-75 s a head on 2 cores) for Mixtape, MoS, PLIF and DS-Softmax in the slow tier
(`make test-slow`)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from test_hf import HEADS, _no_randomness  # noqa: E402

CASES = [(name, "aot_eager") for name in HEADS] + [
    pytest.param(name, "inductor", marks=pytest.mark.slow) for name in ("mixtape", "mos", "plif", "ds_softmax")
]


def _model(name):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return _no_randomness(hf_heads.swap_head(model, name, **HEADS[name]).train())


def _step(model, forward, ids):
    model.zero_grad(set_to_none=True)
    loss = forward(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,backend", CASES)
def test_every_head_trains_under_torch_compile_as_in_eager_mode(name, backend):
    torch._dynamo.reset()
    model = _model(name)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    eager_loss, eager_grads = _step(model, model, ids)
    compiled = torch.compile(model, backend=backend)
    loss, grads = _step(model, compiled, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[key], rtol=1e-4, atol=1e-5, msg=key)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # and the compiled model keeps training
    for _ in range(2):
        optimizer.step()
        loss, _ = _step(model, compiled, ids)
    assert torch.isfinite(loss) and loss != eager_loss
    # the head's loss compiled on its own
    head = hf_heads.output_head(model)
    h = torch.randn(10, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    t = torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(2))
    expected = head.loss(h, t)
    (grad_h,) = torch.autograd.grad(expected, h)
    got = torch.compile(lambda h, t: head.loss(h, t), backend=backend)(h, t)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(got, h)[0], grad_h, rtol=1e-4, atol=1e-5)


# heads whose loss reads cached index tables (Mixtape's frequent ids, the class / band / expert tables): the cache
# lookup breaks the graph there, so they compile in pieces
CACHED_TABLES = {"mixtape", "class_softmax", "d_softmax", "ds_softmax"}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_reference_loss_compiles_as_one_graph_with_padding(name):
    """Without the lean loss, head.loss (ignored targets included) has no graph break in the target check:
    fullgraph=True compiles it (heads without cached tables), with the eager loss and gradient; a bad id still
    fails inside the compiled graph."""
    torch._dynamo.reset()
    head = hf_heads.output_head(_model(name))
    head.lean_loss = False
    h = torch.randn(12, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    t = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(2))
    t[::3] = -100
    expected = head.loss(h, t)
    (expected_grad,) = torch.autograd.grad(expected, h)
    compiled = torch.compile(lambda h, t: head.loss(h, t), backend="aot_eager", fullgraph=name not in CACHED_TABLES)
    got = compiled(h, t)
    (grad,) = torch.autograd.grad(got, h)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)
    t[0] = 64
    with pytest.raises(RuntimeError, match="outside"):
        compiled(h, t)
