from hf_heads.cli.runner import run

from .study import main

run(main)
