"""``swap_head`` over transformers' model families: on a tiny model of each (tests/hf_families.py, built offline from
its config class), ``swap_head(model, head, start="pretrained")`` with MoS and Mixtape is exact (normalised
log-probs equal to the model's log-softmax, the eval loss, the training loss with the lean loss on and off under the
same dropout masks, and beam search's sequences and scores), or refused with a ``ValueError`` naming the class:
never a silent difference. What each family gives is the table in docs/huggingface.md, which the default tier checks;
the slow tier sweeps every family the Auto classes map. Also: FSMT's output layer (train, generate, save and load),
the refusal of an input embedding in the output layer's place, and the probe."""

from __future__ import annotations

import copy
import os
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from hf_heads.hf import modeling  # noqa: E402
from hf_heads.hf.lean_forward import is_seq2seq  # noqa: E402
from hf_families import NEEDS_DECODER_INPUTS, VOCAB, all_families, embedding_size, tiny_model  # noqa: E402

#: families whose own training loss runs on the head's log-probs instead of the lean loss (labels not shifted)
OWN_LOSS_IN_TRAINING = {"trocr", "whisper"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADS = ("mos", "mixtape")
ATOL = 1e-5
#: the default tier: causal and seq2seq families, every one the docs name among them (variants: hf_families.VARIANTS)
DEFAULT_FAMILIES = [
    # causal
    "gpt2",
    "gpt_neo",
    "gptj",
    "gpt_neox",
    "codegen",
    "opt",
    "bloom",
    "falcon",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "phi",
    "phi3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "cohere",
    "granite",
    "granite_logits_scaling",
    "falcon_h1",
    "falcon_h1_lm_head_multiplier",
    "olmo",
    "stablelm",
    "starcoder2",
    "xglm",
    "biogpt",
    "vaultgemma",
    "cohere2",
    "dory",
    "mamba",
    "trocr",
    "whisper",
    # seq2seq
    "bart",
    "mbart",
    "marian",
    "pegasus",
    "blenderbot",
    "blenderbot-small",
    "t5",
    "mt5",
    "m2m_100",
    "umt5",
    "plbart",
    "led",
    "t5gemma",
    "fsmt",
]


def docs_table() -> dict:
    """``{family: (class, outcome)}`` from the families table of docs/huggingface.md."""
    with open(os.path.join(ROOT, "docs", "huggingface.md"), encoding="utf-8") as f:
        text = f.read()
    rows = re.findall(r"^\| `([^`]+)` \| `([A-Za-z0-9_]+)` \| \*?\*?(exact|refused)\*?\*? \|", text, re.MULTILINE)
    return {family: (cls, outcome) for family, cls, outcome in rows}


def batch(model, kind: str) -> dict:
    """A fixed batch: token ids below the model's vocabularies and labels (causal: the ids, -100 at the end of the
    second row; seq2seq: target ids)."""
    g = torch.Generator().manual_seed(0)
    vocab_in = min(v for v in (embedding_size(model), VOCAB) if v)
    ids = torch.randint(3, vocab_in, (2, 7), generator=g)
    if kind == "causal":
        labels = ids.clone()
        labels[1, -2:] = -100
    else:  # (FSMT's decoder inputs overwrite -100 in the labels: seq2seq labels here have none)
        labels = torch.randint(3, min(VOCAB, modeling.output_layer(model).weight.shape[0]), (2, 5), generator=g)
        if model.config.model_type in NEEDS_DECODER_INPUTS:
            start = torch.full_like(labels[:, :1], model.config.decoder_start_token_id)
            return {"input_ids": ids, "labels": labels, "decoder_input_ids": torch.cat([start, labels[:, :-1]], 1)}
    return {"input_ids": ids, "labels": labels}


def scores(model, b: dict, lean=None) -> dict:
    """What the model gives on ``b``: eval log-probs and loss, the training loss (same seed, so the same dropout
    masks), and beam search's sequences and scores (or, under "generate", why the model's generate failed). ``lean``
    sets a head model's lean loss first."""
    if lean is not None:
        hf_heads.output_head(model).lean_loss = lean
    out = {}
    model.eval()
    with torch.no_grad():
        o = model(**{**b, "labels": b["labels"].clone()})
        out["logits"], out["loss"] = o.logits.float(), o.loss
        prompt = b["input_ids"] if is_seq2seq(model) else b["input_ids"][:, :4]
        try:
            gen = model.generate(
                prompt,
                max_new_tokens=3,
                num_beams=2,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            out["sequences"], out["sequence_scores"] = gen.sequences, gen.sequences_scores
        except Exception as e:  # noqa: BLE001 (compared: the head model must fail alike)
            message = (str(e).splitlines() or [""])[0][:160].replace("SoftmaxHeads", "")
            out["generate"] = f"{type(e).__name__}: {message}"
    model.train()
    torch.manual_seed(1)
    train = model(**{**b, "labels": b["labels"].clone()})
    out["train_loss"], out["lean_used"] = train.loss.detach(), train.logits is None
    model.eval()
    return out


def check_family(case: str, notes: list, lean_expected: bool = False) -> str:
    """``"exact"`` or ``"refused"`` for family ``case`` (both heads give the same), asserting what each means (and,
    with ``lean_expected``, that training ran the lean loss); what could not be compared goes to ``notes``."""
    model, kind = tiny_model(case)
    if model is None:
        pytest.skip(kind)
    b = batch(model, kind)
    try:
        reference = scores(model, b)
    except Exception as e:  # noqa: BLE001 (the plain model itself: nothing to compare with)
        pytest.skip(f"{case}: the plain {type(model).__name__} fails on a tiny batch ({type(e).__name__}: {e})"[:300])
    outcomes = set()
    for head in HEADS:
        swapped = copy.deepcopy(model)
        try:
            hf_heads.swap_head(swapped, head, start="pretrained")
        except ValueError as e:
            assert type(model).__name__ in str(e) and "\n" not in str(e), str(e)
            outcomes.add("refused")
            continue
        outcomes.add("exact")
        for lean in (True, False):
            got = scores(swapped, b, lean=lean)
            if lean and lean_expected:  # the lean loss ran, and equals the model's own
                assert got["lean_used"], f"{case} {head}: the lean loss did not run"
            assert not (got["lean_used"] and not lean)
            torch.testing.assert_close(
                got["logits"].logsumexp(-1), torch.zeros(got["logits"].shape[:-1]), atol=ATOL, rtol=0
            )
            torch.testing.assert_close(got["logits"], torch.log_softmax(reference["logits"], -1), atol=ATOL, rtol=0)
            for key in ("loss", "train_loss"):
                torch.testing.assert_close(got[key], reference[key], atol=ATOL, rtol=0, msg=f"{case} {head} {key}")
            if "generate" in reference:
                assert got.get("generate") == reference["generate"], (case, head)
            else:
                torch.testing.assert_close(got["sequence_scores"], reference["sequence_scores"], atol=ATOL, rtol=0)
                assert torch.equal(got["sequences"], reference["sequences"]), (case, head)
    assert len(outcomes) == 1, (case, outcomes)
    if outcomes == {"exact"} and "generate" in reference:
        notes.append(f"{case}: beam search not compared, the plain model's generate fails ({reference['generate']})")
    return outcomes.pop()


@pytest.mark.parametrize("case", DEFAULT_FAMILIES)
def test_family_is_exact_or_refused_as_the_docs_say(case):
    documented = docs_table()
    assert case in documented, f"{case}: no row in docs/huggingface.md's table of families"
    notes = []
    outcome = check_family(case, notes, lean_expected=case not in OWN_LOSS_IN_TRAINING)
    assert outcome == documented[case][1], (
        f"{case}: swap_head is {outcome}, docs/huggingface.md says {documented[case][1]}"
    )
    assert type(tiny_model(case)[0]).__name__ == documented[case][0]
    if notes:
        pytest.skip("; ".join(notes))


def test_the_default_tier_covers_the_named_families():
    named = {"gpt2", "llama", "qwen2", "mistral", "phi3", "gemma", "gemma2", "gemma3_text", "cohere", "granite"}
    named |= {"opt", "gpt_neox", "bart", "mbart", "marian", "t5", "m2m_100", "fsmt", "falcon_h1"}
    known = set(all_families())
    assert {f for f in named if f in known} <= set(DEFAULT_FAMILIES)
    assert len(DEFAULT_FAMILIES) >= 30
    assert set(DEFAULT_FAMILIES) <= set(docs_table())


@pytest.mark.slow
@pytest.mark.parametrize("case", all_families())
def test_every_mapped_family_is_exact_or_refused(case):
    notes = []
    check_family(case, notes)
    if notes:
        pytest.skip("; ".join(notes))


# -- FSMT: the head in the decoder's output_projection ------------------------------------------------------------


def fsmt(seed=0):
    model, _ = tiny_model("fsmt", seed)
    return model


def test_fsmt_head_replaces_the_output_projection():
    model = hf_heads.swap_head(fsmt(), "mos", start="pretrained")
    head = hf_heads.output_head(model)
    assert model.model.decoder.output_projection is head is model.get_output_embeddings()
    assert isinstance(model.model.decoder.embed_tokens, torch.nn.Embedding)  # the decoder's input stays
    with pytest.raises(ValueError, match="would replace the mos head"):
        model.set_output_embeddings(torch.nn.Linear(32, VOCAB))


def test_fsmt_trains_generates_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    plain = fsmt()
    b = batch(plain, "seq2seq")  # (with decoder inputs: FSMT's forward makes them from input_ids, not the labels)
    model = hf_heads.swap_head(plain, "mixtape", start="pretrained")
    head = hf_heads.output_head(model)
    before = {k: v.detach().clone() for k, v in head.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    loss = model(**b).loss
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(before[k], p) for k, p in head.named_parameters())
    model.eval()
    prompt = b["input_ids"]
    greedy = model.generate(prompt, max_new_tokens=4, do_sample=False, num_beams=1)
    beam = model.generate(prompt, max_new_tokens=4, do_sample=False, num_beams=3)
    model.save_pretrained(tmp_path / "fsmt")
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "fsmt").eval()
    assert type(loaded) is type(model) and loaded.model.decoder.output_projection is hf_heads.output_head(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**b).logits, model(**b).logits)
    assert torch.equal(loaded.generate(prompt, max_new_tokens=4, do_sample=False, num_beams=1), greedy)
    assert torch.equal(loaded.generate(prompt, max_new_tokens=4, do_sample=False, num_beams=3), beam)


