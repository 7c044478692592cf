"""A new head for a trained causal LM, trained on the model's cached final hidden states with the model frozen.

The LM's body runs once over the text (:func:`cache_states`: the states its ``lm_head`` reads, in shards on disk,
resumable); a head started at the pretrained ``lm_head`` (:func:`hf_heads.swap_head`; MoS / Mixtape with identity
contexts, PLIF at its identity, so step 0 is the pretrained model) then trains on them alone
(:func:`train_head_on_states`: Adam, validated after every epoch, the best epoch kept, stopped by patience,
resumable from a checkpoint), and :func:`nll_per_block` scores it. Only the head changes, so the upgraded model is the
pretrained body with the new head: ``save_pretrained`` saves it (with the head's code, so it also loads with
``trust_remote_code=True`` where softmax-heads is not installed). ``softmax-heads upgrade`` is the command.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from ..core import OutputHead, build_head
from .output_layer import logit_map_options


@dataclass
class States:
    """Cached final hidden states ``[N, d]`` (stored in ``states.dtype``) and the next-token ids ``[N]`` they predict,
    block after block (``block_tokens`` tokens each: per-block scores)."""

    states: torch.Tensor
    targets: torch.Tensor
    block_tokens: int

    def __len__(self) -> int:
        return self.targets.numel()


def body(model) -> nn.Module:
    """The part of a causal LM that makes the hidden states its ``lm_head`` reads (``model.base_model``: GPT-2's
    ``transformer``, Llama's ``model``; their ``last_hidden_state`` has the final norm applied)."""
    return model.base_model


def fingerprint(model, blocks: torch.Tensor) -> str:
    """Digest of the token blocks and the body's weights, byte for byte: a cache folder holds the states of one pair
    only. (Of the bytes, not of a sum per tensor: a sum's last bits depend on how many threads add it up, so a cache
    made with two threads would be refused by a run with one.)"""
    digest = hashlib.sha1(blocks.numpy().tobytes())
    for name, tensor in sorted(body(model).state_dict().items()):
        digest.update(name.encode())
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def cache_states(
    model,
    blocks: torch.Tensor,
    folder: str,
    batch_size: int = 8,
    dtype: torch.dtype = torch.float16,
    shard_blocks: int = 256,
    progress: bool = True,
    desc: str = "cache states",
) -> States:
    """The final hidden states of ``blocks`` ``[B, L]`` (token ids) under ``model`` (a causal LM), with the ids that
    follow them (``L - 1`` per block), in ``dtype``. Written to ``folder`` in shards of ``shard_blocks`` blocks as they
    are made; a rerun reads the shards already there (the folder's ``meta.json`` must name the same blocks and
    weights, else ``ValueError``)."""
    from tqdm.auto import tqdm

    os.makedirs(folder, exist_ok=True)
    meta_path = os.path.join(folder, "meta.json")
    meta = {
        "fingerprint": fingerprint(model, blocks),
        "blocks": list(blocks.shape),
        "dtype": str(dtype),
        "shard_blocks": shard_blocks,
    }
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            old = json.load(f)
        if old != meta:
            raise ValueError(
                f"cache_states: {folder} holds the states of other blocks or weights ({old}), or states cached "
                f"under the earlier fingerprint (a sum per weight tensor); use another folder or empty it"
            )
    else:
        with open(meta_path, "w") as f:
            json.dump(meta, f)
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    parts_h, parts_t = [], []
    starts = range(0, blocks.shape[0], shard_blocks)
    for start in tqdm(starts, desc=desc, disable=not progress, unit="shard"):
        path = os.path.join(folder, f"shard-{start // shard_blocks:05d}.pt")
        if not os.path.exists(path):
            part = blocks[start : start + shard_blocks]
            hs = []
            for i in range(0, part.shape[0], batch_size):
                out = body(model)(input_ids=part[i : i + batch_size].to(device)).last_hidden_state
                hs.append(out[:, :-1].reshape(-1, out.shape[-1]).to("cpu", dtype))
            _save_whole({"states": torch.cat(hs), "targets": part[:, 1:].reshape(-1).clone()}, path)
        shard = torch.load(path)
        parts_h.append(shard["states"])
        parts_t.append(shard["targets"])
    model.train(was)
    return States(torch.cat(parts_h), torch.cat(parts_t), blocks.shape[1] - 1)


@torch.no_grad()
def nll_per_block(head: OutputHead, data: States, batch_tokens: int = 8192) -> torch.Tensor:
    """The head's mean NLL (nats) of every block of ``data`` (evaluation mode), float64 ``[blocks]``."""
    was = head.training
    head.eval()
    device = next(head.parameters()).device
    nll = torch.cat(
        [
            head.loss(
                data.states[i : i + batch_tokens].to(device, torch.float32),
                data.targets[i : i + batch_tokens].to(device),
                reduction="none",
            )
            .double()
            .cpu()
            for i in range(0, len(data), batch_tokens)
        ]
    )
    head.train(was)
    return nll.view(-1, data.block_tokens).mean(1)


def pretrained_head(model) -> OutputHead:
    """The model's own ``lm_head`` as a softmax head over the states it reads (its weight shared, not copied), with the
    scale or soft-cap the model applies after it (:func:`~hf_heads.hf.output_layer.logit_map_options`: Gemma 2's
    cap), so it scores what the model does."""
    out = model.get_output_embeddings()
    bias = getattr(out, "bias", None)
    return build_head(
        "softmax",
        hidden_size=out.weight.shape[1],
        vocab_size=out.weight.shape[0],
        weight=out.weight.detach(),
        bias=None if bias is None else bias.detach(),
        use_bias=bias is not None,
        **logit_map_options(model),
    ).to(out.weight.device)


def pretrained_nll_per_block(head: OutputHead, data: States, folder: str) -> torch.Tensor:
    """:func:`nll_per_block` of ``head``, the model's own ``lm_head`` (:func:`pretrained_head`), on ``data`` (the
    states :func:`cache_states` wrote to ``folder``), kept in ``folder/pretrained_nll.pt`` beside them: every head
    trained on the same states is compared with the same "before", scored once. The file names the head it scored (a
    digest of its weight and bias, and of its map of the logits): another head's scores are not read, they are
    replaced."""
    digest = hashlib.sha1()
    for tensor in (head.weight, head.bias):
        if tensor is not None:
            digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    if head.config.has_logit_map:  # (scores made without the model's cap or scale are not these)
        digest.update(repr((head.config.logit_scale, head.config.logit_softcap)).encode())
    path = os.path.join(folder, "pretrained_nll.pt")
    if os.path.exists(path):
        saved = torch.load(path)
        if saved["lm_head"] == digest.hexdigest() and saved["block_nll"].numel() * data.block_tokens == len(data):
            return saved["block_nll"]
    block_nll = nll_per_block(head, data)
    _save_whole({"lm_head": digest.hexdigest(), "block_nll": block_nll}, path)
    return block_nll


def perplexity_interval(block_nll: torch.Tensor, level: float = 0.95) -> Dict[str, float]:
    """Perplexity ``exp(mean NLL)`` with a ``level`` interval from the spread of the per-block NLLs (a t interval on
    their mean, blocks as the units), ``{"ppl", "lo", "hi", "blocks"}``."""
    from scipy import stats

    n = block_nll.numel()
    mean = float(block_nll.mean())
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * block_nll.std() / math.sqrt(n)) if n > 1 else float("nan")
    return {"ppl": math.exp(mean), "lo": math.exp(mean - half), "hi": math.exp(mean + half), "blocks": n}


