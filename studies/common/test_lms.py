"""The study's train-split LSTM (studies.common.lms) on a tiny generated corpus: the valid-based stop keeps the best
epoch's weights, a run cut after an epoch or within one goes on to the weights of an uncut run, and the task's states
are the ones its LM scores."""

import math
import os
import random

import pytest
import torch

from corpora import tiny_corpus
from studies.common import lms

TINY = {"dim": 8, "layers": 1, "dropout": 0.1, "bptt": 5, "batch": 4, "lr": 1e-2, "max_epochs": 3, "seed": 3}


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(12)]
    for split, lines in (("train", 60), ("valid", 12), ("test", 10)):
        with open(tmp_path / f"{split}.txt", "w") as f:
            for _ in range(lines):  # a Markov-ish text: each word mostly followed by the next
                w = rng.randrange(12)
                line = []
                for _ in range(rng.randint(3, 8)):
                    line.append(words[w])
                    w = (w + 1) % 12 if rng.random() < 0.8 else rng.randrange(12)
                f.write(" ".join(line) + "\n")
    return tmp_path


def test_improving():
    curve = [{"valid_ppl": p} for p in (5.0, 4.0, 4.5)]
    assert lms.improving(curve[:1], 1) and lms.improving(curve[:2], 1)
    assert not lms.improving(curve, 1)
    assert lms.improving(curve, 2)  # 4.0 < 5.0 within the last two


