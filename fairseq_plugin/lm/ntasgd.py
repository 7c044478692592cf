"""Non-monotonically triggered averaged SGD (NT-ASGD, Merity et al. 2018), the AWD-LSTM / MoS schedule, in fairseq.

* ``--optimizer ntasgd`` (``--weight-decay``): plain SGD, which once switched also keeps the running mean of
  every parameter since the switch (torch's ASGD with ``t0`` = the switch and ``lambd = 0``, as AWD-LSTM uses
  it). The switch and the averages live in the optimizer state, so they survive checkpoints and resuming.
* ``--lr-scheduler ntasgd`` (``--nonmono N``, ``--asgd-from-epoch E``): a constant learning rate; at the end of
  each epoch it switches the optimizer to averaging when the validation loss is worse than the best of the
  epochs before the last ``N`` (AWD-LSTM's test), or at epoch ``E`` when given (MoS's finetune stage averages
  from the start: ``--asgd-from-epoch 1``).
* ``python -m fairseq_plugin.average CHECKPOINT OUT``: a checkpoint whose model weights are the averages, what
  AWD-LSTM evaluates and keeps; score it with ``fairseq-eval-lm --path OUT``.

Validation sees the averages once the switch is made, as AWD-LSTM's loop swaps them in to evaluate: the plugin
wraps fairseq-train's ``validate`` (:func:`validate_on_averages`), so the logged valid loss, ``--patience``, the
trigger and the choice of ``checkpoint_best.pt`` all read the averaged model. Checkpoints keep the SGD iterate as
their model and the averages in the optimizer state (a resumed run goes on as it was);
``python -m fairseq_plugin.average checkpoint_best.pt OUT`` writes the averaged model that validated best.
"""

import contextlib
import logging
import sys
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

logger = logging.getLogger(__name__)


