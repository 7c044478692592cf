"""The command that gives a stock fairseq checkpoint file a head (``hf_heads.convert_head`` does it to a loaded model,
:mod:`fairseq_plugin.conversion`)::

    python -m fairseq_plugin.convert STOCK.pt OUT.pt --output-head mixtape --head-options '{"num_gates": 4}' \
        --head-start pretrained

whose ``OUT.pt`` ``fairseq-generate`` / ``fairseq-interactive`` / ``fairseq-eval-lm`` load with ``--user-dir
fairseq_plugin``, and the hub after ``import fairseq_plugin`` (:func:`fairseq_plugin.stock.convert_checkpoint`).
"""

import argparse
import sys

from .options import HeadFlagError
from .stock import convert_checkpoint


def main(argv=None) -> int:
    """``python -m fairseq_plugin.convert STOCK.pt OUT.pt --output-head NAME [--head-options JSON] [--head-start
    pretrained]``: a plugin checkpoint of a stock one (:func:`fairseq_plugin.stock.convert_checkpoint`). A checkpoint
    or flag it cannot take: one line on stderr, exit 2."""
    import hf_heads

    p = argparse.ArgumentParser(
        prog="python -m fairseq_plugin.convert",
        description="Give a stock fairseq transformer / transformer_lm checkpoint an output head: writes a plugin "
        "checkpoint that fairseq-generate, fairseq-interactive, fairseq-eval-lm and the hub load with --user-dir "
        "fairseq_plugin.",
    )
    p.add_argument("source", help="the stock checkpoint (.pt)")
    p.add_argument("target", help="the plugin checkpoint to write (.pt)")
    p.add_argument("--output-head", required=True, help=f"one of: {', '.join(hf_heads.available_heads())}")
    p.add_argument("--head-options", default="{}", help="JSON object of the head's options, as fairseq-train's")
    p.add_argument(
        "--head-start",
        default="",
        choices=["", *hf_heads.core.START_CHOICES],
        help="'pretrained': the head starts exactly as the checkpoint's model (refused for a head without an exact "
        "start); 'nearest': as near as the head comes; empty: the head's own initialisation",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the head's other parameters' start")
    args = p.parse_args(argv)
    try:
        done = convert_checkpoint(
            args.source, args.target, args.output_head, args.head_options, args.head_start, args.seed
        )
    except (HeadFlagError, OSError) as e:
        p.error(str(e))
    print(
        f"{args.target}: {done['arch']} with the {done['head']} head {done['options']} "
        f"({'tied' if done['tied'] else 'untied'} output embedding); load it with --user-dir fairseq_plugin",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
