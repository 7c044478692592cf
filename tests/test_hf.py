"""The HF adapter: the head table crossed with GPT-2, BART and Marian tiny configs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from hf_heads.hf import HeadModelMixin  # noqa: E402
from hf_families import TINY_SEQ2SEQ  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64
HEADS = {
    "softmax": {},
    "sigsoftmax": {},
    "mos": {"num_components": 2},
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.5, "gate_embedding_size": 8},
    "plif": {"num_knots": 500},
    "mos_plif": {"num_components": 2, "num_knots": 500},
    "ds_softmax": {"num_experts": 2},
    "class_softmax": {"num_classes": 8},
    "d_softmax": {"band_fractions": [0.25, 0.75], "band_dims": [24, 8]},
    "svd_softmax": {"preview_rank": 4, "num_refine": 16},
    "adaptive_sampling": {},
}


def gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    return transformers.AutoModelForCausalLM.from_config(cfg)


def bart():
    cfg = transformers.BartConfig(vocab_size=VOCAB, **TINY_SEQ2SEQ)
    return transformers.AutoModelForSeq2SeqLM.from_config(cfg)


def marian():
    cfg = transformers.MarianConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        forced_eos_token_id=None,
    )
    return transformers.AutoModelForSeq2SeqLM.from_config(cfg)


MODELS = {"gpt2": gpt2, "bart": bart, "marian": marian}


def batch(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = 0, 0  # right padding in the second row
    labels = torch.randint(3, VOCAB, (2, 6), generator=g) if model.config.is_encoder_decoder else ids.clone()
    labels[1, -2:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def swapped(model_name, head, seed=0):
    torch.manual_seed(seed)
    model = MODELS[model_name]()
    return hf_heads.swap_head(model, head, **HEADS[head]).eval()


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_loss_is_head_nll_and_backward(model_name, head):
    model = swapped(model_name, head)
    b = batch(model)
    out = model(**b)
    lp = out.logits
    assert torch.allclose(lp.exp().sum(-1), torch.ones(lp.shape[:-1]), atol=1e-4)  # logits are log-probs
    labels = b["labels"]
    if not model.config.is_encoder_decoder:  # causal LMs shift inside the model
        lp, labels = lp[:, :-1], labels[:, 1:]
    nll = F.nll_loss(lp.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    head_nll = hf_heads.output_head(model).loss(_final_hidden(model, b)[:, : lp.shape[1]], labels, ignore_index=-100)
    torch.testing.assert_close(out.loss, nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, head_nll, rtol=1e-5, atol=1e-5)
    model.train()
    model(**b).loss.backward()
    grads = [p.grad for p in hf_heads.output_head(model).parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def _no_randomness(model):
    """Dropout off everywhere (nn.Dropout modules and the float rates BART-like layers read) and no gate
    noise, so two training-mode forwards give the same numbers."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for name in ("dropout", "activation_dropout", "attention_dropout"):
            if isinstance(getattr(m, name, None), float):
                setattr(m, name, 0.0)
    head = hf_heads.output_head(model)
    if hasattr(head.config, "gate_noise"):  # (Mixtape's is a rate, DS-Softmax's a switch)
        head.config.gate_noise = False if isinstance(head.config.gate_noise, bool) else 0.0
    return model


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_uses_the_lean_loss_and_matches_the_reference(model_name, head):
    model = _no_randomness(swapped(model_name, head).train())
    b = batch(model)
    lean_head = hf_heads.output_head(model)

    def loss_and_grads(**extra):
        model.zero_grad()
        out = model(**b, **extra)
        out.loss.backward()
        return out, [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    lean_by_default = lean_head.lean_loss  # every head but DS-Softmax
    lean, lean_grads = loss_and_grads()
    assert (lean.logits is None) == lean_by_default  # the lean path never makes [tokens, V]
    lean_head.lean_loss = False
    ref, ref_grads = loss_and_grads()
    assert ref.logits is not None
    torch.testing.assert_close(lean.loss, ref.loss, rtol=1e-5, atol=1e-6)
    for a, r in zip(lean_grads, ref_grads):
        assert (a is None) == (r is None)
        if a is not None:
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)
    # transformers' Trainer passes num_items_in_batch: the summed NLL divided by it
    lean_head.lean_loss = lean_by_default
    n = torch.tensor(5)
    summed, _ = loss_and_grads(num_items_in_batch=n)
    lean_head.lean_loss = False
    ref_summed, _ = loss_and_grads(num_items_in_batch=n)
    torch.testing.assert_close(summed.loss, ref_summed.loss, rtol=1e-5, atol=1e-6)


