"""Data for the reproduced tables: checks of ``--data``, joint BPE (sentencepiece), fairseq binarisation.

Mini translation tables use the shared Multi30k files (``DATA/multi30k/{train,val,test_2016_flickr,
test_2017_flickr}.{en,de,fr}.gz``); the full-size ones the WMT'14 data, which only a machine with internet can
fetch (:func:`require_internet` stops at once otherwise, naming what it needs).

Run as a script it prepares one table's data (what ``commands.sh`` records, so a user can redo it by hand)::

    python -m recipes.reproduce.data.prepare multi30k --data ../shared/data --src en --tgt de --bpe-size 4000 --out DIR
    python -m recipes.reproduce.data.prepare lm --data ../shared/data --corpus ptb --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import sys
from typing import Any, Dict, List, Sequence
from recipes.common import data as data_paths

#: Multi30k splits: our name -> the file stem in DATA/multi30k
MULTI30K_SPLITS = {
    "train": "train",
    "valid": "val",
    "test_2016_flickr": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr",
}
MULTI30K_TESTS = ["test_2016_flickr", "test_2017_flickr"]


class DataError(SystemExit):
    """A missing or unusable data directory: the message names the path expected and what is there."""


def missing_files_error(directory: str, expected: Sequence[str], what: str) -> DataError:
    """The error for ``expected`` files not found in ``directory``, listing what the directory holds."""
    if os.path.isdir(directory):
        present = sorted(os.listdir(directory))
        there = ", ".join(present[:20]) + (" ..." if len(present) > 20 else "") if present else "nothing"
        found = f"{directory} holds: {there}"
    else:
        found = f"{directory} does not exist"
    missing = [f for f in expected if not os.path.isfile(os.path.join(directory, f))]
    return DataError(
        f"{what}: expected {', '.join(missing)} in {directory}; {found}. Pass --data DIR, the "
        f"directory that holds multi30k/ (default ../shared/data, beside the project)"
    )


def multi30k_files(data: str, langs: Sequence[str]) -> Dict[str, Dict[str, str]]:
    """``{split: {lang: path}}`` of the Multi30k files under ``data``; a clear stop when any is missing."""
    directory = os.path.join(data, "multi30k")
    expected = [f"{stem}.{lang}.gz" for stem in MULTI30K_SPLITS.values() for lang in langs]
    if not all(os.path.isfile(os.path.join(directory, f)) for f in expected):
        raise missing_files_error(directory, expected, "Multi30k")
    return {
        split: {lang: os.path.join(directory, f"{stem}.{lang}.gz") for lang in langs}
        for split, stem in MULTI30K_SPLITS.items()
    }


def read_lines(path: str, limit: int = 0) -> List[str]:
    """Stripped lines of a text file (``.gz`` or plain), the first ``limit`` when ``limit`` > 0."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n").strip() for line in f]
    return lines[:limit] if limit > 0 else lines


