"""What each rank runs in tests/test_tensor_parallel.py (gloo on the CPU): ``python tests/tp_ranks.py CHECK``, one
process per rank, RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment. Each rank compares its results
with the same head in one process (built from the same seed) and exits non-zero, saying what differs, where they do
not agree."""

from __future__ import annotations

import copy
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

import hf_heads

V, N, D = 37, 24, 8  # a vocabulary no rank count here divides
HEADS = {
    "softmax": {},
    "sigsoftmax": {"use_bias": True},
    "plif": {"num_knots": 50, "knot_range": 4.0},
    "mos": {"num_components": 3},
    "mos_plif": {"num_components": 2, "num_knots": 50, "knot_range": 4.0},
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.3, "gate_embedding_size": 4, "gate_noise": 0.0},
}


def made(name: str) -> torch.nn.Module:
    """The head ``name`` with its weights moved off their start (and, for Mixtape, frequent ids spread over the
    vocabulary, so that each rank's slice holds some)."""
    torch.manual_seed(0)
    head = hf_heads.build_head(name, hidden_size=D, vocab_size=V, **HEADS[name])
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    if head.uses_frequency_order:
        head.set_frequency_order(torch.randperm(V, generator=torch.Generator().manual_seed(1)))
    return head


def batch():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(N, D, generator=g)
    target = torch.randint(0, V, (N,), generator=g)
    target[::5] = -100  # ignored positions
    return hidden, target


def whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def close(what: str, got, want, tol: float = 1e-5) -> None:
    """``got`` within ``tol`` of ``want`` (times the largest of ``want``'s magnitudes, where that is past 1)."""
    got, want = whole(got), whole(want)
    if got is None or want is None:
        assert got is None and want is None, f"{what}: one gradient is None"
        return
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = max(1.0, want.double().abs().max().item()) if want.numel() else 1.0  # (a relative tolerance past 1)
    assert diff <= tol * scale, f"{what}: differs by {diff:.3g} (tolerance {tol} x {scale:.3g})"


class ShapeAudit(TorchDispatchMode):
    """Records every tensor an op makes with a dimension of V and at least N values per V-wide row set: an N x V
    (or K x N x V) activation."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and V in t.shape and t.numel() >= N * V // 2:
                self.seen.append((str(func), tuple(t.shape)))
        return out


def check_heads(mesh) -> None:
    rank = dist.get_rank()
    hidden, target = batch()
    for name in HEADS:
        one = made(name)
        split = parallelize_module(copy.deepcopy(one), mesh, hf_heads.VocabParallel())
        assert split.weight.to_local().shape[0] < V, f"{name}: the weight was not split"
        for impl in ("reference", "lean"):
            for smoothing in (0.0, 0.1):
                for reduction in ("mean", "sum"):
                    where = f"{name} impl={impl} smoothing={smoothing} {reduction} rank {rank}"
                    grads = []
                    for head in (one, split):
                        head.zero_grad()
                        h = hidden.clone().requires_grad_()
                        loss = head.loss(h, target, reduction=reduction, label_smoothing=smoothing, impl=impl)
                        loss.backward()
                        grads.append((loss.detach(), h.grad, [p.grad for p in head.parameters()]))
                    close(f"{where}: loss", grads[1][0], grads[0][0])
                    close(f"{where}: hidden's gradient", grads[1][1], grads[0][1])
                    for (pname, _), a, b in zip(one.named_parameters(), grads[1][2], grads[0][2]):
                        close(f"{where}: {pname}'s gradient", a, b)
        with torch.no_grad():
            close(f"{name}: log-probs", split(hidden), one(hidden))
            got, want = split.topk(hidden, 5), one.topk(hidden, 5)
            close(f"{name}: top-5 log-probs", got[0], want[0])
            assert torch.equal(got[1], want[1]), f"{name}: top-5 ids differ"
        t = target.clamp_min(0)
        close(f"{name}: log p(target) at T=0.7", split.token_log_probs(hidden, t, temperature=0.7),
              one.token_log_probs(hidden, t, temperature=0.7))  # fmt: skip
        audit_shapes(name, one, split, hidden, target)


def audit_shapes(name, one, split, hidden, target) -> None:
    """No rank makes an N x V tensor in the loss, its backward or the top-k; the whole head does (the control)."""
    for head, expect in ((split, False), (one, True)):
        for impl in ("reference", "lean"):
            with ShapeAudit() as audit:
                head.loss(hidden.clone().requires_grad_(), target, impl=impl, label_smoothing=0.1).backward()
                with torch.no_grad():
                    head.topk(hidden, 5)
            assert bool(audit.seen) == expect, f"{name} impl={impl} (split: {not expect}): {audit.seen[:3]}"


def check_models(mesh) -> None:
    """Each saved head model in $TP_MODELS (tests/test_tensor_parallel.py made them), loaded with ``tp_plan="auto"``:
    its head split, logits, the training loss and every gradient, greedy generation, the saved folder and the losses
    of three AdamW steps equal the model loaded in one process."""
    import tempfile

    import transformers

    folder, rank = os.environ["TP_MODELS"], dist.get_rank()
    for sub in sorted(os.listdir(folder)):
        path = os.path.join(folder, sub)
        one = transformers.AutoModelForCausalLM.from_pretrained(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split = transformers.AutoModelForCausalLM.from_pretrained(path, tp_plan="auto")
        head = hf_heads.output_head(split)
        said = [str(w.message) for w in caught if "cannot split its vocabulary" in str(w.message)]
        if head.vocab_parallel:
            assert head.weight.to_local().shape[0] < head.config.vocab_size, f"{sub}: the head's rows were not split"
            assert not said, said
        else:  # a fast head: whole on every rank, said once
            assert said == [f"{head.head_name}: this head cannot split its vocabulary over the 2 tensor-parallel "
                            f"ranks (its structure is laid out over the ids): every rank holds and computes the "
                            f"whole head"], said  # fmt: skip
        ids = torch.randint(0, one.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            close(f"{sub}: logits", split(ids).logits, one(ids).logits)
        for model in (one, split):
            model.train()
            model(ids, labels=ids).loss.backward()
        close(f"{sub}: training loss", split(ids, labels=ids).loss, one(ids, labels=ids).loss)
        assert len(list(one.parameters())) == len(list(split.parameters())), f"{sub}: parameters differ"
        for (name, a), b in zip(one.named_parameters(), split.parameters()):
            close(f"{sub}: {name}'s gradient (rank {rank})", b.grad, a.grad)
        one.eval(), split.eval()
        prompt = ids[:1, :4]
        want = one.generate(prompt, max_new_tokens=5, do_sample=False)
        assert torch.equal(split.generate(prompt, max_new_tokens=5, do_sample=False), want), f"{sub}: generate"
        saved = os.path.join(tempfile.gettempdir(), f"tp-{os.environ['MASTER_PORT']}-{sub}")
        split.save_pretrained(saved)
        dist.barrier()
        again = transformers.AutoModelForCausalLM.from_pretrained(saved)
        for (name, a), b in zip(one.state_dict().items(), again.state_dict().values()):
            close(f"{sub}: saved {name}", b, a, tol=0.0)
        train_alike(sub, one, split, ids)


def train_alike(sub: str, one, split, ids) -> None:
    """Two AdamW steps of each model: the split model's losses are the one-process model's."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (one, split)]
    for model in (one, split):
        model.train()
        model.zero_grad()
    for step in range(3):
        losses = []
        for model, optimizer in zip((one, split), optimizers):
            loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        close(f"{sub}: training loss at step {step}", losses[1], losses[0])


