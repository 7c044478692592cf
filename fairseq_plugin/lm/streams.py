"""The AWD-LSTM / MoS protocol in fairseq: contiguous streams, the LSTM state carried across windows, variable BPTT.

fairseq's ``language_modeling`` task cuts the corpus into blocks and gives each on its own, shuffled; the code the
MoS, Mixtape and PLIF papers ran (zihangdai/mos, on salesforce/awd-lstm-lm) does something else, which this task
(``--task awd_language_modeling``) reproduces:

* the split, its lines joined (each ending in ``</s>``, as the papers' ``<eos>``), is cut into ``B`` contiguous
  streams (``batchify``: the last ``N mod B`` tokens dropped); train: ``B = --batch-size`` (times ranks and
  ``--update-freq``, below), valid: ``--eval-batch-size`` (10), test: ``--test-batch-size`` (1);
* training reads the streams in order, window after window, each window's length drawn as the papers draw it
  (``bptt = 70`` with probability 0.95, else 35, then ``max(5, int(N(bptt, 5)))``, capped at ``bptt +
  --max-seq-len-delta`` as MoS caps it; the last window clipped to the data), one ``numpy`` generator seeded with
  ``--seed`` and continued over the epochs: with one process the windows of every epoch are those of the papers'
  code run with the same seed;
* the learning rate of each update is scaled by ``drawn length / bptt`` (and restored after the step);
* the LSTM state is carried from one window of a stream to the next (detached: truncated backpropagation), starting
  from zeros at each epoch and each evaluation; evaluation reads windows of ``bptt`` over the whole split.

The model carries the state itself (``AWDLSTMDecoder`` keeps one state per stream, :class:`CarriedStates`), driven by
``stream_key`` / ``stream_step`` in each batch, so ``fairseq-eval-lm --task awd_language_modeling`` scores with the
state carried too; ``--stateless`` gives the same windows from a zero state each (the blocks protocol on the papers'
windows). With ``W`` ranks and ``--update-freq U``, the corpus is cut into ``W * U * --batch-size`` streams: rank
``r``, micro-batch ``m`` reads its own block of ``--batch-size`` of them (MoS's ``small_batch_size`` chunks), every
rank the same windows, so the run equals one process with all the streams. Differences from the papers' code: the
state is not in the checkpoint (a run resumed mid-epoch restarts the streams from zeros, with a warning); the
evaluation loss is the mean over the scored tokens (the papers divide by one row more: 0.06% lower perplexity on PTB
valid); averaged SGD applies the rescaled rate at once (torch's old ASGD, one step late).
"""
# no `from __future__ import annotations`: fairseq reads the dataclass annotations as real types

import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import FairseqDataset, data_utils, iterators
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from omegaconf import II

logger = logging.getLogger(__name__)


def train_windows(
    rng: np.random.RandomState,
    nrows: int,
    bptt: int,
    p: float = 0.95,
    std: float = 5.0,
    min_len: int = 5,
    max_delta: int = 40,
    fixed: bool = False,
) -> List[Tuple[int, int, int]]:
    """One epoch of the papers' training loop over ``nrows`` rows: ``[(start row, length, drawn length)]``, drawing
    from ``rng`` as their code draws from ``np.random`` (``max_delta < 0``: no cap, as awd-lstm-lm; ``fixed``:
    always ``bptt``, nothing drawn)."""
    out, i = [], 0
    while i < nrows - 1 - 1:
        if fixed:
            drawn = bptt
        else:
            mean = bptt if rng.random_sample() < p else bptt / 2.0
            drawn = max(min_len, int(rng.normal(mean, std)))
            if max_delta >= 0:
                drawn = min(drawn, bptt + max_delta)
        out.append((i, min(drawn, nrows - 1 - i), drawn))
        i += drawn
    return out


def eval_windows(nrows: int, bptt: int) -> List[Tuple[int, int, int]]:
    """The papers' evaluation: windows of ``bptt`` from row 0, the last clipped."""
    return [(i, min(bptt, nrows - 1 - i), bptt) for i in range(0, nrows - 1, bptt)]


class Window(NamedTuple):
    """One batch: rows ``[start, start + length)`` (inputs; targets one row later) of columns ``[lo, hi)`` of the
    split cut into ``streams`` streams; the ``step``-th window of the stream group ``key`` (None: no carried state)."""

    key: Optional[str]
    step: int
    start: int
    length: int
    drawn: int
    lo: int
    hi: int
    streams: int


