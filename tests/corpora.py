"""Tiny word corpora for the recipes' language-model paths (valid.txt trains, test.txt tests)."""

from __future__ import annotations

import os

import torch

#: the LSTM settings of a tiny language model (studies.common.lms.LSTM_SETTINGS) for the recipes' and studies' tests
TINY_LM = {"dim": 8, "layers": 1, "bptt": 5, "batch": 4, "lr": 1e-2, "max_epochs": 1}
#: WikiText-2 in ../shared/data beside the checkout, where it is there
WIKI = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "data", "wikitext-2"
)


def tiny_corpus(
    directory, num_words: int, valid_lines: int, seed: int, test_lines: int = 20, train_lines: int = 0
) -> None:
    """Write ``valid.txt`` / ``test.txt`` (and ``train.txt`` with ``train_lines``) of 8-word lines drawn from
    ``w0 .. w{num_words-1}`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(num_words)]
    g = torch.Generator().manual_seed(seed)
    for split, n in (("valid.txt", valid_lines), ("test.txt", test_lines), ("train.txt", train_lines)):
        if not n:
            continue
        lines = [" ".join(words[j] for j in torch.randint(0, num_words, (8,), generator=g).tolist()) for _ in range(n)]
        (directory / split).write_text("\n".join(lines) + "\n")


def text_files(tmp_path):
    """WikiText-2 from ../shared/data when present, else a small generated corpus: ``(train text, valid text)``."""
    if os.path.isdir(WIKI):
        return os.path.join(WIKI, "valid.txt"), os.path.join(WIKI, "test.txt")
    rng = torch.Generator().manual_seed(0)
    words = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "and", "then"]
    lines = [" ".join(words[i] for i in torch.randint(0, len(words), (30,), generator=rng)) for _ in range(200)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path), str(path)
