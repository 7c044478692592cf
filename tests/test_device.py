"""The device tier: what can break on a GPU and nowhere else, run on the device given by ``--device``.

``make test`` runs it on the CPU (``--device cpu``, the default); ``make test-gpu`` runs it on CUDA
(``--device cuda``; without CUDA it says why and stops). Every head's log-probs, loss and every gradient on the
device equal the same head's on the CPU in float64; bf16 / fp16 autocast (and fp16 with a GradScaler) stays finite
and within a stated tolerance of fp32; the memory-lean loss equals the plain path on the device; ``topk`` (batch 1
included, the fast heads' serving path); GPT-2 and BART with mixtape / mos / ds_softmax train, generate (greedy and
beam) and save / load on the device; TRL's SFTTrainer trains a head model there. On the CPU, every head is also built
and run on the ``meta`` device: a tensor a head makes on the CPU (an ``arange``, an index table) then meets the head's
meta tensors and fails.
"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_heads
from head_cases import HEAD_CASES, HIDDEN, VOCAB, build_case, quiet
from hf_families import TINY_SEQ2SEQ

CASES = pytest.mark.parametrize("case", HEAD_CASES, ids=[c.id for c in HEAD_CASES])
#: fp32 on the device against float64 on the CPU: the tolerances of the CPU tests (tests/test_heads.py)
FP32 = dict(rtol=1e-5, atol=1e-5)
#: gradients sum over tokens and vocabulary: a little looser
FP32_GRAD = dict(rtol=1e-4, atol=1e-5)
#: the head's math runs in float32 under autocast (hf_heads.core.functional.autocast_off): against fp32 on the same
#: (rounded) inputs only the order of float32 sums differs
AUTOCAST = dict(rtol=1e-4, atol=1e-4)
#: a whole model under autocast against fp32: its trunk runs in low precision (bf16 keeps 8 bits of mantissa)
MODEL_AUTOCAST_LOSS = {torch.bfloat16: 0.05, torch.float16: 0.01}


def inputs(device, dtype=torch.float32, shape=(3, 2)):
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(*shape, HIDDEN, generator=g, dtype=torch.float64)
    target = torch.randint(0, VOCAB, shape, generator=g)
    target.view(-1)[0] = -100  # an ignored position
    return hidden.to(device, dtype), target.to(device)


def loss_and_grads(head, hidden, target):
    """Training-mode loss (the memory-lean path) and the gradients of hidden and of every parameter, on the CPU
    in float64."""
    hidden = hidden.detach().requires_grad_()
    head.zero_grad(set_to_none=True)
    loss = head.loss(hidden, target)
    loss.backward()
    grads = {n: p.grad for n, p in head.named_parameters() if p.grad is not None}
    return loss.detach().cpu().double(), hidden.grad.cpu().double(), {n: g.cpu().double() for n, g in grads.items()}


@CASES
def test_head_on_the_device_equals_float64_on_the_cpu(case, device):
    ref = quiet(case, torch.float64)
    head = copy.deepcopy(ref).float().to(device)
    hidden, target = inputs(device)
    if not case.approximate:  # SVD-softmax's evaluation path is checked against its own reference below
        with torch.no_grad():
            torch.testing.assert_close(head(hidden).cpu().double(), ref(hidden.cpu().double()), **FP32)
    ref.train(), head.train()
    ref_loss, ref_h, ref_p = loss_and_grads(ref, hidden.cpu().double(), target.cpu())
    loss, grad_h, grads = loss_and_grads(head, hidden, target)
    torch.testing.assert_close(loss, ref_loss, **FP32)
    torch.testing.assert_close(grad_h, ref_h, **FP32_GRAD)
    assert set(grads) == set(ref_p) and ref_p
    for name in ref_p:
        torch.testing.assert_close(grads[name], ref_p[name], **FP32_GRAD, msg=lambda m: f"{name}: {m}")


@CASES
def test_evaluation_path_on_the_device_equals_its_slow_reference(case, device):
    head = quiet(case).to(device)
    hidden, _ = inputs(device, shape=(2,))
    with torch.no_grad():
        got = head(hidden).cpu()
        slow = copy.deepcopy(head).cpu()
        expected = torch.stack([case.reference(slow, g) for g in hidden.cpu()])
    # SVD-softmax factors W in float32 here, its reference in float64: the preview logits differ by more
    torch.testing.assert_close(got, expected.float(), **(dict(rtol=1e-3, atol=1e-3) if case.approximate else FP32))


@CASES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_on_the_device_is_finite_and_matches_fp32(case, dtype, device):
    """Low-precision hidden states (as a bf16 / fp16 trunk gives them) under autocast: log-probs and loss in
    float32, finite, within AUTOCAST of fp32 on the same inputs; fp16 trains through a GradScaler."""
    head = quiet(case).to(device).train()
    hidden, target = inputs(device)
    hidden = (hidden * 30).to(dtype)  # large logits
    with torch.no_grad():
        expected_lp = head.eval()(hidden.float())
    head.train()
    expected = head.loss(hidden.float(), target)
    with torch.autocast(device.type, dtype=dtype):
        with torch.no_grad():
            lp = head.eval()(hidden)
        head.train()
        loss = head.loss(hidden.requires_grad_(), target)
    assert lp.dtype == loss.dtype == torch.float32
    assert torch.isfinite(lp[lp > float("-inf")]).all() and torch.isfinite(loss)
    if not case.approximate:
        torch.testing.assert_close(lp, expected_lp, **AUTOCAST)
    torch.testing.assert_close(loss, expected.detach(), **AUTOCAST)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    # a start scale of 2^10, not 2^16: the hidden states' fp16 gradients (about 1 here) would overflow at 2^16 and
    # the scaler would skip this one step, as it does a first step of a real run
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, enabled=dtype == torch.float16)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    assert torch.isfinite(hidden.grad.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)
    before = [p.detach().clone() for p in head.parameters()]
    scaler.step(optimizer)
    scaler.update()
    assert any(not torch.equal(b, p) for b, p in zip(before, head.parameters()))  # the step was not skipped


LEAN = [c for c in HEAD_CASES if not c.approximate and c.name != "ds_softmax"]


@pytest.mark.parametrize("case", LEAN, ids=[c.id for c in LEAN])
def test_memory_lean_loss_on_the_device_equals_the_plain_path(case, device):
    head = quiet(case).to(device).train()
    head.lean_chunk_tokens = lambda: 4  # several chunks, one partial
    hidden, target = inputs(device, shape=(5, 3))
    results = []
    for lean in (False, True):
        head.lean_loss = lean
        results.append(loss_and_grads(head, hidden, target))
    (ref_loss, ref_h, ref_p), (loss, grad_h, grads) = results
    torch.testing.assert_close(loss, ref_loss, **FP32)
    torch.testing.assert_close(grad_h, ref_h, **FP32_GRAD)
    for name in ref_p:
        torch.testing.assert_close(grads[name], ref_p[name], **FP32_GRAD, msg=lambda m: f"{name}: {m}")


def test_low_precision_product_keeps_float32_results(device):
    """``functional.product(a, b, bf16)``: float32 results; on CUDA accumulated in float32 (torch.mm's out_dtype: the
    error against float64 products of the same bf16 operands is float32's), elsewhere rounded to bf16 first."""
    from hf_heads.core import functional

    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 256, generator=g).to(device), torch.randn(256, 48, generator=g).to(device)
    got = functional.product(a, b, torch.bfloat16)
    exact = (a.bfloat16().double() @ b.bfloat16().double()).float()
    assert got.dtype == torch.float32 and got.device == a.device
    if device.type == "cuda":
        assert functional._MM_OUT_DTYPE["cuda"] is True, "torch.mm has no out_dtype on CUDA here"
        torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-4)
    else:
        torch.testing.assert_close(got, (a.bfloat16() @ b.bfloat16()).float(), rtol=0, atol=0)
        assert 0 < relative_error(got, exact) < 2**-8


