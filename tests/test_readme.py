"""The README is the landing page: its example is real code and its links and the docs' links lead somewhere.
The example runs on a GPU in tests/gpu/test_readme_example.py; here, without one, it must parse and import only names
that exist, and every relative link of README.md and docs/*.md must name a file that is there (and a heading of it,
for a link with an anchor)."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def readme_example() -> str:
    """The first python block after the README's "## Example" heading."""
    text = (ROOT / "README.md").read_text()
    after = text.split("\n## Example\n", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_example_parses_and_imports_what_exists():
    tree = ast.parse(readme_example())
    imported = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names]
    assert imported, "the README example imports nothing from generator"
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"README example: {module} has no {name}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it, ASCII letters, digits and hyphens only (both sides are compared so)."""
    return re.sub(r"[^a-z0-9_ -]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> set[str]:
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            found.add(slug(m.group(1)))
    return found


def test_relative_links_lead_to_files_and_headings():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            file = page if not path else page.parent / path
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and slug(anchor) not in headings(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links: " + "; ".join(broken)
