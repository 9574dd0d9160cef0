"""mkdocs hook: the repository files that the pages cite are published with the site.

A page links a repository file as a clone reads it, relative to the page: docs/speed.md cites
`../benchmarks/results/<device>/models.json`. The site is built from docs/ alone, so this hook
copies every such file that exists into the site under `repository/<its path>` (as it is: a
cited .md file is evidence, not a page) and points the page's link at the copy; the Markdown
sources keep their links, which work in a clone and on the repository's web view.

A link that leaves docs/ to a file that does not exist (or leaves the repository) is left as
written: mkdocs' link check (`validation: links: not_found: warn`) reports it, and
`mkdocs build --strict` fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

SITE_FOLDER = "repository"
# Inline links and images, `[text](target)` / `![alt](target "title")`: the pages use no others.
LINK = re.compile(r"(\]\()([^)\s]+)")

_published: dict[str, str] = {}  # link target as written in a page (page src_uri, target) -> site path


class RepositoryFile(File):
    """A cited repository file, copied into the site byte for byte (never rendered)."""

    def is_documentation_page(self) -> bool:
        return False


def _cited_file(page_uri: str, target: str, docs_dir: Path, root: Path) -> str | None:
    """The repository path (relative to `root`) of a page's link target that leaves docs/ to a
    file of the repository, else None (a link inside docs/, out of the repository, to nothing,
    to a web address or an anchor: mkdocs checks those itself)."""
    path = target.split("#")[0]
    if not path or re.match(r"[a-zA-Z][\w+.-]*:", path) or path.startswith("/"):
        return None
    found = (docs_dir / posixpath.dirname(page_uri) / path).resolve()
    if found.is_relative_to(docs_dir) or not found.is_relative_to(root) or not found.is_file():
        return None
    return found.relative_to(root).as_posix()


def on_files(files, config):
    """Add each repository file a page cites to the site's files."""
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    _published.clear()
    added = set()
    for page in files.documentation_pages():
        for _, target in LINK.findall(Path(page.abs_src_path).read_text(encoding="utf-8")):
            cited = _cited_file(page.src_uri, target, docs_dir, root)
            if cited is None:
                continue
            _published[(page.src_uri, target.split("#")[0])] = f"{SITE_FOLDER}/{cited}"
            if cited not in added:
                added.add(cited)
                files.append(RepositoryFile.generated(config, f"{SITE_FOLDER}/{cited}", abs_src_path=str(root / cited)))
    return files


def on_page_markdown(markdown, page, config, files):
    """Point the page's links to cited repository files at their copies in the site."""

    def relink(match: re.Match) -> str:
        path, hash_, anchor = match.group(2).partition("#")
        site_path = _published.get((page.file.src_uri, path))
        if site_path is None:
            return match.group(0)
        here = posixpath.dirname(page.file.src_uri) or "."
        return match.group(1) + posixpath.relpath(site_path, here) + hash_ + anchor

    return LINK.sub(relink, markdown)
