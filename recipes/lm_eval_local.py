"""``python -m recipes.lm_eval_local``: an alias of ``softmax-heads lm-eval`` (:mod:`hf_heads.cli.lm_eval`),
kept for the commands the docs, the tables and the studies write; imported, it is that module."""

from hf_heads.cli.runner import alias

alias(__name__, "lm_eval")
