"""HF paths users take on day one: a model from a config that names its head, resize_token_embeddings, PEFT."""

from __future__ import annotations

import json
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from hf_heads.hf import HeadModelMixin  # noqa: E402
from hf_families import TINY_SEQ2SEQ  # noqa: E402
from test_hf import HEADS, VOCAB, _no_randomness, batch, swapped  # noqa: E402

GPT2_SIZES = dict(
    n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0
)
BART_SIZES = dict(vocab_size=VOCAB, **TINY_SEQ2SEQ)
MIXTAPE = {"num_gates": 4, "frequent_fraction": 0.5, "gate_embedding_size": 8}


# ----------------------------------------------------------------------------- a model from a head config
@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_auto_config_for_model_builds_the_head_model_and_round_trips(kind, tmp_path):
    base_type, sizes, auto = (
        ("gpt2", GPT2_SIZES, transformers.AutoModelForCausalLM)
        if kind == "causal"
        else ("bart", BART_SIZES, transformers.AutoModelForSeq2SeqLM)
    )
    cfg = transformers.AutoConfig.for_model(
        "softmax-heads", base_model_type=base_type, output_head={"name": "mixtape", "options": MIXTAPE}, **sizes
    )
    assert cfg.model_type == "softmax-heads" and cfg.base_model_type == base_type
    torch.manual_seed(0)
    model = auto.from_config(cfg).eval()
    assert isinstance(model, HeadModelMixin)
    head = hf_heads.output_head(model)
    assert head.head_name == "mixtape" and head.config.num_gates == 4 and head.config.vocab_size == VOCAB
    assert head.weight is model.get_input_embeddings().weight  # tied, as the base config says
    b = batch(model)
    with torch.no_grad():
        out = model(**b)
    torch.testing.assert_close(out.logits.exp().sum(-1), torch.ones(out.logits.shape[:-1]))
    model.save_pretrained(tmp_path)
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config.output_head == cfg.output_head
    with torch.no_grad():
        assert torch.equal(loaded(**b).logits, out.logits)


def test_head_config_helper_equals_for_model():
    cfg = hf_heads.head_config(transformers.GPT2Config(**GPT2_SIZES), "mixtape", **MIXTAPE)
    same = transformers.AutoConfig.for_model(
        "softmax-heads",
        base_model_type="gpt2",
        output_head={"name": "mixtape", "options": MIXTAPE, "use_bias": False},
        **GPT2_SIZES,
    )
    assert type(cfg) is type(same) and cfg.output_head == same.output_head
    torch.manual_seed(0)
    a = transformers.AutoModelForCausalLM.from_config(cfg)
    torch.manual_seed(0)
    b = transformers.AutoModelForCausalLM.from_config(same)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb), na


def test_head_config_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"needs base_model_type.*hf_heads.head_config"):
        transformers.AutoConfig.for_model("softmax-heads", n_layer=2)
    with pytest.raises(ValueError, match="num_gates=3"):  # options are checked when the config is made
        hf_heads.head_config(transformers.GPT2Config(**GPT2_SIZES), "mixtape", num_gates=3)
    with pytest.raises(ValueError, match="expected a transformers config"):
        hf_heads.head_config({"n_layer": 2}, "mos")
    # AutoConfig.for_model checks the head when the config is made too, not at from_config
    for spec, message in (
        ({"name": "mixtap"}, r"unknown output head 'mixtap' \(did you mean 'mixtape'\?\)"),
        ({"name": "mixtape", "options": {"num_gates": 3}}, "num_gates=3 is out of range"),
        ({"name": "mos", "option": {}}, "output_head has keys"),
        ("mixtape", "output_head must be a dict"),
    ):
        with pytest.raises(ValueError, match=message):
            transformers.AutoConfig.for_model("softmax-heads", base_model_type="gpt2", output_head=spec, **GPT2_SIZES)


# ----------------------------------------------------------------------------- resize_token_embeddings
RESIZABLE = [h for h in HEADS if hf_heads.get_head_class(h).resizable]
REFUSING = [h for h in HEADS if not hf_heads.get_head_class(h).resizable]