#: heads whose lean loss has a V-wide product (Mixtape with every id frequent has none: its gated logits are its own)
LOW_PRODUCTS = [
    c
    for c in LEAN
    if c.name in ("softmax", "sigsoftmax", "plif", "mos", "mixtape") and c.options.get("frequent_fraction", 0) < 1
]
#: bf16 operands (8 bits of mantissa), float32 results: the error of a tensor against float32 products, relative
#: to its norm (an elementwise bound would trip on PLIF, where a rounded logit can cross a knot)
BF16_PRODUCTS = 2e-2
#: PLIF's gradients take a slope per bin of the logit, and a logit rounded through bf16 can land in the next bin
#: (here 16 knots whose randomised slopes range from 0.5 to 1.75): its gradients move by up to 13% of their norm
BF16_PRODUCTS_PLIF = 0.2


def relative_error(got, expected):
    return float((got - expected).norm() / expected.norm().clamp_min(1e-12))


@pytest.mark.parametrize("case", LOW_PRODUCTS, ids=[c.id for c in LOW_PRODUCTS])
def test_lean_products_in_bf16_stay_near_float32(case, device):
    """``head.lean_product_dtype = torch.bfloat16`` (the V-wide products' operands in bf16, float32 results): the
    loss and every gradient within BF16_PRODUCTS of the float32 products', and not equal to them (the setting acts)."""
    head = quiet(case).to(device).train()
    head.lean_chunk_tokens = lambda: 4
    hidden, target = inputs(device, shape=(5, 3))
    ref = loss_and_grads(head, hidden, target)
    head.lean_product_dtype = torch.bfloat16
    low = loss_and_grads(head, hidden, target)
    errors = {
        "loss": relative_error(low[0], ref[0]),
        "hidden": relative_error(low[1], ref[1]),
        **{name: relative_error(low[2][name], ref[2][name]) for name in ref[2]},
    }
    assert max(errors.values()) < (BF16_PRODUCTS_PLIF if case.name == "plif" else BF16_PRODUCTS), errors
    assert errors["loss"] > 0


