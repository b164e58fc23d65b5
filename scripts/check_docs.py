#!/usr/bin/env python3
"""Checks that ferry's Markdown renders as written and cites only what the repository holds.

Each of README.md, python/README.md and every .md under docs/ is parsed with a CommonMark parser
(markdown-it-py, Debian's python3-markdown-it) and fails on:
  - a fenced code block that is never closed (it runs to the end of the file),
  - a fence whose info string is more than one word (```sh some prose): CommonMark makes such a line an
    opening fence, or, when it holds a backtick, no fence at all, so the block before it never closes,
  - a code block holding a line that looks like a fence or a Markdown heading: the sign that a closing
    fence was missed and the block swallowed what follows,
  - a relative link or image whose file is not in the repository,
  - a path cited in prose or in `code` that names a file of the repository's tree (docs/..., scripts/...,
    a bare NAME.md) but does not exist: a reference to a file the repository does not hold.
And docs/ARCHITECTURE.md's table of targets has a row for every target of scripts/check_layers.py's LAYERS.

Usage: check_docs.py [FILE.md ...]   (default: the files above; exit status 1 on any finding)
       check_docs.py --self-test         (each kind of breakage above is found, and a sound file passes)
"""
import os
import re
import sys

try:
    from markdown_it import MarkdownIt
except ImportError:  # scripts/setup.sh installs it
    sys.exit("check_docs.py: needs markdown-it-py (Debian: apt-get install python3-markdown-it)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Top-level folders whose paths, cited in prose or code spans, must exist. build/ and output files of
# commands (traces/, out/) are what a run makes, so they are not checked.
TREE = ("docs/", "scripts/", "src/", "include/", "tests/", "examples/", "tools/", "python/", "cmake/", ".ci/")
# Code blocks in these languages use '#' for comments, so a '# ...' line there is no swallowed heading.
HASH_COMMENTS = {"sh", "bash", "shell", "console", "python", "py", "pycon", "cmake", "text", "toml", "yaml",
                 "ini", "make", "dockerfile", "conf"}
FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING_LINE = re.compile(r"^ {0,3}#{1,6} \S")
BARE_MD = re.compile(r"(?<![\w/.-])([A-Za-z0-9_-]+\.md)\b")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def default_files():
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "python", "README.md")]
    for base, dirs, names in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        files += [os.path.join(base, n) for n in sorted(names) if n.endswith(".md")]
    return files


def closes(line, markup):
    """Whether `line` is a closing fence for a block opened with `markup` (CommonMark 4.5)."""
    s = line.rstrip("\n")
    stripped = s.lstrip(" ")
    if len(s) - len(stripped) > 3:
        return False
    run = len(stripped) - len(stripped.lstrip(markup[0]))
    return run >= len(markup) and stripped[run:].strip() == ""


def exists(path, doc, link=False):
    """Whether `path` is in the tree. A link resolves as a browser of the repository resolves it: from
    the doc's folder, or from the root when it starts with '/'; a path cited in prose may be either."""
    path = path.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return True
    if path.startswith("/"):
        bases, path = (ROOT,), path.lstrip("/")
    else:
        bases = (os.path.dirname(doc),) if link else (os.path.dirname(doc), ROOT)
    for base in bases:
        full = os.path.normpath(os.path.join(base, path))
        if os.path.commonpath([full, ROOT]) == ROOT and os.path.exists(full):
            return True
    return False


def cited_paths(text):
    """Words of `text` that name a file of the repository's tree: a path under one of TREE, or NAME.md."""
    out = []
    for word in text.split():
        word = word.strip("()[]\"',.:;`")
        if word.startswith(TREE) and not re.search(r"[<>*{}$]", word):
            out.append(word)
    out += BARE_MD.findall(text)
    return out


