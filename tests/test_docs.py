"""The README and docs/*.md: the heads table is generated from the registry, every relative link and anchor
resolves, and every ```python block runs (the blocks of one file in order, in one fresh process)."""

import ast
import json
import os
import re
import subprocess
import sys
import urllib.parse
import warnings

import pytest

from hf_heads.docs import heads_table, starts_table
from recipes.reproduce.analysis import facts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
#: the user's pages: the README and the guides
MARKDOWN = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))
#: the lab's pages: each study's page and reading, the benchmarks' page
LAB = sorted(
    os.path.relpath(os.path.join(base, name), ROOT)
    for folder in ("studies", "benchmarks", "artifacts")
    for base, _, names in os.walk(os.path.join(ROOT, folder))
    for name in names
    if name.endswith(".md")
)
GENERATED = {  # written by a command (no Python blocks): recipes.reproduce.report, each study's report
    "docs/reproduction.md",
    "studies/bottleneck_map/README.md",
    "studies/fast_softmax/README.md",
}
NOT_RUN = re.compile(r"^<!--\s*snippet:\s*not run\s*(?:—|–|-|:)\s*(?P<reason>.*\S)\s*-->\s*$")
SNIPPET_TIMEOUT_S = 240


class SnippetNotRun(UserWarning):
    """A documentation block marked ``<!-- snippet: not run — REASON -->``."""


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _fences(text):
    """``(info, first_code_line, code, lines_before)`` for every fenced block; line numbers are 1-based."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).strip(), i + 1
        j = start
        while j < len(lines) and not re.match(r"^ {0,3}" + re.escape(fence[0]) + "{%d,}\\s*$" % len(fence), lines[j]):
            j += 1
        blocks.append((info, start + 1, "\n".join(lines[start:j]), lines[:i]))
        i = j + 1
    return blocks


def _prose(text):
    """The text with fenced blocks and inline code spans blanked out (links inside code are not links)."""
    out, in_fence, fence = [], False, ""
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if in_fence:
            if (
                m
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and not line.strip()[len(m.group(1)) :]
            ):
                in_fence = False
            out.append("")
        elif m:
            in_fence, fence = True, m.group(1)
            out.append("")
        else:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def _python_blocks(rel):
    """``(first_code_line, code, skip_reason or None)`` for every ```python block of ``rel``."""
    return _python_blocks_in(_read(rel))


def _python_blocks_in(text):
    found = []
    for info, line, code, before in _fences(text):
        if info.split()[:1] != ["python"]:
            continue
        previous = next((b.strip() for b in reversed(before) if b.strip()), "")
        m = NOT_RUN.match(previous)
        found.append((line, code, m.group("reason") if m else None))
    return found


def _slug(heading):
    """GitHub's anchor of a heading: markup removed, lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline html
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(rel):
    """Every heading anchor of a markdown file (duplicates numbered -1, -2, ... as GitHub does)."""
    seen, anchors = {}, set()
    for line in _prose(_read(rel)).split("\n"):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(rel):
    """``(line, target)`` of every markdown link and image link ``[text](target)`` outside code."""
    found = []
    for number, line in enumerate(_prose(_read(rel)).split("\n"), start=1):
        for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            found.append((number, m.group(1)))
    return found


# ----------------------------------------------------------------------------- the README's generated parts
def test_readme_heads_table_is_generated_from_the_registry():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert heads_table() in readme, "README's table of heads is stale: paste `python -m hf_heads.docs`"


def test_heads_page_starts_table_is_generated_from_the_heads():
    page = open(os.path.join(ROOT, "docs", "heads.md")).read()
    assert starts_table() in page, "docs/heads.md's table of starts is stale: paste `python -m hf_heads.docs starts`"
    assert "| `mos` | exact |" in page and "| `sigsoftmax` | refused |" in page


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


def test_readme_stays_a_page():
    """The README is the way in (the two commands, what the heads are, a quick start, the results table, the links):
    at most 150 lines. Prose beyond that belongs in docs/ or in a table's hand-written reading."""
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move prose to docs/"


#: the most words a sentence of the user's pages may have (outside code blocks and tables)
MAX_WORDS = 60


def sentences(text):
    """The sentences of a page's prose: code blocks, tables and comments left out, a list item or a heading its own
    paragraph, inline code and a link's target one word each; a sentence ends at ``.``, ``!`` or ``?`` and a space."""
    prose, code = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            code = not code
        skip = code or line.strip().startswith(("```", "|", "<!--"))
        prose.append("" if skip else line)
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*(?:[*-]|\d+\.) )|\n(?=#)", "\n".join(prose)):
        flat = re.sub(r"`[^`]*`", "CODE", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", paragraph.replace("\n", " ")))
        yield from (s.strip() for s in re.split(r"(?<=[.!?])\s+", flat) if s.strip())


READINGS = sorted(f"docs/reproduction/{n}" for n in os.listdir(os.path.join(DOCS, "reproduction")) if n.endswith(".md"))


@pytest.mark.parametrize("rel", MARKDOWN + READINGS)
def test_no_sentence_of_a_users_page_is_over_60_words(rel):
    """One idea per sentence: the README, the guides, the tables' page and its readings (the lab's pages are notes)."""
    long = [s for s in sentences(_read(rel)) if len(s.split()) > MAX_WORDS]
    assert long == [], f"{rel}: {len(long)} sentences over {MAX_WORDS} words; the first: {long[:1]}"


def test_the_sentence_reader_skips_code_and_tables_and_splits_lists():
    text = "A b.\n\n```\n" + "x " * 99 + "\n```\n| " + "y " * 99 + "|\n* one `" + "z " * 99 + "` two\n* three four."
    assert [len(s.split()) for s in sentences(text)] == [2, 4, 3]


# ----------------------------------------------------------------------------- links
@pytest.mark.parametrize("rel", MARKDOWN + LAB)
def test_relative_links_and_anchors_resolve(rel):
    problems = []
    for line, target in _links(rel):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http(s), mailto, ...: not checked here
            continue
        path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(path)
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel), path)) if path else os.path.join(ROOT, rel)
        where = f"{rel}:{line}: ({target})"
        if os.path.commonpath([resolved, ROOT]) != ROOT:
            problems.append(f"{where} points outside the repository")
        elif not os.path.exists(resolved):
            problems.append(f"{where} names {os.path.relpath(resolved, ROOT)}, which does not exist")
        elif anchor and resolved.endswith(".md") and anchor not in _anchors(os.path.relpath(resolved, ROOT)):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {os.path.relpath(resolved, ROOT)}")
    assert not problems, "\n".join(problems)