@CASES
@pytest.mark.parametrize("shape", [(1, 1), (2, 3)], ids=["batch1", "batch6"])
def test_topk_on_the_device_agrees_with_the_full_log_probs(case, shape, device):
    head = quiet(case).to(device).eval()
    hidden, _ = inputs(device, shape=shape)
    with torch.no_grad():
        lp, idx = head.topk(hidden, 4)
        full = head(hidden)
    assert lp.device == idx.device == hidden.device and lp.shape == idx.shape == (*shape, 4)
    torch.testing.assert_close(lp, full.gather(-1, idx), **FP32)
    torch.testing.assert_close(lp, full.topk(4, dim=-1).values, **FP32)


# ------------------------------------------------------------------ no tensor made on the wrong device
#: heads whose paths read values on the host, which the meta device does not have: the CUDA run of this tier covers
#: them (a CPU tensor meeting their CUDA tensors fails there)
READS_VALUES = {
    "ds_softmax": "routes tokens to experts by grouping rows on the host (functional.group_rows)",
    "class_softmax": "groups tokens by class on the host (functional.group_rows)",
    "svd_softmax": "finds its refined ids with torch.unique, which has no meta kernel",
    "adaptive_sampling": "runs its topk bandit with values read on the host",
}


@CASES
def test_every_head_runs_on_the_meta_device(case):
    """Built on the CPU, moved to ``meta``, run there (evaluation, training loss and backward, topk): an op that
    meets a CPU tensor the head made itself (no ``device=``) fails. Shapes only: no value is read."""
    if case.name in READS_VALUES:
        pytest.skip(f"{case.name} {READS_VALUES[case.name]}: the CUDA run of tests/test_device.py covers it")
    head = build_case(case).to("meta")
    hidden = torch.empty(3, 2, HIDDEN, device="meta")
    target = torch.empty(3, 2, dtype=torch.long, device="meta")
    with torch.no_grad():
        assert head(hidden).shape == (3, 2, VOCAB) and head(hidden).device.type == "meta"
        lp, idx = head.topk(hidden, 4)
        assert lp.device.type == idx.device.type == "meta"
    head.train()
    loss = head.loss(hidden.requires_grad_(), target)
    assert loss.device.type == "meta"
    loss.backward()
    assert hidden.grad.device.type == "meta"


# ------------------------------------------------------------------ HF models on the device
HF_HEADS = {"mixtape": {"num_gates": 4, "gate_noise": 0.0}, "mos": {}, "ds_softmax": {"gate_noise": False}}


def hf_model(kind, head, device):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=60, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common
        )
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        config = transformers.BartConfig(**{**TINY_SEQ2SEQ, **common}, dropout=0.0)
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    return hf_heads.swap_head(model, head, **HF_HEADS[head]).to(device)


def batch(model, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (2, 7), generator=g).to(device)
    if model.config.is_encoder_decoder:
        return {"input_ids": ids, "labels": torch.randint(3, 60, (2, 5), generator=g).to(device)}
    return {"input_ids": ids, "labels": ids}


