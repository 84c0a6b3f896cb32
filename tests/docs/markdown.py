"""What the documentation tests read from markdown: links, headings' anchors, prose without code."""

from __future__ import annotations

import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FENCE = re.compile(r"^\s*```")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[str]:
    """Every page users read, relative to the repository root."""
    found = ["README.md"]
    for folder in ("docs", "benchmarks"):
        for directory, _, files in os.walk(os.path.join(REPO_ROOT, folder)):
            found += [os.path.relpath(os.path.join(directory, f), REPO_ROOT)
                      for f in files if f.endswith(".md")]
    return sorted(found)


def read(path: str) -> str:
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        return f.read()


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def links(text: str) -> list[str]:
    """Every link target outside fenced blocks and inline code."""
    found = []
    for line in prose_lines(text):
        found += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, numbered as GitHub numbers repeated ones."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: str) -> list[str]:
    """The relative links of a page whose file or #anchor does not exist."""
    broken = []
    for target in links(read(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                    if file_part else path)
        full = os.path.join(REPO_ROOT, resolved)
        if not os.path.exists(full):
            broken.append(f"{target} (no {resolved})")
        elif anchor and (not resolved.endswith(".md") or anchor not in anchors(read(resolved))):
            broken.append(f"{target} (no heading #{anchor} in {resolved})")
    return broken
