"""Where the recipes read the shared data (recipes/common/data.py): one root, one default, moved by one variable."""

from __future__ import annotations

import argparse
import os

from recipes.common import data


def test_the_default_root_is_the_shared_data_beside_the_checkout_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(data.ENV, raising=False)
    beside = os.path.join(os.path.dirname(data.CHECKOUT), "shared", "data")
    monkeypatch.chdir(data.CHECKOUT)
    assert data.default_root() == os.path.join("..", "shared", "data")  # as the docs' commands write it
    monkeypatch.chdir(tmp_path)
    assert os.path.abspath(data.default_root()) == os.path.abspath(beside)
    assert data.corpus("ptb", "/d") == os.path.join("/d", "ptb")


def test_the_environment_moves_every_commands_default(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV, str(tmp_path))
    assert data.corpus("wikitext-2") == os.path.join(str(tmp_path), "wikitext-2")
    p = argparse.ArgumentParser()
    data.add_data_option(p)
    assert p.parse_args([]).data == str(tmp_path) and p.parse_args(["--data", "x"]).data == "x"