class StreamDataset(FairseqDataset):
    """A split as one token stream; its items are :class:`Window` s (self-describing: no state of its own)."""

    def __init__(self, tokens: torch.Tensor, split: str):
        super().__init__()
        self.tokens, self.split = tokens.long(), split

    def nrows(self, streams: int) -> int:
        return len(self.tokens) // streams

    def layout(self, streams: int) -> torch.Tensor:
        """``[nrows, streams]``: column ``j`` is the ``j``-th contiguous part of the split (the papers' batchify)."""
        nrows = self.nrows(streams)
        return self.tokens[: nrows * streams].view(streams, nrows).t()

    def __getitem__(self, window: Window):
        data = self.layout(window.streams)
        source = data[window.start : window.start + window.length, window.lo : window.hi].t().contiguous()
        target = data[window.start + 1 : window.start + 1 + window.length, window.lo : window.hi].t().contiguous()
        return window, source, target

    def __len__(self) -> int:
        return len(self.tokens)

    def collater(self, items):
        ((window, source, target),) = items  # one window per batch
        rows, length = source.shape
        return {
            "id": torch.arange(window.lo, window.hi),
            "nsentences": rows,
            "ntokens": rows * length,
            "net_input": {
                "src_tokens": source,
                "src_lengths": torch.full((rows,), length),
                "stream_key": window.key,
                "stream_step": window.step,
            },
            "target": target,
            "bptt_seq_len": window.drawn,
        }

    def num_tokens(self, index) -> int:
        return 0 if not isinstance(index, Window) else index.length * (index.hi - index.lo)

    def size(self, index) -> int:
        return 0 if not isinstance(index, Window) else index.length

    @property
    def can_reuse_epoch_itr_across_epochs(self) -> bool:
        return False  # each epoch has its own windows


class CarriedStates:
    """The LSTM state of each stream group between windows, in the model (so that ``fairseq-eval-lm``, which only
    calls the model, carries it too); not saved with the checkpoint. A window continues the state of the window
    before it; window 0 starts from zeros; the same window again (fairseq replays a step after an fp16 overflow)
    starts from the same state; any other gap starts from zeros, with a warning."""

    def __init__(self):
        self._states: Dict[str, tuple] = {}
        self._warned = False

    def incoming(self, key: str, step: int, batch: int):
        if step == 0:
            return None
        last = self._states.get(key)
        if last is not None and last[2][0][0].shape[1] == batch:
            if last[0] == step - 1:
                return last[2]
            if last[0] == step:
                return last[1]
        if not self._warned:
            self._warned = True
            logger.warning(
                f"stream {key}: window {step} does not follow window {last[0] if last else None}; it "
                f"starts from a zero state (a run resumed mid-epoch, or a skipped batch)"
            )
        return None

    def store(self, key: str, step: int, incoming, outgoing) -> None:
        self._states[key] = (step, incoming, tuple((h.detach(), c.detach()) for h, c in outgoing))


@dataclass
class AWDLanguageModelingConfig(LanguageModelingConfig):
    bptt: int = field(default=70, metadata={"help": "mean training window and evaluation window (the papers' bptt)"})
    bptt_p: float = field(default=0.95, metadata={"help": "probability of a window of mean --bptt (else --bptt / 2)"})
    bptt_std: float = field(default=5.0, metadata={"help": "std of the window length's normal draw"})
    min_seq_len: int = field(default=5, metadata={"help": "shortest drawn window"})
    max_seq_len_delta: int = field(
        default=40,
        metadata={"help": "longest drawn window: --bptt + this (MoS: 40, 20 on WT2; -1: no cap, as awd-lstm-lm)"},
    )
    fixed_bptt: bool = field(default=False, metadata={"help": "every training window --bptt long (nothing drawn)"})
    no_lr_rescale: bool = field(
        default=False, metadata={"help": "do not scale the learning rate by window length / --bptt"}
    )
    eval_batch_size: int = field(default=10, metadata={"help": "streams of the validation splits (the papers: 10)"})
    test_batch_size: int = field(default=1, metadata={"help": "streams of the test* splits (the papers: 1)"})
    stateless: bool = field(
        default=False, metadata={"help": "every window starts from a zero state (the same windows, no carried state)"}
    )
    update_freq: List[int] = II("optimization.update_freq")  # micro-batches per update: chunks of the streams


