"""The full-size translation tables' WMT data, prepared on a machine with internet (the ``--dry-run`` plan that
trains on it is :func:`recipes.reproduce.tables.translation.full_plan`).

Data, once, on a machine with internet (then copy ``DATA/wmt16-en-de`` / ``DATA/wmt14-en-fr`` to the cluster)::

    python -m recipes.reproduce.data.wmt --pair en-de --data ../shared/data     # WMT'16 En-De (4.5M pairs), 32k BPE
    python -m recipes.reproduce.data.wmt --pair en-fr --data ../shared/data     # WMT'14 En-Fr (36M pairs), 32k BPE

It downloads the training corpora (the lists of fairseq's ``prepare-wmt14en2*.sh`` / the WMT'16 En-De data
of fairseq's transformer-big recipes), newstest2013 (valid) and newstest2014 (test, ``wmt14/full``) through
sacrebleu, drops pairs longer than 250 words or with a length ratio above 1.5 (as fairseq's ``clean-corpus-n``),
learns a joint sentencepiece BPE of 32k (the Mixtape paper's Table 2 and section 4.2: "a vocabulary size of 32K" for
both pairs; fairseq's scripts use 40k for En-Fr, Moses tokenisation + subword-nmt,
we keep the raw text so the hypotheses come out detokenized for sacrebleu) and binarises with
``fairseq-preprocess``. Offline it stops at once, naming the URLs it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from typing import Any, Dict

from recipes.reproduce.data import prepare as data_prep
from recipes.reproduce.engine.runner import tool
from recipes.common import data as data_paths

CORPORA = {
    "en-de": {
        "dir": "wmt16-en-de",
        "bpe": 32000,
        "urls": [
            "http://www.statmt.org/europarl/v7/de-en.tgz",
            "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
            "http://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz",
        ],
        "files": ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v11.de-en"],
    },
    "en-fr": {
        "dir": "wmt14-en-fr",
        "bpe": 32000,
        "urls": [
            "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
            "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
            "http://www.statmt.org/wmt13/training-parallel-un.tgz",
            "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
            "http://www.statmt.org/wmt10/training-giga-fren.tar",
        ],
        "files": [
            "europarl-v7.fr-en",
            "commoncrawl.fr-en",
            "undoc.2000.fr-en",
            "news-commentary-v9.fr-en",
            "giga-fren.release2.fixed",
        ],
    },
}
TESTSET = "newstest2014"


def data_dir(args, table) -> str:
    return os.path.join(args.data, CORPORA[f"{table.src}-{table.tgt}"]["dir"])


def prepared_full(table, args) -> Dict[str, Any]:
    """The prepared WMT data of a table, or a stop naming the command that prepares it."""
    directory = data_dir(args, table)
    bin_dir = os.path.join(directory, "bin")
    if not os.path.isfile(os.path.join(bin_dir, f"dict.{table.tgt}.txt")):
        raise data_prep.missing_files_error(
            bin_dir,
            [f"dict.{table.src}.txt", f"dict.{table.tgt}.txt"],
            f"{table.name} --scale full (prepare the data first, on a machine with internet: "
            f"python -m recipes.reproduce.data.wmt --pair {table.src}-{table.tgt} --data {args.data})",
        )
    return {"bin": bin_dir, "raw": os.path.join(directory, "raw"), "subsets": {TESTSET: "test"}}


def prepare(pair: str, data: str, max_words: int = 250, ratio: float = 1.5) -> str:
    """Download, clean, BPE and binarise one WMT pair into ``data/<dir>``; return the directory."""
    src, tgt = pair.split("-")
    spec = CORPORA[pair]
    data_prep.require_internet(f"WMT {pair} data", spec["urls"])
    import sacrebleu  # noqa: F401  (the test sets come through its command line)

    out = os.path.join(data, spec["dir"])
    raw, bpe, downloads = (os.path.join(out, d) for d in ("raw", "bpe", "downloads"))
    for d in (raw, bpe, downloads):
        os.makedirs(d, exist_ok=True)
    for url in spec["urls"]:
        data_prep.extract(data_prep.download(url, downloads), downloads)
    train = {src: [], tgt: []}
    for stem in spec["files"]:
        a = data_prep.read_lines(data_prep.find_file(downloads, f"{stem}.{src}"))
        b = data_prep.read_lines(data_prep.find_file(downloads, f"{stem}.{tgt}"))
        for x, y in zip(a, b):
            nx, ny = len(x.split()), len(y.split())
            if 0 < nx <= max_words and 0 < ny <= max_words and max(nx, ny) <= ratio * min(nx, ny):
                train[src].append(x)
                train[tgt].append(y)
    for lang in (src, tgt):
        data_prep.write_lines(os.path.join(raw, f"train.{lang}"), train[lang])
    for split, test in (("valid", "wmt13"), (TESTSET, "wmt14/full")):
        for lang, side in ((src, "src"), (tgt, "ref")):
            text = subprocess.run(
                ["sacrebleu", "-t", test, "-l", pair, "--echo", side], capture_output=True, text=True, check=True
            ).stdout.splitlines()
            data_prep.write_lines(os.path.join(raw, f"{split}.{lang}"), text)
    sample = train[src][:: max(1, len(train[src]) // 2_000_000)] + train[tgt][:: max(1, len(train[tgt]) // 2_000_000)]
    model = data_prep.learn_bpe(sample, os.path.join(out, "spm"), spec["bpe"])
    for split in ("train", "valid", TESTSET):
        for lang in (src, tgt):
            data_prep.write_lines(
                os.path.join(bpe, f"{split}.{lang}"),
                data_prep.encode(model, data_prep.read_lines(os.path.join(raw, f"{split}.{lang}"))),
            )
    subprocess.run(
        [
            tool("fairseq-preprocess"),
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            os.path.join(bpe, "train"),
            "--validpref",
            os.path.join(bpe, "valid"),
            "--testpref",
            os.path.join(bpe, TESTSET),
            "--destdir",
            os.path.join(out, "bin"),
            "--joined-dictionary",
            "--workers",
            str(os.cpu_count() or 1),
        ],
        check=True,
    )
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.reproduce.data.wmt", description=__doc__.split("\n")[0])
    p.add_argument("--pair", required=True, choices=sorted(CORPORA))
    data_paths.add_data_option(p)
    args = p.parse_args(argv)
    out = prepare(args.pair, args.data)
    print(json.dumps({"prepared": out}))


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
