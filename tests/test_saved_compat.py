"""Heads, HF models and fairseq checkpoints saved by softmax-heads 0.1.0 (tests/data/saved_0_1_0, made by its
make.py with the code of commit ae9d721) load with today's code and compute what they computed then."""

import os

import pytest
import torch

import hf_heads

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "saved_0_1_0")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["mixtape", "ds_softmax", "plif"])
def test_heads_saved_by_0_1_0_load_and_compute_as_saved(name):
    expected = torch.load(os.path.join(DATA, "heads_expected.pt"), weights_only=True)
    head = hf_heads.load_head(os.path.join(DATA, f"head_{name}")).eval()
    assert head.head_name == name
    torch.testing.assert_close(head(expected["hidden"]), expected[name], rtol=1e-5, atol=1e-6)
    if head.uses_frequency_order:  # the saved order is a permutation, not the default arange
        assert not torch.equal(head.frequency_order, torch.arange(head.config.vocab_size))


@pytest.mark.parametrize(
    "saved,key,auto",
    [
        ("hf_gpt2_mixtape", "gpt2_mixtape", "AutoModelForCausalLM"),
        ("hf_gpt2_ds_softmax", "gpt2_ds_softmax", "AutoModelForCausalLM"),
        ("hf_bart_mos", "bart_mos", "AutoModelForSeq2SeqLM"),
    ],
)
def test_hf_models_saved_by_0_1_0_load_and_compute_as_saved(saved, key, auto):
    transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
    expected = torch.load(os.path.join(DATA, "hf_expected.pt"), weights_only=True)
    model = getattr(transformers, auto).from_pretrained(os.path.join(DATA, saved)).eval()
    assert isinstance(model, hf_heads.hf.HeadModelMixin)
    head = hf_heads.output_head(model)
    if head.head_name == "mixtape":  # saved before the form was kept: the default of then, also when saved again
        assert head.config.scaled_input is True and float(head.scaled_form) == 1.0
    ids = expected["ids"]
    with torch.no_grad():
        out = model(ids) if "gpt2" in saved else model(input_ids=ids, decoder_input_ids=ids)
    torch.testing.assert_close(out.logits, expected[key], rtol=1e-5, atol=1e-5)


def test_fairseq_checkpoint_saved_by_0_1_0_loads_under_weights_only_and_scores_as_saved(tmp_path):
    pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")
    import shutil

    import fairseq_plugin
    from fairseq.models.transformer_lm import TransformerLanguageModel

    for f in ("dict.txt", "checkpoint_best.pt"):  # a copy: fairseq's loader may write beside the checkpoint
        shutil.copy(os.path.join(DATA, "fairseq_lm", f), tmp_path / f)
    expected = torch.load(os.path.join(DATA, "fairseq_expected.pt"), weights_only=True)
    lm = TransformerLanguageModel.from_pretrained(
        str(tmp_path), "checkpoint_best.pt", user_dir=os.path.dirname(fairseq_plugin.__file__)
    ).eval()
    net = lm.models[0]
    assert isinstance(net.decoder.head, hf_heads.OutputHead) and net.decoder.head.head_name == "mixtape"
    assert net.decoder.head.config.scaled_input is True  # saved before the form was kept: the default of then
    with torch.no_grad():
        lp = net.get_normalized_probs(net(lm.encode(expected["sentence"])[None]), log_probs=True)
    torch.testing.assert_close(lp, expected["log_probs"], rtol=1e-5, atol=1e-5)
