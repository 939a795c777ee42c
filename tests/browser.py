"""Headless Chromium for tests: open a local page, screenshot it, see what it asked the network for.

Debian's ``chromium`` and ``chromium-driver`` driven by Selenium (nothing is downloaded:
Selenium is pointed at ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``, or at
``$ATTNLAB_CHROMIUM`` / ``$ATTNLAB_CHROMEDRIVER``). Install with::

    apt-get install -y chromium chromium-driver
    pip install selenium

In a test module::

    from browser import require_chromium, screenshot     # tests/ is on sys.path (conftest.py)

    require_chromium()                                   # module-level skip, with the reason
    def test_report(tmp_path):
        shot = screenshot("bench-out/report.html", tmp_path / "report.png", width=1400, height=900)
        assert not shot.errors and shot.title

Or from a shell: ``python tests/browser.py PAGE OUT.png [WIDTHxHEIGHT]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ATTNLAB_CHROMEDRIVER", "/usr/bin/chromedriver")


def missing() -> str | None:
    """None when Chromium, its driver and selenium are all here, else what is missing and how to install it."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (pip install selenium)"
    return None


def require_chromium() -> None:
    """Skip the calling test module, with the reason, when the browser cannot run here."""
    import pytest

    why = missing()
    if why:
        pytest.skip(why, allow_module_level=True)


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator:
    """A headless Chromium WebDriver with a ``width`` x ``height`` viewport, its console and
    network logged; quit and its profile removed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="attnlab-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        # --window-size sets the window; make the page's own viewport exactly width x height
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list[dict]:
    """The page's console messages at level SEVERE or ERROR since the last call."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for since the last call (documents, scripts, styles, images, fonts)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


@dataclass
class Shot:
    """What :func:`screenshot` saw: the PNG, the page's title, its console errors and every URL it requested."""

    path: Path
    title: str
    errors: list[dict] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)


def open_page(driver, page: str | Path, settle: float = 0.3, timeout: float = 20.0) -> None:
    """Load ``page`` (a file path or a URL) and wait until it and its images have loaded."""
    url = page if "://" in str(page) else Path(page).resolve().as_uri()
    driver.get(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = driver.execute_script(
            "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)")
        if ready:
            break
        time.sleep(0.1)
    time.sleep(settle)  # fonts and layout


def screenshot(page: str | Path, out: str | Path, width: int = 1400, height: int = 900, driver=None) -> Shot:
    """Open ``page`` in headless Chromium at ``width`` x ``height`` and save the first screen as PNG ``out``.

    Pass a ``driver`` from :func:`chromium` to take several shots in one browser.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if driver is None:
            driver = stack.enter_context(chromium(width, height))
        console_errors(driver), requested_urls(driver)  # drop what earlier pages logged
        open_page(driver, page)
        broken = driver.execute_script(
            "return Array.from(document.images).filter(i => i.naturalWidth === 0).map(i => i.src)")
        driver.save_screenshot(str(out))
        return Shot(out, driver.title, console_errors(driver), requested_urls(driver), broken)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python tests/browser.py PAGE OUT.png [WIDTHxHEIGHT]")
    w, h = (int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1400x900").split("x"))
    shot = screenshot(sys.argv[1], sys.argv[2], w, h)
    print(f"{shot.path}: {shot.title!r}, {len(shot.urls)} requests, {len(shot.errors)} console errors")