def check_file(doc):
    rel = os.path.relpath(doc, ROOT)
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    problems = []

    def problem(line, message):
        problems.append(f"{rel}:{line}: {message}")

    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    for tok in tokens:
        if tok.type == "fence":
            start, end = tok.map
            info = tok.info.strip()
            if " " in info or "\t" in info:
                problem(start + 1, f"fence info string {info!r} is more than a language name; a fence line "
                                   "carries no prose (put the text after the closing fence, on its own line)")
            last = lines[end - 1] if end - 1 > start and end - 1 < len(lines) else ""
            if end - 1 <= start or not closes(last, tok.markup):
                problem(start + 1, f"the {tok.markup} fence opened here is never closed: it runs to the end of "
                                   "the file")
            lang = info.split()[0].lower() if info else ""
            for i, line in enumerate(tok.content.splitlines()):
                if FENCE_LINE.match(line):
                    problem(start + 2 + i, f"a fence-like line inside the code block opened at line {start + 1}: "
                                           f"{line.strip()!r}; its closing fence is missing or carries text, so "
                                           "the block swallows what follows")
                elif lang not in HASH_COMMENTS and HEADING_LINE.match(line):
                    problem(start + 2 + i, f"a heading inside the code block opened at line {start + 1}: "
                                           f"{line.strip()!r} (a missed closing fence swallowed it)")
        elif tok.type == "inline":
            line = tok.map[0] + 1 if tok.map else 0
            for child in tok.children or []:
                if child.type in ("link_open", "image"):
                    target = child.attrs.get("href") or child.attrs.get("src") or ""
                    if target.startswith("#") or SCHEME.match(target) or target.startswith("//"):
                        continue
                    if not exists(target, doc, link=True):
                        problem(line, f"link to {target!r}, which is not in the repository")
                elif child.type in ("text", "code_inline"):
                    for path in cited_paths(child.content):
                        if not exists(path, doc):
                            problem(line, f"cites {path!r}, which is not in the repository (cite only what the "
                                          "repository holds; copy the figures needed into this file)")
    return problems


# Each kind of breakage, as it would be written, and the words of the finding it must give.
BROKEN = {
    "closing fence with text": ("```console\n$ ferry probe --help\n...\n``` `docs/X` holds the figures.\n\n"
                                "## Using ferry from Python\n\n```sh\npip install .\n```\n", "fence-like line"),
    "fence never closed": ("# t\n\n```python\nimport ferry\n", "never closed"),
    "prose in the info string": ("```sh run this first\nls\n```\n", "info string"),
    "heading swallowed": ("````cpp\nint x;\n## Next section\n````\n", "a heading inside"),
    "link to a missing file": ("See [the notes](NOTES_THAT_DO_NOT_EXIST.md).\n", "link to"),
    "cited missing file": ("The figures are in `docs/NO_SUCH_FILE.md` and BACKGROUND_NOT_HERE.md.\n", "cites"),
}
SOUND = ("# t\n\n```sh\nls   # a comment\n## also a comment\n```\n\nSee [the README](/README.md), "
         "`scripts/check_docs.py` and [the web](https://example.org/x.md).\n")


def layer_problems(architecture, layers):
    """The layered targets (scripts/check_layers.py's LAYERS) that docs/ARCHITECTURE.md's table of targets
    does not give a row: each must name its folder as `src/TARGET`."""
    rows = [line for line in architecture.splitlines() if line.startswith("|")]
    return [f"docs/ARCHITECTURE.md: the layered target {t!r} (scripts/check_layers.py) has no row naming "
            f"`src/{t}` in the table of targets" for t in sorted(layers)
            if not any(f"`src/{t}`" in row for row in rows)]


def architecture_problems():
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_layers", os.path.join(ROOT, "scripts", "check_layers.py"))
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md")) as f:
        return layer_problems(f.read(), layers.LAYERS)


def self_test():
    import tempfile
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (text, expect) in [*BROKEN.items(), ("sound file", (SOUND, None))]:
            path = os.path.join(tmp, "doc.md")
            with open(path, "w") as f:
                f.write(text)
            found = check_file(path)
            ok = not found if expect is None else any(expect in p for p in found)
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {found or 'no problems'}")
            if not ok:
                failures.append(name)
    table = "| target | folder |\n| --- | --- |\n| `ferry::core` | `src/core` |\n"
    for name, layers, expect in [("a layered target without a row", {"core": set(), "inject": {"core"}}, "'inject'"),
                                 ("every layered target with a row", {"core": set()}, None)]:
        found = layer_problems(table, layers)
        ok = not found if expect is None else any(expect in p for p in found)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {found or 'no problems'}")
        if not ok:
            failures.append(name)
    return 1 if failures else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    files = [os.path.abspath(a) for a in argv] or default_files()
    problems = []
    for doc in files:
        problems += check_file(doc)
    if not argv:
        problems += architecture_problems()
    for p in problems:
        print(p)
    print(f"check_docs: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