def _final_hidden(model, b):
    """The hidden states the head sees, captured with a forward hook on the head."""
    seen = {}

    def keep(module, args, out):
        seen["h"] = args[0]  # returns None: the output is left as it is

    h = hf_heads.output_head(model).register_forward_hook(keep)
    with torch.no_grad():
        model(**b)
    h.remove()
    return seen["h"]


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_generate_greedy_beam_sampling(model_name, head):
    model = swapped(model_name, head)
    b = batch(model)
    kw = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], max_new_tokens=4, pad_token_id=0)
    if not model.config.is_encoder_decoder:
        kw.update(input_ids=b["input_ids"][:1, :4], attention_mask=b["attention_mask"][:1, :4])
    greedy = model.generate(**kw, do_sample=False)
    beam = model.generate(**kw, num_beams=3, do_sample=False)
    torch.manual_seed(0)
    sample = model.generate(**kw, do_sample=True, top_k=10, top_p=0.9, temperature=0.8)
    for out in (greedy, beam, sample):
        assert out.dtype == torch.long and out.shape[0] == kw["input_ids"].shape[0]
        assert ((out >= 0) & (out < VOCAB)).all()
    # greedy picks the head's argmax: compare with one manual step
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = torch.full((kw["input_ids"].shape[0], 1), model.config.decoder_start_token_id)
            step = model(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"], decoder_input_ids=start)
            first = greedy[:, 1]
        else:
            step = model(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"])
            first = greedy[:, kw["input_ids"].shape[1]]
    assert torch.equal(step.logits[:, -1].argmax(-1), first)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_save_pretrained_from_pretrained_same_class_same_outputs(model_name, head, tmp_path):
    model = swapped(model_name, head)
    with torch.no_grad():  # move every parameter off its initial value
        for p in hf_heads.output_head(model).parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    auto = transformers.AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else transformers.AutoModelForCausalLM
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and isinstance(loaded, HeadModelMixin)
    assert loaded.config.output_head == model.config.output_head
    b = batch(model)
    with torch.no_grad():
        assert torch.equal(loaded(**b).logits, model(**b).logits)
        assert torch.equal(loaded(**b).loss, model(**b).loss)
    # (a head with no dense V x d output embedding, D-Softmax, has no weight: untied before and after)
    tied_before = getattr(model.get_output_embeddings(), "weight", None) is model.get_input_embeddings().weight
    tied_after = getattr(loaded.get_output_embeddings(), "weight", None) is loaded.get_input_embeddings().weight
    assert tied_before == tied_after


def test_swap_keeps_the_tie_and_starts_from_the_old_projection():
    model = gpt2().eval()
    old = model.lm_head.weight.detach().clone()
    ids = torch.randint(3, VOCAB, (1, 6))
    with torch.no_grad():
        before = torch.log_softmax(model(ids).logits, -1)
    hf_heads.swap_head(model, "plif", num_knots=100)  # PLIF starts as the identity: same distribution
    assert model.lm_head.weight is model.transformer.wte.weight and torch.equal(model.lm_head.weight, old)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)


def test_marian_final_logits_bias_is_folded_into_the_head():
    model = marian().eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    b = batch(model)
    with torch.no_grad():
        before = torch.log_softmax(model(**b).logits, -1)
    hf_heads.swap_head(model, "softmax")
    assert model.final_logits_bias.abs().sum() == 0 and model.lm_head.bias is not None
    with torch.no_grad():
        torch.testing.assert_close(model(**b).logits, before, rtol=1e-5, atol=1e-5)


def test_aux_loss_is_added_in_training_only(monkeypatch):
    model = _no_randomness(swapped("gpt2", "softmax").train())
    b = batch(model)
    base = model(**b).loss
    monkeypatch.setattr(type(hf_heads.output_head(model)), "aux_loss", lambda self: torch.tensor(0.25))
    torch.testing.assert_close(model(**b).loss, base + 0.25)
    model.eval()
    torch.testing.assert_close(model(**b).loss, base)  # evaluation: the plain NLL


def test_gradient_checkpointing_and_trainer(tmp_path):
    model = swapped("gpt2", "mixtape").train()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    b = batch(model)
    model(**b).loss.backward()
    assert hf_heads.output_head(model).gate_embedding.grad is not None
    data = [{k: v[i] for k, v in b.items()} for i in range(2)] * 4
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    result = trainer.train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))


def test_unsupported_models_get_a_clear_error():
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        )
    )
    with pytest.raises(ValueError, match="has no output projection"):
        hf_heads.swap_head(bert, "mos")
    with pytest.raises(ValueError, match="expected a transformers PreTrainedModel"):
        hf_heads.swap_head(torch.nn.Linear(2, 2), "mos")
    model = swapped("gpt2", "mos")
    with pytest.raises(ValueError, match="already has an output head"):
        hf_heads.swap_head(model, "mixtape")
    with pytest.raises(ValueError, match="num_gates=3 is out of range"):
        hf_heads.swap_head(gpt2(), "mixtape", num_gates=3)