class Scored(torch.nn.Module):
    """A head and its loss as a module's forward (what FSDP2 wraps: it gathers the parameters before a forward)."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, hidden, target):
        return self.head.loss(hidden, target, reduction="sum", label_smoothing=0.1)


def check_mesh_2d(_) -> None:
    """4 ranks, a 2 x 2 mesh: FSDP2 over the data-parallel ranks on top of the head split over the tensor-parallel
    ones; each data-parallel rank scores half the batch. The summed loss's gradients (FSDP2 summing, not averaging)
    equal one process's on the whole batch."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    hidden, target = batch()
    half = slice(dp * N // 2, (dp + 1) * N // 2)
    for name in HEADS:
        one = Scored(made(name))
        model = copy.deepcopy(one)
        parallelize_module(model.head, mesh["tp"], hf_heads.VocabParallel())
        fully_shard(model, mesh=mesh["dp"])
        model.set_force_sum_reduction_for_comms(True)  # (gloo's average is not to be trusted: pytorch#162338)
        model.set_gradient_divide_factor(1.0)  # the ranks' gradients summed: the whole batch's summed loss
        h_one, h = hidden.clone().requires_grad_(), hidden[half].clone().requires_grad_()
        one(h_one, target).backward()
        with ShapeAudit() as audit:  # FSDP2 hands the head its tensor-parallel slice: no [N / 2, V] anywhere
            loss = model(h, target[half])
            loss.backward()
        assert not audit.seen, f"{name}: {audit.seen[:3]}"
        close(f"{name}: loss", total_over(loss.detach(), mesh["dp"]), one(hidden, target).detach())
        close(f"{name}: hidden's gradient", h.grad, h_one.grad[half])
        for (pname, a), b in zip(one.named_parameters(), model.parameters()):
            close(f"{name}: {pname}'s gradient", b.grad, a.grad)


def total_over(x: torch.Tensor, mesh) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x, group=mesh.get_group())
    return x


def main(check: str) -> None:
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        {"heads": check_heads, "models": check_models, "mesh_2d": check_mesh_2d}[check](mesh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
