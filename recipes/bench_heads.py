"""``python -m recipes.bench_heads``: an alias of ``softmax-heads bench`` (:mod:`hf_heads.cli.bench`),
kept for the commands the docs, the tables and the studies write; imported, it is that module."""

from hf_heads.cli.runner import alias

alias(__name__, "bench")
