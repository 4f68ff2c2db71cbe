"""Every relative link and anchor in README.md and docs/*.md resolves, and the README links every docs page.

The README is a landing page and the reference lives in docs/, one page per task; a section that moves
or is renamed breaks the links into it silently on GitHub. Anchors are checked against the heading slugs
GitHub makes (lowercase, punctuation dropped except - and _, spaces to -, a repeated slug gets -1, -2, ...).
Pure: reads files, starts nothing."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `# comment` in a shell block is no heading, and a
    `[x](y)` in a TOML block no link."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): the rendered text lowercased, every
    character that is not a letter, a digit, a mark, `_`, `-` or a space dropped, spaces to `-`."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    kept = []
    for ch in text.lower():
        category = unicodedata.category(ch)
        if ch in "-_ " or category[0] in "LNM":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    found = []
    for line in prose_lines(path.read_text()):
        found += LINK.findall(INLINE_CODE.sub("", line))
    return found


def broken_links(path: Path) -> list[str]:
    """Each link of `path` that does not resolve, with the reason."""
    problems = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: ({target}): {file_part} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.name}: ({target}): {dest.name} has no heading whose anchor is #{anchor}")
    return problems


def test_every_relative_link_and_anchor_resolves():
    problems = [p for page in pages() for p in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_links_every_docs_page():
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme) if not EXTERNAL.match(t)}
    missing = [p.relative_to(ROOT).as_posix() for p in pages()[1:] if p.resolve() not in linked]
    assert not missing, f"README.md links no page {missing}: add each to its map of the docs"


def test_slugs_are_githubs():
    assert slug("Speed where agents live: context depth, a replayed session, thinking models") == \
        "speed-where-agents-live-context-depth-a-replayed-session-thinking-models"
    assert slug("`depth`: speed at context depth") == "depth-speed-at-context-depth"
    assert slug("The CPU demo: `./dev demo`") == "the-cpu-demo-dev-demo"
    assert slug("The marker: /etc/llama-cpp/active.json") == "the-marker-etcllama-cppactivejson"
    assert slug("The doctor's checks") == "the-doctors-checks"
    assert slug("3. Switching: `llm-bench engine hyperqwen up|down`") == "3-switching-llm-bench-engine-hyperqwen-updown"
    assert slug("services.llama-cpp: nixpkgs' module, extended") == "servicesllama-cpp-nixpkgs-module-extended"


def test_the_check_finds_a_broken_file_an_unknown_anchor_and_counts_repeated_headings(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## Part\n\n## Part\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[ok](other.md#part) [ok](other.md#part-1) [ok](#here) [web](https://example.org/x.md#nope)\n"
        "`[code](missing.md)` is code, not a link\n"
        "[gone](missing.md) [no anchor](other.md#part-2) [no anchor](#not-a-heading) [comment](other.md#not-a-heading)\n"
        "```toml\n[in](a-fence.md)\n```\n"
    )
    problems = broken_links(page)
    assert len(problems) == 4, problems
    assert "missing.md does not exist" in problems[0]
    assert all("has no heading" in p for p in problems[1:]), problems