def train_epoch(
    head,
    train: States,
    optimizer,
    order: torch.Generator,
    batch_tokens: int,
    progress: bool = False,
    desc: str = "epoch",
    *,
    skip: int = 0,
    total: float = 0.0,
    count: int = 0,
    after_step: Optional[Callable[[int, float, int], None]] = None,
) -> float:
    """One epoch of ``optimizer`` on ``head`` (its loss plus ``aux_loss()``) over ``train``'s states, shuffled by
    ``order``, ``batch_tokens`` a step; returns the epoch's mean training loss.

    To go on with an epoch that stopped: ``order`` as it was at the epoch's start, ``skip`` the steps already taken and
    ``total`` / ``count`` the summed loss and tokens of those steps. ``after_step(steps, total, count)`` is called after
    every step (:func:`train_head_on_states` saves its checkpoints there)."""
    from tqdm.auto import tqdm

    device = next(head.parameters()).device
    head.train()
    batches = torch.randperm(len(train), generator=order).split(batch_tokens)
    bar = tqdm(total=len(batches), initial=skip, desc=desc, disable=not progress, leave=False)
    for step in range(skip, len(batches)):
        index = batches[step]
        loss = head.loss(train.states[index].to(device, torch.float32), train.targets[index].to(device))
        total += float(loss.detach()) * index.numel()
        count += index.numel()
        (loss + head.aux_loss()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        bar.update()
        if after_step is not None:
            after_step(step + 1, total, count)
    bar.close()
    return total / count


def train_head_on_states(
    head: OutputHead,
    train: States,
    valid: States,
    lr: float = 1e-3,
    max_epochs: int = 10,
    patience: int = 2,
    batch_tokens: int = 4096,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    checkpoint: Optional[str] = None,
    checkpoint_seconds: float = 600.0,
) -> List[Dict[str, float]]:
    """Adam on the head's parameters over ``train``'s states (shuffled by a generator of ``seed``, ``batch_tokens`` a
    step; the loss is the head's :meth:`~OutputHead.loss`, plus its ``aux_loss()``), validated on ``valid`` after every
    epoch; stops when the valid NLL has not improved for ``patience`` epochs or after ``max_epochs``, and loads the
    best epoch's weights (epoch 0, the start, included). Returns the curve: ``{"epoch", "train_nll", "valid_nll",
    "seconds", "train_cpu_seconds", "cpu_seconds"}`` per epoch (``seconds``: wall time since the start, validation
    included; ``train_cpu_seconds``: this process's CPU time in the epoch's training steps alone, every thread
    counted; ``cpu_seconds``: this process's CPU time since the start, validation included).

    **Resumable** with ``checkpoint`` (a file path): the head, Adam's state, the shuffling generator, torch's random
    state, the best epoch's weights and the curve are saved there (atomically) every ``checkpoint_seconds`` of wall
    time and after every epoch, so a run that stopped goes on from its last save, step for step as if it had not
    stopped (a test checks the weights bitwise). When training ends the file holds the finished run, and a rerun
    returns it without training: delete it once its results are saved. A checkpoint of another run (other settings,
    data sizes or parameters) is refused with ``ValueError``."""
    for name, value, low in (
        ("max_epochs", max_epochs, 1),
        ("patience", patience, 1),
        ("batch_tokens", batch_tokens, 1),
    ):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"train_head_on_states: {name}={value!r}; allowed: an integer >= {low}")
    if not checkpoint_seconds >= 0:
        raise ValueError(f"train_head_on_states: checkpoint_seconds={checkpoint_seconds!r}; allowed: a number >= 0")
    run = {
        "lr": lr,
        "max_epochs": max_epochs,
        "patience": patience,
        "batch_tokens": batch_tokens,
        "seed": seed,
        "train_tokens": len(train),
        "valid_tokens": len(valid),
        "parameters": [[k, list(v.shape)] for k, v in head.state_dict().items()],
    }
    saved = _load_checkpoint(checkpoint, run) if checkpoint else None
    training = _HeadTraining(head, run, checkpoint, checkpoint_seconds)
    if saved is not None and saved["finished"]:
        head.load_state_dict(saved["head"])
        head.eval()
        log(f"{checkpoint}: the finished run (best epoch {saved['best_epoch']}), not trained again")
        return saved["curve"]
    if saved is None:
        training.start(valid)
        log(f"epoch 0 (the start): valid NLL {training.best:.4f} (perplexity {math.exp(training.best):.2f})")
    else:
        training.resume(saved)
        log(
            f"{checkpoint}: going on from epoch {training.epoch}, step {training.skip} (best so far: epoch "
            f"{training.best_epoch}, {training.best:.4f})"
        )
    for epoch in range(training.epoch, max_epochs + 1):
        train_nll, valid_nll = training.run_epoch(epoch, train, valid, progress)
        log(
            f"epoch {epoch}: train NLL {train_nll:.4f}, valid NLL {valid_nll:.4f} (perplexity "
            f"{math.exp(valid_nll):.2f})"
        )
        if not training.keep_best(epoch, valid_nll) and epoch - training.best_epoch >= patience:
            break
        training.next_epoch(epoch < max_epochs)
    return training.finish()