def test_train_split_lm_keeps_the_best_epoch_and_resumes(corpus, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    body, head, record = lms.train_split_lm(str(corpus), "tiny", str(full_dir), TINY, progress=False, log=lambda m: 0)
    assert record["vocab_size"] == 13  # 12 words and <eos>
    curve = record["curve"]
    assert 1 <= len(curve) <= 3
    assert record["best_epoch"] == min(curve, key=lambda e: e["valid_ppl"])["epoch"]
    assert record["cpu_seconds"] == pytest.approx(sum(e["cpu_seconds"] for e in curve))
    # the kept weights are the best epoch's: their valid perplexity is the curve's lowest
    vocab = lms.vocabulary(str(corpus))
    valid = lms.split_ids(str(corpus), vocab, "valid")
    ppl = math.exp(lms.mean_nll(head, *lms.split_states(body, valid, lms.STREAMS["valid"], TINY["bptt"])))
    assert ppl == pytest.approx(record["valid_ppl"], rel=1e-5)
    assert record["valid_ppl"] == min(e["valid_ppl"] for e in curve)
    assert record["test_ppl"] < 13  # learnt something: below the uniform distribution's perplexity

    class Cut(Exception):
        pass

    def cut_after_first(message):
        if "epoch 1:" in message:
            raise Cut

    with pytest.raises(Cut):
        lms.train_split_lm(str(corpus), "tiny", str(cut_dir), TINY, progress=False, log=cut_after_first)
    assert list(cut_dir.glob("*-partial.pt"))
    messages = []
    body2, head2, record2 = lms.train_split_lm(
        str(corpus), "tiny", str(cut_dir), TINY, progress=False, log=messages.append
    )
    assert any("going on after epoch 1" in m for m in messages)
    assert not list(cut_dir.glob("*-partial.pt"))
    for a, b in zip(
        list(body.state_dict().values()) + list(head.state_dict().values()),
        list(body2.state_dict().values()) + list(head2.state_dict().values()),
    ):
        assert torch.equal(a, b)
    assert [e["valid_ppl"] for e in record2["curve"]] == [e["valid_ppl"] for e in curve]
    # cut within an epoch (as it would save its 6th step, after its 3rd's was saved), it goes on from the 3rd step
    within_dir = tmp_path / "within"
    real_save = torch.save

    def cut_saving_step_6(obj, f, *a, **k):
        if isinstance(obj, dict) and (obj.get("within") or {}).get("start") == 6 * TINY["bptt"]:
            raise Cut
        real_save(obj, f, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(torch, "save", cut_saving_step_6)
        with pytest.raises(Cut):
            lms.train_split_lm(str(corpus), "tiny", str(within_dir), TINY, False, lambda m: 0, checkpoint_steps=3)
    messages = []
    body3, head3, record3 = lms.train_split_lm(
        str(corpus), "tiny", str(within_dir), TINY, False, messages.append, checkpoint_steps=3
    )
    assert any("going on after epoch 0, step 3 of epoch 1" in m for m in messages), messages
    for a, b in zip(body.state_dict().values(), body3.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(head.weight, head3.weight)
    assert [e["train_loss"] for e in record3["curve"]] == [e["train_loss"] for e in curve]
    # a third call reads the finished LM
    messages.clear()
    lms.train_split_lm(str(corpus), "tiny", str(cut_dir), TINY, progress=False, log=messages.append)
    assert any("trained weights from" in m for m in messages)


def test_export_keeps_the_lm_in_float16_and_a_fresh_machine_reads_it(corpus, tmp_path, monkeypatch):
    """export_lm writes the trained LM's weights in float16 with its perplexities measured again on them; with no LM
    in --out, train_split_lm reads the kept one instead of training."""
    torch.set_num_threads(1)
    body, head, record = lms.train_split_lm(str(corpus), "tiny", str(tmp_path / "a"), TINY, progress=False, log=print)
    with pytest.raises(SystemExit, match="no trained LM at .*python -m studies.common.lms --out"):
        lms.export_lm(str(corpus), "tiny", str(tmp_path / "none"), str(tmp_path / "kept"), TINY)
    out = lms.export_lm(str(corpus), "tiny", str(tmp_path / "a"), str(tmp_path / "kept"), TINY, log=lambda m: 0)
    saved = torch.load(out, weights_only=True)
    assert all(v.dtype == torch.float16 for v in saved["head"].values() if v.is_floating_point())
    kept = saved["record"]
    assert kept["weights"] == "float16" and kept["valid_ppl_float32"] == record["valid_ppl"]
    assert kept["valid_ppl"] == pytest.approx(record["valid_ppl"], rel=1e-2) and kept["test_ppl"] > 1
    monkeypatch.setattr(lms, "KEPT_LMS", str(tmp_path / "kept"))
    messages = []
    body2, head2, record2 = lms.train_split_lm(
        str(corpus), "tiny", str(tmp_path / "fresh"), TINY, progress=False, log=messages.append
    )
    assert record2 == kept and any(out in m for m in messages) and not (tmp_path / "fresh").exists()
    assert torch.equal(head2.weight, head.weight.half().float()) and head2.weight.dtype == torch.float32


def test_split_task_states(corpus, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr(lms, "LSTM_SETTINGS", {**lms.LSTM_SETTINGS, **TINY})
    task = lms.split_task(
        "wikitext-2", str(corpus), str(tmp_path / "lm"), train_tokens=50, progress=False, log=lambda m: 0
    )
    assert task.train_h.shape == (50, 8) and task.vocab_size == 13
    assert len(task.test_y) == len(lms.split_ids(str(corpus), lms.vocabulary(str(corpus)), "test")) - 1  # one stream
    assert task.info["softmax_test_ppl"] == pytest.approx(task.info["lm"]["test_ppl"], rel=1e-5)
    assert task.info["softmax_valid_ppl"] == pytest.approx(task.info["lm"]["valid_ppl"], rel=1e-5)
    with pytest.raises(ValueError, match="corpus='wt103'"):
        lms.split_task("wt103", str(corpus), str(tmp_path))
    with pytest.raises(ValueError, match="train_tokens=0"):
        lms.split_task("wikitext-2", str(corpus), str(tmp_path), train_tokens=0)


def test_valid_stop_keeps_the_best_scored_weights():
    from studies.common.hidden_tasks import ValidStop, train_head

    import hf_heads

    torch.manual_seed(0)
    h, y = torch.randn(400, 6), torch.randint(0, 5, (400,))
    vh, vy = torch.randn(100, 6), torch.randint(0, 5, (100,))
    head = hf_heads.build_head("softmax", hidden_size=6, vocab_size=5)
    snapshots = {}

    def score():  # valid top-1; remembers the weights it scored
        snapshots[len(snapshots)] = head.weight.detach().clone()
        return float((head(vh).argmax(-1) == vy).double().mean())

    stop = ValidStop(score, every=5, start=10, patience=2)
    train_head(head, h, y, 60, 32, 0.5, 0, "t", False, stop=stop)
    steps = [e["step"] for e in stop.curve]
    assert steps[0] == 10 and all(b - a == 5 for a, b in zip(steps, steps[1:]))
    best = max(range(len(stop.curve)), key=lambda i: (stop.curve[i]["score"], -i))
    assert stop.best_step == stop.curve[best]["step"]
    assert torch.equal(head.weight, snapshots[best])  # the head ends at the best score's weights
    assert stop.stopped_at == 60 or len(stop.curve) - 1 - best == 2  # the end, or two scores without a new best
    with pytest.raises(ValueError, match="every=0"):
        ValidStop(score, every=0)


def test_states_task_reads_the_cached_states_and_scores_them_with_the_models_head(tmp_path):
    """studies.common.lms.states_task (the DS recipe's smollm2 task) on a tiny GPT-2's cached states: train cut to
    train_tokens, and the model's own head's perplexity is the one the upgrade code's per-block NLL gives."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
    from hf_heads.hf.upgrade import cache_states, nll_per_block, pretrained_head

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    cached = {}
    for split, n in (("train", 6), ("valid", 3), ("test", 4)):
        blocks = torch.randint(0, 30, (n, 9))
        cached[split] = cache_states(model, blocks, str(tmp_path / split), shard_blocks=2, progress=False)
    head = pretrained_head(model)
    task = lms.states_task("tiny", str(tmp_path), head, train_tokens=20)
    assert task.train_h.shape == (20, 8) and len(task.test_y) == 4 * 8 and task.vocab_size == 30
    assert torch.equal(task.valid_y, cached["valid"].targets)
    expected = math.exp(float(nll_per_block(head, cached["test"]).mean()))
    assert task.info["softmax_test_ppl"] == pytest.approx(expected, rel=1e-4)
    with pytest.raises(FileNotFoundError, match="no cached states"):
        lms.states_task("tiny", str(tmp_path / "none"), head)


def test_lm_task_is_kept_and_loaded_instead_of_trained_again(tmp_path, monkeypatch):
    """make_lm_task(cache_dir=...) keeps the trained LM (named by its settings and the text's checksum) and a later
    call loads it: the same hidden states, perplexity and random draws after it, no training; another seed or text
    trains anew."""
    from studies.common import hidden_tasks as ht

    tiny_corpus(tmp_path / "text", num_words=30, valid_lines=30, seed=3)
    kw = dict(data_dir=str(tmp_path / "text"), corpus="ptb", dim=8, epochs=1, progress=False, cache_dir=str(tmp_path))
    first = ht.make_lm_task(seed=1, **kw)
    after_first = torch.rand(3)
    (kept,) = [p for p in os.listdir(tmp_path) if p.endswith(".pt")]
    assert kept.startswith("lm-ptb-d8-l1-e1-s1-") and ht.text_checksum(str(tmp_path / "text")) in kept

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(ht, "train_lm", no_training)
    again = ht.make_lm_task(seed=1, **kw)
    assert torch.equal(again.train_h, first.train_h) and torch.equal(again.test_h, first.test_h)
    assert again.info == first.info and torch.equal(torch.rand(3), after_first)
    with pytest.raises(AssertionError, match="trained again"):
        ht.make_lm_task(seed=2, **kw)
    with open(tmp_path / "text" / "test.txt", "a") as f:
        f.write("w1 w2\n")
    with pytest.raises(AssertionError, match="trained again"):  # the text changed: its checksum names another file
        ht.make_lm_task(seed=1, **kw)