class AveragedSGD(torch.optim.SGD):
    """SGD that, after :meth:`start_averaging`, also keeps ``state[p]["ax"]``, the mean of ``p`` over the steps
    since the switch (its own count in ``state[p]["avg_steps"]``)."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0):
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        for group in self.param_groups:
            group.setdefault("averaging", False)

    @property
    def averaging(self) -> bool:
        return bool(self.param_groups[0]["averaging"])

    def start_averaging(self) -> None:
        for group in self.param_groups:
            group["averaging"] = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            if not group["averaging"]:
                continue
            for p in group["params"]:
                state = self.state[p]
                n = state.get("avg_steps", 0) + 1
                state["avg_steps"] = n
                if n == 1:
                    state["ax"] = p.detach().clone()
                else:
                    state["ax"].add_(p.detach() - state["ax"], alpha=1.0 / n)
        return loss


@dataclass
class NTASGDConfig(FairseqDataclass):
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay (AWD-LSTM / MoS: 1.2e-6)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("ntasgd", dataclass=NTASGDConfig)
class FairseqNTASGD(FairseqOptimizer):
    """fairseq's wrapper of :class:`AveragedSGD`; pair it with ``--lr-scheduler ntasgd``."""

    def __init__(self, cfg: NTASGDConfig, params):
        super().__init__(cfg)
        self._optimizer = AveragedSGD(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        return {"lr": self.cfg.lr[0], "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        return False


@dataclass
class NTASGDScheduleConfig(FairseqDataclass):
    nonmono: int = field(
        default=5,
        metadata={
            "help": "switch to averaging when the validation loss is worse "
            "than the best before the last N epochs (AWD-LSTM: 5)"
        },
    )
    asgd_from_epoch: int = field(
        default=0, metadata={"help": "switch at the end of this epoch at the latest (0: only the non-monotone test)"}
    )
    lr: List[float] = II("optimization.lr")


def find_averaged_sgd(optimizer) -> Optional[AveragedSGD]:
    """The :class:`AveragedSGD` inside fairseq's optimizer wrappers, or None (another optimizer)."""
    inner = optimizer
    for _ in range(4):
        if isinstance(inner, AveragedSGD):
            return inner
        inner = getattr(inner, "optimizer", getattr(inner, "fp32_optimizer", None))
    return None


def averaged_sgd(optimizer) -> AveragedSGD:
    """The :class:`AveragedSGD` inside fairseq's optimizer wrappers, or a clear error."""
    sgd = find_averaged_sgd(optimizer)
    if sgd is None:
        raise ValueError("--lr-scheduler ntasgd needs --optimizer ntasgd (the averages are the optimizer's)")
    return sgd


@contextlib.contextmanager
def averaged_weights(optimizer):
    """Inside the block every parameter that has an NT-ASGD average holds it; the SGD iterate is put back after
    (also on an error). Does nothing for another optimizer or before the switch."""
    sgd = find_averaged_sgd(optimizer)
    swapped = []
    if sgd is not None and sgd.averaging:
        with torch.no_grad():
            for group in sgd.param_groups:
                for p in group["params"]:
                    ax = sgd.state[p].get("ax")
                    if ax is not None:
                        swapped.append((p, p.detach().clone()))
                        p.copy_(ax)
    try:
        yield len(swapped)
    finally:
        with torch.no_grad():
            for p, iterate in swapped:
                p.copy_(iterate)


def validate_on_averages() -> None:
    """Make fairseq-train's ``validate`` run on the NT-ASGD averages once averaging has started (AWD-LSTM's
    evaluation), and on the weights as they are otherwise. Idempotent; nothing outside fairseq-train."""
    for name in ("fairseq_cli.train", "__main__"):
        module = sys.modules.get(name)
        validate = getattr(module, "validate", None)
        if not callable(validate) or not hasattr(module, "validate_and_save"):
            continue
        if getattr(validate, "_softmax_heads_averages", False):
            return

        def on_averages(cfg, trainer, task, epoch_itr, subsets, _validate=validate):
            with averaged_weights(trainer.optimizer) as n:
                if n:
                    logger.info(f"NT-ASGD: validating the averages of {n} parameters")
                return _validate(cfg, trainer, task, epoch_itr, subsets)

        on_averages._softmax_heads_averages = True
        on_averages.__doc__ = validate.__doc__
        module.validate = on_averages


@register_lr_scheduler("ntasgd", dataclass=NTASGDScheduleConfig)
class NTASGDSchedule(FairseqLRScheduler):
    """A constant learning rate and the non-monotone trigger of averaging (see the module's docstring)."""

    def __init__(self, cfg: NTASGDScheduleConfig, optimizer):
        super().__init__(cfg, optimizer)
        if cfg.nonmono < 0 or cfg.asgd_from_epoch < 0:
            raise ValueError(f"--nonmono {cfg.nonmono} / --asgd-from-epoch {cfg.asgd_from_epoch}: allowed >= 0")
        averaged_sgd(optimizer)
        self.lr = cfg.lr[0]
        validate_on_averages()  # fairseq-train has loaded its module by now (the plugin loads from its main)
        self.val_losses: List[float] = []
        self.optimizer.set_lr(self.lr)

    def state_dict(self):
        return {"best": self.best, "val_losses": self.val_losses}

    def load_state_dict(self, state_dict):
        self.best = state_dict.get("best", self.best)
        self.val_losses = list(state_dict.get("val_losses", []))

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        if val_loss is None:
            return self.optimizer.get_lr()
        sgd = averaged_sgd(self.optimizer)
        n = self.cfg.nonmono
        worse = len(self.val_losses) > n and val_loss > min(self.val_losses[: len(self.val_losses) - n])
        forced = self.cfg.asgd_from_epoch and epoch >= self.cfg.asgd_from_epoch
        if not sgd.averaging and (worse or forced):
            sgd.start_averaging()
            logger.info(
                f"NT-ASGD: averaging from the end of epoch {epoch} ("
                + (
                    "validation loss %.4f worse than the best before the last %d epochs" % (val_loss, n)
                    if worse
                    else f"--asgd-from-epoch {self.cfg.asgd_from_epoch}"
                )
                + ")"
            )
        self.val_losses.append(float(val_loss))
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        return self.optimizer.get_lr()


def checkpoint_data_dir(path: str, state: Dict, data: Optional[str] = None) -> str:
    """The data directory the checkpoint's task reads its dictionary from: ``data`` when given, else the one stored
    in the checkpoint, which fairseq keeps as training was given it (often relative to the directory training ran
    in): as stored where it exists, else relative to the checkpoint's folder or one of its parents. ``ValueError``
    naming it (and ``--data``) when none exists."""
    if data is not None:
        if not os.path.isdir(data):
            raise ValueError(f"--data {data}: not a directory")
        return data
    cfg = state.get("cfg")
    stored = cfg["task"]["data"] if cfg is not None else getattr(state.get("args"), "data", None)
    if stored and os.path.isdir(stored):
        return stored
    if stored and not os.path.isabs(stored):
        folder = os.path.dirname(os.path.abspath(path))
        while True:
            if os.path.isdir(os.path.join(folder, stored)):
                return os.path.join(folder, stored)
            if os.path.dirname(folder) == folder:
                break
            folder = os.path.dirname(folder)
    raise ValueError(
        f"{path} was trained on the data directory {stored!r} (its dictionary gives the model's size), "
        f"which is not here nor beside the checkpoint; pass --data DIR (the binarized data directory)"
    )


def average_checkpoint(path: str, out: str, data: Optional[str] = None) -> int:
    """Write ``out``: the checkpoint ``path`` with every parameter replaced by its NT-ASGD average; returns how
    many were replaced (0, with a warning, before the switch). ``data``: the binarized data directory, where the
    one stored in the checkpoint is not found (:func:`checkpoint_data_dir`)."""
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    data = checkpoint_data_dir(path, state, data)
    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    names = [n for n, p in models[0].named_parameters() if p.requires_grad]
    opt_state = state["last_optimizer_state"]
    ids = [i for group in opt_state["param_groups"] for i in group["params"]]
    if len(ids) != len(names):
        raise ValueError(f"{path}: {len(ids)} optimizer parameters for {len(names)} model parameters")
    replaced, averages = 0, {}
    for name, i in zip(names, ids):
        ax = opt_state["state"].get(i, {}).get("ax")
        if ax is not None:
            averages[state["model"][name].data_ptr()] = ax.to(state["model"][name].dtype)
            replaced += 1
    # a tied weight is one parameter under several keys (AWD-LSTM's embedding is its softmax's weight): every key
    # that holds it gets the average, else loading the checkpoint would copy the SGD iterate back into it last
    for key, tensor in state["model"].items():
        if torch.is_tensor(tensor) and tensor.data_ptr() in averages:
            state["model"][key] = averages[tensor.data_ptr()]
    if not replaced:
        logger.warning(f"{path}: no averages (NT-ASGD had not switched): the weights are copied as they are")
    checkpoint_utils.torch_persistent_save(state, out)
    return replaced
