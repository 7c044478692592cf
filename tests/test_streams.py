"""``--task awd_language_modeling``: the AWD-LSTM / MoS protocol (streams, carried state, variable BPTT, the rescaled
learning rate) against a slow reference: the papers' loop written out (batchify, get_batch, repackage_hidden, the
draws from a seeded ``np.random``) on the same model, step by step through fairseq's own Trainer."""

import copy
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")

from fairseq.trainer import Trainer  # noqa: E402

from fairseq_plugin.lm.streams import StreamDataset, eval_windows, train_windows  # noqa: E402
from recipes.reproduce.engine.costs import FairseqSteps, setup_task  # noqa: E402
from test_fairseq_cli import PLUGIN, cli, data  # noqa: E402,F401  (data: the tiny corpus fixture)

TINY = [
    "--emsize",
    "16",
    "--nhid",
    "24",
    "--nhidlast",
    "16",
    "--nlayers",
    "2",
    "--dropout",
    "0",
    "--dropouth",
    "0",
    "--dropouti",
    "0",
    "--dropoute",
    "0",
    "--wdrop",
    "0",
    "--dropoutl",
    "0",
    "--alpha",
    "0",
    "--beta",
    "0",
]


def papers_plan(seed, nrows, epochs, bptt=70, delta=40):
    """The papers' training loop's windows, literally (awd-lstm-lm main.py, MoS's cap)."""
    np.random.seed(seed)
    out = []
    for _ in range(epochs):
        windows, i = [], 0
        while i < nrows - 1 - 1:
            b = bptt if np.random.random() < 0.95 else bptt / 2.0
            seq_len = max(5, int(np.random.normal(b, 5)))
            if delta >= 0:
                seq_len = min(seq_len, bptt + delta)
            windows.append((i, min(seq_len, nrows - 1 - i), seq_len))
            i += seq_len
        out.append(windows)
    return out


@pytest.mark.parametrize("seed, nrows, bptt, delta", [(1, 5530, 70, 40), (7, 400, 20, -1), (3, 73, 10, 5)])
def test_windows_are_the_papers_draws_epoch_after_epoch(seed, nrows, bptt, delta):
    rng = np.random.RandomState(seed)
    ours = [train_windows(rng, nrows, bptt, max_delta=delta) for _ in range(3)]
    assert ours == papers_plan(seed, nrows, 3, bptt, delta)
    for epoch in ours:  # every row but the last is read once (the papers' loop stops at nrows - 2)
        assert epoch[0][0] == 0 and all(a[0] + a[2] == b[0] for a, b in zip(epoch, epoch[1:]))
        assert epoch[-1][0] + epoch[-1][1] in (nrows - 1, nrows - 2) or epoch[-1][1] < epoch[-1][2]
    assert eval_windows(75, 10)[-1] == (70, 4, 10) and len(eval_windows(75, 10)) == 8


def train_args(data_dir, save_dir, *extra):
    return [
        str(data_dir),
        "--user-dir",
        PLUGIN,
        "--task",
        "awd_language_modeling",
        "--arch",
        "head_awd_lstm_lm",
        *TINY,
        "--output-head",
        "softmax",
        "--criterion",
        "head_cross_entropy",
        "--optimizer",
        "sgd",
        "--lr",
        "2",
        "--clip-norm",
        "0.25",
        "--weight-decay",
        "1.2e-6",
        "--batch-size",
        "4",
        "--bptt",
        "12",
        "--cpu",
        "--max-epoch",
        "2",
        "--seed",
        "3",
        "--num-workers",
        "0",
        "--save-dir",
        str(save_dir),
        *extra,
    ]


def batchify(tokens, bsz):
    nrows = len(tokens) // bsz
    return tokens[: nrows * bsz].view(bsz, -1).t().contiguous()


def reference_step(model, rows, i, seq_len, hidden):
    """get_batch + the forward of the papers' loop; returns (mean NLL, the detached final state)."""
    length = min(seq_len, len(rows) - 1 - i)
    src, tgt = rows[i : i + length].t(), rows[i + 1 : i + 1 + length].t()
    features, extra = model.decoder.extract_features(src, hidden=hidden)
    lp = model.decoder.get_normalized_probs((features, None), log_probs=True)
    loss = F.nll_loss(lp.reshape(-1, lp.shape[-1]), tgt.reshape(-1))
    return loss, tuple((h.detach(), c.detach()) for h, c in extra["hidden"])