class _HeadTraining:
    """One run of :func:`train_head_on_states`: the head, Adam, the shuffling generator (``order``, and its state at
    the current epoch's start), the best epoch so far and its weights, the curve, where the run stands within an
    epoch (``skip`` steps, their summed loss and tokens) and its clocks, which a checkpoint saves whole."""

    def __init__(self, head: OutputHead, run: Dict, checkpoint: Optional[str], checkpoint_seconds: float):
        self.head, self.run, self.checkpoint, self.checkpoint_seconds = head, run, checkpoint, checkpoint_seconds
        self.optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=run["lr"])
        self.order = torch.Generator().manual_seed(run["seed"])
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def start(self, valid: States) -> None:
        """Epoch 0: the start's valid NLL, the best so far."""
        self.best = float(nll_per_block(self.head, valid).mean())
        self.best_epoch, self.best_state = 0, self._weights()
        self.curve = [
            {
                "epoch": 0,
                "train_nll": float("nan"),
                "valid_nll": self.best,
                "seconds": 0.0,
                "train_cpu_seconds": 0.0,
                "cpu_seconds": time.process_time() - self.cpu,
            }
        ]
        self.epoch, self.skip, self.total, self.count = 1, 0, 0.0, 0
        self.offset = {"seconds": 0.0, "cpu_seconds": 0.0}
        self.epoch_order = self.order.get_state()
        self.epoch_cpu_start = time.process_time()
        self.last_save = time.perf_counter()

    def resume(self, saved: Dict) -> None:
        """Where a stopped run's checkpoint left it."""
        self.head.load_state_dict(saved["head"])
        self.optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        self.best, self.best_epoch, self.best_state = saved["best"], saved["best_epoch"], saved["best_state"]
        self.curve = saved["curve"]
        self.epoch, self.skip, self.total, self.count = saved["epoch"], saved["step"], saved["total"], saved["count"]
        self.offset, self.epoch_order = saved["offset"], saved["order"]
        self.epoch_cpu_start = time.process_time() - saved["epoch_cpu"]
        self.last_save = time.perf_counter()

    def run_epoch(self, epoch: int, train: States, valid: States, progress: bool):
        """``(train_nll, valid_nll)`` of epoch ``epoch`` (from its ``skip``-th step), its row added to the curve."""
        self.epoch = epoch
        self.order.set_state(self.epoch_order)
        train_nll = train_epoch(
            self.head,
            train,
            self.optimizer,
            self.order,
            self.run["batch_tokens"],
            progress,
            f"epoch {epoch}",
            skip=self.skip,
            total=self.total,
            count=self.count,
            after_step=self._after_step,
        )
        train_cpu = time.process_time() - self.epoch_cpu_start
        self.skip, self.total, self.count = 0, 0.0, 0
        valid_nll = float(nll_per_block(self.head, valid).mean())
        row = {"epoch": epoch, "train_nll": train_nll, "valid_nll": valid_nll, "train_cpu_seconds": train_cpu}
        self.curve.append({**row, **self._elapsed()})
        return train_nll, valid_nll

    def keep_best(self, epoch: int, valid_nll: float) -> bool:
        """Whether epoch ``epoch`` is the best so far (its weights then kept)."""
        if valid_nll < self.best:
            self.best, self.best_epoch, self.best_state = valid_nll, epoch, self._weights()
            return True
        return False

    def next_epoch(self, more: bool) -> None:
        """Between two epochs: the generator's state for the next, its CPU clock, a checkpoint (``more``: one comes)."""
        self.epoch_order = self.order.get_state()
        self.epoch_cpu_start = time.process_time()
        if self.checkpoint and more:
            self._save(False, self.epoch + 1, 0, 0.0, 0)

    def finish(self) -> List[Dict[str, float]]:
        """The best epoch's weights loaded, marked in the curve (and the finished run saved); the curve."""
        self.head.load_state_dict(self.best_state)
        self.head.eval()
        self.curve[self.best_epoch]["best"] = True
        if self.checkpoint:
            self.epoch_order = self.order.get_state()
            self._save(True, self.epoch, 0, 0.0, 0)
        return self.curve

    def _weights(self) -> Dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.head.state_dict().items()}

    def _elapsed(self) -> Dict[str, float]:
        """Wall and CPU time since the start, over every start of a resumed run."""
        return {
            "seconds": self.offset["seconds"] + time.perf_counter() - self.wall,
            "cpu_seconds": self.offset["cpu_seconds"] + time.process_time() - self.cpu,
        }

    def _after_step(self, step: int, total: float, count: int) -> None:
        if self.checkpoint and time.perf_counter() - self.last_save >= self.checkpoint_seconds:
            self._save(False, self.epoch, step, total, count)

    def _save(self, finished: bool, epoch: int, step: int, total: float, count: int) -> None:
        started = time.process_time()
        blob = {
            "run": self.run,
            "finished": finished,
            "head": self.head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "order": self.epoch_order,
            "epoch": epoch,
            "step": step,
            "total": total,
            "count": count,
            "epoch_cpu": time.process_time() - self.epoch_cpu_start,
            "offset": self._elapsed(),
            "best": self.best,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "curve": self.curve,
        }
        os.makedirs(os.path.dirname(os.path.abspath(self.checkpoint)), exist_ok=True)
        _save_whole(blob, self.checkpoint)
        self.last_save = time.perf_counter()
        self.epoch_cpu_start += time.process_time() - started  # an epoch's training CPU leaves its saves out