def heads_nll(model, inputs):
    """The head's own mean NLL: its log-probs (the model's logits) at the labels, no loss code involved."""
    with torch.no_grad():
        was = model.training
        lp = model.eval()(
            **{k: v for k, v in inputs.items() if k != "labels"},
            **(
                {"decoder_input_ids": model.prepare_decoder_input_ids_from_labels(inputs["labels"])}
                if model.config.is_encoder_decoder
                else {}
            ),
        ).logits
        model.train(was)
    labels = inputs["labels"]
    if not model.config.is_encoder_decoder:
        lp, labels = lp[:, :-1], labels[:, 1:]
    return -lp.gather(-1, labels[..., None]).mean()


@pytest.mark.parametrize("kind", ["gpt2", "bart"])
@pytest.mark.parametrize("head", sorted(HF_HEADS))
def test_hf_model_trains_generates_and_reloads_on_the_device(kind, head, device, tmp_path):
    model = hf_model(kind, head, device)
    data = batch(model, device)
    head_module = hf_heads.output_head(model)
    assert all(p.device == device or p.device.type == device.type for p in model.parameters())
    # a training step: the loss is the head's NLL (plus DS-Softmax's regulariser) and the head's parameters move
    model.train()
    out = model(**data)
    aux = float(head_module.aux_loss().detach()) if head == "ds_softmax" else 0.0
    torch.testing.assert_close(out.loss.detach().cpu(), heads_nll(model, data).cpu() + aux, rtol=1e-4, atol=1e-4)
    before = {n: p.detach().clone() for n, p in head_module.named_parameters()}
    out.loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    moved = [n for n, p in head_module.named_parameters() if not torch.equal(before[n], p.detach())]
    assert "weight" in moved and len(moved) >= 2, moved
    # generate: greedy equals the slow argmax loop over the head's log-probs; beam search runs on the device
    model.eval()
    prompt = data["input_ids"][:1, :4]
    kwargs = dict(max_new_tokens=3, pad_token_id=0, eos_token_id=None, do_sample=False)
    greedy = model.generate(prompt, **kwargs)
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            seq = torch.full((1, 1), model.config.decoder_start_token_id, device=device)
            for _ in range(3):
                seq = torch.cat([seq, model(input_ids=prompt, decoder_input_ids=seq).logits[:, -1:].argmax(-1)], 1)
        else:
            seq = prompt
            for _ in range(3):
                seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(greedy, seq)
    beams = model.generate(prompt, num_beams=3, num_return_sequences=2, **kwargs)
    assert beams.device == greedy.device and beams.shape[0] == 2
    # save and load: the same log-probs on the device
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).to(device).eval()
    inputs_only = (
        {"input_ids": prompt}
        if not model.config.is_encoder_decoder
        else {"input_ids": prompt, "decoder_input_ids": seq[:, :3]}
    )
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs_only).logits, model(**inputs_only).logits, **FP32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_hf_model_under_autocast_stays_near_fp32(dtype, device):
    """A whole GPT-2 with a Mixtape head under autocast: the head runs in float32, the trunk in low precision; the
    loss stays within MODEL_AUTOCAST_LOSS (relative) of fp32's and every gradient is finite."""
    model = hf_model("gpt2", "mixtape", device).train()
    data = batch(model, device)
    expected = model(**data).loss.detach()
    with torch.autocast(device.type, dtype=dtype):
        loss = model(**data).loss
    assert loss.dtype == torch.float32
    assert abs(float(loss.detach()) / float(expected) - 1) < MODEL_AUTOCAST_LOSS[dtype]
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_trl_sft_trains_the_head_on_the_device(device, tmp_path):
    """TRL's SFTTrainer, 2 steps on the device: every head parameter moves and the logged loss is finite (the CPU
    run, with the loss held to the head's NLL, is tests/test_trl.py)."""
    if device.type == "cpu":
        pytest.skip("on the CPU tests/test_trl.py::test_sft_trainer_trains_the_head_and_logs_its_loss runs this")
    trl = pytest.importorskip("trl", reason="trl is not installed: scripts/gpu_check.sh installs it from its wheels")
    datasets = pytest.importorskip("datasets", reason="datasets comes with trl")
    from test_trl import head_model, sentences, tokenizer

    model = head_model("mixtape").to(device)
    before = {n: p.detach().clone() for n, p in model.lm_head.named_parameters()}
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        bf16=False,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        processing_class=tokenizer(),
        train_dataset=datasets.Dataset.from_dict({"text": sentences(16, 0)}),
    )
    trainer.train()
    assert next(model.parameters()).device.type == device.type
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.lm_head.named_parameters()}
    assert all(v > 0 for v in moved.values()), moved
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(v)) for v in losses)


