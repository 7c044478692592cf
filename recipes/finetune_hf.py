"""``python -m recipes.finetune_hf``: an alias of ``softmax-heads finetune`` (:mod:`hf_heads.cli.finetune`),
kept for the commands the docs, the tables and the studies write; imported, it is that module."""

from hf_heads.cli.runner import alias

alias(__name__, "finetune")
