"""What several recipes train heads on: tasks of (hidden state, label) pairs and the loop that fits a head to them.

* :class:`Task`: hidden states and labels of a train and a test set (plus hidden super classes, if known);
* :func:`make_lm_task` (:func:`make_ptb_task`): a word-level LSTM language model trained on a corpus's
  ``valid.txt`` (PTB, WikiText-2: a small text, so the LM trains in minutes; the train splits are not read), whose
  last hidden states on valid / ``test.txt`` make the task (DS-Softmax recipe, fast-inference benchmark);
* :func:`train_head`: Adam with cosine decay on such pairs, ``loss + aux_loss``.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

import hf_heads


@dataclass
class Task:
    """Hidden states and labels of one task (train / test), plus the hidden super classes if known."""

    name: str
    train_h: torch.Tensor
    train_y: torch.Tensor
    test_h: torch.Tensor
    test_y: torch.Tensor
    vocab_size: int
    super_of: Optional[torch.Tensor] = None  # [V] super class of each class (synthetic only)
    softmax: Optional[torch.nn.Module] = None  # a softmax head trained with the hidden states (LM)
    valid_h: Optional[torch.Tensor] = None  # held-out states for a valid-based stop (the train-split LMs)
    valid_y: Optional[torch.Tensor] = None
    info: Dict = field(default_factory=dict)


def read_words(path: str) -> List[str]:
    with open(path) as f:
        return [w for line in f for w in line.split() + ["<eos>"]]


class LSTMLM(torch.nn.Module):
    """Embedding -> LSTM -> dropout: the body whose last hidden states feed the heads."""

    def __init__(self, vocab: int, dim: int, layers: int, dropout: float):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, dim, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, tokens):
        return self.run(tokens)[0]

    def run(self, tokens, state=None):
        """The last layer's output ``[B, T, d]`` for ``tokens`` ``[B, T]`` from the LSTM state ``state`` (zeros when
        None), and the state after them."""
        out, state = self.lstm(self.drop(self.embed(tokens)), state)
        return self.drop(out), state


#: the standard word vocabularies: the shipped valid / test text uses most of them (targets outside it never occur)
VOCAB = {"ptb": 10000, "wikitext-2": 33278}


def make_ptb_task(data_dir: str, dim: int, epochs: int, seed: int, progress: bool, **kw) -> Task:
    """:func:`make_lm_task` on PTB."""
    return make_lm_task(data_dir, "ptb", dim, epochs, seed, progress, **kw)


def lm_token_ids(data_dir: str, corpus: str):
    """The ids of ``valid.txt`` (the task's train text) and ``test.txt``, words ordered by their count in valid.txt,
    and the vocabulary size (at least :data:`VOCAB`'s for ``corpus``)."""
    train_w, test_w = (read_words(os.path.join(data_dir, f)) for f in ("valid.txt", "test.txt"))
    counts: Dict[str, int] = {}
    for w in train_w:
        counts[w] = counts.get(w, 0) + 1
    vocab_words = sorted(set(train_w) | set(test_w), key=lambda w: (-counts.get(w, 0), w))
    ids = {w: i for i, w in enumerate(vocab_words)}
    vocab = max(len(ids), VOCAB[corpus])
    return torch.tensor([ids[w] for w in train_w]), torch.tensor([ids[w] for w in test_w]), vocab


def trained_or_cached(body, head, settings: Dict, train, cache_dir: Optional[str]) -> None:
    """``train()`` the LM's ``body`` and ``head``, or, with ``cache_dir`` holding the weights of the same
    ``settings``, load them and torch's random state after their training; a training with ``cache_dir`` keeps them
    there."""
    cached = lm_cache_path(cache_dir, settings) if cache_dir else None
    if cached and os.path.isfile(cached):
        saved = torch.load(cached, weights_only=True)
        body.load_state_dict(saved["body"])
        head.load_state_dict(saved["head"])
        torch.set_rng_state(saved["rng"])  # where training left it: what the caller draws next is the same
        print(f"{settings['corpus']} LSTM: the trained weights from {cached}")
        return
    train()
    if cached:
        os.makedirs(cache_dir, exist_ok=True)
        state = {
            "settings": settings,
            "body": body.state_dict(),
            "head": head.state_dict(),
            "rng": torch.get_rng_state(),
        }
        torch.save(state, cached + ".tmp")
        os.replace(cached + ".tmp", cached)


def make_lm_task(
    data_dir: str,
    corpus: str,
    dim: int,
    epochs: int,
    seed: int,
    progress: bool,
    layers: int = 1,
    bptt: int = 35,
    batch: int = 20,
    lr: float = 2e-3,
    cache_dir: Optional[str] = None,
) -> Task:
    """Train an LSTM LM + softmax on ``data_dir/valid.txt`` of ``corpus`` (a key of :data:`VOCAB`: its vocabulary
    size); hidden states of valid (train) and test.txt. With ``cache_dir``, the trained weights are kept there
    (``lm-CORPUS-....pt``, named by every setting and the text's checksum, with torch's random state after
    training) and a later call with the same settings and text loads them instead of training again (WikiText-2's
    LM is ~25 minutes on one thread): the same task, and the same random draws after it."""
    if corpus not in VOCAB:
        raise ValueError(f"make_lm_task: corpus={corpus!r}; allowed: {', '.join(VOCAB)}")
    missing = [f for f in ("valid.txt", "test.txt") if not os.path.isfile(os.path.join(data_dir, f))]
    if missing:
        raise FileNotFoundError(f"{corpus}: {data_dir} lacks {', '.join(missing)} (the corpus's text files)")
    train, test, vocab = lm_token_ids(data_dir, corpus)
    torch.manual_seed(seed)
    body = LSTMLM(vocab, dim, layers, dropout=0.5)
    head = hf_heads.build_head("softmax", hidden_size=dim, vocab_size=vocab)
    settings = {
        "corpus": corpus,
        "dim": dim,
        "layers": layers,
        "epochs": epochs,
        "seed": seed,
        "bptt": bptt,
        "batch": batch,
        "lr": lr,
        "text": text_checksum(data_dir),
    }
    trained_or_cached(
        body, head, settings, lambda: train_lm(body, head, train, epochs, bptt, batch, lr, progress, corpus), cache_dir
    )
    body.eval()
    head.eval()

    @torch.no_grad()
    def states(tokens):
        h = body(tokens[:-1][None])[0]
        return h, tokens[1:]

    train_h, train_y = states(train)
    test_h, test_y = states(test)
    test_ppl = math.exp(mean_nll(head, test_h, test_y))
    return Task(
        corpus,
        train_h,
        train_y,
        test_h,
        test_y,
        vocab,
        softmax=head,
        info={
            "dim": dim,
            "layers": layers,
            "epochs": epochs,
            "train_tokens": len(train_y),
            "test_tokens": len(test_y),
            "softmax_test_ppl": test_ppl,
        },
    )


@torch.no_grad()
def mean_nll(head, h: torch.Tensor, y: torch.Tensor, block: int = 4096) -> float:
    """The head's mean NLL (nats) over the states ``h`` and targets ``y``, in blocks (33k-word logits at once would
    not fit)."""
    total = sum(
        float(head.loss(h[i : i + block].float(), y[i : i + block], reduction="sum")) for i in range(0, len(y), block)
    )
    return total / len(y)


def text_checksum(data_dir: str) -> str:
    """sha1 of a corpus's valid.txt and test.txt (what :func:`make_lm_task` reads), the first 12 hex digits."""
    digest = hashlib.sha1()
    for name in ("valid.txt", "test.txt"):
        with open(os.path.join(data_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:12]


def lm_cache_path(cache_dir: str, settings: Dict) -> str:
    """Where :func:`make_lm_task` keeps the LM trained with ``settings`` (every one in the name)."""
    s = settings
    return os.path.join(
        cache_dir,
        f"lm-{s['corpus']}-d{s['dim']}-l{s['layers']}-e{s['epochs']}-s{s['seed']}-"
        f"bptt{s['bptt']}-b{s['batch']}-lr{s['lr']:g}-{s['text']}.pt",
    )


def train_lm(
    body: LSTMLM, head, train: torch.Tensor, epochs: int, bptt: int, batch: int, lr: float, progress: bool, corpus: str
) -> None:
    """Adam with cosine decay over ``epochs`` of ``train`` in ``batch`` streams cut every ``bptt`` tokens."""
    from tqdm.auto import tqdm

    params = list(body.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    n = (len(train) - 1) // batch * batch
    x_all, y_all = train[:n].view(batch, -1), train[1 : n + 1].view(batch, -1)
    chunks = list(range(0, x_all.shape[1] - 1, bptt))
    bar = tqdm(total=epochs * len(chunks), desc=f"{corpus} LSTM", disable=not progress, leave=False)
    for epoch in range(epochs):
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
        body.train()
        for i in chunks:
            x, y = x_all[:, i : i + bptt], y_all[:, i : i + bptt]
            loss = head.loss(body(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.25 * 10)
            opt.step()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.2f}")
    bar.close()


@dataclass
class ValidStop:
    """A valid-based stop for :func:`train_head`: ``score()`` (higher is better: top-1 on held-out states) is taken
    every ``every`` steps from step ``start`` on (and at the last step; with ``baseline``, also before the first, so
    the head as it came is a candidate: step 0); the head ends with the weights of the best score, and training stops
    after ``patience`` scores without a new best. ``curve`` (step, score), ``best_step`` and ``stopped_at`` are
    filled in."""

    score: Callable[[], float]
    every: int
    start: int = 0
    patience: int = 3
    baseline: bool = False
    curve: List[Dict] = field(default_factory=list)
    best_step: Optional[int] = None
    stopped_at: Optional[int] = None

    def __post_init__(self):
        if self.every < 1:
            raise ValueError(f"ValidStop: every={self.every}; it must be >= 1")
        if self.patience < 1:
            raise ValueError(f"ValidStop: patience={self.patience}; it must be >= 1")

    def due(self, step: int, steps: int) -> bool:
        return step + 1 == steps or (step + 1 >= self.start and (step + 1 - self.start) % self.every == 0)

    def check(self, head, step: int) -> bool:
        """Score the head after ``step`` (0-based); keep its weights if best; True when training should stop."""
        head.eval()
        with torch.no_grad():
            value = float(self.score())
        head.train()
        self.curve.append({"step": step + 1, "score": value})
        if self.best_step is None or value > max(e["score"] for e in self.curve[:-1]):
            self.best_step = step + 1
            self._best = {k: v.detach().clone() for k, v in head.state_dict().items()}
        return len(self.curve) - [e["step"] for e in self.curve].index(self.best_step) - 1 >= self.patience

    def restore(self, head) -> None:
        head.load_state_dict(self._best)


def train_head(
    head,
    h: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    desc: str,
    progress: bool,
    stop: Optional[ValidStop] = None,
    loss_fn: Optional[Callable] = None,
) -> float:
    """Adam with cosine decay over ``steps`` on (hidden, label) pairs; ``loss + aux_loss`` (DS-Softmax prunes
    itself), the loss ``head.loss(h, y)`` of a batch or ``loss_fn(head, h, y)``; with ``stop``, its valid-based stop
    (the head ends at its best score's weights). Returns the seconds."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    opt = torch.optim.Adam(head.parameters(), lr=lr, fused=True)  # one pass over E x V x d, not a dozen
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(seed)
    head.train()
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False)
    if stop is not None and stop.baseline:
        stop.check(head, -1)  # step 0: the head before training
    for step in bar:
        idx = torch.randint(0, len(y), (batch,), generator=g)
        loss = head.loss(h[idx], y[idx]) if loss_fn is None else loss_fn(head, h[idx], y[idx])
        opt.zero_grad()
        (loss + head.aux_loss()).backward()
        opt.step()
        sched.step()
        if progress and step % 20 == 0:
            kept = {"classes": int(head.mask.sum())} if hasattr(head, "mask") else {}
            bar.set_postfix(loss=f"{loss.item():.3f}", **kept)
        if stop is not None and stop.due(step, steps) and stop.check(head, step):
            break
    if stop is not None:
        stop.stopped_at = step + 1
        stop.restore(head)
    head.eval()
    return time.perf_counter() - start
