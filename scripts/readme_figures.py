"""The README's pictures: MiniLM's attention from "it" and a screenshot of the explorer.

Run ``python scripts/readme_figures.py docs`` (``scripts/readme_figures.sh`` does). The
screenshot needs Debian's ``chromium`` + ``chromium-driver`` and ``selenium``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

SENTENCE = "The animal didn't cross the street because it was too tired"


def _it_animal_head(ta) -> tuple[int, int]:
    """The (layer, head) whose query "it" puts the most weight on "animal"."""
    import torch

    i, j = ta.tokens.index("it"), ta.tokens.index("animal")
    w = torch.stack(ta.weights)[:, :, i, j]  # (L, H)
    k = int(w.flatten().argmax())
    return k // w.shape[1], k % w.shape[1]


def it_heatmap(out: Path, layer: int | None = None, head: int | None = None) -> Path:
    """Heat map of one MiniLM head with the query "it" outlined.

    Default: the head whose "it" attends most to "animal" (layer 5, head 11).
    """
    from attnlab.viz.plots import plot_attention, require_matplotlib
    from attnlab.viz.source import load_source, text_attention

    plt = require_matplotlib()
    ta = text_attention(load_source("minilm"), SENTENCE)
    if layer is None or head is None:
        layer, head = _it_animal_head(ta)
    w = ta.weights[layer][head]  # (N, N)
    i = ta.tokens.index("it")
    fig = plot_attention(w, ta.tokens, title=f"all-MiniLM-L6-v2, layer {layer} head {head}: attention from \"it\" (outlined row)")
    from matplotlib.patches import Rectangle

    ax = fig.axes[0]
    ax.add_patch(Rectangle((-0.5, i - 0.5), len(ta.tokens), 1, fill=False, edgecolor="#e4572e", linewidth=2.5))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def explorer_screenshot(out: Path, layer: int | None = None, head: int | None = None) -> Path:
    """Write the explorer page for MiniLM on the sentence, click "it", and screenshot it (same default head)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from attnlab.viz.explorer import write_explorer
    from attnlab.viz.source import load_source, text_attention

    ta = text_attention(load_source("minilm"), SENTENCE)
    if layer is None or head is None:
        layer, head = _it_animal_head(ta)
    with tempfile.TemporaryDirectory() as tmp:
        page = write_explorer(Path(tmp) / "page.html", ta.weights, ta.tokens, title="all-MiniLM-L6-v2: attention",
                              subtitle=SENTENCE, layer=layer, head=head)
        opts = webdriver.ChromeOptions()
        opts.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={tmp}/profile", "--window-size=1240,820", "--hide-scrollbars"):
            opts.add_argument(flag)
        d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            d.get(page.as_uri())
            toks = d.find_elements(By.CSS_SELECTOR, 'g.tok[data-panel="0"][data-side="q"]')
            toks[ta.tokens.index("it")].click()
            d.save_screenshot(str(out))
        finally:
            d.quit()
    return out


def main(argv: list[str] | None = None) -> int:
    """Write both pictures into the directory given as the first argument (default ``docs``)."""
    args = sys.argv[1:] if argv is None else argv
    docs = Path(args[0] if args else "docs")
    docs.mkdir(parents=True, exist_ok=True)
    print(it_heatmap(docs / "minilm_it_heatmap.png"))
    print(explorer_screenshot(docs / "explorer.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
