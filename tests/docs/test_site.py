"""The built documentation site (``docs/_build/html``, made by ``bash scripts/docs.sh``).

Marked ``docs``: ``bash scripts/docs.sh --test`` builds the site and runs these
(``.ci/run`` does); the default test run skips them. Checks: every internal link and
anchor resolves, no page loads anything from the network, every public name has its
entry in the API reference, every tour page was executed and kept its outputs, and
headless Chromium opens the front page and a tour page (screenshots in
``docs/_build/screenshots/``).
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from browser import missing as browser_missing
from browser import screenshot

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SITE = DOCS / "_build" / "html"
SHOTS = DOCS / "_build" / "screenshots"

pytestmark = pytest.mark.docs


@pytest.fixture(scope="module")
def pages() -> dict[Path, Page]:
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site at {SITE}: run bash scripts/docs.sh first")
    return {p: Page.parse(p) for p in SITE.rglob("*.html")}


class Page(HTMLParser):
    """The links, loaded resources and element ids of one HTML file."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []  # <a href>
        self.loads: list[str] = []  # what the browser fetches to show the page
        self.ids: set[str] = set()

    @classmethod
    def parse(cls, path: Path) -> Page:
        page = cls()
        page.feed(path.read_text(encoding="utf-8"))
        return page

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in ("script", "img", "iframe", "source", "video", "audio") and a.get("src"):
            self.loads.append(a["src"])
        if tag == "link" and a.get("href") and (a.get("rel") or "") != "canonical":
            self.loads.append(a["href"])


def _target(page: Path, href: str) -> tuple[Path, str] | None:
    """The local file and fragment a relative link points to (None for external links)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    path = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    if path.is_dir():
        path = path / "index.html"
    return path, unquote(parts.fragment)


def test_every_internal_link_and_anchor_resolves(pages):
    broken = []
    for page, parsed in pages.items():
        for href in parsed.links:
            t = _target(page, href)
            if t is None:
                continue
            path, frag = t
            if not path.exists():
                broken.append(f"{page.relative_to(SITE)}: {href} (no file)")
            elif frag and path.suffix == ".html" and frag not in pages[path].ids:
                broken.append(f"{page.relative_to(SITE)}: {href} (no anchor)")
    assert not broken, "\n".join(broken[:40])


def test_no_page_loads_anything_from_the_network(pages):
    remote = [f"{p.relative_to(SITE)}: {u}" for p, parsed in pages.items() for u in parsed.loads
              if urlsplit(u).scheme in ("http", "https") or u.startswith("//")]
    assert not remote, "\n".join(remote[:20])
    for css in SITE.rglob("*.css"):
        urls = re.findall(r"url\(\s*['\"]?(https?:)?//", css.read_text(errors="replace"))
        assert not urls, f"{css.relative_to(SITE)} loads a remote url()"


def test_every_public_name_is_in_the_api_reference(pages):
    sys.path.insert(0, str(DOCS / "_ext"))
    import apigen

    ids = set()
    for p, parsed in pages.items():
        if p.parent == SITE / "api":
            ids |= parsed.ids
    mods = apigen.collect()
    missing = [f"{m.name}.{n}" for m in mods for n in m.owned if f"{m.name}.{n}" not in ids]
    assert not missing, missing[:30]
    assert sum(len(m.owned) for m in mods) > 300


def test_every_tour_page_ran_and_kept_its_outputs(pages):
    sources = sorted((DOCS / "tour_source").glob("[0-9][0-9]_*.py"))
    assert len(sources) >= 9
    for src in sources:
        html = SITE / "tour" / f"{src.stem}.html"
        assert html in pages, f"{src.name} has no page"
        text = html.read_text(encoding="utf-8")
        assert "sphx-glr-script-out" in text, f"{src.name}: no printed output on its page"
        if "plt.show()" in src.read_text() or "plot_" in src.read_text():
            images = [u for u in pages[html].loads if f"sphx_glr_{src.stem}_" in u]
            assert images, f"{src.name}: draws figures but its page shows none"
            for u in images:
                assert (html.parent / unquote(u)).resolve().exists(), u


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
@pytest.mark.parametrize("name", ["index.html", "tour/02_heat_map.html"])
def test_chromium_opens_the_page(pages, name):
    shot = screenshot(SITE / name, SHOTS / (Path(name).stem + ".png"), width=1400, height=900)
    assert "attnlab" in shot.title
    assert not shot.errors, shot.errors
    assert not shot.broken_images, shot.broken_images
    remote = [u for u in shot.urls if urlsplit(u).scheme not in ("file", "data", "about", "blob")]
    assert not remote, remote
    assert shot.path.stat().st_size > 20_000  # a rendered page, not a blank one
