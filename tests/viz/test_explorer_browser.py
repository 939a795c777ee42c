"""The explorer page in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, Selenium).

No browser is downloaded: Selenium is pointed at ``/usr/bin/chromium`` and
``/usr/bin/chromedriver``. Install with::

    apt-get install -y chromium chromium-driver
    pip install selenium

Skipped, with the reason, when any of them is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
import torch

from attnlab.viz import write_explorer

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ATTNLAB_CHROMEDRIVER", "/usr/bin/chromedriver")

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install -y chromium chromium-driver)",
                allow_module_level=True)
selenium = pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

L, H, N = 2, 3, 7
TOKENS = ["[CLS]", "the", "animal", "</script>", "it", "tired", "[SEP]"]


def _maps(seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2.0 * torch.randn(L, H, N, N, generator=g), -1).numpy()  # (L, H, N, N)


EXACT, APPROX = _maps(0), _maps(1)


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which starts the browser once
pytestmark = pytest.mark.xdist_group("test_explorer_browser")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def page(tmp_path_factory):
    path = write_explorer(tmp_path_factory.mktemp("explorer") / "page.html", list(EXACT), TOKENS,
                          compare=list(APPROX), names=("exact", "approx"), compare_on=False)
    profile = tempfile.mkdtemp(prefix="attnlab-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        driver.get(path.as_uri())
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _severe(driver):
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def _tokens(driver, side: str, panel: int = 0):
    return driver.find_elements(By.CSS_SELECTOR, f'g.tok[data-panel="{panel}"][data-side="{side}"]')


def _weights(driver, side: str, panel: int = 0) -> np.ndarray:
    return np.array([float(t.get_attribute("data-weight")) for t in _tokens(driver, side, panel)])


def _unpin(driver):
    driver.execute_script("window.attnlab.state.pinned = null; window.attnlab.select(null, false);")


def _tokens_view(driver):
    driver.find_element(By.ID, "view-tokens").click()


def test_loads_without_console_errors(page):
    assert page.execute_script("return typeof window.attnlab") == "object"
    assert _severe(page) == []
    assert [t.find_element(By.TAG_NAME, "text").text for t in _tokens(page, "q")] == TOKENS
    assert len(_tokens(page, "k")) == N


def test_click_query_token_highlights_its_row(page):
    _tokens_view(page)
    _unpin(page)
    _tokens(page, "q")[4].click()  # "it"
    np.testing.assert_allclose(_weights(page, "k"), EXACT[0, 0, 4], rtol=1e-6, atol=1e-7)
    assert "query 4 'it' attends to" in page.find_element(By.ID, "readout").text
    # the query side carries no weights while a query is selected
    assert all(t.get_attribute("data-weight") is None for t in _tokens(page, "q"))


def test_click_key_token_highlights_its_column(page):
    _tokens_view(page)
    _unpin(page)
    _tokens(page, "k")[2].click()  # who attends to "animal"
    np.testing.assert_allclose(_weights(page, "q"), EXACT[0, 0, :, 2], rtol=1e-6, atol=1e-7)


def test_switching_head_and_layer_changes_the_weights(page):
    _tokens_view(page)
    _unpin(page)
    _tokens(page, "q")[1].click()
    Select(page.find_element(By.ID, "head")).select_by_value("2")
    np.testing.assert_allclose(_weights(page, "k"), EXACT[0, 2, 1], rtol=1e-6, atol=1e-7)
    Select(page.find_element(By.ID, "layer")).select_by_value("1")
    np.testing.assert_allclose(_weights(page, "k"), EXACT[1, 2, 1], rtol=1e-6, atol=1e-7)
    Select(page.find_element(By.ID, "head")).select_by_value("all")
    np.testing.assert_allclose(_weights(page, "k"), EXACT[1, :, 1].mean(0), rtol=1e-5, atol=1e-7)
    Select(page.find_element(By.ID, "layer")).select_by_value("0")
    Select(page.find_element(By.ID, "head")).select_by_value("0")


def test_switching_head_changes_the_matrix_picture(page):
    page.find_element(By.ID, "view-matrix").click()
    canvas = page.find_elements(By.CSS_SELECTOR, "canvas.matrix")
    assert len(canvas) == 1
    before = page.execute_script("return document.querySelector('canvas.matrix').toDataURL()")
    assert float(canvas[0].get_attribute("data-max")) == pytest.approx(float(EXACT[0, 0].max()), rel=1e-5)
    Select(page.find_element(By.ID, "head")).select_by_value("1")
    after = page.execute_script("return document.querySelector('canvas.matrix').toDataURL()")
    assert after != before
    assert float(page.find_element(By.CSS_SELECTOR, "canvas.matrix").get_attribute("data-max")) == pytest.approx(
        float(EXACT[0, 1].max()), rel=1e-5)
    Select(page.find_element(By.ID, "head")).select_by_value("0")
    again = page.execute_script("return document.querySelector('canvas.matrix').toDataURL()")
    assert again == before


def test_side_by_side_comparison_with_difference(page):
    page.find_element(By.ID, "view-matrix").click()
    page.find_element(By.ID, "compare").click()
    canvases = page.find_elements(By.CSS_SELECTOR, "canvas.matrix")
    assert [c.get_attribute("data-panel") for c in canvases] == ["0", "1", "diff"]
    diff_max = float(canvases[2].get_attribute("data-max"))
    assert diff_max == pytest.approx(float(np.abs(EXACT[0, 0] - APPROX[0, 0]).max()), rel=1e-5)
    # the tokens view shows both maps; a click highlights each with its own weights
    _tokens_view(page)
    _unpin(page)
    _tokens(page, "q", panel=1)[3].click()
    np.testing.assert_allclose(_weights(page, "k", 0), EXACT[0, 0, 3], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_weights(page, "k", 1), APPROX[0, 0, 3], rtol=1e-6, atol=1e-7)
    page.find_element(By.ID, "compare").click()


def test_head_labels_are_shown(page):
    options = [o.text for o in Select(page.find_element(By.ID, "head")).options]
    assert options[0].startswith("all heads") and len(options) == H + 1
    assert all(" \u2014 " in o for o in options[1:])  # "head h - label score"
    rows = page.find_elements(By.CSS_SELECTOR, "#stats tbody tr")
    assert len(rows) == H


def test_no_console_errors_after_interaction(page):
    assert _severe(page) == []
