from hf_heads.cli.runner import run

from .command import main

run(main)
