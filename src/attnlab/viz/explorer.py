"""The attention explorer: one self-contained HTML page, viewable offline or served locally.

In the spirit of bertviz (Vig, 2019, "A Multiscale Visualization of Attention in the
Transformer Model") but with no notebook and no network: the weights, tokens and
per-head analysis (:func:`attnlab.diagnostics.analysis.analyze_heads`) are embedded in
the page as JSON (weights as base64 float32), and the page's script draws them.

In the page: pick a layer and a head (or all heads overlaid), hover or click a query
token to see what it attends to or a key token to see what attends to it, switch
between the tokens view and the matrix view, and show two maps side by side (exact
against an approximation, with their difference in the matrix view).

Page size O(L H N M) floats (4 bytes each, base64); refused above ``max_values``.
Shape legend: ``L`` layers, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ._explorer_page import PAGE

__all__ = ["explorer_html", "write_explorer", "serve", "stack_layers"]

#: the largest number of weights a page embeds (about 4 * 1.33 bytes each)
MAX_VALUES = 12_000_000


def stack_layers(weights, name: str = "weights") -> np.ndarray:
    """Per-layer weights as one float32 array ``(L, H, N, M)``.

    Accepts a sequence of ``(H, N, M)`` or ``(1, H, N, M)`` tensors/arrays (one per layer),
    or one ``(L, H, N, M)`` / ``(H, N, M)`` / ``(N, M)`` array.
    """
    def arr(x):
        return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)

    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError(f"{name} must hold at least one layer")
        layers = []
        for i, w in enumerate(weights):
            a = arr(w)
            if a.ndim == 4 and a.shape[0] == 1:
                a = a[0]
            if a.ndim == 2:
                a = a[None]
            if a.ndim != 3:
                raise ValueError(f"{name}[{i}] must be (H, N, M) or (1, H, N, M), got shape {a.shape}")
            layers.append(a)
        shapes = {a.shape for a in layers}
        if len(shapes) != 1:
            raise ValueError(f"{name} layers must share (H, N, M), got {sorted(shapes)}")
        out = np.stack(layers)  # (L, H, N, M)
    else:
        out = arr(weights)
        while out.ndim < 4:
            out = out[None]
        if out.ndim != 4:
            raise ValueError(f"{name} must be (L, H, N, M), (H, N, M) or (N, M), got shape {out.shape}")
    return np.ascontiguousarray(out, dtype=np.float32)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.astype("<f4").tobytes()).decode("ascii")


def explorer_html(
    weights,
    tokens: Sequence[str],
    *,
    key_tokens: Sequence[str] | None = None,
    compare=None,
    names: tuple[str, str] = ("exact", "approximation"),
    stats: bool | Sequence = True,
    title: str = "attnlab explorer",
    subtitle: str = "",
    layer: int = 0,
    head: int | str = 0,
    compare_on: bool = True,
    max_values: int = MAX_VALUES,
) -> str:
    """The explorer page for one or two sets of attention maps, as an HTML string.

    Args:
        weights: per-layer weights (see :func:`stack_layers`), rows = queries.
        tokens: the ``N`` query tokens (also the keys unless ``key_tokens``).
        key_tokens: the ``M`` key tokens when they differ.
        compare: a second set of maps of the same shape (an approximation) to show side
            by side; the matrix view adds their difference ``weights - compare``.
        names: display names of the two sets.
        stats: True to label heads with :func:`~attnlab.diagnostics.analysis.analyze_heads`,
            False for none, or a precomputed list of ``HeadStats``.
        title, subtitle: page header.
        layer, head: what the page shows first (``head="all"`` overlays all heads).
        compare_on: start with the side-by-side view when ``compare`` is given.
        max_values: refuse pages embedding more weights than this.

    Raises:
        ValueError: on mismatched shapes/tokens or a page above ``max_values``.
    """
    a = stack_layers(weights)
    L, H, N, M = a.shape
    keys = list(key_tokens) if key_tokens is not None else list(tokens)
    if len(tokens) != N or len(keys) != M:
        raise ValueError(f"tokens must have N={N} entries and key tokens M={M}, got {len(tokens)} and {len(keys)}")
    maps = [{"name": names[0], "layers": L, "heads": H, "n": N, "m": M, "data": _b64(a)}]
    total = a.size
    if compare is not None:
        b = stack_layers(compare, "compare")
        if b.shape != a.shape:
            raise ValueError(f"compare must have the shape of weights {a.shape}, got {b.shape}")
        maps.append({"name": names[1], "layers": L, "heads": H, "n": N, "m": M, "data": _b64(b)})
        total += b.size
    if total > max_values:
        raise ValueError(f"the page would embed {total:,} weights (> max_values={max_values:,}); "
                         "use fewer tokens or layers, or raise max_values")
    if not (0 <= layer < L):
        raise ValueError(f"layer must be in [0, {L}), got {layer!r}")
    if head != "all" and not (isinstance(head, int) and 0 <= head < H):
        raise ValueError(f"head must be 'all' or in [0, {H}), got {head!r}")
    table = None
    if stats is True:
        from ..diagnostics.analysis import analyze_heads

        stats = analyze_heads(torch.from_numpy(a).unsqueeze(1).unbind(0), keys)  # layers of (1, H, N, M)
    if stats:
        table = [[None] * H for _ in range(L)]
        for s in stats:
            d = s.to_dict()
            d.pop("scores", None)
            table[s.layer][s.head] = d
    payload = {
        "title": title, "subtitle": subtitle, "tokens": [str(t) for t in tokens], "key_tokens": [str(t) for t in keys],
        "maps": maps, "stats": table, "initial_layer": int(layer), "initial_head": head, "compare_on": bool(compare_on),
    }
    blob = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")  # never close the script tag
    return PAGE.replace("__ATTNLAB_DATA__", blob)


def write_explorer(path: str | Path, weights, tokens: Sequence[str], **kwargs) -> Path:
    """Write :func:`explorer_html` to ``path`` (UTF-8) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(explorer_html(weights, tokens, **kwargs), encoding="utf-8")
    return p


class _OneFile(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, page: Path, **kwargs):
        self._page = page
        super().__init__(*args, directory=str(page.parent), **kwargs)

    def do_GET(self):  # http.server's naming
        if self.path in ("/", "/index.html", "/" + self._page.name):
            self.path = "/" + self._page.name
            return super().do_GET()
        self.send_error(404, "only the explorer page is served")

    def log_message(self, format, *args):  # keep the console quiet
        pass


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8000, background: bool = False):
    """Serve the page at ``http://host:port/`` (localhost only by default).

    Args:
        path: an HTML file written by :func:`write_explorer`.
        port: 0 picks a free port.
        background: start a daemon thread and return ``(server, url)`` instead of blocking
            (call ``server.shutdown()`` to stop).

    Returns:
        ``(server, url)`` when ``background``; otherwise blocks until interrupted.
    """
    page = Path(path).resolve()
    if not page.is_file():
        raise ValueError(f"path must be an existing HTML file, not found: {page}")
    server = http.server.ThreadingHTTPServer((host, port), functools.partial(_OneFile, page=page))
    url = f"http://{host}:{server.server_address[1]}/"
    if background:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, url
    print(f"serving {page} at {url} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return None
