"""The README as a newcomer's first page (issue #47): it opens with the two
commands, stays short, and every link in it and in docs/ leads somewhere;
CI runs the README's test command, and that command alone installs what
the tests need (scripts/setup)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# About 250 lines: the page a newcomer reads to the end; the rest is in docs/.
MAX_README_LINES = 260


def prose_lines(path: pathlib.Path):
    """(number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    seen: dict = {}
    out = set()
    for _, line in prose_lines(path):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: pathlib.Path):
    """(line number, target) of every relative Markdown link in prose."""
    for number, line in prose_lines(path):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if not re.match(r"[a-z]+:", target):
                yield number, target


def test_the_readme_opens_with_the_two_commands():
    text = README.read_text()
    m = re.match(r"# exec-gateway\n\n```sh\n(.*?)\n```\n", text, re.S)
    assert m, "the README starts with its title, then a sh block"
    commands = [line.split("#", 1)[0].strip() for line in m.group(1).splitlines()]
    assert commands == ["cargo run --release -- serve", "scripts/test"], commands


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)}
    missing = [d.name for d in DOCS if d.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_every_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in [README, *DOCS]:
        for number, target in links(page):
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def commands(path: pathlib.Path) -> list:
    """The script's lines that are not comments or blank."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def test_ci_runs_the_readme_test_command_and_installs_nothing_itself():
    ci = commands(ROOT / ".ci" / "run")
    assert ci[-1] == "scripts/test", ci
    installers = re.compile(r"\b(apt-get|apt|npm|pip|curl|fetch-codex|scripts/setup)\b")
    assert not [line for line in ci if installers.search(line)], ci


def test_the_test_command_runs_the_setup_before_any_test():
    test = commands(ROOT / "scripts" / "test")
    setup = next(i for i, line in enumerate(test) if line == "scripts/setup")
    first_test = next(i for i, line in enumerate(test)
                      if re.search(r"\b(cargo test|pytest|npm test|vm-test|buf lint)\b", line))
    assert setup < first_test, test
    # Nothing else in it installs: the setup does, once.
    installers = re.compile(r"\b(apt-get|npm ci|npm install|fetch-codex)\b|pip install .*-r ")
    assert not [line for line in test if installers.search(line)], test