@pytest.fixture
def deterministic():
    """``torch.use_deterministic_algorithms(True)`` for one test (cuBLAS's workspace is set in conftest.py)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


KERNELS = [c for c in HEAD_CASES if hf_heads.get_head_class(c.name).row_kernels]
#: impl="triton" against the PyTorch lean loss on the same device and parameters: both compute in float32 from the
#: same values; only the order of float32 sums differs (low precision: the parameters' gradients are rounded to it)
KERNEL_TOL = {
    torch.float32: FP32_GRAD,
    torch.bfloat16: dict(rtol=2e-2, atol=1e-3),
    torch.float16: dict(rtol=2e-3, atol=1e-4),
}


@pytest.mark.parametrize("case", KERNELS, ids=[c.id for c in KERNELS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernels_on_the_device_equal_the_lean_loss(case, dtype, device):
    """The Triton kernels of the lean loss's rows (``impl="triton"``) compiled for the device, with fp32, bf16 and
    fp16 parameters: loss and every gradient as the PyTorch lean loss's."""
    if device.type != "cuda":
        pytest.skip("on the CPU tests/test_triton_rows.py runs the kernels in triton's interpreter")
    head = quiet(case).to(device, dtype).train()
    head.lean_chunk_tokens = lambda: 4  # several chunks, one partial
    hidden, target = inputs(device, dtype, shape=(5, 3))
    results = []
    for kernel in (None, "triton"):
        head.lean_kernel = kernel
        results.append(loss_and_grads(head, hidden, target))
    (ref_loss, ref_h, ref_p), (loss, grad_h, grads) = results
    tol = KERNEL_TOL[dtype]
    torch.testing.assert_close(loss, ref_loss, **tol)
    torch.testing.assert_close(grad_h, ref_h, **tol)
    for name in ref_p:
        torch.testing.assert_close(grads[name], ref_p[name], **tol, msg=lambda m: f"{name}: {m}")


@CASES
@pytest.mark.parametrize("kernel", [None, "triton"])
def test_a_training_step_gives_the_same_bits_twice_in_deterministic_mode(case, kernel, device, deterministic):
    """Under ``torch.use_deterministic_algorithms(True)``, what users set for runs they can repeat bit for bit: every
    head runs (no op of theirs lacks a deterministic CUDA kernel) and its loss and every gradient, twice from the same
    state, are bitwise equal. (Without it, PLIF's slope gradients on CUDA differ in their last bits from run to run:
    their ``scatter_add_`` adds floats atomically in whatever order the threads come.) With the Triton kernels too
    (``lean_kernel="triton"``, on CUDA; PLIF's slope gradients then take the PyTorch path, the kernels' atomics being
    unordered)."""
    if kernel and (device.type != "cuda" or not hf_heads.get_head_class(case.name).row_kernels):
        pytest.skip("the Triton kernels' deterministic run is on CUDA, for the heads that have them")
    head = quiet(case).to(device).train()
    head.lean_kernel = kernel
    hidden, target = inputs(device, shape=(6, 5))
    first, second = (loss_and_grads(head, hidden, target) for _ in range(2))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for name in first[2]:
        assert torch.equal(first[2][name], second[2][name]), name


def test_lean_chunks_are_sized_for_the_device(device):
    """CPU chunks fit its caches (a few MiB); GPU chunks are larger (its kernels want large products)."""
    from hf_heads.core import lean

    head = hf_heads.build_head("softmax", hidden_size=8, vocab_size=50000).to(device)
    gpu = device.type == "cuda"
    rows = lean.LEAN_MIN_CHUNK_GPU if gpu else lean.LEAN_MIN_CHUNK
    elements = lean.LEAN_CHUNK_ELEMENTS_GPU if gpu else lean.LEAN_CHUNK_ELEMENTS
    assert head.lean_chunk_tokens() == max(rows, elements // (50000 * head.lean_width))
    assert head.lean_chunk_tokens() == (1024 if gpu else 256)
