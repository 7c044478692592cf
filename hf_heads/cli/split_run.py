"""``softmax-heads finetune --tensor-parallel``: the model split over torchrun's processes with transformers'
``tp_plan="auto"``, the head's rows split over the vocabulary (:mod:`hf_heads.hf.tensor_parallel`).

Every process builds the model with its head as one process does (the same seed, so the same weights), rank 0 saves
it, and every process loads it back split (``from_pretrained(DIR, tp_plan="auto")``). All processes then see the same
batches: the run is one process's, spread over the ranks, and its losses are that process's (but for randomness a
head draws per rank: Mixtape's gate noise).

    torchrun --nproc_per_node 2 -m hf_heads.cli finetune --model-config llama-tiny --head mixtape --tensor-parallel ...

accelerate 1.16 does not split a model over CPU processes (its ``ParallelismConfig`` wants GPUs), so
:class:`SplitRun` gives the few calls the recipe makes of an ``Accelerator`` for a run whose ranks share the batch.
"""

from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist


class SplitRun:
    """What the recipe asks of accelerate's ``Accelerator``, for ranks that all see the same batches: nothing to
    gather, nothing to wrap, batches moved to this rank's device."""

    def __init__(self):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world < 2:
            raise SystemExit(
                f"--tensor-parallel splits the model over torchrun's processes, and this is {world} process: run "
                f"`torchrun --nproc_per_node N -m hf_heads.cli finetune ... --tensor-parallel` with N >= 2"
            )
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.num_processes = dist.get_world_size()
        self.is_main_process = dist.get_rank() == 0
        self.is_local_main_process = int(os.environ.get("LOCAL_RANK", "0")) == 0

    def print(self, *args, **kwargs) -> None:
        if self.is_main_process:
            print(*args, **kwargs)

    def prepare(self, *objects):
        """The objects as given; data loaders yield their batches on this rank's device."""
        out = tuple(_OnDevice(o, self.device) if isinstance(o, torch.utils.data.DataLoader) else o for o in objects)
        return out[0] if len(out) == 1 else out

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def gather_for_metrics(self, value: torch.Tensor) -> torch.Tensor:
        return value  # every rank scored the same batches

    def unwrap_model(self, model):
        return model

    def wait_for_everyone(self) -> None:
        dist.barrier()

    def split(self, model, folder: str):
        """``model`` (a head model, the same on every rank) loaded back split over the ranks with the model's own
        tensor-parallel plan: rank 0 saves it to ``folder``, every rank loads it, ``folder`` goes. The random state
        is this process's again afterwards, so the run draws as one process does."""
        from transformers import AutoModelForCausalLM
        from transformers.distributed import DistributedConfig

        require_plan(model)
        if self.is_main_process:
            model.save_pretrained(folder)
        dist.barrier()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            split = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(tp_plan="auto"))
        dist.barrier()
        if self.is_main_process:
            shutil.rmtree(folder)
        return split

    def rows_per_rank(self, head) -> list:
        """How many rows of the head's projection each rank holds (all of them where the head is held whole)."""
        weight = head.weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        rows = torch.tensor([local.shape[0]], device=self.device)
        gathered = [torch.zeros_like(rows) for _ in range(self.num_processes)]
        dist.all_gather(gathered, rows)
        return [int(r) for r in gathered]


def require_plan(model) -> None:
    """Refuse, in one line, a model whose family transformers gives no tensor-parallel plan (GPT-2): transformers' own
    error names a config option, where the user needs another family."""
    if not getattr(model, "tp_plan", None):
        raise SystemExit(
            f"--tensor-parallel: {type(model).__name__} has no tensor-parallel plan in transformers (its family "
            f"gives none); use a family that has one, such as Llama, Qwen2 or Gemma 2 (--model-config llama-tiny)"
        )


class _OnDevice:
    """A data loader whose batches come on ``device``."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __iter__(self):
        for batch in self.loader:
            yield tuple(t.to(self.device) for t in batch)

    def __len__(self):
        return len(self.loader)
