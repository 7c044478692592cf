"""The README's heads table is the one generated from the registry."""
import os

from hf_heads.docs import heads_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_heads_table_is_generated_from_the_registry():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert heads_table() in readme, "README's table of heads is stale: paste `python -m hf_heads.docs`"


def test_readme_starts_with_the_two_commands_and_ci_runs_make_test():
    readme = open(os.path.join(ROOT, "README.md")).read()
    head = readme[:1500]
    assert "make demo" in head and "make test" in head
    assert "make test" in open(os.path.join(ROOT, ".ci", "run")).read()


def test_readme_says_each_thing_once_and_calls_built_heads_built():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert readme.count(heads_table()) == 1
    shared_line = heads_table().splitlines()[-1]
    assert readme.count(shared_line) == 1, "the shared-options sentence is printed more than once"
    assert "roadmap" not in readme[:1500], "the opening paragraph calls built heads a roadmap"
