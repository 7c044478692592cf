"""``python -m recipes.reproduce.report``: :func:`recipes.reproduce.report.page.main`."""

from recipes.common.cli import run
from recipes.reproduce.report.page import main

run(main)
