"""TRL's trainers train the head (not a softmax over its output embedding): real trl, a tiny GPT-2, a few steps.

TRL replaces ``model.forward`` by a fused LM head that projects through ``get_output_embeddings().weight``; a head
model keeps its own forward, which answers TRL's ``fused_lm_head=True`` calls with the head (hf_heads/hf/trl.py).
Also: :meth:`OutputHead.token_log_probs`, the memory-lean per-token log-probs those calls use.
"""

import copy
import random

import pytest
import torch

import hf_heads

trl = pytest.importorskip(
    "trl", reason="trl not installed: `make install` installs it on Python >= 3.11 (the clients extra)"
)
datasets = pytest.importorskip("datasets", reason="datasets comes with trl: run `make install`")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast  # noqa: E402

import hf_heads.hf.trl as head_trl  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
HEADS = {
    "mixtape": {"num_gates": 4, "gate_embedding_size": 8, "gate_noise": 0.0},
    "mos": {"num_components": 2},
    "plif": {"num_knots": 100},
}


def tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def head_model(name):
    torch.manual_seed(0)
    base = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=len(WORDS) + 4,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return AutoModelForCausalLM.from_config(hf_heads.head_config(base, name, **HEADS.get(name, {})))


def sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]


@pytest.fixture
def spy(monkeypatch):
    """Records every fused call TRL makes (its inputs, its per-token log-probs, the model as it was then); check()
    compares them afterwards with the head's own: the model's plain forward, whose logits are the head's log-probs
    and whose loss is their NLL. (Nothing runs inside the trainer's step but the call itself.)"""
    calls = []
    original = head_trl.fused_forward

    def recording(model, base_forward, args, kwargs):
        out = original(model, base_forward, args, kwargs)
        calls.append(
            {
                "model": copy.deepcopy(model).eval(),
                "args": args,
                "kwargs": dict(kwargs),
                "log_probs": out.log_probs.detach().clone(),
                "loss": out.loss.detach().clone(),
            }
        )
        return out

    def check():
        for call in calls:
            model, kwargs = call["model"], call["kwargs"]
            labels = kwargs["labels"]
            inputs = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels", "num_items_in_batch")}
            with torch.no_grad():
                lp = model(*call["args"], **inputs).logits[:, :-1]
                call["nll_sum"] = model(*call["args"], **inputs, labels=labels, num_items_in_batch=1).loss
            target = labels[:, 1:]
            mask = target != -100
            expected = lp.gather(-1, target.clamp(min=0)[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
            torch.testing.assert_close(call["log_probs"], expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(-call["log_probs"].sum(), call["nll_sum"], rtol=1e-5, atol=1e-5)
        return calls

    monkeypatch.setattr(head_trl, "fused_forward", recording)
    return check


@pytest.mark.parametrize("name", sorted(HEADS))
def test_sft_trainer_trains_the_head_and_logs_its_loss(tmp_path, spy, name):
    model = head_model(name)
    before = {n: p.detach().clone() for n, p in model.lm_head.named_parameters()}
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        bf16=False,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        processing_class=tokenizer(),
        train_dataset=datasets.Dataset.from_dict({"text": sentences(24, 0)}),
    )
    counts = []  # the token count Trainer divides each step's summed loss by
    compute_loss = trainer.compute_loss
    trainer.compute_loss = lambda *a, num_items_in_batch=None, **k: (
        counts.append(num_items_in_batch) or compute_loss(*a, num_items_in_batch=num_items_in_batch, **k)
    )
    trainer.train()
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.lm_head.named_parameters()}
    assert all(v > 0 for v in moved.values()), moved  # every head parameter trained (the bypass left them at 0)
    first = trainer.state.log_history[0]
    calls = spy()
    assert len(calls) >= 3
    assert first["loss"] == pytest.approx(calls[0]["nll_sum"].item() / float(counts[0]), rel=1e-4)  # the head's NLL
    assert 0 < first["entropy"] <= torch.log(torch.tensor(float(len(WORDS) + 4))).item() + 1e-4


def test_sft_metrics_are_the_heads_entropy_and_accuracy():
    model = head_model("mos").eval()
    trl.trainer.utils.add_fused_lm_head(
        model, outputs=("log_probs", "entropy", "is_top1", "log_sum_sq_probs", "mean_logits")
    )
    ids = torch.randint(4, len(WORDS) + 4, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        lp = model(input_ids=ids).logits[:, :-1]
    mask = labels[:, 1:] != -100
    assert torch.equal(out.label_mask, mask)
    torch.testing.assert_close(out.entropy, (-(lp.exp() * lp).sum(-1)).masked_fill(~mask, 0), rtol=1e-5, atol=1e-6)
    assert torch.equal(out.is_top1, (lp.argmax(-1) == labels[:, 1:]) & mask)
    torch.testing.assert_close(out.log_sum_sq_probs, torch.logsumexp(2 * lp, -1).masked_fill(~mask, 0))
    torch.testing.assert_close(out.mean_logits, lp.mean(-1).masked_fill(~mask, 0))


def test_dpo_trainer_scores_chosen_and_rejected_with_the_head(tmp_path, spy):
    model = head_model("mixtape")
    before = {n: p.detach().clone() for n, p in model.lm_head.named_parameters()}
    prompts, chosen, rejected = sentences(8, 1), sentences(8, 2), sentences(8, 3)
    data = datasets.Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        bf16=False,
    )
    trainer = trl.DPOTrainer(
        model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tokenizer(), train_dataset=data
    )  # the reference is the head model as it starts
    trainer.train()
    assert len(spy()) >= 2  # policy (and reference) log-probs came through the head's fused forward
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.lm_head.named_parameters()}
    assert all(v > 0 for v in moved.values()), moved
    assert "logps/chosen" in trainer.state.log_history[0]


