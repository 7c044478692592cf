"""``python -m recipes.upgrade_head``: an alias of ``softmax-heads upgrade`` (:mod:`hf_heads.cli.upgrade`),
kept for the commands the docs, the tables and the studies write; imported, it is that module."""

from hf_heads.cli.runner import alias

alias(__name__, "upgrade")
