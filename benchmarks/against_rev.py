"""Time the heads' training loss of this checkout against an earlier commit's, in one process, paired.

Run beside the old code, a refactor of the loss engine is held to the old times (within 5%). Separate
``softmax-heads bench`` runs of the same code differ by up to 18% in a ratio on the 2-core machine
(records/lean_engine_check/), so this script puts both in one process instead: ``git archive REV hf_heads`` is unpacked
under another package name (``hf_heads_rev``, its absolute imports renamed), both builds of every head start from
the same weights, and ``head.loss(hidden, target).backward()`` of the two alternate, round by round (the order
flips every round), in training mode (the memory-lean path). Prints and writes each head's median time of both and
their ratio, with both losses (equal: the same math).

    python -m benchmarks.against_rev --rev ce3bed9 --rounds 5 --out records/lean_engine_check/paired.json
    python -m benchmarks.against_rev --rev ce3bed9 --rounds 21 --vocab 10000 --heads sigsoftmax class_softmax
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def import_rev(rev: str, into: str):
    """``hf_heads`` of commit ``rev`` as the package ``hf_heads_rev`` (unpacked under ``into``)."""
    data = subprocess.run(["git", "-C", ROOT, "archive", rev, "hf_heads"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    package = os.path.join(into, "hf_heads_rev")
    os.rename(os.path.join(into, "hf_heads"), package)
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                text = re.sub(r"\bhf_heads\b(?=[.\s])", "hf_heads_rev", text)
                with open(path, "w") as f:
                    f.write(text)
    sys.path.insert(0, into)
    import hf_heads_rev

    return hf_heads_rev


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", required=True, help="the earlier commit (any git revision)")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds per head (after one warm-up round)")
    p.add_argument("--vocab", type=int, nargs="+", default=[10000, 33000])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", nargs="+", default=None, help="head names (default: every setting of HEADS)")
    p.add_argument("--out", default=None, help="json of the medians and ratios")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    import torch

    import hf_heads
    from hf_heads.cli.bench import HEADS  # the benchmark's output-layer settings

    with tempfile.TemporaryDirectory() as tmp:
        old_package = import_rev(args.rev, tmp)
        builds = {"rev": old_package.build_head, "now": hf_heads.build_head}
        out = {"rev": args.rev, "threads": torch.get_num_threads(), "results": {}}
        for vocab in args.vocab:
            g = torch.Generator().manual_seed(0)
            hidden = torch.randn(args.tokens, args.dim, generator=g).requires_grad_()
            target = torch.randint(0, vocab, (args.tokens,), generator=g)
            for label, name, options in HEADS:
                if args.heads and name not in args.heads:
                    continue
                torch.manual_seed(0)
                heads = {side: build(name, hidden_size=args.dim, vocab_size=vocab, **options).train()
                         for side, build in builds.items()}  # fmt: skip
                assert type(heads["rev"]).__module__.startswith("hf_heads_rev."), "the old build is not the old code"
                heads["rev"].load_state_dict(heads["now"].state_dict())
                samples, losses = {"rev": [], "now": []}, {}
                for r in range(args.rounds + 1):
                    for side in ("rev", "now") if r % 2 else ("now", "rev"):
                        torch.manual_seed(r)  # the same dropout / gate noise for both
                        start = time.perf_counter()
                        loss = heads[side].loss(hidden, target)
                        loss.backward()
                        if r:
                            samples[side].append(time.perf_counter() - start)
                        losses[side] = loss.item()
                        hidden.grad = None
                        heads[side].zero_grad(set_to_none=True)
                ms = {side: 1000 * statistics.median(v) for side, v in samples.items()}
                key = f"V={vocab} {label}"
                out["results"][key] = {
                    "ms_rev": ms["rev"],
                    "ms_now": ms["now"],
                    "now_over_rev": ms["now"] / ms["rev"],
                    "loss_rev": losses["rev"],
                    "loss_now": losses["now"],
                }
                print(
                    f"{key}: {args.rev} {ms['rev']:.0f} ms, now {ms['now']:.0f} ms, now / {args.rev} "
                    f"{ms['now'] / ms['rev']:.3f} (loss {losses['rev']:.6f} / {losses['now']:.6f})",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