#: heads whose distribution over the old ids, renormalised, does not change when ids are added: one softmax
#: over per-id scores that do not depend on the other ids (not MoS: each component renormalises over every id)
SAME_ON_OLD_IDS = {"softmax", "sigsoftmax", "plif", "mixtape", "ds_softmax", "adaptive_sampling"}


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("head", RESIZABLE)
def test_resize_token_embeddings_grows_and_shrinks_the_head(head, tie, tmp_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(**GPT2_SIZES, tie_word_embeddings=tie)
    )
    model = _no_randomness(hf_heads.swap_head(model, head, **HEADS[head]).eval())
    b = batch(model)
    with torch.no_grad():
        before = model(**b).logits
    for size in (VOCAB + 3, VOCAB - 2):
        model.resize_token_embeddings(size)
        h = hf_heads.output_head(model)
        assert h.config.vocab_size == size == model.config.vocab_size
        assert (h.weight is model.get_input_embeddings().weight) == (tie and h.can_tie)
        if size > VOCAB and head in SAME_ON_OLD_IDS:
            with torch.no_grad():
                old = model(**b).logits[..., :VOCAB]
            torch.testing.assert_close(old - old.logsumexp(-1, keepdim=True), before, rtol=1e-5, atol=1e-5)
        ids = b["input_ids"].clamp(max=size - 1)
        ids[0, 0] = size - 1  # the newest (or last kept) id, as input and as label
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=b["attention_mask"], labels=ids)
        assert out.logits.shape[-1] == size and torch.isfinite(out.loss)
        torch.testing.assert_close(out.logits.exp().sum(-1), torch.ones(out.logits.shape[:-1]))
        model.train()  # training (the lean loss) and a backward step work at the new size
        model(input_ids=ids, labels=ids).loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in h.parameters() if p.grad is not None)
        model.zero_grad(set_to_none=True)  # (transformers resizes the input embedding's Parameter in place)
        model.eval()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf_heads.output_head(loaded).config.vocab_size == VOCAB - 2
    ids = b["input_ids"].clamp(max=VOCAB - 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("head", REFUSING)
def test_resize_token_embeddings_refuses_before_changing_anything(head):
    model = swapped("gpt2", head)
    with pytest.raises(ValueError, match=head):
        model.resize_token_embeddings(VOCAB + 3)
    assert model.get_input_embeddings().weight.shape[0] == VOCAB == model.config.vocab_size
    assert hf_heads.output_head(model).config.vocab_size == VOCAB


# ----------------------------------------------------------------------------- PEFT
peft = pytest.importorskip("peft", reason="peft not installed: run `make install`")


def _lora_model(head="mixtape", **peft_options):
    torch.manual_seed(0)
    model = _no_randomness(swapped("gpt2", head).train())
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], modules_to_save=["lm_head"], task_type="CAUSAL_LM", **peft_options
    )
    return peft.get_peft_model(model, config)


def test_peft_lora_with_a_trained_head_keeps_the_lean_loss(tmp_path):
    model = _lora_model()
    inner = model.get_base_model()
    head = hf_heads.output_head(inner)
    wrapper = inner.lm_head
    assert head is wrapper.modules_to_save["default"] and head is not wrapper.original_module
    b = batch(inner)
    out = model(**b)
    assert out.logits is None  # the lean loss ran: no [tokens, V] logits
    out.loss.backward()
    assert head.gate_embedding.grad is not None and wrapper.original_module.gate_embedding.grad is None
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.grad is not None for p in lora)
    lean_grads = [p.grad.clone() for p in head.parameters()]
    model.zero_grad()
    head.lean_loss = False  # the reference path: the model's cross-entropy on the head's log-probs
    ref = model(**b)
    ref.loss.backward()
    assert ref.logits is not None
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
    for a, r in zip(lean_grads, [p.grad for p in head.parameters()]):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)
    head.lean_loss = True
    # the adapter (LoRA + the trained head) saves and reloads onto a fresh base model
    with torch.no_grad():
        head.gate_bias.add_(0.5)
    model.eval()
    with torch.no_grad():
        expected = model(**b).logits
    model.save_pretrained(tmp_path / "adapter")
    base = swapped("gpt2", "mixtape")
    reloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**b).logits, expected)
    with model.disable_adapter():  # adapters off: the original head runs
        assert hf_heads.output_head(model.get_base_model()) is wrapper.original_module


