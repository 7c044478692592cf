"""``python -m fairseq_plugin.average CHECKPOINT OUT``: the checkpoint with NT-ASGD's averaged weights as its
model weights (what AWD-LSTM evaluates and keeps); see :func:`fairseq_plugin.lm.ntasgd.average_checkpoint`."""
import argparse
import sys

from fairseq_plugin.lm.ntasgd import average_checkpoint


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m fairseq_plugin.average", description=average_checkpoint.__doc__)
    p.add_argument("checkpoint", help="a checkpoint trained with --optimizer ntasgd")
    p.add_argument("out", help="where to write the averaged checkpoint")
    args = p.parse_args(argv)
    n = average_checkpoint(args.checkpoint, args.out)
    print(f"{args.out}: {n} parameters averaged", file=sys.stderr)


if __name__ == "__main__":
    main()