def test_the_link_checker_reads_links_anchors_and_code_as_github_does():
    text = "# A `swap_head` (on GPT-2)!\n## Mixtape's scaled input\n## Mixtape's scaled input\n"
    assert [_slug(h[2:].lstrip("# ")) for h in text.splitlines()] == [
        "a-swap_head-on-gpt-2",
        "mixtapes-scaled-input",
        "mixtapes-scaled-input",
    ]
    prose = _prose('see [a](x.md) and `[b](y.md)`\n```\n[c](z.md)\n```\n![img](p.png "title")')
    assert re.findall(r"\]\(([^)\s]+)", prose) == ["x.md", "p.png"]


# ----------------------------------------------------------------------------- Python blocks
_RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    print(f"--- {block['file']}: block at line {block['line']}", flush=True)
    # padded with newlines so that tracebacks give the line numbers of the markdown file
    code = compile("\n" * (block["line"] - 1) + block["code"], block["file"], "exec")
    try:
        exec(code, namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: {block['file']}: the block at line {block['line']}", file=sys.stderr, flush=True)
        sys.exit(1)
"""

SNIPPET_FILES = [rel for rel in MARKDOWN + LAB if rel not in GENERATED and _python_blocks(rel)]


def test_the_block_reader_finds_python_blocks_and_not_run_markers():
    text = (
        "intro\n```python\na = 1\n```\n\n<!-- snippet: not run — needs a GPU -->\n\n```python\nb = 2\n```\n"
        "```bash\nmake test\n```\n````md\n```python\nnot a block\n```\n````\n"
    )
    assert _python_blocks_in(text) == [(3, "a = 1", None), (9, "b = 2", "needs a GPU")]


def test_generated_pages_hold_no_python_blocks():
    for rel in GENERATED:
        assert not _python_blocks(rel), f"{rel} is generated; its Python blocks would not be run"


@pytest.mark.parametrize("rel", SNIPPET_FILES)
def test_python_blocks_run(rel, tmp_path):
    blocks = _python_blocks(rel)
    skipped = [(line, reason) for line, _, reason in blocks if reason is not None]
    for line, reason in skipped:
        message = f"{rel}: the python block at line {line} is not run: {reason}"
        print(message)
        warnings.warn(SnippetNotRun(message), stacklevel=2)
    run = [{"file": rel, "line": line, "code": code} for line, code, reason in blocks if reason is None]
    if not run:
        return
    (tmp_path / "blocks.json").write_text(json.dumps(run))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        MPLBACKEND="Agg",
        PYTHONHASHSEED="0",
        # one thread: the blocks are tiny, and on a busy 2-core machine torch's thread pool spins for seconds
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(tmp_path / "blocks.json")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=SNIPPET_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        ran = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        last = [line for line in ran.splitlines() if line.startswith("--- ")][-1:]
        pytest.fail(f"{rel}: the Python blocks took longer than {SNIPPET_TIMEOUT_S} s; last started: {last}")
    assert proc.returncode == 0, (
        f"{rel}: a Python block failed\n--- stdout (tail)\n{proc.stdout[-3000:]}\n"
        f"--- stderr (tail)\n{proc.stderr[-6000:]}"
    )


def test_not_run_markers_are_few_and_say_why():
    marked = [
        (rel, line, reason)
        for rel in MARKDOWN
        if rel not in GENERATED
        for line, _, reason in _python_blocks(rel)
        if reason is not None
    ]
    assert len(marked) <= 3, f"too many Python blocks are not run: {marked}"
    for rel in MARKDOWN:
        text = _read(rel).split("\n")
        for number, line in enumerate(text, start=1):
            if "snippet:" in line and line.strip().startswith("<!--"):
                assert NOT_RUN.match(line.strip()), f"{rel}:{number}: write `<!-- snippet: not run — REASON -->`"


# ----------------------------------------------------------------------------- the reproduction page
REPRODUCTION, RECORDS = os.path.join(DOCS, "reproduction"), os.path.join(ROOT, "records", "reproduction")


def _names(suffix, folder=REPRODUCTION):
    return sorted(name[: -len(suffix)] for name in os.listdir(folder) if name.endswith(suffix))


def test_the_reproduction_page_is_what_its_generator_writes_from_the_committed_json(tmp_path):
    """docs/reproduction.md (every table, plot and full-size plan) is what `python -m recipes.reproduce.report
    --no-collect` writes from the committed json and readings: rerun it after changing either."""
    import shutil

    from recipes.reproduce.report import page

    (tmp_path / "reproduction").mkdir()
    for folder, suffix in ((RECORDS, ".json"), (REPRODUCTION, "-reading.md")):
        for name in os.listdir(folder):
            if name.endswith(suffix):
                shutil.copy(os.path.join(folder, name), tmp_path / "reproduction" / name)
    assert page.build_report(str(tmp_path), str(tmp_path / "reproduction")) == _read("docs/reproduction.md")


def test_the_reproduction_pages_derived_numbers_are_what_its_generator_computes():
    """records/reproduction/NAME-numbers.json, the derived numbers the hand-written readings cite (paired means,
    intervals, Holm p, detectable differences, ratios, the papers' numbers), equal what the report computes from the
    committed json; one per reading."""

    derived = facts.all_numbers(RECORDS)
    assert set(_names("-numbers.json", RECORDS)) == set(derived) == set(_names("-reading.md"))
    for name, values in derived.items():
        with open(os.path.join(RECORDS, f"{name}-numbers.json")) as f:
            assert json.load(f) == values, f"{name}-numbers.json: run python -m recipes.reproduce.report --no-collect"


def test_every_number_of_a_reproduction_reading_is_a_json_value_as_the_page_writes_it():
    """Each decimal, percentage and number with a unit of docs/reproduction/NAME-reading.md is a value of NAME.json
    or NAME-numbers.json (records/reproduction/) as one of the page's formatters writes it, or one of at most ten
    listed exceptions, each used; every table's json has its reading."""
    from recipes.reproduce.report import page

    names = _names("-reading.md")
    assert set(_names(".json", RECORDS)) - {"compute-set-aside"} <= set(names) | {n + "-numbers" for n in names}
    assert not _names(".json")  # docs/ holds the pages, their plots and readings; the json is under records/
    assert {name: page.unmatched(DOCS, name) for name in names} == {name: [] for name in names}
    assert sum(len(numbers) for numbers in page.EXCEPTIONS.values()) <= 10
    for name, numbers in page.EXCEPTIONS.items():
        text = _read(f"docs/reproduction/{name}-reading.md")
        assert all(number in text for number in numbers), f"{name}: an exception no longer in its reading"


def test_the_reproduction_page_and_each_of_its_sections_open_with_a_table():
    """The page opens with its overview table after the title and one short line, each section with its table; no
    line of prose is longer than 400 characters."""
    lines = _read("docs/reproduction.md").split("\n")
    assert lines[0].startswith("# ") and len(lines[2]) <= 120 and lines[4].startswith("| table |")
    prose = _prose("\n".join(lines)).split("\n")  # a code block's `# ...` lines are no headings
    for i, line in enumerate(prose[1:], start=1):
        if line.startswith("#"):
            first = next(x for x in lines[i + 1 :] if x.strip())
            assert first.startswith("|") or first == "_no finished cells yet_", f"line {i + 1}: {line}"
    assert max(len(line) for line in prose if not line.startswith("|")) <= 400
    # a wrapped line of a reading or a note starts no list item, quote or heading underline
    assert not [line for line in prose if re.match(r"([-+*=>]|\d+[.)])(\s|$)", line)]


#: the code that writes the results pages: tables, plots, commands and the pasted readings (what they render, the
#: statistics, the collection and the derived numbers, lives in each page's analysis:
#: studies/bottleneck_map/analysis.py, studies/fast_softmax/fast_analysis.py, recipes/reproduce/analysis/)
PAGE_WRITERS = (
    "studies/bottleneck_map/page.py",
    "studies/bottleneck_map/report.py",
    "studies/fast_softmax/fast_report.py",
    "recipes/reproduce/report",
)


def test_the_code_that_writes_the_pages_stays_small_and_writes_no_sentences_from_numbers():
    """About 1.5k lines in all, and no f-string in it is prose long enough to be a generated sentence about the
    numbers (a caption, a header and a note are short; a reading is written by hand, beside its page)."""
    files = []
    for path in (os.path.join(ROOT, p) for p in PAGE_WRITERS):
        files += (
            [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".py")]
            if os.path.isdir(path)
            else [path]
        )
    lines = sum(len(open(f).read().splitlines()) for f in files)
    assert lines <= 1560, f"the page writers are {lines} lines (at most about 1.5k)"
    for f in files:
        for node in ast.walk(ast.parse(open(f).read())):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                assert len(text) <= 200 or text.count(". ") < 2, f"{f}: an f-string of {len(text)} characters"
