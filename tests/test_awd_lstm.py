"""The AWD-LSTM language model of the plugin (``--arch head_awd_lstm_lm``): its dropouts against their
definitions, the eval forward against a plain LSTM stack, every head through fairseq's criterion, the command
line (fairseq-train -> fairseq-eval-lm), and the NT-ASGD schedule (averages, trigger, averaged checkpoint)."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")

from fairseq_plugin.lm.awd_lstm import WeightDropLSTM, embedded_dropout, locked_dropout  # noqa: E402
from recipes.reproduce.engine.costs import FairseqSteps  # noqa: E402
from test_fairseq_cli import HEAD_OPTIONS, PLUGIN, TRAIN, cli, data  # noqa: E402,F401

TINY = ["--emsize", "16", "--nhid", "24", "--nhidlast", "20", "--tokens-per-sample", "16"]
OPTIONS = {**HEAD_OPTIONS, "d_softmax": {"band_fractions": [0.25, 0.75], "band_dims": [16, 4]}}  # sum: --nhidlast
UNTIED = ("ds_softmax", "d_softmax")  # experts / bands are no V x d matrix: they cannot be tied


def test_locked_dropout_shares_one_mask_over_time():
    x = torch.ones(3, 7, 5)
    y = locked_dropout(x, 0.5, training=True)
    assert torch.equal(y, y[:, :1].expand_as(y))  # the same at every step
    assert set(y.unique().tolist()) <= {0.0, 2.0} and (y == 0).any() and (y == 2).any()
    assert torch.equal(locked_dropout(x, 0.5, training=False), x)


def test_embedded_dropout_drops_whole_word_types():
    embed = torch.nn.Embedding(50, 8)
    tokens = torch.tensor([[3, 3, 4, 5, 3], [4, 5, 6, 7, 3]])
    out = embedded_dropout(embed, tokens, 0.5, training=True)
    for t in tokens.unique():
        rows = out[tokens == t]
        assert torch.equal(rows, rows[:1].expand_as(rows))  # every occurrence alike
        assert torch.allclose(rows[0], torch.zeros(8)) or torch.allclose(rows[0], 2 * embed.weight[t])
    assert torch.equal(embedded_dropout(embed, tokens, 0.5, training=False), embed(tokens))


def test_weight_drop_masks_only_the_recurrent_matrix_in_training():
    torch.manual_seed(0)
    layer = WeightDropLSTM(4, 6, 0.5)
    x = torch.randn(2, 5, 4)
    layer.eval()
    assert torch.equal(layer(x)[0], layer.lstm(x)[0])
    layer.train()
    first, second = layer(x)[0], layer(x)[0]
    assert not torch.equal(first, second)  # a new mask every forward
    # the same as an LSTM whose weight_hh is the dropped matrix
    torch.manual_seed(1)
    got = layer(x)[0]
    torch.manual_seed(1)
    dropped = torch.nn.functional.dropout(layer.lstm.weight_hh_l0, 0.5, training=True)
    ref = torch.nn.LSTM(4, 6, batch_first=True)
    ref.load_state_dict({**layer.lstm.state_dict(), "weight_hh_l0": dropped.detach()})
    torch.testing.assert_close(got, ref(x)[0])
    got.sum().backward()
    assert layer.lstm.weight_hh_l0.grad is not None and layer.lstm.weight_hh_l0.grad.abs().sum() > 0


def _steps(data, head):
    untie = ["--untie-weights"] if head in UNTIED else []
    return FairseqSteps(
        [
            str(data / "lm-bin"),
            "--user-dir",
            PLUGIN,
            "--task",
            "language_modeling",
            "--arch",
            "head_awd_lstm_lm_ptb",
            *TINY,
            *untie,
            "--output-head",
            head,
            "--head-options",
            json.dumps(OPTIONS[head]),
            "--criterion",
            "head_cross_entropy",
            "--optimizer",
            "sgd",
            "--lr",
            "20",
            "--max-tokens",
            "1024",
            "--cpu",
            "--seed",
            "1",
        ]
    )


def test_eval_forward_is_a_plain_lstm_stack_and_every_head_trains(data):
    for head in HEAD_OPTIONS:
        steps = _steps(data, head)
        model, decoder = steps.model, steps.model.decoder
        last = 20 if head in ("mos", "mixtape", "mos_plif", *UNTIED) else 16  # else tied at --emsize
        assert decoder.head.head_name == head and decoder.head.config.hidden_size == last
        assert [r.lstm.hidden_size for r in decoder.rnns] == [24, 24, last]
        if head not in UNTIED:  # tied to the input embedding, as the papers
            assert decoder.head.weight is decoder.embed_tokens.weight
        sample = steps.batch(4)
        tokens = sample["net_input"]["src_tokens"]
        model.eval()
        with torch.no_grad():
            x = decoder.embed_tokens(tokens)
            for rnn in decoder.rnns:
                x = rnn.lstm(x)[0]
            torch.testing.assert_close(model(**sample["net_input"])[0], x)
            lp = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            torch.testing.assert_close(lp.exp().sum(-1), torch.ones(lp.shape[:-1]), rtol=1e-4, atol=1e-4)
        model.train()
        loss, _, log = steps.criterion(model, sample)
        assert torch.isfinite(loss) and log["aux_loss"] > 0  # AR / TAR (plus the head's own aux loss)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), head


@pytest.mark.long
def test_awd_lstm_command_line_trains_and_evaluates(data, tmp_path):
    out = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_awd_lstm_lm_wt2",
        *TINY,
        "--output-head",
        "mixtape",
        "--head-options",
        json.dumps(HEAD_OPTIONS["mixtape"]),
        "--criterion",
        "head_cross_entropy",
        "--batch-size",
        "12",
        "--required-batch-size-multiple",
        "1",
        *[a for a in TRAIN if a not in ("--max-tokens", "1024")],
        "--max-update",
        3,
        "--save-dir",
        tmp_path,
    )
    valid = float(re.findall(r"valid on 'valid' subset \| loss [\d.]+ \| nll_loss [\d.]+ \| ppl ([\d.]+)", out)[-1])
    assert "bsz=12" in out
    ev = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "checkpoint_best.pt",
        "--tokens-per-sample",
        "16",
        "--cpu",
        "--num-workers",
        "0",
        "--gen-subset",
        "valid",
    )
    ppl = float(re.search(r"Perplexity: ([\d.]+)", ev).group(1))
    assert abs(ppl - valid) / valid < 0.02, (ppl, valid)
    code, err = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_awd_lstm_lm",
        *TINY,
        "--wdrop",
        "1.5",
        *TRAIN,
        "--max-update",
        1,
        "--save-dir",
        tmp_path / "x",
        check=False,
    )
    assert code == 2 and "--wdrop 1.5 is out of range" in err
    code, err = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_awd_lstm_lm",
        *TINY,
        "--output-head",
        "ds_softmax",
        *TRAIN,
        "--max-update",
        1,
        "--save-dir",
        tmp_path / "y",
        check=False,
    )
    assert code == 2 and "--untie-weights" in err


def test_averaged_sgd_keeps_the_mean_since_the_switch_and_saves_it():
    from fairseq_plugin.lm.ntasgd import AveragedSGD

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = AveragedSGD([p], lr=0.1, weight_decay=0.01)
    seen = []
    for step in range(6):
        if step == 2:
            opt.start_averaging()
        p.grad = torch.randn(5)
        opt.step()
        if opt.averaging:
            seen.append(p.detach().clone())
    torch.testing.assert_close(opt.state[p]["ax"], torch.stack(seen).mean(0))
    again = AveragedSGD([p], lr=0.1)
    again.load_state_dict(opt.state_dict())
    assert again.averaging and torch.equal(again.state[p]["ax"], opt.state[p]["ax"])


def test_ntasgd_switches_when_validation_is_worse_than_before_the_last_epochs():
    from fairseq_plugin.lm.ntasgd import FairseqNTASGD, NTASGDConfig, NTASGDSchedule, NTASGDScheduleConfig

    opt = FairseqNTASGD(NTASGDConfig(lr=[20.0]), [torch.nn.Parameter(torch.zeros(2))])
    sched = NTASGDSchedule(NTASGDScheduleConfig(nonmono=2, lr=[20.0]), opt)
    for epoch, loss in enumerate([5.0, 4.0, 3.0, 4.5], 1):  # 4.5 is worse than the last two, not than epoch 1
        sched.step(epoch, loss)
        assert not opt.optimizer.averaging
    sched.step(5, 4.2)  # worse than 4.0, the best before the last 2 epochs (5, 4 | 3, 4.5)
    assert opt.optimizer.averaging and opt.get_lr() == 20.0
    with pytest.raises(ValueError, match="--optimizer ntasgd"):
        from fairseq.optim.sgd import SGD

        NTASGDSchedule(
            NTASGDScheduleConfig(lr=[1.0]), SGD(argparse_namespace(lr=[1.0]), [torch.nn.Parameter(torch.zeros(1))])
        )


def argparse_namespace(**kw):
    import argparse

    return argparse.Namespace(momentum=0.0, weight_decay=0.0, **kw)


@pytest.mark.long
def test_ntasgd_on_the_command_line_validates_the_averages_then_the_averaged_checkpoint_is_scored(data, tmp_path):
    import subprocess
    import sys

    out = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_awd_lstm_lm_ptb",
        *TINY,
        "--output-head",
        "mos",
        "--head-options",
        '{"num_components": 2}',
        "--criterion",
        "head_cross_entropy",
        "--optimizer",
        "ntasgd",
        "--weight-decay",
        "1.2e-6",
        "--lr-scheduler",
        "ntasgd",
        "--asgd-from-epoch",
        "1",
        "--lr",
        "20",
        "--clip-norm",
        "0.25",
        "--batch-size",
        "12",
        "--required-batch-size-multiple",
        "1",
        "--max-epoch",
        "2",
        "--cpu",
        "--save-dir",
        tmp_path,
        "--no-epoch-checkpoints",
        "--num-workers",
        "0",
        "--log-format",
        "json",
    )
    assert "NT-ASGD: averaging from the end of epoch 1" in out
    assert out.count("NT-ASGD: validating the averages") == 1  # epoch 2's validation, not epoch 1's
    valid = [json.loads(line[line.index("{") :]) for line in out.splitlines() if "| valid |" in line]
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
    assert avg.returncode == 0 and "parameters averaged" in avg.stderr, avg.stderr[-2000:]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairseq_plugin.average",
            str(tmp_path / "checkpoint_last.pt"),
            str(tmp_path / "x.pt"),
            "--data",
            str(tmp_path / "nowhere"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--data" in bad.stderr.splitlines()[-1]
    ppl = {}
    for name in ("checkpoint_last.pt", "avg.pt"):
        ev = cli(
            "fairseq-eval-lm",
            data / "lm-bin",
            "--user-dir",
            PLUGIN,
            "--path",
            tmp_path / name,
            "--tokens-per-sample",
            "16",
            "--cpu",
            "--num-workers",
            "0",
            "--gen-subset",
            "valid",
        )
        ppl[name] = float(re.search(r"Perplexity: ([\d.]+)", ev).group(1))
    assert ppl["avg.pt"] != ppl["checkpoint_last.pt"]  # other weights: the averages
    # epoch 2 validated the averages (AWD-LSTM's evaluation), not the SGD iterate the checkpoint holds as its model:
    # the logged loss is the loss of the averages in the checkpoint's optimizer state
    iterate, averages = validation_losses(tmp_path / "checkpoint_last.pt", max_sentences=12)
    assert float(valid[-1]["valid_loss"]) == pytest.approx(averages, abs=1e-3)
    assert abs(float(valid[-1]["valid_loss"]) - iterate) > 0.01
    # the averaged checkpoint holds those averages, the tied embedding / softmax weight included (under both keys)
    scored, _ = validation_losses(tmp_path / "avg.pt", max_sentences=12)
    assert scored == pytest.approx(averages, abs=1e-6)


def validation_losses(checkpoint, max_sentences: int):
    """The validation loss (bits a token, as fairseq logs it) of the checkpoint's model and of its NT-ASGD averages,
    computed in this process as fairseq-train's validation computes it."""
    import math

    from fairseq import checkpoint_utils

    from fairseq_plugin.lm.ntasgd import AveragedSGD, averaged_weights

    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model, criterion = models[0].eval(), task.build_criterion(cfg.criterion)
    task.load_dataset("valid")

    def loss():
        batches = task.get_batch_iterator(dataset=task.dataset("valid"), max_sentences=max_sentences)
        total, n = 0.0, 0
        with torch.no_grad():
            for sample in batches.next_epoch_itr(shuffle=False):
                value, size, _ = criterion(model, sample)
                total, n = total + value.item(), n + size
        return total / n / math.log(2)

    sgd = AveragedSGD(list(model.parameters()), lr=1.0)
    sgd.load_state_dict(state["last_optimizer_state"])
    with averaged_weights(sgd) as swapped:
        assert swapped == len(list(model.parameters()))
        averaged = loss()
    return loss(), averaged


