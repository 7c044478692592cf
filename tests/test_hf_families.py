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
from hf_heads.hf import modeling, output_layer  # noqa: E402
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
        labels = torch.randint(3, min(VOCAB, output_layer.output_layer(model).weight.shape[0]), (2, 5), generator=g)
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


def check_family(case: str, notes: list, lean_expected: bool = False, heads=HEADS) -> str:
    """``"exact"`` or ``"refused"`` for family ``case`` (every one of ``heads`` gives the same), asserting what each
    means (and, with ``lean_expected``, that training ran the lean loss); what could not be compared goes to
    ``notes``."""
    model, kind = tiny_model(case)
    if model is None:
        pytest.skip(kind)
    b = batch(model, kind)
    try:
        reference = scores(model, b)
    except Exception as e:  # noqa: BLE001 (the plain model itself: nothing to compare with)
        pytest.skip(f"{case}: the plain {type(model).__name__} fails on a tiny batch ({type(e).__name__}: {e})"[:300])
    outcomes = set()
    for head in heads:
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
    monkeypatch.setattr(output_layer, "OUTPUT_LAYERS", {})
    with pytest.raises(
        ValueError,
        match=r"^swap_head: FSMTForConditionalGeneration calls its get_output_embeddings\(\) "
        r"\(Embedding\) on token ids: an input embedding",
    ) as e:
        hf_heads.swap_head(fsmt(), "mos")
    assert "\n" not in str(e.value)


# -- the probe ----------------------------------------------------------------------------------------------------


#: the families whose config scales or soft-caps the logits after lm_head (variants: hf_families.VARIANTS): the field
#: that swap_head switches off, its neutral value, and the head options that take its place
MAPPED = {
    "gemma2": ("final_logit_softcapping", None, {"logit_softcap": 30.0}),
    "vaultgemma": ("final_logit_softcapping", None, {"logit_softcap": 30.0}),
    "t5gemma": ("final_logit_softcapping", None, {"logit_softcap": 30.0}),
    "cohere": ("logit_scale", 1.0, {"logit_scale": 0.0625}),
    "cohere2": ("logit_scale", 1.0, {"logit_scale": 0.0625}),
    "granite_logits_scaling": ("logits_scaling", 1.0, {"logit_scale": 0.125}),
    "falcon_h1_lm_head_multiplier": ("lm_head_multiplier", 1.0, {"logit_scale": 0.5}),
}


def _holders(model, field):
    """The configs (and nested configs) and modules of ``model`` that have ``field``."""
    return [c for c in output_layer.nested_configs(model.config) if field in vars(c)] + [
        m for m in model.modules() if field in vars(m)
    ]


@pytest.mark.parametrize("case", sorted(MAPPED))
@pytest.mark.parametrize("head", ["softmax", "plif", "mos_plif"])
def test_a_scaled_or_capped_family_is_exact_with_every_head_that_applies_the_map(case, head):
    """The heads with an exact start besides MoS and Mixtape (check_family's), on the families whose logits are
    scaled or soft-capped after lm_head: exact (normalised log-probs, losses lean and not, beam scores)."""
    notes = []
    assert check_family(case, notes, lean_expected=True, heads=(head,)) == "exact"


@pytest.mark.parametrize("case", sorted(MAPPED))
def test_swap_head_moves_the_map_into_the_head_and_switches_the_models_copy_off(case):
    field, neutral, options = MAPPED[case]
    model, _ = tiny_model(case)
    holders = _holders(model, field)
    assert holders and all(getattr(h, field) not in (None, 1.0) for h in holders)
    hf_heads.swap_head(model, "mos", start="pretrained", num_components=2)
    assert all(getattr(h, field) == neutral for h in _holders(model, field))  # the config, and copies (Cohere)
    spec = model.config.output_head["options"]
    assert {k: v for k, v in spec.items() if k.startswith("logit_")} == options
    head = hf_heads.output_head(model)
    assert {k: getattr(head.config, k) for k in options} == options


FAST_OPTIONS = {
    "ds_softmax": {},
    "svd_softmax": {},
    "adaptive_sampling": {},
    "class_softmax": {"num_classes": 4},
    "d_softmax": {"band_fractions": [0.5, 0.5], "band_dims": [16, 16]},
}