def test_a_head_with_an_aux_loss_is_refused_when_the_trainer_is_built(tmp_path):
    model = head_model("ds_softmax")
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    with pytest.raises(
        ValueError,
        match=r"^SFTTrainer: the ds_softmax head has an auxiliary loss .* that TRL's "
        r"losses do not include",
    ):
        trl.SFTTrainer(
            model=model,
            args=args,
            processing_class=tokenizer(),
            train_dataset=datasets.Dataset.from_dict({"text": sentences(4, 0)}),
        )


@pytest.mark.parametrize("name", sorted(HEADS))
def test_token_log_probs_equal_the_heads_log_probs_and_keep_no_vocabulary_wide_tensor(name):
    """Lean per-token log-probs (chunks under checkpoint): the values and every gradient of a weighted sum equal the
    plain path's, at temperature 1 and 2; what autograd keeps for backward has no [tokens, V] tensor."""
    torch.manual_seed(0)
    vocab, n = 300, 40
    head = hf_heads.build_head(name, hidden_size=8, vocab_size=vocab, dropout=0.2, **HEADS[name]).train()
    head.lean_chunk_tokens = lambda: 16  # three chunks, one partial
    hidden = torch.randn(4, n // 4, 8, requires_grad=True)
    target = torch.randint(0, vocab, (4, n // 4))
    target[0, :3] = -100
    weights = torch.randn(target.shape)
    for temperature in (1.0, 2.0):
        results = []
        for lean in (True, False):
            head.lean_loss = lean
            head.zero_grad()
            hidden.grad = None
            saved = []
            torch.manual_seed(1)
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
                lp = head.token_log_probs(hidden, target, temperature=temperature)
            (lp * weights).sum().backward()
            grads = [hidden.grad.clone()] + [p.grad.clone() for p in head.parameters() if p.grad is not None]
            results.append((lp.detach(), grads, max(saved)))
        (lean_lp, lean_grads, lean_saved), (ref_lp, ref_grads, ref_saved) = results
        assert torch.equal(lean_lp[0, :3], torch.zeros(3))
        torch.testing.assert_close(lean_lp, ref_lp, rtol=1e-5, atol=1e-6)
        for a, b in zip(lean_grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert ref_saved >= (n - 3) * vocab > lean_saved  # the plain path keeps [tokens, V]; the lean one does not