def test_an_input_embedding_in_the_output_layer_place_is_refused(monkeypatch):
    """Without FSMT's entry in OUTPUT_LAYERS, its get_output_embeddings() is the decoder's input embedding: refused
    by the probe (it is called on token ids), in one line naming the class."""
    monkeypatch.setattr(modeling, "OUTPUT_LAYERS", {})
    with pytest.raises(
        ValueError,
        match=r"^swap_head: FSMTForConditionalGeneration calls its get_output_embeddings\(\) "
        r"\(Embedding\) on token ids: an input embedding",
    ) as e:
        hf_heads.swap_head(fsmt(), "mos")
    assert "\n" not in str(e.value)


# -- the probe ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, hint",
    [
        ("gemma2", r"a soft-cap\? \|returned logits\| <= 27\.9"),
        ("cohere", r"a scalar scale: returned logits = 0\.0625 x"),
        ("granite_logits_scaling", r"a scalar scale: returned logits = 0\.125 x"),
    ],
)
def test_a_transform_after_the_output_layer_is_refused_naming_it(case, hint):
    model, _ = tiny_model(case)
    model.train()
    with pytest.raises(
        ValueError,
        match=rf"^swap_head: {type(model).__name__} transforms the logits after its output "
        rf"layer \(returned logits != the output layer's: max \|diff\| [0-9.]+; {hint}",
    ):
        hf_heads.swap_head(model, "mos")
    assert model.training and all(m.training for m in model.modules())  # the probe restored the mode
    assert not isinstance(model, modeling.HeadModelMixin)  # nothing changed