def write_lines(path: str, lines: Sequence[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise SystemExit(
            "the reproduction recipes learn their BPE with sentencepiece: pip install -e .[reproduce] "
            "(or `make install`)"
        ) from None
    return sentencepiece


def learn_bpe(texts: Sequence[str], prefix: str, vocab_size: int) -> str:
    """Learn a joint BPE model (sentencepiece, ``model_type=bpe``) on ``texts``; return the model path.

    Deterministic: every sentence is used, in order, on one thread."""
    spm = _sentencepiece()
    corpus = prefix + ".corpus.txt"
    write_lines(corpus, texts)
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    os.remove(corpus)
    return prefix + ".model"


def encode(model: str, lines: Sequence[str]) -> List[str]:
    """BPE pieces of each line, space-separated (fairseq's input; ``--post-process sentencepiece`` undoes it)."""
    sp = _sentencepiece().SentencePieceProcessor(model_file=model)
    return [" ".join(pieces) for pieces in sp.encode(list(lines), out_type=str)]


def prepare_multi30k(data: str, src: str, tgt: str, bpe_size: int, out: str, limit: int = 0) -> Dict[str, str]:
    """Raw references and BPE-encoded text of every split for ``src -> tgt``, in ``out``.

    Writes ``out/raw/SPLIT.LANG`` (the detokenized originals: references for sacrebleu), ``out/bpe/SPLIT.LANG``
    and ``out/spm.model`` (joint BPE of the training text of both languages). ``limit`` keeps the first
    lines of every split (tests). Returns ``{"bpe": dir, "raw": dir, "model": path}``."""
    files = multi30k_files(data, [src, tgt])
    raw_dir, bpe_dir = os.path.join(out, "raw"), os.path.join(out, "bpe")
    texts = {
        (split, lang): read_lines(path, limit) for split, by_lang in files.items() for lang, path in by_lang.items()
    }
    for (split, lang), lines in texts.items():
        write_lines(os.path.join(raw_dir, f"{split}.{lang}"), lines)
    model = learn_bpe(texts["train", src] + texts["train", tgt], os.path.join(out, "spm"), bpe_size)
    for (split, lang), lines in texts.items():
        write_lines(os.path.join(bpe_dir, f"{split}.{lang}"), encode(model, lines))
    return {"bpe": bpe_dir, "raw": raw_dir, "model": model}


#: the language-model corpora here: their directory under --data, and the files the mini tables read
LM_CORPORA = {"ptb": "ptb", "wikitext-2": "wikitext-2"}


def prepare_lm(data: str, corpus: str, out: str, limit: int = 0, eval_limit: int = 0) -> Dict[str, Any]:
    """A language-modelling corpus from the standard splits under ``DATA/CORPUS``: ``train.txt`` trains (its first
    ``limit`` lines when ``limit`` > 0: a stated prefix), ``valid.txt`` validates (the checkpoint choice, the
    stopping rule, the NT-ASGD trigger), ``test.txt`` tests (their first ``eval_limit`` lines when > 0: tests).
    Every line is kept as the papers' code reads it (an empty line is one ``<eos>``). Writes
    ``out/raw/{train,valid,test}.txt``, ``out/tokens.json`` (tokens of each split with one ``<eos>`` a line, as the
    papers count, and of the whole train split) and ``out/dict.txt``: the words of the *whole* train split (the
    papers' vocabulary, also when a prefix trains, plus any valid / test word not in it), most frequent first
    (frequency order for Mixtape's gate sharing). Returns the paths written."""
    directory = os.path.join(data, LM_CORPORA[corpus])
    expected = ["train.txt", "valid.txt", "test.txt"]
    if not all(os.path.isfile(os.path.join(directory, f)) for f in expected):
        raise missing_files_error(directory, expected, corpus)
    whole = read_lines(os.path.join(directory, "train.txt"))
    splits = {
        "train": whole[:limit] if limit > 0 else whole,
        "valid": read_lines(os.path.join(directory, "valid.txt"), eval_limit),
        "test": read_lines(os.path.join(directory, "test.txt"), eval_limit),
    }
    raw = os.path.join(out, "raw")
    for split, text in splits.items():
        write_lines(os.path.join(raw, f"{split}.txt"), text)
    counts: Dict[str, int] = {}
    for line in whole:
        for w in line.split():
            counts[w] = counts.get(w, 0) + 1
    words = set(counts) | {w for text in splits.values() for line in text for w in line.split()}
    ordered = sorted(words, key=lambda w: (-counts.get(w, 0), w))
    write_lines(os.path.join(out, "dict.txt"), [f"{w} {counts.get(w, 0)}" for w in ordered if w != "<unk>"])

    def tokens(text):  # with one <eos> a line, as the papers count
        return sum(len(line.split()) + 1 for line in text)

    counts_path = os.path.join(out, "tokens.json")
    with open(counts_path, "w") as f:
        json.dump(
            {
                **{split: tokens(text) for split, text in splits.items()},
                "train_lines": len(splits["train"]),
                "train_lines_of": len(whole),
                "train_tokens_of": tokens(whole),
            },
            f,
            indent=1,
        )
    return {"raw": raw, "dict": os.path.join(out, "dict.txt"), "tokens": counts_path}


def download(url: str, dst_dir: str) -> str:
    """``url`` saved in ``dst_dir`` under its own name (kept: a rerun does not download it again); returns the path."""
    import urllib.request

    os.makedirs(dst_dir, exist_ok=True)
    path = os.path.join(dst_dir, url.rsplit("/", 1)[1])
    if not os.path.exists(path):
        print(f"downloading {url}", file=sys.stderr)
        urllib.request.urlretrieve(url, path + ".part")
        os.replace(path + ".part", path)
    return path


def extract(archive: str, dst_dir: str) -> None:
    """Unpack a .tar(.gz) / .tgz / .zip archive into ``dst_dir``."""
    import tarfile
    import zipfile

    if archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dst_dir)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dst_dir)


def find_file(root: str, name: str) -> str:
    """The path of the file ``name`` (or ``name.gz``) somewhere under ``root``; a stop when there is none."""
    for base, _dirs, files in os.walk(root):
        for f in files:
            if f == name or f == name + ".gz":
                return os.path.join(base, f)
    raise SystemExit(f"{name} not found under {root} after extraction")


def require_internet(what: str, urls: Sequence[str], timeout: float = 5.0) -> None:
    """Stop at once, naming ``what`` and the ``urls`` it needs, when the first URL's host is unreachable."""
    host = urls[0].split("/")[2]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as e:
        raise SystemExit(
            f"{what} needs the internet ({host} unreachable: {e}). On a machine with internet it "
            f"downloads:\n  " + "\n  ".join(urls)
        ) from None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.reproduce.data.prepare", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("multi30k", help="Multi30k task 1 from --data, joint BPE, raw references")
    data_paths.add_data_option(m)
    m.add_argument("--src", required=True, choices=["en", "de", "fr"])
    m.add_argument("--tgt", required=True, choices=["en", "de", "fr"])
    m.add_argument("--bpe-size", type=int, default=4000)
    m.add_argument("--limit", type=int, default=0, help="first N lines of every split (0: all)")
    m.add_argument("--out", required=True)
    lm = sub.add_parser("lm", help="an LM corpus from the standard train/valid/test splits (see prepare_lm)")
    data_paths.add_data_option(lm)
    lm.add_argument("--corpus", required=True, choices=sorted(LM_CORPORA))
    lm.add_argument("--limit", type=int, default=0, help="first N lines of train.txt (0: all)")
    lm.add_argument("--eval-limit", type=int, default=0, help="first N lines of valid.txt and test.txt (0: all)")
    lm.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.what == "lm":
        prepare_lm(args.data, args.corpus, args.out, args.limit, args.eval_limit)
        print(f"wrote {args.out}/raw, {args.out}/dict.txt, {args.out}/tokens.json", file=sys.stderr)
    elif args.what == "multi30k":
        prepare_multi30k(args.data, args.src, args.tgt, args.bpe_size, args.out, args.limit)
        print(f"wrote {args.out}/bpe, {args.out}/raw, {args.out}/spm.model", file=sys.stderr)


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