@pytest.mark.parametrize("case", ["gemma2", "cohere"])
@pytest.mark.parametrize("head", sorted(FAST_OPTIONS))
def test_a_head_that_cannot_apply_the_map_is_refused_and_the_model_left_as_it_was(case, head):
    field, _, options = MAPPED[case]
    model, _ = tiny_model(case)
    before = {id(h): getattr(h, field) for h in _holders(model, field)}  # (Cohere: the config and the model's copy)
    name, value = next(iter(options.items()))
    with pytest.raises(
        ValueError,
        match=rf"^swap_head: {type(model).__name__} applies {field}=[0-9.]+ to its logits after its output "
        rf"layer, which moves into the head: {head}: option {name}={value} is out of range",
    ) as e:
        hf_heads.swap_head(model, head, **FAST_OPTIONS[head])
    assert "\n" not in str(e.value)
    assert {id(h): getattr(h, field) for h in _holders(model, field)} == before
    assert not isinstance(model, modeling.HeadModelMixin)


def test_convert_head_keeps_the_map_in_the_new_head():
    """A head model whose softmax head applies Gemma 2's cap, converted to MoS at its exact start: the cap stays with
    the head (recorded in the config), step 0 unchanged; a head that cannot apply it is refused."""
    model, kind = tiny_model("gemma2")
    b = batch(model, kind)
    hf_heads.swap_head(model, "softmax").eval()
    with torch.no_grad():
        before = model(input_ids=b["input_ids"]).logits
    hf_heads.convert_head(model, "mos", start="pretrained", num_components=2)
    assert model.config.output_head["options"]["logit_softcap"] == 30.0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=b["input_ids"]).logits, before, atol=ATOL, rtol=0)
    model, _ = tiny_model("gemma2")
    hf_heads.swap_head(model, "softmax")
    with pytest.raises(ValueError, match=r"^svd_softmax: option logit_softcap=30.0 is out of range"):
        hf_heads.convert_head(model, "svd_softmax")
    with pytest.raises(ValueError, match=r"^convert_head: option logit_softcap=None, but the source head applies"):
        hf_heads.convert_head(model, "mos", logit_softcap=None)


@pytest.mark.parametrize("case", ["gemma2", "cohere"])
def test_the_pretrained_head_of_an_upgrade_scores_what_the_model_computes(case):
    """hf_heads.hf.upgrade.pretrained_head (the "before" of a head upgrade, over the states lm_head reads) applies the
    model's cap or scale; the model is left as it was."""
    from hf_heads.hf import upgrade

    model, kind = tiny_model(case)
    b = batch(model, kind)
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=b["input_ids"]).logits, -1)
    handle.remove()
    head = upgrade.pretrained_head(model)
    torch.testing.assert_close(head(seen[0]), expected, atol=ATOL, rtol=0)
    field, _, options = MAPPED[case]
    assert {k: getattr(head.config, k) for k in options} == options
    assert getattr(model.config, field) not in (None, 1.0) and not isinstance(model, modeling.HeadModelMixin)


def test_a_map_given_as_an_option_on_a_model_that_applies_its_own_is_refused():
    model, _ = tiny_model("cohere")
    with pytest.raises(ValueError, match=r"^swap_head: CohereForCausalLM applies logit_scale=0.0625 .*option "):
        hf_heads.swap_head(model, "mos", logit_scale=0.0625)
    assert model.logit_scale == model.config.logit_scale == 0.0625


def test_a_transform_no_config_field_holds_is_refused_naming_it():
    """A scale the model keeps only in a module (it would come back from the config on reload) or a transform that is
    no scale or soft-cap: refused with what the probe saw, the model as it was."""
    model, _ = tiny_model("cohere")
    model.logit_scale = 0.3  # the module's copy, not the config's
    with pytest.raises(
        ValueError,
        match=r"^swap_head: CohereForCausalLM transforms the logits after its output layer \(returned logits != the "
        r"output layer's: max \|diff\| [0-9.]+; a scalar scale: returned logits = 0\.3 x",
    ):
        hf_heads.swap_head(model, "mos")
    assert model.logit_scale == 0.3 and model.config.logit_scale == 0.0625

    model, _ = tiny_model("gemma2")
    model.config.final_logit_softcapping = 7.0
    model.train()
    forward = type(model).forward

    def shifted(self, *args, **kwargs):  # a soft-cap plus a shift: no field explains it
        out = forward(self, *args, **kwargs)
        out.logits = out.logits + 1.0
        return out

    model.forward = shifted.__get__(model)
    with pytest.raises(ValueError, match=r"^swap_head: Gemma2ForCausalLM transforms the logits after its output layer"):
        hf_heads.swap_head(model, "mos")
    assert model.config.final_logit_softcapping == 7.0
    assert model.training and all(m.training for m in model.modules())  # the probe restored the mode