def test_the_probe_is_deterministic_and_leaves_the_model_as_it_was():
    model, _ = tiny_model("gpt2")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    layer = modeling.output_layer(model)
    model.eval()
    model.transformer.h[0].train()  # a module in another mode than the model keeps it
    rng = torch.get_rng_state()
    assert modeling.probe_output_layer(model, layer) is None
    assert modeling.probe_output_layer(model, layer) is None
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model.training and model.transformer.h[0].training and not model.transformer.h[1].training
    assert not layer._forward_hooks and all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_an_output_layer_that_transforms_inside_itself_is_refused():
    """The probe's hook sees the layer's output: a layer with its own parameters besides weight and bias (Dory's
    per-token logit_scale) or one that does not compute hidden @ weight.T + bias is refused, though a tiny model's
    transform may start as the identity."""
    model, _ = tiny_model("dory")
    with pytest.raises(
        ValueError,
        match=r"^swap_head: DoryForCausalLM has an output layer \(DoryLMHead\) with "
        r"parameters besides weight and bias \(logit_scale\)",
    ):
        hf_heads.swap_head(model, "mos")

    class Doubled(torch.nn.Linear):
        def forward(self, hidden):
            return 2 * super().forward(hidden)

    model, _ = tiny_model("gpt2")
    doubled = Doubled(32, VOCAB, bias=False)
    doubled.weight = model.lm_head.weight
    model.lm_head = doubled
    with pytest.raises(
        ValueError,
        match=r"^swap_head: GPT2LMHeadModel has an output layer \(Doubled\) that does not "
        r"compute hidden @ weight.T \+ bias",
    ):
        hf_heads.swap_head(model, "mos")


def test_a_new_model_from_a_head_config_is_probed_too():
    """``from_config(head_config(...))`` builds the model with weights: probed with the head in place, so a family
    that transforms the logits after its output layer is refused there too, and one that does not builds."""
    from hf_families import tiny_config

    with pytest.raises(
        ValueError,
        match=r"^SoftmaxHeadsGemma2ForCausalLM: Gemma2ForCausalLM transforms the logits "
        r"after its output layer .*a soft-cap\?",
    ):
        transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny_config("gemma2"), "mos"))
    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny_config("gemma"), "mos"))
    assert isinstance(hf_heads.output_head(model), hf_heads.OutputHead)


def test_fsmt_lean_loss_needs_its_decoder_inputs():
    """FSMT's forward makes its decoder inputs from input_ids, not from the labels: with labels alone the model's own
    forward and loss run (the same numbers as the plain model), with decoder inputs the lean loss."""
    plain = fsmt()
    b = batch(plain, "seq2seq")
    only_labels = {"input_ids": b["input_ids"][:, :5], "labels": b["labels"]}  # (FSMT needs them the same length)
    plain.train()
    expected = plain(**only_labels).loss
    model = hf_heads.swap_head(plain, "mos", start="pretrained").train()
    out = model(**only_labels)
    assert out.logits is not None  # not the lean loss
    torch.testing.assert_close(out.loss, expected, atol=ATOL, rtol=0)
    assert model(**b).logits is None  # the lean loss