def test_average_finds_the_data_directory_from_any_directory(tmp_path):
    """fairseq keeps the data directory as training was given it (often relative): the averaging command looks for it
    beside the checkpoint and in the folders above, else says to pass --data."""
    from fairseq_plugin.lm.ntasgd import checkpoint_data_dir

    (tmp_path / "exp" / "e_bin").mkdir(parents=True)
    (tmp_path / "exp" / "checkpoints").mkdir()
    ckpt = str(tmp_path / "exp" / "checkpoints" / "checkpoint_last.pt")
    found = str(tmp_path / "exp" / "e_bin")
    assert checkpoint_data_dir(ckpt, {"cfg": {"task": {"data": "e_bin"}}}) == found
    assert checkpoint_data_dir(ckpt, {"cfg": None, "args": argparse_namespace(data="e_bin")}) == found
    assert checkpoint_data_dir(ckpt, {"cfg": {"task": {"data": found}}}) == found  # absolute, as stored
    with pytest.raises(ValueError, match=r"data directory 'f_bin' .* pass --data DIR"):
        checkpoint_data_dir(ckpt, {"cfg": {"task": {"data": "f_bin"}}})
    assert checkpoint_data_dir(ckpt, {"cfg": {"task": {"data": "f_bin"}}}, data=found) == found
