#!/usr/bin/env python3
"""Checks that the docs stay true: every relative link in README.md and docs/*.md resolves to a
file in the repository (none leaves it), and every collective named in the first column of
docs/architecture.md's collective table is declared in include/nax/ops/collectives.h.

Usage: scripts/check_docs.py [REPO_ROOT]   (exit 1 and one line per problem if any)
"""
import pathlib
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def link_problems(repo: pathlib.Path):
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if repo.resolve() not in path.parents and path != repo.resolve():
                yield f"{doc.relative_to(repo)}: link {target} leaves the repository"
            elif not path.exists():
                yield f"{doc.relative_to(repo)}: link {target} names no file"


def collective_problems(repo: pathlib.Path):
    doc = (repo / "docs" / "architecture.md").read_text()
    header = (repo / "include" / "nax" / "ops" / "collectives.h").read_text()
    table = doc.split("## The collectives", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)\(", row.split("|")[1]))
    if not names:
        yield "docs/architecture.md: found no collective table under '## The collectives'"
    for name in sorted(names):
        if not re.search(rf"\b{name}\(", header):
            yield f"docs/architecture.md names the collective {name}, which include/nax/ops/collectives.h does not declare"


def main() -> int:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    problems = [*link_problems(repo), *collective_problems(repo)]
    for p in problems:
        print(p)
    print(f"check_docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