@register_task("awd_language_modeling", dataclass=AWDLanguageModelingConfig)
class AWDLanguageModelingTask(LanguageModelingTask):
    """Language modelling as the AWD-LSTM / MoS code trains and scores it (see the module docstring)."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        for name, low in (("bptt", 1), ("min_seq_len", 1), ("eval_batch_size", 1), ("test_batch_size", 1)):
            if getattr(args, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
        if not 0.0 <= args.bptt_p <= 1.0:
            raise ValueError(f"--bptt-p must be in [0, 1], got {args.bptt_p}")
        self._plans: Dict[int, Tuple[np.random.RandomState, List[List[Tuple[int, int, int]]]]] = {}
        self._seq_len: Optional[int] = None

    # -- data --------------------------------------------------------------------------------
    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        paths = utils.split_paths(self.args.data)
        path = os.path.join(paths[(epoch - 1) % len(paths)], split)
        lines = data_utils.load_indexed_dataset(path, self.dictionary, self.args.dataset_impl, combine=combine)
        if lines is None:
            raise FileNotFoundError(f"awd_language_modeling: no split {split!r} in {os.path.dirname(path)}")
        self.datasets[split] = StreamDataset(torch.cat([lines[i] for i in range(len(lines))]), split)

    def plan(self, nrows: int, epoch: int) -> List[Tuple[int, int, int]]:
        """The training windows of ``epoch`` (1-based): one generator seeded with ``--seed``, continued over the
        epochs (replayed from epoch 1 when a run resumes), as the papers' code draws."""
        a = self.args
        rng, epochs = self._plans.setdefault(nrows, (np.random.RandomState(a.seed), []))
        while len(epochs) < epoch:
            epochs.append(
                train_windows(
                    rng, nrows, a.bptt, a.bptt_p, a.bptt_std, a.min_seq_len, a.max_seq_len_delta, a.fixed_bptt
                )
            )
        return epochs[epoch - 1]

    def windows(
        self, dataset: StreamDataset, batch_size: Optional[int], num_shards: int, shard_id: int, epoch: int
    ) -> List[List[Window]]:
        """The batches of ``dataset`` for this rank, in stream order (see the module docstring)."""
        a = self.args
        split = dataset.split
        if split.startswith("train"):
            if not batch_size:
                raise ValueError("--task awd_language_modeling needs --batch-size (the streams per update and rank)")
            update_freq = list(a.update_freq or [1])
            chunks = update_freq[min(epoch, len(update_freq)) - 1]
            streams = num_shards * chunks * batch_size
            nrows = dataset.nrows(streams)
            if nrows < 3:
                raise ValueError(f"{split}: {len(dataset)} tokens make {nrows} rows of {streams} streams; need >= 3")
            return [
                [
                    Window(
                        None if a.stateless else f"{split}/{m}",
                        t,
                        start,
                        length,
                        drawn,
                        (shard_id * chunks + m) * batch_size,
                        (shard_id * chunks + m + 1) * batch_size,
                        streams,
                    )
                ]
                for t, (start, length, drawn) in enumerate(self.plan(nrows, epoch))
                for m in range(chunks)
            ]
        streams = a.test_batch_size if split.startswith("test") else a.eval_batch_size
        nrows = dataset.nrows(streams)
        if nrows < 2:
            raise ValueError(f"{split}: {len(dataset)} tokens make {nrows} rows of {streams} streams; need >= 2")
        lo, hi = 0, streams
        if streams % num_shards == 0:  # else every rank scores every stream (fairseq sums the ranks: same mean)
            lo, hi = shard_id * streams // num_shards, (shard_id + 1) * streams // num_shards
        return [
            [Window(None if a.stateless else split, t, start, length, drawn, lo, hi, streams)]
            for t, (start, length, drawn) in enumerate(eval_windows(nrows, a.bptt))
        ]

    def get_batch_iterator(
        self,
        dataset,
        max_tokens=None,
        max_sentences=None,
        max_positions=None,
        ignore_invalid_inputs=False,
        required_batch_size_multiple=1,
        seed=1,
        num_shards=1,
        shard_id=0,
        num_workers=0,
        epoch=1,
        data_buffer_size=0,
        **kwargs,
    ):
        if not isinstance(dataset, StreamDataset):
            raise ValueError(f"--task awd_language_modeling reads its own datasets, got {type(dataset).__name__}")
        batches = self.windows(dataset, max_sentences, num_shards, shard_id, epoch)
        # one shard here: the windows above are this rank's already (every rank the same number, no empty batch)
        return iterators.EpochBatchIterator(
            dataset=dataset,
            collate_fn=dataset.collater,
            batch_sampler=batches,
            seed=self.args.seed,
            num_shards=1,
            shard_id=0,
            num_workers=num_workers,
            epoch=epoch,
            buffer_size=data_buffer_size,
            disable_shuffling=True,
            skip_remainder_batch=False,
        )

    def eval_lm_dataloader(
        self,
        dataset,
        max_tokens=36000,
        batch_size=None,
        max_positions=None,
        num_shards=1,
        shard_id=0,
        num_workers=1,
        data_buffer_size=10,
        context_window=0,
    ):
        if context_window > 0:
            raise ValueError(
                "--context-window: awd_language_modeling carries the LSTM state over the whole split, "
                "which is the context; leave --context-window at 0"
            )
        return self.get_batch_iterator(
            dataset,
            num_shards=num_shards,
            shard_id=shard_id,
            num_workers=num_workers,
            data_buffer_size=data_buffer_size,
        ).next_epoch_itr(shuffle=False)

    # -- training ----------------------------------------------------------------------------
    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False, **kwargs):
        if ignore_grad:  # fairseq's dummy batch: it must not read or write a stream's state
            sample = {**sample, "net_input": {**sample["net_input"], "stream_key": None}}
        else:
            self._seq_len = sample.get("bptt_seq_len")
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad, **kwargs)

    def optimizer_step(self, optimizer, model, update_num):
        """The step at ``lr * drawn length / bptt``, the rate restored after it (as the papers' loop)."""
        seq_len, self._seq_len = self._seq_len, None
        if seq_len is None or self.args.no_lr_rescale or self.args.fixed_bptt:
            return optimizer.step()
        lr = optimizer.get_lr()
        optimizer.set_lr(lr * seq_len / self.args.bptt)
        try:
            optimizer.step()
        finally:
            optimizer.set_lr(lr)
