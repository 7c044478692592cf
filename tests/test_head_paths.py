"""Paths of transformers, its Trainer and PEFT that could read ``get_output_embeddings().weight`` or compute logits
themselves, run on head models (mixtape, mos, ds_softmax): each test writes down what the path does with the head.

A path *runs the head* when its numbers equal what the head gives (a slow loop calling the model, the head's
log-probs); the tests of paths that do something else (skip the head, refuse, or misuse its output) say so in their
names and assert what happens today, so a change there is a deliberate edit of this file.
"""

from __future__ import annotations

import tempfile
import warnings

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from transformers.generation import utils as generation_utils  # noqa: E402
from transformers.generation import candidate_generator  # noqa: E402

from hf_families import TINY_SEQ2SEQ  # noqa: E402
from test_hf import _no_randomness  # noqa: E402

V = 100
HEADS = {"mixtape": {"num_gates": 4}, "mos": {}, "ds_softmax": {}}
HEAD_NAMES = list(HEADS)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these tiny models gain nothing from more, and on a busy machine OpenMP's waiting threads
    made every call here about ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpt2(head=None, seed=0, vocab=V):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return (hf_heads.swap_head(model, head, **HEADS[head]) if head else model).eval()


def bart(head=None, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(vocab_size=V, **TINY_SEQ2SEQ)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg)
    return (hf_heads.swap_head(model, head, **HEADS[head]) if head else model).eval()