@pytest.mark.parametrize("update_freq", [1, 2])
def test_fairseq_trainer_sees_the_papers_batches_state_and_learning_rate(data, tmp_path, update_freq):
    """Two epochs through fairseq's Trainer equal the papers' loop on the same model, update by update: the same
    windows (drawn lengths, streams), the state carried from window to window (zeros at each epoch), the loss, the
    learning rate scaled by the drawn length, the parameters at the end. ``--update-freq 2``: the streams in two
    chunks of --batch-size, one state each, one step (MoS's small batches)."""
    cfg, task = setup_task(train_args(data / "lm-bin", tmp_path, "--update-freq", str(update_freq)))
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    reference = copy.deepcopy(model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    losses = []
    original = task.train_step

    def recording(sample, *args, **kwargs):
        loss, size, log = original(sample, *args, **kwargs)
        losses.append((sample["net_input"]["stream_step"], sample["bptt_seq_len"], loss.item() / size))
        return loss, size, log

    task.train_step = recording
    for epoch in (1, 2):
        itr = trainer.get_train_iterator(epoch).next_epoch_itr(shuffle=True)
        batch = []
        for sample in itr:
            batch.append(sample)
            if len(batch) == update_freq:
                trainer.train_step(batch)
                batch = []
    task.train_step = original

    tokens = task.dataset("train").tokens
    streams = 4 * update_freq
    rows = batchify(tokens, streams)
    plan = papers_plan(3, len(rows), 2, bptt=12)
    optimizer = torch.optim.SGD(reference.parameters(), lr=2.0, weight_decay=1.2e-6)
    expected = []
    reference.train()
    for windows in plan:
        hidden = [None] * update_freq  # init_hidden at the start of every epoch
        for step, (i, _, seq_len) in enumerate(windows):
            optimizer.zero_grad()
            for m in range(update_freq):  # MoS: one state per chunk of columns, the loss weighted by its share
                cols = rows[:, m * 4 : (m + 1) * 4]
                loss, hidden[m] = reference_step(reference, cols, i, seq_len, hidden[m])
                (loss / update_freq).backward()
                expected.append((step, seq_len, loss.item()))
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.25)
            for group in optimizer.param_groups:
                group["lr"] = 2.0 * seq_len / 12
            optimizer.step()
            for group in optimizer.param_groups:
                group["lr"] = 2.0
    assert [(s, n) for s, n, _ in losses] == [(s, n) for s, n, _ in expected]
    np.testing.assert_allclose([loss for *_, loss in losses], [loss for *_, loss in expected], rtol=1e-5)
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6, msg=name)


def evaluate(model, rows, bptt, stateful=True):
    """The papers' evaluate(): one state over the whole split (zeros per window when not stateful); mean NLL over
    the scored tokens."""
    hidden, total, count = None, 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows) - 1, bptt):
            loss, new = reference_step(model, rows, i, bptt, hidden if stateful else None)
            n = min(bptt, len(rows) - 1 - i) * rows.shape[1]
            total, count, hidden = total + loss.item() * n, count + n, new
    return total / count


def test_validation_carries_the_state_over_the_split_and_stateless_does_not(data, tmp_path):
    for stateless in (False, True):
        cfg, task = setup_task(train_args(data / "lm-bin", tmp_path, *(["--stateless"] if stateless else [])))
        torch.manual_seed(0)
        model = task.build_model(cfg.model).eval()
        criterion = task.build_criterion(cfg.criterion)
        task.load_dataset("valid")
        itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=99).next_epoch_itr(shuffle=False)
        total = count = 0.0
        for sample in itr:
            assert sample["net_input"]["src_tokens"].shape[0] == 10  # --eval-batch-size streams
            _, size, log = task.valid_step(sample, model, criterion)
            total, count = total + log["loss"], count + size
        rows = batchify(task.dataset("valid").tokens, 10)
        assert total / count / math.log(2) == pytest.approx(
            evaluate(model, rows, 12, not stateless) / math.log(2), rel=1e-5
        )
        if not stateless:
            assert abs(evaluate(model, rows, 12, True) - evaluate(model, rows, 12, False)) > 1e-4


