"""``python -m recipes.reproduce.report``: :func:`recipes.reproduce.report.page.main`."""

from hf_heads.cli.runner import run
from recipes.reproduce.report.page import main

run(main)