def llama(head=None, seed=0, layers=2):
    """A tiny Llama: its decoder honours ``config.num_hidden_layers`` (early exit) and returns chosen layers'
    hidden states (DFlash); GPT-2 does neither."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return (hf_heads.swap_head(model, head, **HEADS[head]) if head else model).eval()


MODELS = {"gpt2": gpt2, "bart": bart}
#: (model, head) pairs the generate tests run: GPT-2 and BART (the encoder-decoder paths) with every head
CASES = [(m, h) for m in MODELS for h in HEAD_NAMES]


def ids(seed=0, length=5, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (batch, length), generator=g)


N_NEW = 4  # new tokens per generate call


def greedy_kwargs(model):
    # no EOS: every call makes the same number of tokens, so sequences compare position by position
    return dict(max_new_tokens=N_NEW, do_sample=False, pad_token_id=0, eos_token_id=None)


@torch.no_grad()
def slow_greedy(model, x, n=None):
    """The reference: the model called on the whole sequence at every step, argmax of the head's log-probs."""
    n = n or N_NEW
    if model.config.is_encoder_decoder:
        seq = torch.full((x.shape[0], 1), model.config.decoder_start_token_id)
        for _ in range(n):
            lp = model(input_ids=x, decoder_input_ids=seq).logits[:, -1]
            seq = torch.cat([seq, lp.argmax(-1, keepdim=True)], 1)
        return seq
    for _ in range(n):
        x = torch.cat([x, model(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return x


@torch.no_grad()
def log_probs_along(model, x, seq):
    """The head's log-probs at every position of a generated sequence (decoder positions for seq2seq)."""
    if model.config.is_encoder_decoder:
        return model(input_ids=x, decoder_input_ids=seq).logits
    return model(seq).logits


def normalised(lp):
    return torch.allclose(lp.logsumexp(-1), torch.zeros(lp.shape[:-1]), atol=1e-4)


# ----------------------------------------------------------------- the model's own loss and logits_to_keep
@pytest.mark.parametrize("head", HEAD_NAMES)
def test_transformers_causal_lm_loss_is_the_heads_nll(head):
    """loss/loss_utils.py ForCausalLMLoss / fixed_cross_entropy: cross-entropy of log-probs is their NLL (with
    num_items_in_batch and shift_labels as Trainer and TRL pass them)."""
    model = gpt2(head)
    x = ids(length=8, batch=2)
    labels = x.clone()
    labels[1, -3:] = -100
    with torch.no_grad():
        lp = model(x).logits
        hidden = model(x, output_hidden_states=True).hidden_states[-1]
        mean = model(x, labels=labels).loss
        summed = model(x, labels=labels, num_items_in_batch=torch.tensor(7)).loss
        shifted = model(x, shift_labels=F.pad(labels, (0, 1), value=-100)[:, 1:].contiguous(), labels=labels).loss
    target = labels[:, 1:]
    head_nll = hf_heads.output_head(model).loss(hidden[:, :-1], target)
    torch.testing.assert_close(mean, head_nll)
    torch.testing.assert_close(mean, F.nll_loss(lp[:, :-1].reshape(-1, V), target.reshape(-1)))
    torch.testing.assert_close(summed, hf_heads.output_head(model).loss(hidden[:, :-1], target, reduction="sum") / 7)
    torch.testing.assert_close(shifted, mean)


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_logits_to_keep_runs_the_head_on_the_kept_positions(head):
    """GPT2LMHeadModel.forward slices the hidden states (slice_logits_to_keep) and then calls lm_head: the head, on
    the kept positions only; generate passes logits_to_keep=1 (generation/utils.py:2953)."""
    model = gpt2(head)
    x = ids(length=6)
    with torch.no_grad():
        full = model(x).logits
        last = model(x, logits_to_keep=1).logits
        chosen = model(x, logits_to_keep=torch.tensor([0, 3])).logits
    assert last.shape == (1, 1, V) and normalised(last)
    torch.testing.assert_close(last, full[:, -1:])
    torch.testing.assert_close(chosen, full[:, [0, 3]])


# ----------------------------------------------------------------- generate: greedy, output_logits, caches, compile
@pytest.mark.parametrize("model_name, head", CASES)
def test_generate_output_logits_and_scores_are_the_heads_log_probs(model_name, head):
    """generate(output_logits=True): raw logits (generation/utils.py:3247, outputs.logits[:, -1]) are the head's
    log-probs at each step; the greedy sequence is the slow loop's."""
    model = MODELS[model_name](head)
    x = ids(length=6)
    out = model.generate(
        x, **greedy_kwargs(model), output_logits=True, output_scores=True, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, slow_greedy(model, x))
    lp = log_probs_along(model, x, out.sequences)
    start = 0 if model.config.is_encoder_decoder else x.shape[1] - 1
    for i, (raw, score) in enumerate(zip(out.logits, out.scores)):
        torch.testing.assert_close(raw, lp[:, start + i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(score, raw)  # greedy: no processor changes them


@pytest.mark.parametrize("model_name, head", CASES)
def test_static_cache_generate_equals_the_slow_loop(model_name, head):
    model = MODELS[model_name](head)
    x = ids(length=6)
    out = model.generate(x, **greedy_kwargs(model), cache_implementation="static")
    assert torch.equal(out, slow_greedy(model, x))


@pytest.mark.slow  # dynamo's first compile takes seconds
def test_compiled_generate_with_a_static_cache_runs_the_head():
    """generate's automatic torch.compile (generation/utils.py:3201, get_compiled_call) with a static cache, forced on
    CPU: the compiled forward runs the head (backend 'eager' keeps the test fast; tests/test_compile.py compiles the
    heads with inductor)."""
    model = gpt2("mixtape")
    x = ids()
    config = transformers.CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True  # what transformers' own tests set to compile on CPU
    out = model.generate(x, **greedy_kwargs(model), cache_implementation="static", compile_config=config)
    assert hasattr(model, "_compiled_call")  # the compiled call ran the decoding steps
    assert torch.equal(out, slow_greedy(model, x))


@pytest.mark.slow  # continuous batching starts a manager thread and sizes its cache: seconds per call
def test_continuous_batching_generate_batch_runs_the_head():
    """generate_batch (generation/continuous_batching): the model runner passes logits_indices as logits_to_keep
    (model_runner.py:135-137), so the head runs on the rows it samples from; greedy output is the slow loop's. (Its
    cache sizing counts V float32 logits per row, cache.py:602-643, which a mixture head exceeds.)"""
    model = gpt2("mixtape")
    prompts = [ids(seed=0), ids(seed=3)]
    config = transformers.GenerationConfig(max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    results = model.generate_batch(
        inputs=[p[0].tolist() for p in prompts], generation_config=config, progress_bar=False
    )
    outputs = [r.generated_tokens for _, r in sorted(results.items())]
    assert outputs == [slow_greedy(model, p)[0, p.shape[1] :].tolist() for p in prompts]


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_repetition_penalty_acts_on_the_heads_log_probs(head):
    """Logits processors see the head's log-probs. Those that are invariant to adding a constant per row (temperature,
    top-k/p, min-p, bias, suppression, ...) act as on logits; RepetitionPenaltyLogitsProcessor is not (it divides
    positive and multiplies negative scores): on log-probs, all <= 0, it always multiplies."""
    model = gpt2(head)
    x = ids()
    out = model.generate(x, **greedy_kwargs(model), repetition_penalty=1.5)
    penalty = transformers.RepetitionPenaltyLogitsProcessor(1.5)
    seq = x
    with torch.no_grad():
        for _ in range(N_NEW):
            scores = penalty(seq, model(seq).logits[:, -1])
            seq = torch.cat([seq, scores.argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


# ----------------------------------------------------------------- assisted generation and speculative decoding
@pytest.mark.parametrize("model_name, head", CASES)
def test_prompt_lookup_and_assisted_greedy_equal_the_slow_loop(model_name, head):
    """_assisted_decoding (generation/utils.py:3919) verifies candidates with the model's own forward
    (outputs.logits, :4091): with prompt lookup (PromptLookupCandidateGenerator) and with an assistant head model
    (AssistedCandidateGenerator, the assistant's generate runs its head), greedy output is the model's."""
    model = MODELS[model_name](head)
    x = torch.cat([ids(length=4)] * 3, 1)  # repeated n-grams: prompt lookup proposes candidates
    ref = slow_greedy(model, x)
    assert torch.equal(model.generate(x, **greedy_kwargs(model), prompt_lookup_num_tokens=3), ref)
    for assistant in (MODELS[model_name](head, seed=1), model):  # a different model; the model itself (all accepted)
        assert torch.equal(model.generate(x, **greedy_kwargs(model), assistant_model=assistant), ref)


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_speculative_sampling_compares_the_two_heads_distributions(head, monkeypatch):
    """do_sample=True with an assistant: _speculative_sampling (generation/utils.py:4430) takes softmax of the
    assistant's candidate scores (q) and of the model's new logits (p): softmax of log-probs is the head's p."""
    model, assistant = gpt2(head), gpt2(head, seed=1)
    calls = []
    original = generation_utils._speculative_sampling

    def spy(candidate_ids, candidate_logits, length, new_logits, **kwargs):
        calls.append((candidate_ids.clone(), candidate_logits.clone(), length, new_logits.clone()))
        return original(candidate_ids, candidate_logits, length, new_logits, **kwargs)

    monkeypatch.setattr(generation_utils, "_speculative_sampling", spy)
    x = ids()
    torch.manual_seed(0)
    model.generate(x, max_new_tokens=6, do_sample=True, top_k=0, top_p=1.0, pad_token_id=0, assistant_model=assistant)
    assert calls
    with torch.no_grad():
        for candidate_ids, candidate_logits, length, new_logits in calls:
            torch.testing.assert_close(new_logits, model(candidate_ids).logits[:, -length - 1 :], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                candidate_logits, assistant(candidate_ids).logits[:, -length - 1 : -1], rtol=1e-5, atol=1e-5
            )


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_early_exit_drafts_through_the_head(head, monkeypatch):
    """assistant_early_exit (EarlyExitCandidateGenerator, candidate_generator.py:1153): the model drafts with its
    first layers and then its final norm and lm_head (the head); the output is the model's greedy output."""
    model = llama(head, layers=3)
    x = ids()
    drafts = []
    original = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        candidate_ids, candidate_logits = original(self, input_ids, **kwargs)
        drafts.append((candidate_ids.clone(), candidate_logits))
        return candidate_ids, candidate_logits

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates", spy)
    out = model.generate(x, **greedy_kwargs(model), assistant_early_exit=1)
    assert torch.equal(out, slow_greedy(model, x))
    assert any(logits is not None for _, logits in drafts)
    one_layer = llama(head, layers=3)
    one_layer.config.num_hidden_layers = 1  # what the generator sets while drafting
    with torch.no_grad():
        for candidate_ids, candidate_logits in drafts:
            if candidate_logits is None:  # no room left for a draft
                continue
            n = candidate_logits.shape[1]
            torch.testing.assert_close(
                candidate_logits, one_layer(candidate_ids).logits[:, -n - 1 : -1], rtol=1e-5, atol=1e-5
            )


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_dflash_drafts_through_the_targets_head(head):
    """speculation_type='dflash' (DFlashTokenCandidateGenerator, candidate_generator.py:1643) calls the target's
    get_output_embeddings() module on the draft model's hidden states: the head runs on them; verification keeps
    the target's greedy output."""
    from transformers.models.muse_glimmer_assistant import modeling_muse_glimmer_assistant as dflash

    model = llama(head)
    torch.manual_seed(0)
    config = transformers.MuseGlimmerAssistantConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        block_size=3,
        mask_token_id=99,
        target_layer_ids=[0, 1],
    )
    drafter = dflash.MuseGlimmerAssistantModel(config).eval()
    seen = []
    hook = hf_heads.output_head(model).register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    x = ids()
    try:
        out = model.generate(x, **greedy_kwargs(model), assistant_model=drafter, speculation_type="dflash")
    finally:
        hook.remove()
    assert torch.equal(out, slow_greedy(model, x))
    drafts = [lp for h, lp in seen if h.shape[1] == config.block_size - 1]  # the draft block, through the head
    assert drafts and all(normalised(lp) for lp in drafts)


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[3]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=words[0], bos_token=words[1], eos_token=words[2], unk_token=words[3]
    )


def _universal_setup(head):
    """A target and an assistant with different vocabularies (80 of whose ids 52 map to the target's), with fresh
    tokenizers (transformers caches its vocabulary translator per tokenizer pair)."""
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    target_tok = _word_tokenizer(special + [f"w{i}" for i in range(V - 4)])
    assistant_tok = _word_tokenizer(special + [f"w{i}" for i in range(48)] + [f"x{i}" for i in range(28)])
    model, assistant = gpt2(head), gpt2(head, seed=1, vocab=80)
    x = torch.tensor([target_tok("w5 w6 w7 w8")["input_ids"]])
    kwargs = dict(
        max_new_tokens=5,
        pad_token_id=0,
        assistant_model=assistant,
        tokenizer=target_tok,
        assistant_tokenizer=assistant_tok,
        attention_mask=torch.ones_like(x),
    )
    return model, assistant, x, kwargs


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_universal_assisted_greedy_keeps_both_heads(head):
    """Different tokenizers, do_sample=False (AssistedCandidateGeneratorDifferentTokenizers): the assistant generates
    text with its head, re-tokenized for the target, which verifies with its head."""
    model, assistant, x, kwargs = _universal_setup(head)
    out = model.generate(x, do_sample=False, **kwargs)
    assert torch.equal(out, model.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0))
    assert hf_heads.output_head(assistant).head_name == head


@pytest.mark.parametrize("head", ["mixtape", "mos"])
def test_universal_speculative_sampling_refuses_to_replace_the_assistants_head(head):
    """Different tokenizers, do_sample=True (UniversalSpeculativeDecodingGenerator): AssistantToTargetTranslator
    (candidate_generator.py:723-732) prunes the assistant's lm_head with prune_linear_layer (pytorch_utils.py:76,
    lm_head.weight rows) and set_output_embeddings() it, which would leave the assistant drafting with a plain softmax
    over its head's output embedding, for good. A head model refuses the replacement: generate fails with one line
    naming the fix, and the assistant keeps its head."""
    model, assistant, x, kwargs = _universal_setup(head)
    old = hf_heads.output_head(assistant)
    torch.manual_seed(0)
    with pytest.raises(
        ValueError,
        match=rf"set_output_embeddings\(_PruneReindexingLMHead\) would replace the {head} "
        r"head .* use do_sample=False",
    ):
        model.generate(x, do_sample=True, **kwargs)
    assert hf_heads.output_head(assistant) is old
    assert torch.equal(
        model.generate(x, do_sample=False, **kwargs),  # the assistant still works, as before
        model.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0),
    )


def test_universal_speculative_sampling_fails_on_a_ds_softmax_assistant():
    """prune_linear_layer index_selects rows of lm_head.weight, which for DS-Softmax is [experts, V, d]."""
    model, assistant, x, kwargs = _universal_setup("ds_softmax")
    with pytest.raises(IndexError, match="index out of range"):
        model.generate(x, do_sample=True, **kwargs)
    assert hf_heads.output_head(assistant).head_name == "ds_softmax"  # refused before anything changed


# ----------------------------------------------------------------- decoding methods that moved to the Hub
@pytest.mark.parametrize(
    "options, match",
    [
        (dict(penalty_alpha=0.6, top_k=4), "Contrastive Search requires `trust_remote_code=True`"),
        (dict(dola_layers="high"), "Dola Generation requires `trust_remote_code=True`"),
        (dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0), "Group Beam Search requires `trust_remote_code"),
        (dict(num_beams=2, force_words_ids=[[5]]), "Constrained Beam Search requires `trust_remote_code=True`"),
        (dict(use_mtp=True), "Could not find `num_mtp_layers`"),
    ],
    ids=["contrastive", "dola", "group_beam", "constrained_beam", "mtp"],
)
def test_decoding_methods_refused_here_as_for_the_plain_model(options, match):
    """Contrastive search, DoLa, group and constrained beam search moved to Hub code (GENERATION_MODES_MAPPING,
    generation/utils.py:150-153): without trust_remote_code (and a network) transformers refuses them, for the head
    model as for the plain one. MTP drafting needs num_mtp_layers, which GPT-2 has not."""
    for model in (gpt2("mixtape"), gpt2()):
        with pytest.raises(ValueError, match=match):
            model.generate(ids(), max_new_tokens=3, pad_token_id=0, **options)


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_dola_premature_layer_scores_are_the_heads_log_probs(head):
    """What transformers-community/dola computes per candidate layer: lm_head = model.get_output_embeddings();
    lm_head(outputs.hidden_states[layer][:, -1, :]), then log_softmax of it and of the final logits: the head runs on
    the early layer, and log_softmax leaves log-probs unchanged, so DoLa contrasts two head distributions."""
    model = gpt2(head)
    with torch.no_grad():
        out = model(ids(), output_hidden_states=True)
        early = model.get_output_embeddings()(out.hidden_states[1][:, -1, :])
    assert normalised(early)
    torch.testing.assert_close(early, hf_heads.output_head(model)(out.hidden_states[1][:, -1, :]))
    torch.testing.assert_close(early.log_softmax(-1), early, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- Trainer
def _eval_data():
    x = ids(seed=1, length=8, batch=4)
    return x, [{"input_ids": x[i], "labels": x[i]} for i in range(4)]


def _trainer(model, data, **options):
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_eval_batch_size=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        log_level="error",
        **options,
    )
    return transformers.Trainer(model=model, args=args, eval_dataset=data)


@pytest.mark.parametrize(
    "head, options",
    [(h, {}) for h in HEAD_NAMES]
    + [
        ("mixtape", {"prediction_loss_only": True}),
        ("mixtape", {"prediction_loss_only": True, "use_liger_kernel": True}),
    ],
    ids=HEAD_NAMES + ["mixtape-prediction_loss_only", "mixtape-use_liger_kernel"],
)
def test_trainer_evaluate_loss_and_predictions_are_the_heads(head, options):
    """prediction_step (trainer.py:3262-3269) calls the model with labels: the eval loss is the head's summed NLL over
    num_items_in_batch, which Trainer counts over the unshifted labels for GPT-2 (GPT2LMHeadModel's loss_type is None;
    the same for the plain model); predictions (compute_metrics) are the head's log-probs. With use_liger_kernel,
    Liger applies nothing to model type softmax-heads, and the skip_logits=True Trainer adds with
    prediction_loss_only (trainer.py:3265) changes nothing."""
    if options.get("use_liger_kernel"):
        pytest.importorskip("liger_kernel", reason="liger-kernel not installed")
    model = gpt2(head)
    x, data = _eval_data()
    with torch.no_grad():
        lp = model(x).logits
    nll_sum = F.nll_loss(lp[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1), reduction="sum")
    seen = {}
    trainer = _trainer(model, data, **options)
    trainer.compute_metrics = lambda p: seen.update(predictions=torch.as_tensor(p.predictions)) or {}
    assert trainer.evaluate()["eval_loss"] == pytest.approx((nll_sum / x.numel()).item(), rel=1e-5)
    if options.get("prediction_loss_only"):
        assert not seen
    else:
        torch.testing.assert_close(seen["predictions"], lp, rtol=1e-5, atol=1e-5)


def _smoothed(lp, target, eps=0.1):
    nll = -lp.gather(-1, target[..., None]).squeeze(-1)
    return ((1 - eps) * nll - eps * lp.mean(-1)).mean()


def test_trainer_label_smoothing_shifts_the_labels_of_a_causal_head_model():
    """With label_smoothing_factor, Trainer.compute_loss pops the labels and calls LabelSmoother with
    shift_labels=True only when model._get_name() is a class name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    (trainer.py:2186-2189): a head model answers its base class's name, so it is scored as the plain GPT2LMHeadModel
    is, each position against the next token. (The head's log-probs are what is smoothed: log_softmax leaves them
    unchanged.)"""
    x, data = _eval_data()
    plain, model = gpt2(), gpt2("mixtape")
    assert model._get_name() == "GPT2LMHeadModel" and repr(model).startswith("GPT2LMHeadModel(")
    for m in (plain, model):
        with torch.no_grad():
            lp = m(x).logits.log_softmax(-1)
        loss = _trainer(m, data, label_smoothing_factor=0.1).evaluate()["eval_loss"]
        # shifted, over Trainer's unshifted count (28 scored positions / 32 labels), as for the plain model
        assert loss == pytest.approx(_smoothed(lp[:, :-1], x[:, 1:]).item() * 28 / 32, rel=1e-5)


def test_training_forward_without_labels_warns_that_the_ds_softmax_aux_loss_is_not_added():
    """Trainer.compute_loss (trainer.py:2155-2164) calls the model without labels when label_smoothing_factor (or
    compute_loss_func) is set, so the model returns no loss to add the head's aux loss to: the training loss is the
    smoothed NLL alone, and the model says so (once), naming what to add."""
    model = _no_randomness(gpt2("ds_softmax").train())
    head = hf_heads.output_head(model)
    x, data = _eval_data()
    trainer = _trainer(model, data, label_smoothing_factor=0.1)
    with pytest.warns(
        UserWarning,
        match=r"ds_softmax: a training forward without labels .* add "
        r"hf_heads.output_head\(model\).aux_loss\(\) to your loss",
    ):
        loss = trainer.compute_loss(model, {"input_ids": x, "labels": x.clone()})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        model(x)
    with torch.no_grad():
        lp = model(x).logits.log_softmax(-1)
        aux = head.aux_loss()
    assert aux > 0
    torch.testing.assert_close(loss, _smoothed(lp[:, :-1], x[:, 1:]), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- PEFT
def _peft():
    return pytest.importorskip("peft", reason="peft not installed: run `make install`")


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_peft_lora_on_the_backbone_runs_the_frozen_head(head):
    peft_lib = _peft()
    model = gpt2(head)
    x = ids(length=8)
    with torch.no_grad():
        before = model(x).logits
    lora = peft_lib.get_peft_model(model, peft_lib.LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"))
    base = lora.get_base_model()
    assert hf_heads.output_head(base).head_name == head
    assert not any(p.requires_grad for p in hf_heads.output_head(base).parameters())
    with torch.no_grad():
        torch.testing.assert_close(lora(x).logits, before)  # LoRA starts at zero
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_()
        after = lora(x).logits
    assert normalised(after) and not torch.allclose(after, before)
    assert torch.equal(lora.generate(input_ids=x[:, :4], **greedy_kwargs(lora)), slow_greedy(lora, x[:, :4]))


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_peft_all_linear_puts_lora_inside_the_head(head):
    """target_modules='all-linear' leaves the output layer (lm_head) out but finds the nn.Linear layers inside the head
    (Mixtape's and MoS's context/gate/prior projections, DS-Softmax's gate and noise): LoRA adapts the head, which
    still runs and stays normalised."""
    peft_lib = _peft()
    model = gpt2(head)
    x = ids(length=8)
    lora = peft_lib.get_peft_model(model, peft_lib.LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    inside = [n for n, p in lora.named_parameters() if ".lm_head." in n and "lora_" in n]
    assert inside
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name and ".lm_head." in name:
                p.normal_()
        lp = lora(x).logits
        base = lora.get_base_model()
        hidden = base(x, output_hidden_states=True).hidden_states[-1]
    assert normalised(lp)
    torch.testing.assert_close(lp, hf_heads.output_head(base)(hidden))


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_peft_refuses_lora_on_the_head_and_trainable_token_indices(head):
    """LoRA on lm_head itself: PEFT refuses the module type when the adapter is built. trainable_token_indices:
    PEFT wraps the tied lm_head in a TrainableTokensWrapper, which cannot run a head (its own error would name an
    unknown layer type, or for DS-Softmax the [experts, V, d] weight): the model refuses it at the first forward."""
    peft_lib = _peft()
    with pytest.raises(ValueError, match=r"(?s)Target module \w+Head\(.* is not supported"):
        peft_lib.get_peft_model(gpt2(head), peft_lib.LoraConfig(r=4, target_modules=["lm_head"], task_type="CAUSAL_LM"))
    lora = peft_lib.get_peft_model(
        gpt2(head),
        peft_lib.LoraConfig(r=4, target_modules=["c_attn"], trainable_token_indices=[5, 6], task_type="CAUSAL_LM"),
    )
    with (
        warnings.catch_warnings(),
        pytest.raises(
            ValueError,
            match=rf"trainable_token_indices wrapped the {head} "
            r"head .* modules_to_save=\['lm_head'\]",
        ),
    ):
        warnings.simplefilter("ignore")  # PEFT: "Unsupported layer type ... proceed at your own risk"
        lora(ids(length=8))