@pytest.mark.long
def test_command_line_trains_with_ntasgd_and_eval_lm_scores_the_average_with_and_without_the_state(data, tmp_path):
    """The full plans' commands, tiny: fairseq-train (NT-ASGD) -> python -m fairseq_plugin.average ->
    fairseq-eval-lm --task awd_language_modeling, with the state carried and --stateless (another number)."""
    import subprocess
    import sys

    cli(
        "fairseq-train",
        *train_args(
            data / "lm-bin",
            tmp_path,
            "--max-epoch",
            "2",
            "--no-epoch-checkpoints",
            "--log-format",
            "simple",
            "--optimizer",
            "ntasgd",
            "--lr-scheduler",
            "ntasgd",
            "--asgd-from-epoch",
            "1",
        ),
    )
    avg = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairseq_plugin.average",
            str(tmp_path / "checkpoint_last.pt"),
            str(tmp_path / "avg.pt"),
        ],
        capture_output=True,
        text=True,
    )
    assert avg.returncode == 0, avg.stderr[-2000:]
    scores = {}
    for extra in ([], ["--stateless"]):
        out = cli(
            "fairseq-eval-lm",
            data / "lm-bin",
            "--user-dir",
            PLUGIN,
            "--task",
            "awd_language_modeling",
            "--path",
            tmp_path / "avg.pt",
            "--gen-subset",
            "valid",
            "--bptt",
            "12",
            "--cpu",
            "--num-workers",
            "0",
            *extra,
        )
        scores[bool(extra)] = float(re.search(r"Perplexity: ([\d.]+)", out).group(1))
    assert all(1.0 < s < 200.0 for s in scores.values()) and scores[False] != scores[True]
    code, out = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "awd_language_modeling",
        "--path",
        tmp_path / "avg.pt",
        "--gen-subset",
        "valid",
        "--cpu",
        "--context-window",
        "5",
        check=False,
    )
    assert code != 0


def test_stream_dataset_layout_is_the_papers_batchify():
    tokens = torch.arange(23)
    dataset = StreamDataset(tokens, "valid")
    torch.testing.assert_close(dataset.layout(4), batchify(tokens, 4))  # the last 23 mod 4 = 3 tokens dropped
    assert dataset.nrows(4) == 5


def test_two_processes_read_their_own_streams_and_equal_one_process_with_all_of_them(data, tmp_path):
    """fairseq's distributed training (gloo, legacy_ddp, 2 CPU processes) with --batch-size 2 each: rank r reads
    streams [2r, 2r + 2) of 4, every rank the same windows; the weights equal one process with --batch-size 4."""
    import os
    import subprocess

    from test_fairseq_cli import BIN, _free_port, clean_env

    one = tmp_path / "one"
    cli("fairseq-train", *train_args(data / "lm-bin", one, "--max-epoch", "1", "--no-epoch-checkpoints"))
    two = tmp_path / "two"
    common = [
        os.path.join(BIN, "fairseq-train"),
        *train_args(data / "lm-bin", two, "--max-epoch", "1", "--no-epoch-checkpoints"),
        "--distributed-world-size",
        "2",
        "--distributed-backend",
        "gloo",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{_free_port()}",
        "--distributed-no-spawn",
        "--ddp-backend",
        "legacy_ddp",
    ]
    common[common.index("--batch-size") + 1] = "2"
    procs = [
        subprocess.Popen(
            common + ["--distributed-rank", str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(),
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    a = torch.load(one / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    b = torch.load(two / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_cost_columns_step_on_the_first_training_window_of_the_streams(data, tmp_path):
    """The cost columns (recipes/reproduce/engine/costs.py) under this task: a batch of n sequences is the first
    training window of n streams, with the papers' first drawn length, and both steps run on it."""
    steps = FairseqSteps(train_args(data / "lm-bin", tmp_path / "ckpt"))
    dataset = steps.dataset
    rows = dataset.layout(6)
    start, length, _ = train_windows(np.random.RandomState(3), dataset.nrows(6), 12)[0]
    sample = steps.batch(6)
    assert start == 0 and sample["nsentences"] == 6 and sample["ntokens"] == 6 * length
    torch.testing.assert_close(sample["net_input"]["src_tokens"], rows[:length].t())
    torch.testing.assert_close(sample["target"], rows[1 : length + 1].t())
    for step in steps.steps(6).values():
        step()