def test_the_hypotheses_name_a_scale_a_cap_or_both_by_their_values():
    """What the probe's returned logits are explained by, from the values the config's fields hold: a multiplier, a
    divisor, a cap, a scale then a cap (two fields); names that speak of logits are tried first."""
    made = output_layer._probe_values((1, 5, 96), torch.float32, "cpu").float()

    def probe(got):
        return output_layer.Probe("transforms", torch.zeros(1, 5, 32), made, got.float())

    fields = {"num_hidden_layers": (2, []), "logit_multiplier": (0.5, []), "softcap": (30.0, []), "eps": (1e-6, [])}
    scaled = output_layer._map_hypotheses(probe(0.5 * made), fields)
    assert scaled == [
        ({"logit_scale": 0.5}, [("logit_multiplier", 1.0)]),
        ({"logit_scale": 0.5}, [("num_hidden_layers", 1.0)]),
    ]
    assert output_layer._map_hypotheses(probe(30 * torch.tanh(made / 30)), fields) == [
        ({"logit_softcap": 30.0}, [("softcap", None)])
    ]
    both = output_layer._map_hypotheses(probe(30 * torch.tanh(0.5 * made / 30)), fields)
    assert both[0] == ({"logit_scale": 0.5, "logit_softcap": 30.0}, [("softcap", None), ("logit_multiplier", 1.0)])
    assert output_layer._map_hypotheses(probe(made + 1.0), fields) == []


def test_the_probe_is_deterministic_and_leaves_the_model_as_it_was():
    model, _ = tiny_model("gpt2")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    layer = output_layer.output_layer(model)
    model.eval()
    model.transformer.h[0].train()  # a module in another mode than the model keeps it
    rng = torch.get_rng_state()
    assert output_layer.probe_output_layer(model, layer) is None
    assert output_layer.probe_output_layer(model, layer) is None
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


def test_a_new_model_from_a_head_config_takes_the_map_too():
    """``from_config(head_config(...))`` builds the model with weights: probed with the head in place, so a family
    whose config soft-caps its logits has the cap moved into the head there too (the config records it), a head that
    cannot apply it is refused, and a family that transforms nothing builds as it is."""
    from hf_families import tiny_config

    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny_config("gemma2"), "mos"))
    assert model.config.final_logit_softcapping is None
    assert model.config.output_head["options"] == {"logit_softcap": 30.0}
    assert hf_heads.output_head(model).config.logit_softcap == 30.0
    with pytest.raises(
        ValueError,
        match=r"^SoftmaxHeadsGemma2ForCausalLM: Gemma2ForCausalLM applies final_logit_softcapping=30.0 to its logits "
        r"after its output layer, which moves into the head: ds_softmax: option logit_softcap=30.0",
    ):
        transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny_config("gemma2"), "ds_softmax"))
    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny_config("gemma"), "mos"))
    assert isinstance(hf_heads.output_head(model), hf_heads.OutputHead)


@pytest.mark.parametrize("case", ["gemma", "gemma2", "falcon_h1_lm_head_multiplier"])
def test_a_plain_checkpoint_loaded_with_a_head_config_starts_at_the_model(case, tmp_path):
    """``from_pretrained(plain checkpoint, config=head_config(..., start="pretrained"))``: the head's weight loads from
    lm_head.weight, its other parameters start as the head builds them (identity contexts, not transformers' random
    init), and a map the model applies after lm_head moves into the head: step 0 is the plain model. (transformers 5
    marks what it loaded; before it, the head's parts get transformers' init, docs/huggingface.md.)"""
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"transformers {transformers.__version__} does not mark the tensors it loaded")
    plain, kind = tiny_model(case)
    plain.save_pretrained(tmp_path)
    b = batch(plain, kind)
    with torch.no_grad():
        expected = torch.log_softmax(plain(input_ids=b["input_ids"]).logits, -1)
    config = hf_heads.head_config(plain.config, "mos", start="pretrained", num_components=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, config=config).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=b["input_ids"]).logits, expected, atol=ATOL, rtol=0)
    head = hf_heads.output_head(model)
    assert torch.equal(head.context_proj.weight, torch.eye(32).repeat(2, 1))
    if case in MAPPED:
        assert model.config.output_head["options"].items() >= MAPPED[case][2].items()


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
