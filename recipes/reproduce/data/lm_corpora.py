"""Full-size language-modelling data for the perplexity tables (``lm-ptb``, ``lm-wt2``, ``lm-1b``), prepared once on
a machine with internet (then copy ``DATA/CORPUS-full`` to the cluster)::

    python -m recipes.reproduce.data.lm_corpora --corpus ptb --data ../shared/data          # Mikolov's PTB (10k)
    python -m recipes.reproduce.data.lm_corpora --corpus wikitext-2 --data ../shared/data   # WikiText-2 v1 (33,278)
    python -m recipes.reproduce.data.lm_corpora --corpus lm1b --data ../shared/data         # One Billion Word (100k)

PTB and WikiText-2 are the files AWD-LSTM / MoS read (``getdata.sh``): already tokenised, rare words already
``<unk>``, every word of them in the vocabulary. One Billion Word as the Mixtape paper (following MoS): the
benchmark's tokenised text lower-cased, the 100k most frequent tokens as the vocabulary (the rest ``<unk>``);
training = the 99 training shards, valid = held-out shard 1, test = held-out shard 0 (the benchmark's test set).
Each corpus ends binarised by ``fairseq-preprocess --only-source`` in ``DATA/CORPUS-full/bin``, its dictionary
in frequency order (what Mixtape's gate sharing needs). Offline it stops at once, naming the URLs it needs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Dict

from recipes.reproduce.data import prepare as data_prep
from recipes.reproduce.engine.runner import tool
from recipes.common import data as data_paths

CORPORA: Dict[str, Dict] = {
    "ptb": {
        "url": "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
        "files": {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"},
        "vocab": 10000,
    },
    "wikitext-2": {
        "url": "https://wikitext.smerity.com/wikitext-2-v1.zip",
        "files": {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"},
        "vocab": 33278,
    },
    "lm1b": {
        "url": "http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz",
        "files": {
            "train": "news.en-000??-of-00100",
            "valid": "news.en.heldout-00001-of-00050",
            "test": "news.en.heldout-00000-of-00050",
        },
        "vocab": 100000,
        "lowercase": True,
    },
}


def full_dir(data: str, corpus: str) -> str:
    """Where a corpus's full-size data lives: ``DATA/CORPUS-full`` (``bin/`` holds what fairseq reads)."""
    return os.path.join(data, f"{corpus}-full")


def prepare(corpus: str, data: str) -> str:
    """Download, (lower-case,) and binarise one corpus into :func:`full_dir`; returns the directory."""
    spec = CORPORA[corpus]
    data_prep.require_internet(f"the full {corpus} data", [spec["url"]])
    out = full_dir(data, corpus)
    downloads, raw = os.path.join(out, "downloads"), os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    archive = data_prep.download(spec["url"], downloads)
    data_prep.extract(archive, downloads)
    for split, pattern in spec["files"].items():
        paths = sorted(glob.glob(os.path.join(downloads, "**", pattern), recursive=True))
        if not paths:
            raise SystemExit(f"{pattern} not found under {downloads} after extracting {archive}")
        with open(os.path.join(raw, f"{split}.txt"), "w", encoding="utf-8") as dst:
            for path in paths:
                with open(path, encoding="utf-8") as src:
                    for line in src:
                        dst.write(line.lower() if spec.get("lowercase") else line)
    vocab = ["--nwordssrc", str(spec["vocab"])] if corpus == "lm1b" else []
    subprocess.run(
        [
            tool("fairseq-preprocess"),
            "--only-source",
            *vocab,
            "--trainpref",
            os.path.join(raw, "train.txt"),
            "--validpref",
            os.path.join(raw, "valid.txt"),
            "--testpref",
            os.path.join(raw, "test.txt"),
            "--destdir",
            os.path.join(out, "bin"),
            "--workers",
            str(os.cpu_count() or 1),
        ],
        check=True,
    )
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.reproduce.data.lm_corpora", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, choices=sorted(CORPORA))
    data_paths.add_data_option(p)
    args = p.parse_args(argv)
    print(json.dumps({"prepared": prepare(args.corpus, args.data)}), file=sys.stdout)


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
