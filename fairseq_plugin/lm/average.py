"""``python -m fairseq_plugin.average CHECKPOINT OUT``: the checkpoint with NT-ASGD's averaged weights as its
model weights (what AWD-LSTM evaluates and keeps); see :func:`fairseq_plugin.lm.ntasgd.average_checkpoint`."""

import argparse
import sys

from fairseq_plugin.lm.ntasgd import average_checkpoint


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m fairseq_plugin.average", description=average_checkpoint.__doc__)
    p.add_argument("checkpoint", help="a checkpoint trained with --optimizer ntasgd")
    p.add_argument("out", help="where to write the averaged checkpoint")
    p.add_argument(
        "--data",
        help="the binarized data directory (default: the one the checkpoint was trained on, as "
        "stored, or relative to the checkpoint's folder or a parent of it)",
    )
    args = p.parse_args(argv)
    try:
        n = average_checkpoint(args.checkpoint, args.out, args.data)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    print(f"{args.out}: {n} parameters averaged", file=sys.stderr)


if __name__ == "__main__":
    main()