def _save_whole(obj, path: str) -> None:
    """``torch.save`` through a temporary file: ``path`` holds the whole new object or, if the process stops while
    writing, what it held before (a cache shard, a score, a training checkpoint)."""
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def _load_checkpoint(path: str, run: Dict) -> Optional[Dict]:
    """The checkpoint of :func:`train_head_on_states` at ``path`` if there is one, refused unless it is ``run``'s."""
    if not os.path.exists(path):
        return None
    saved = torch.load(path, weights_only=True)
    if saved.get("run") != run:
        theirs = saved.get("run") or {}
        diff = {k: (theirs.get(k), v) for k, v in run.items() if theirs.get(k) != v and k != "parameters"}
        if theirs.get("parameters") != run["parameters"]:
            diff["parameters"] = "other names or shapes"
        raise ValueError(
            f"train_head_on_states: {path} is the checkpoint of another run ({diff}, as (saved, now)); delete it to "
            f"start over"
        )
    return saved


def untie_output_embedding(model) -> None:
    """Give ``lm_head`` its own copy of the weight it shares with the input embedding (SmolLM2 and GPT-2 tie them), so
    training the head leaves the body, and the states cached from it, as they were; the config records the untying."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if inp is not None and out.weight is inp.weight:
        out.weight = nn.Parameter(out.weight.detach().clone())
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False


#: names that moved out of this module -> where they are now (a checkout's study code); one release of warnings
_MOVED = {"ResidualMLP": "studies.head_upgrade.control", "mlp_size_matching": "studies.head_upgrade.control"}


def __getattr__(name: str):
    """``hf_heads.hf.upgrade.ResidualMLP`` and ``mlp_size_matching`` (softmax-heads 0.1) for one more release: they are
    the upgrade study's control now (``studies/head_upgrade/control.py``, in a checkout, not in the wheel); a
    ``FutureWarning`` says so and, from a checkout, the name still resolves to the study's."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    where = _MOVED[name]
    warnings.warn(
        f"hf_heads.hf.upgrade.{name} moved to the upgrade study's code, {where}.{name} (a checkout's "
        f"recipes/, not installed with the wheel); this name goes in the next release",
        FutureWarning,
        stacklevel=2,
    )
    try:
        return getattr(importlib.import_module(where), name)  # the study's module, where a checkout is importable
    except ImportError as e:
        raise AttributeError(
            f"hf_heads.hf.upgrade.{name} moved to {where}, which is not importable here ({e}): it is the study "
            f"code of a checkout of softmax-heads (recipes/), not part of the installed library"
        ) from None
