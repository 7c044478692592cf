"""``softmax-heads COMMAND [OPTION...]``: the commands of softmax-heads, installed as a console script by
``pip install softmax-heads[hf]`` (``python -m hf_heads.cli`` is the same). ``softmax-heads COMMAND --help`` lists a
command's options.

    softmax-heads finetune --model gpt2 --head mos --train-file train.txt --valid-file valid.txt
    softmax-heads upgrade --model HuggingFaceTB/SmolLM2-135M --head mos --train-file ... --valid-file ...
    softmax-heads lm-eval --model out/finetune --text test.txt
    softmax-heads serve-check --model DIR --url http://127.0.0.1:8000/v1
    softmax-heads bench --device cuda
    fairseq-train DATA --user-dir "$(softmax-heads fairseq-user-dir)" --arch head_transformer_lm ...
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Optional, Sequence

#: command -> (module of hf_heads.cli, what it does); ``fairseq-user-dir`` is answered here
COMMANDS = {
    "finetune": ("finetune", "fine-tune a causal LM (a Hub id or a local folder) with an output head swapped in"),
    "upgrade": ("upgrade", "train a new head on a frozen pretrained LM's hidden states, then score it"),
    "lm-eval": ("lm_eval", "perplexity per token and per word of a saved model on a text"),
    "serve-check": ("serve_check", "compare a running vLLM server's greedy log-probs with transformers' on its model"),
    "bench": ("bench", "the heads' training cost against plain softmax (output layer and whole model; CPU or GPU)"),
    "fairseq-user-dir": (None, "print the folder to pass to fairseq's --user-dir (the installed fairseq_plugin)"),
}
PROG = "softmax-heads"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [OPTION...]   ({PROG} COMMAND --help for its options)", "", "commands:"]
    return "\n".join(lines + [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()])


def fairseq_user_dir() -> str:
    """The installed ``fairseq_plugin`` package's folder (located, not imported: importing it loads fairseq)."""
    spec = importlib.util.find_spec("fairseq_plugin")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PROG} fairseq-user-dir: the fairseq_plugin package is not installed")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``COMMAND`` with the rest of ``argv`` (``sys.argv[1:]`` by default); exits as the command does."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"{PROG}: error: unknown command {name!r}; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if name == "fairseq-user-dir":
        print(fairseq_user_dir())
        return 0
    from .runner import run

    module = importlib.import_module(f"hf_heads.cli.{COMMANDS[name][0]}")
    sys.argv = [f"{PROG} {name}", *rest]  # argparse's usage lines and the runner's messages name the command
    run(module.main, rest, program_name=f"{PROG} {name}")
    return 0  # (run exits)


def console() -> None:
    """The ``softmax-heads`` console script: :func:`main`, in a process whose idle OpenMP threads sleep
    (``OMP_WAIT_POLICY=PASSIVE``, read when torch loads: where it is unset, the command starts again with it set, as
    every ``python -m recipes.X`` does before torch loads; see :mod:`hf_heads.cli.process`)."""
    from .process import WAIT_POLICY, DEFAULT

    script = sys.argv[0] if sys.argv else ""
    again = WAIT_POLICY not in os.environ and os.name == "posix" and os.path.isfile(script)
    if again and sys.argv[1:2] != ["fairseq-user-dir"]:
        os.environ[WAIT_POLICY] = DEFAULT
        # the script itself again (not python -m, which would put the working folder first on sys.path)
        os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])
    raise SystemExit(main())


if __name__ == "__main__":
    raise SystemExit(main())