def _run(code, env_extra=None):
    env = {**os.environ, "PYTHONPATH": ROOT, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_fresh_process_loads_after_import_hf_heads_and_asks_for_remote_code_without(tmp_path):
    # (without the package, trust_remote_code=True loads the files saved with the model: tests/test_remote_code.py)
    model = swapped("bart", "mixtape")
    model.save_pretrained(tmp_path)
    load = (
        "import torch, transformers\n{imp}\n"
        "m = transformers.AutoModelForSeq2SeqLM.from_pretrained(%r)\nprint(type(m).__name__)\n"
    ) % str(tmp_path)
    ok = _run(load.format(imp="import hf_heads"))
    assert ok.returncode == 0 and "SoftmaxHeadsBartForConditionalGeneration" in ok.stdout, ok.stderr[-2000:]
    without = _run(load.format(imp=""))
    assert without.returncode != 0 and "trust_remote_code=True" in without.stderr


def test_swap_head_and_head_config_accept_the_models_own_sizes_and_refuse_others():
    """Every head takes hidden_size and vocab_size; on a model they are the model's: the same value is accepted,
    another one refused in one line (it raised a raw TypeError, "multiple values for keyword argument")."""
    import transformers

    def tiny():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))

    model = hf_heads.swap_head(tiny(), "mos", hidden_size=32, vocab_size=50, num_components=2)
    assert hf_heads.output_head(model).config.num_components == 2
    assert "hidden_size" not in model.config.output_head["options"]
    with pytest.raises(
        ValueError,
        match=r"^swap_head: hidden_size=16 does not match the model's hidden_size, 32: "
        r"leave it out, the model sets it$",
    ):
        hf_heads.swap_head(tiny(), "mos", hidden_size=16)
    config = hf_heads.head_config(tiny().config, "mixtape", vocab_size=50)
    assert config.output_head["options"] == {}
    with pytest.raises(ValueError, match=r"^head_config: vocab_size=51 does not match the model's vocab_size, 50"):
        hf_heads.head_config(tiny().config, "mixtape", vocab_size=51)


@pytest.mark.parametrize("head", ["mos", "mixtape", "mos_plif"])
def test_start_pretrained_is_the_model_exactly_and_the_config_records_the_options(head, tmp_path):
    torch.manual_seed(0)
    plain = gpt2().eval()
    b = batch(plain)
    with torch.no_grad():
        before = torch.log_softmax(plain(input_ids=b["input_ids"]).logits, -1)
    model = hf_heads.swap_head(plain, head, start="pretrained").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=b["input_ids"]).logits, before, atol=1e-5, rtol=0)
    assert model.config.output_head["options"] == {"context_activation": "identity", "identity_init": True}
    model.save_pretrained(tmp_path)  # the options travel, not the word: the reload is the same head
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=b["input_ids"]).logits, before, atol=1e-5, rtol=0)
    config = hf_heads.head_config(gpt2().config, head, start="pretrained")
    assert config.output_head["options"] == {"context_activation": "identity", "identity_init": True}


def test_start_refuses_a_head_without_an_exact_start_and_nearest_warns():
    with pytest.raises(ValueError, match=r"^swap_head: start='pretrained': the sigsoftmax head has no start"):
        hf_heads.swap_head(gpt2(), "sigsoftmax", start="pretrained")
    with pytest.raises(ValueError, match=r"^head_config: start='pretrained': the class_softmax head has no start"):
        hf_heads.head_config(gpt2().config, "class_softmax", start="pretrained")
    with pytest.raises(ValueError, match=r"start='pretrained' sets the ds_softmax option num_experts=1"):
        hf_heads.head_config(gpt2().config, "ds_softmax", start="pretrained", num_experts=4)
    with pytest.warns(UserWarning, match=r"^swap_head: start='nearest': the sigsoftmax head does not start as"):
        model = hf_heads.swap_head(gpt2(), "sigsoftmax", start="nearest")
    assert model.config.output_head["options"] == {}
    with pytest.raises(ValueError, match=r"start='pretrained' sets the mos option context_activation='identity'"):
        hf_heads.swap_head(gpt2(), "mos", start="pretrained", context_activation="tanh")
    with pytest.raises(ValueError, match=r"^swap_head: start='pretrianed' is not a start"):
        hf_heads.swap_head(gpt2(), "mos", start="pretrianed")
