"""The fast-softmax study's language models, trained on the train splits, and the hidden-state tasks they give.

* WikiText-2 (:func:`train_split_lm`): a softmax LSTM of the DS-Softmax poster's size (2 layers, hidden size 200,
  :class:`studies.common.hidden_tasks.LSTMLM`) trained on the whole of ``train.txt`` (2.09M tokens) with Adam, the
  LSTM state carried along ``batch`` streams in windows of ``bptt`` (truncated backpropagation), for at most
  ``max_epochs`` epochs with a valid-based stop: the weights of the epoch of lowest valid perplexity are kept, and
  training stops after ``patience`` epochs without a new lowest. Resumable: after every epoch and every 250 steps
  within one the run's state (weights, optimizer, random state, curve; within an epoch its position and carried LSTM
  state) is saved beside the result, and a rerun goes on from it; the finished LM is read, not trained again.
  :func:`export_lm` keeps it in the checkout (``artifacts/lm-wikitext-2``, float16 weights, its perplexities measured
  again on them): a fresh machine then reads it instead of training for hours.
* PTB (:func:`trunk_features`): the mini AWD-LSTM kept in ``artifacts/lm-ptb`` (PTB's train split), read through
  fairseq; its own softmax head is the study's softmax.

:func:`split_task` makes either into a :class:`studies.common.hidden_tasks.Task`: the last hidden states (evaluation
mode, the state carried along the text as the papers score: one stream for test) of at most ``train_tokens`` tokens of
the train split (the states fast heads are fitted on), of valid (their valid-based stops) and of test (what is scored).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

import hf_heads
from hf_heads.hf.upgrade import States
from recipes.common import runtime
from studies.common.hidden_tasks import LSTMLM, Task, mean_nll, read_words

#: the train-split LSTM's settings (the poster's size); every one is in the name of its file
LSTM_SETTINGS = {
    "dim": 200,
    "layers": 2,
    "dropout": 0.2,
    "bptt": 35,
    "batch": 20,
    "lr": 2e-3,
    "max_epochs": 6,
    "patience": 1,
    "seed": 1,
}
#: streams each split is scored with (the papers' valid / test batches)
STREAMS = {"valid": 10, "test": 1}


@torch.no_grad()
def trunk_features(checkpoint: str, data: str, split: str, streams: int, bptt: int = 70) -> States:
    """The last layer's features (evaluation mode) of every token of ``split`` and the ids that follow them, the LSTM
    state carried along ``streams`` contiguous streams in windows of ``bptt`` (the papers' scoring)."""
    import fairseq_plugin  # noqa: F401  (registers the task and model)
    from fairseq import checkpoint_utils
    from fairseq_plugin.lm.streams import eval_windows

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    decoder = models[0].decoder.eval()
    task.load_dataset(split)
    layout = task.datasets[split].layout(streams)  # [rows, streams]
    feats, targets, hidden = [], [], None
    for start, length, _ in eval_windows(layout.shape[0], bptt):
        source = layout[start : start + length].t()
        out, extra = decoder.extract_features(source, hidden=hidden)
        hidden = extra["hidden"]
        feats.append(out.reshape(-1, out.shape[-1]).half())
        targets.append(layout[start + 1 : start + 1 + length].t().reshape(-1))
    return States(torch.cat(feats), torch.cat(targets), 1)


def vocabulary(data_dir: str) -> Dict[str, int]:
    """Word ids of a corpus: every word of train / valid / test.txt (plus ``<eos>``), ordered by its count in
    train.txt (ties by the word)."""
    words = {s: read_words(os.path.join(data_dir, f"{s}.txt")) for s in ("train", "valid", "test")}
    counts: Dict[str, int] = {}
    for w in words["train"]:
        counts[w] = counts.get(w, 0) + 1
    every = set().union(*words.values())
    return {w: i for i, w in enumerate(sorted(every, key=lambda w: (-counts.get(w, 0), w)))}


def split_ids(data_dir: str, vocab: Dict[str, int], split: str) -> torch.Tensor:
    """The ids of ``split``.txt (each line's words, then ``<eos>``)."""
    return torch.tensor([vocab[w] for w in read_words(os.path.join(data_dir, f"{split}.txt"))])


def streams(ids: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets ``[n, T]``: ``ids`` cut into ``n`` contiguous streams (the remainder dropped)."""
    length = (len(ids) - 1) // n
    return ids[: n * length].view(n, length), ids[1 : n * length + 1].view(n, length)


def run_streams(body: LSTMLM, x: torch.Tensor, bptt: int, fn: Callable, state=None, begin: int = 0, after=None):
    """Run ``body`` over the streams ``x`` ``[n, T]`` in windows of ``bptt`` from position ``begin``, the LSTM state
    carried from window to window (detached; ``state``: the one to start from), calling ``fn(start, hidden [n, t,
    d])`` on each window's last-layer output, then ``after(next_start, state)`` where given."""
    for start in range(begin, x.shape[1], bptt):
        out, state = body.run(x[:, start : start + bptt], state)
        state = tuple(s.detach() for s in state)
        fn(start, out)
        if after is not None:
            after(start + bptt, state)
    return state


@torch.no_grad()
def split_states(body: LSTMLM, ids: torch.Tensor, n: int, bptt: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Evaluation-mode last hidden states ``[N, d]`` of ``ids`` read along ``n`` streams, and the ids that follow."""
    body.eval()
    x, y = streams(ids, n)
    chunks: List[torch.Tensor] = []
    run_streams(body, x, bptt, lambda start, out: chunks.append(out))
    h = torch.cat(chunks, dim=1)
    return h.reshape(-1, h.shape[-1]), y.reshape(-1)


def lm_path(out_dir: str, corpus: str, settings: Dict) -> str:
    """Where :func:`train_split_lm` keeps the LM trained with ``settings`` (every one in the name)."""
    s = settings
    return os.path.join(
        out_dir,
        f"lm-{corpus}-train-d{s['dim']}-l{s['layers']}-drop{s['dropout']:g}-bptt{s['bptt']}-b{s['batch']}-"
        f"lr{s['lr']:g}-e{s['max_epochs']}-p{s['patience']}-s{s['seed']}.pt",
    )


def trained_lm_path(out_dir: str, corpus: str, settings: Optional[Dict] = None) -> Optional[str]:
    """The file :func:`train_split_lm` reads the trained LM from: ``out_dir``'s (:func:`lm_path`), else the
    checkout's copy under :data:`KEPT_LMS` (:func:`export_lm`); None when neither is there."""
    path = lm_path(out_dir, corpus, {**LSTM_SETTINGS, **(settings or {})})
    kept = os.path.join(KEPT_LMS, os.path.basename(path))
    return next((p for p in (path, kept) if os.path.isfile(p)), None)


def train_split_lm(
    data_dir: str,
    corpus: str,
    out_dir: str,
    settings: Optional[Dict] = None,
    progress: bool = True,
    log=print,
    checkpoint_steps: int = 250,
) -> Tuple[LSTMLM, torch.nn.Module, Dict]:
    """The softmax LSTM LM of ``corpus`` trained on ``data_dir/train.txt`` with the valid-based stop (module
    docstring), read from ``out_dir`` when it is there; returns the body, its softmax head (at the best epoch, in
    evaluation mode) and the record: settings, vocabulary size, curve (valid perplexity, mean train loss, wall and
    CPU seconds per epoch), best epoch, why it ended, CPU seconds in all and torch's thread count. The run's state is
    saved after every epoch and every ``checkpoint_steps`` steps within one (the position in the text, the carried
    LSTM state and the losses so far with it): a run cut short goes on from there, to the weights of an uncut run
    (its seconds then count the steps kept, not those done again after the cut; each epoch says its threads)."""
    from tqdm.auto import tqdm

    s = {**LSTM_SETTINGS, **(settings or {})}
    path = lm_path(out_dir, corpus, s)
    vocab = vocabulary(data_dir)
    torch.manual_seed(s["seed"])
    body = LSTMLM(len(vocab), s["dim"], s["layers"], s["dropout"])
    head = hf_heads.build_head("softmax", hidden_size=s["dim"], vocab_size=len(vocab))
    found = trained_lm_path(out_dir, corpus, s)  # out_dir's, else the checkout's copy (export_lm)
    if found:
        saved = torch.load(found, weights_only=True)
        body.load_state_dict({k: v.float() for k, v in saved["body"].items()})
        head.load_state_dict({k: v.float() for k, v in saved["head"].items()})
        log(f"{corpus} LSTM (train split): the trained weights from {found}")
        return body.eval(), head.eval(), saved["record"]
    os.makedirs(out_dir, exist_ok=True)
    opt = torch.optim.Adam(list(body.parameters()) + list(head.parameters()), lr=s["lr"])
    record = {"settings": s, "vocab_size": len(vocab), "threads": torch.get_num_threads(), "curve": []}
    best, within = None, None
    partial = path[: -len(".pt")] + "-partial.pt"
    if os.path.isfile(partial):  # an earlier run's state after its last finished epoch, or within one
        record, best, within = _resume(partial, body, head, opt)
        at = f", step {within['start'] // s['bptt']} of epoch {len(record['curve']) + 1}" if within else ""
        log(f"{corpus} LSTM: going on after epoch {len(record['curve'])}{at} ({partial})")
    train, valid = split_ids(data_dir, vocab, "train"), split_ids(data_dir, vocab, "valid")
    x_all, y_all = streams(train, s["batch"])
    steps = math.ceil(x_all.shape[1] / s["bptt"])

    def save(**extra):
        state = {"body": body.state_dict(), "head": head.state_dict(), "opt": opt.state_dict()}
        torch.save({**state, "rng": torch.get_rng_state(), "record": record, "best": best, **extra}, partial + ".tmp")
        os.replace(partial + ".tmp", partial)

    while len(record["curve"]) < s["max_epochs"] and improving(record["curve"], s["patience"]):
        epoch = len(record["curve"]) + 1
        part, within = within or {"start": 0, "state": None, "losses": [], "wall": 0.0, "cpu": 0.0}, None
        wall, cpu = time.perf_counter() - part["wall"], time.process_time() - part["cpu"]
        bar = tqdm(total=steps, desc=f"{corpus} LSTM epoch {epoch}", disable=not progress, leave=False)
        losses = _train_epoch(body, head, opt, x_all, y_all, s["bptt"], part, (wall, cpu), bar, save, checkpoint_steps)
        valid_ppl = math.exp(mean_nll(head, *split_states(body, valid, STREAMS["valid"], s["bptt"])))
        record["curve"].append(
            {
                "epoch": epoch,
                "valid_ppl": valid_ppl,
                "train_loss": sum(losses) / len(losses),
                "wall_seconds": time.perf_counter() - wall,
                "cpu_seconds": time.process_time() - cpu,
                "threads": torch.get_num_threads(),
            }
        )
        if best is None or valid_ppl < best["valid_ppl"]:
            best = {"valid_ppl": valid_ppl, "epoch": epoch, "body": copy_state(body), "head": copy_state(head)}
        save()
        log(f"{corpus} LSTM epoch {epoch}: valid ppl {valid_ppl:.2f} ({record['curve'][-1]['wall_seconds']:.0f} s)")
    _finish(body, head, record, best, split_ids(data_dir, vocab, "test"), path, partial)
    log(
        f"{corpus} LSTM: best epoch {best['epoch']}, valid ppl {record['valid_ppl']:.2f}, test {record['test_ppl']:.2f}"
    )
    return body, head, record


def _resume(partial: str, body, head, opt) -> Tuple[Dict, Dict, Optional[Dict]]:
    """The weights, optimizer and random state of :func:`train_split_lm`'s run saved at ``partial``, loaded; its
    record, best epoch and ``within`` (where it stopped within an epoch, None after a whole one)."""
    saved = torch.load(partial, weights_only=False)
    body.load_state_dict(saved["body"])
    head.load_state_dict(saved["head"])
    opt.load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    return saved["record"], saved["best"], saved.get("within")


def _train_epoch(body, head, opt, x_all, y_all, bptt: int, part: Dict, clock, bar, save, checkpoint_steps: int):
    """One epoch of :func:`train_split_lm`'s steps from ``part`` (where an earlier run stopped within it: position,
    carried LSTM state, losses; ``clock``: the epoch's wall and CPU starts), calling ``save(within=...)`` every
    ``checkpoint_steps`` steps; the epoch's losses. ``bar`` (a tqdm of the epoch's steps) starts at the part's
    position and is closed at the end; body and head train in training mode, the head is in evaluation mode after."""
    params = list(body.parameters()) + list(head.parameters())
    losses: List[float] = part["losses"]
    bar.update(part["start"] // bptt)
    body.train()
    head.train()

    def step(start, out):
        loss = head.loss(out, y_all[:, start : start + bptt])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25 * 10)
        opt.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.2f}")

    def checkpoint(start, state):
        if (start // bptt) % checkpoint_steps == 0 and start < x_all.shape[1]:
            times = {"wall": time.perf_counter() - clock[0], "cpu": time.process_time() - clock[1]}
            save(within={"start": start, "state": state, "losses": losses, **times})

    run_streams(body, x_all, bptt, step, part["state"], part["start"], checkpoint)
    bar.close()
    head.eval()
    return losses


def _finish(body, head, record: Dict, best: Dict, test_ids: torch.Tensor, path: str, partial: str) -> None:
    """:func:`train_split_lm`'s end: the best epoch's weights back, the record completed (best epoch, why it ended,
    CPU seconds, valid and test perplexity), the LM saved at ``path`` and the run's state at ``partial`` removed."""
    s = record["settings"]
    body.load_state_dict(best["body"])
    head.load_state_dict(best["head"])
    record.update(
        best_epoch=best["epoch"],
        ended_by="patience" if len(record["curve"]) < s["max_epochs"] else "max_epochs",
        cpu_seconds=sum(e["cpu_seconds"] for e in record["curve"]),
    )
    body.eval()
    head.eval()
    test_h, test_y = split_states(body, test_ids, STREAMS["test"], s["bptt"])
    record["valid_ppl"] = best["valid_ppl"]
    record["test_ppl"] = math.exp(mean_nll(head, test_h, test_y))
    torch.save({"body": body.state_dict(), "head": head.state_dict(), "record": record}, path + ".tmp")
    os.replace(path + ".tmp", path)
    os.remove(partial)


def export_lm(
    data_dir: str, corpus: str, lm_dir: str, dest: str = "", settings: Optional[Dict] = None, log=print
) -> str:
    """Keep the LM :func:`train_split_lm` trained in ``lm_dir`` in ``dest`` (default :data:`KEPT_LMS`) under the
    same name, its weights in float16 (half the bytes; read back as float32), its record's ``valid_ppl`` and
    ``test_ppl`` measured again on those weights (the float32 ones kept as ``*_float32``); returns the file."""
    s = {**LSTM_SETTINGS, **(settings or {})}
    path = lm_path(lm_dir, corpus, s)
    if not os.path.isfile(path):
        raise SystemExit(f"export: no trained LM at {path} (python -m studies.common.lms --out {lm_dir} trains it)")
    saved = torch.load(path, weights_only=True)
    half = {part: {k: v.half() for k, v in saved[part].items()} for part in ("body", "head")}
    vocab = vocabulary(data_dir)
    body = LSTMLM(len(vocab), s["dim"], s["layers"], s["dropout"])
    head = hf_heads.build_head("softmax", hidden_size=s["dim"], vocab_size=len(vocab))
    body.load_state_dict({k: v.float() for k, v in half["body"].items()})
    head.load_state_dict({k: v.float() for k, v in half["head"].items()})
    body.eval(), head.eval()
    record = dict(saved["record"], weights="float16", exported_from=path)
    for split in ("valid", "test"):
        record[f"{split}_ppl_float32"] = record[f"{split}_ppl"]
        h, y = split_states(body, split_ids(data_dir, vocab, split), STREAMS[split], s["bptt"])
        record[f"{split}_ppl"] = math.exp(mean_nll(head, h, y))
    out = os.path.join(dest or KEPT_LMS, os.path.basename(path))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    torch.save({**half, "record": record}, out)
    log(
        f"kept {out}: valid ppl {record['valid_ppl']:.2f} (float32 {record['valid_ppl_float32']:.2f}), test "
        f"{record['test_ppl']:.2f} (float32 {record['test_ppl_float32']:.2f})"
    )
    return out


def copy_state(module: torch.nn.Module) -> Dict:
    """A copy of the module's weights (its state_dict's tensors are its own: they would move on)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def improving(curve: List[Dict], patience: int) -> bool:
    """False once the last ``patience`` epochs of ``curve`` each failed to lower the lowest valid perplexity."""
    if len(curve) <= patience:
        return True
    best_before = min(e["valid_ppl"] for e in curve[:-patience])
    return any(e["valid_ppl"] < best_before for e in curve[-patience:])


def cached_trunk_features(trunk: str, trunk_data: str, split: str, out_dir: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`trunk_features` of ``split`` (train along 20 streams, valid / test as :data:`STREAMS`) in float32, kept
    in ``out_dir`` under the checkpoint's md5 and read from there the next time."""
    path = os.path.join(out_dir, f"trunk-{runtime.file_md5(trunk)[:12]}-{split}.pt")
    if not os.path.isfile(path):
        s = trunk_features(trunk, trunk_data, split, {"train": 20, **STREAMS}[split])
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"states": s.states, "targets": s.targets}, path + ".tmp")
        os.replace(path + ".tmp", path)
    saved = torch.load(path, weights_only=True)
    return saved["states"].float(), saved["targets"]


#: the corpora of :func:`split_task`
CORPORA = ("ptb", "wikitext-2")
#: where the study's recipes keep (and look for) the trained LMs by default
LM_DIR = os.path.join("results", "lms")
#: the trained LMs kept in the checkout (:func:`export_lm`), read where ``LM_DIR`` has none
KEPT_LMS = os.path.join("artifacts", "lm-wikitext-2")
#: the PTB trunk kept in the checkout (artifacts/README.md) and its binarised data
TRUNK = os.path.join("artifacts", "lm-ptb", "softmax", "lr0.0025", "seed1", "checkpoints", "checkpoint_best.pt")
TRUNK_DATA = os.path.join("artifacts", "lm-ptb", "data", "bin")


def split_task(
    corpus: str,
    data_dir: str,
    out_dir: str,
    trunk: Optional[str] = None,
    trunk_data: Optional[str] = None,
    train_tokens: int = 500_000,
    progress: bool = True,
    log=print,
) -> Task:
    """The hidden-state task of ``corpus``'s study LM (module docstring): WikiText-2's LSTM trained (or read) in
    ``out_dir`` on ``data_dir``'s text; PTB's trunk ``trunk`` (a fairseq checkpoint) on its binarised data
    ``trunk_data``. Train states: the first ``train_tokens`` of the train split; the task's ``softmax`` is the LM's own
    head; ``info`` has the LM's valid / test perplexity (its own head on these states), its curve and CPU seconds."""
    if corpus not in CORPORA:
        raise ValueError(f"split_task: corpus={corpus!r}; allowed: {', '.join(CORPORA)}")
    if train_tokens < 1:
        raise ValueError(f"split_task: train_tokens={train_tokens}; it must be >= 1")
    if corpus == "wikitext-2":
        missing = [f for f in ("train.txt", "valid.txt", "test.txt") if not os.path.isfile(os.path.join(data_dir, f))]
        if missing:
            raise FileNotFoundError(f"{corpus}: {data_dir} lacks {', '.join(missing)} (the corpus's text files)")
        body, head, record = train_split_lm(data_dir, corpus, out_dir, progress=progress, log=log)
        vocab = vocabulary(data_dir)
        bptt = record["settings"]["bptt"]
        ids = {split: split_ids(data_dir, vocab, split) for split in ("train", "valid", "test")}
        ids["train"] = ids["train"][: train_tokens + 1]
        states = {split: split_states(body, ids[split], STREAMS.get(split, 1), bptt) for split in ids}
    else:
        if not (trunk and os.path.isfile(trunk)):
            raise FileNotFoundError(f"{corpus}: no trunk checkpoint at {trunk!r} (artifacts/lm-ptb keeps one)")
        import fairseq_plugin  # noqa: F401  (registers the model)
        from fairseq import checkpoint_utils

        states = {split: cached_trunk_features(trunk, trunk_data, split, out_dir) for split in ("train", *STREAMS)}
        states["train"] = tuple(t[:train_tokens].clone() for t in states["train"])  # not a view of all of it
        models, _cfg, _fairseq_task = checkpoint_utils.load_model_ensemble_and_task(
            [trunk], arg_overrides={"data": trunk_data}
        )
        head = models[0].decoder.head.eval()
        record = {"trunk": trunk}
    return make_task(corpus, states, head, record)


def make_task(name: str, states: Dict, head, record: Dict) -> Task:
    """The :class:`Task` of ``states`` (``{split: (hidden, targets)}``) and the LM's softmax ``head``."""
    nll = {split: mean_nll(head, *states[split]) for split in ("valid", "test")}
    (train_h, train_y), (valid_h, valid_y), (test_h, test_y) = (states[s] for s in ("train", "valid", "test"))
    return Task(
        name,
        train_h,
        train_y,
        test_h,
        test_y,
        head.weight.shape[0],
        softmax=head,
        valid_h=valid_h,
        valid_y=valid_y,
        info={
            "dim": train_h.shape[1],
            "train_tokens": len(train_y),
            "valid_tokens": len(valid_y),
            "test_tokens": len(test_y),
            "softmax_valid_ppl": math.exp(nll["valid"]),
            "softmax_test_ppl": math.exp(nll["test"]),
            "lm": record,
        },
    )


def states_task(name: str, folder: str, head, train_tokens: int = 500_000) -> Task:
    """A task from the hidden states :func:`hf_heads.hf.upgrade.cache_states` kept in ``folder/train``, ``/valid`` and
    ``/test`` (the upgrade table's ``states-cache/table``: SmolLM2 on WikiText-2) and the model's own softmax
    ``head`` (:func:`hf_heads.hf.upgrade.pretrained_head`); train: the first ``train_tokens`` states."""
    import glob

    states = {}
    for split in ("train", "valid", "test"):
        shards = sorted(glob.glob(os.path.join(folder, split, "shard-*.pt")))
        if not shards:
            raise FileNotFoundError(f"{name}: no cached states in {os.path.join(folder, split)} (shard-*.pt)")
        parts = [torch.load(p, weights_only=True) for p in shards]
        states[split] = (torch.cat([p["states"] for p in parts]).float(), torch.cat([p["targets"] for p in parts]))
    states["train"] = tuple(t[:train_tokens].clone() for t in states["train"])  # not a view of all of it
    return make_task(name, states, head.eval(), {"states": folder})


def main(argv=None) -> Dict:
    """``python -m studies.common.lms``: train (or read) the WikiText-2 LSTM of the fast-softmax study, resumable;
    prints its record."""
    import argparse
    import json

    from recipes.common import data as data_paths

    p = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=data_paths.corpus("wikitext-2"), help="WikiText-2's train/valid/test.txt")
    p.add_argument("--out", default=LM_DIR, help="where the LM (and its state while training) is kept")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--max-epochs", type=int, default=LSTM_SETTINGS["max_epochs"])
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--export", metavar="DIR", help=f"keep the trained LM in DIR in float16 (e.g. {KEPT_LMS})")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.export:
        return torch.load(export_lm(args.data, "wikitext-2", args.out, args.export), weights_only=True)["record"]
    _body, _head, record = train_split_lm(
        args.data, "wikitext-2", args.out, {"max_epochs": args.max_epochs}, progress=not args.quiet
    )
    print(json.dumps({k: v for k, v in record.items()}, indent=1))
    return record


if __name__ == "__main__":
    main()