def test_peft_weight_tying_that_drops_the_head_is_refused():
    model = _lora_model(ensure_weight_tying=True)
    with pytest.raises(ValueError, match="ensure_weight_tying=False"):
        model(**batch(model.get_base_model()))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_float_labels_get_the_librarys_message(training):
    model = swapped("gpt2", "mixtape").train(training)
    b = batch(model)
    with pytest.raises(
        ValueError, match=r"mixtape: labels have dtype torch.float32; expected token ids \(torch.long\)"
    ):
        model(input_ids=b["input_ids"], labels=b["labels"].float())


def test_a_causal_head_model_of_a_seq2seq_family_does_not_take_over_auto_seq2seq(tmp_path):
    """BART's config is encoder-decoder, but BartForCausalLM is AutoModelForCausalLM's class for it: after a head is
    swapped onto a BartForCausalLM, AutoModelForSeq2SeqLM still loads a saved BART head model as
    BartForConditionalGeneration (it loaded it as BartForCausalLM, dropping the encoder)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, BartConfig, BartForCausalLM

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=16,
    )
    seq2seq = AutoModelForSeq2SeqLM.from_config(hf_heads.head_config(config, "mos", num_components=2)).eval()
    seq2seq.save_pretrained(tmp_path / "seq2seq")
    hf_heads.swap_head(
        BartForCausalLM(BartConfig(**{**config.to_dict(), "is_decoder": True})), "mos", num_components=2
    ).save_pretrained(tmp_path / "causal")
    ids = torch.randint(0, 40, (2, 6))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "seq2seq").eval()
    assert type(loaded).__name__ == "SoftmaxHeadsBartForConditionalGeneration"
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids, decoder_input_ids=ids).logits, seq2seq(input_ids=ids, decoder_input_ids=ids).logits
        )
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "causal")).__name__ == "SoftmaxHeadsBartForCausalLM"


def test_output_head_specs_carry_a_version_and_old_ones_get_the_old_defaults(tmp_path):
    """A config's output_head stores only the options its user gave: new configs carry the spec version, a config
    saved before versions is read as version 1, and a default changed since comes back at its old value."""
    from hf_heads.core.config import SPEC_VERSION

    cfg = hf_heads.head_config(transformers.GPT2Config(**GPT2_SIZES), "mixtape", num_gates=2)
    assert cfg.output_head["version"] == SPEC_VERSION
    same = transformers.AutoConfig.for_model(
        "softmax-heads",
        base_model_type="gpt2",
        output_head={"name": "mixtape", "options": {"num_gates": 2}},
        **GPT2_SIZES,
    )
    assert same.output_head["version"] == SPEC_VERSION
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(tmp_path)
    ids = torch.arange(8)[None]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.get_output_embeddings().config.scaled_input is False
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["output_head"]["version"] == SPEC_VERSION
    del saved["output_head"]["version"]  # as a model saved before specs had versions
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert transformers.AutoConfig.from_pretrained(tmp_path).output_head["version"] == 1
    # Mixtape's default changed after version 1 (scaled_input True -> the nn.Linear form): a version-1 spec that
    # does not give it means True, today's spec the new default
    from hf_heads.hf import config as HC

    assert HC.spec_options({"name": "mixtape", "options": {"num_gates": 2}, "version": 1}) == {
        "num_gates": 2,
        "scaled_input": True,
    }
    assert HC.spec_options({"name": "mixtape", "options": {"scaled_input": False}, "version": 1}) == {
        "scaled_input": False
    }
    assert HC.spec_options(cfg.output_head) == {"num_gates": 2}
    assert model.get_output_embeddings().config.scaled_input is False
    with pytest.raises(ValueError, match="head spec version 3 is not one this version of softmax-heads reads"):
        HC.spec_options({"name": "mixtape", "options": {}, "version": 3})
