"""INT8 of an exported graph (ONNX Runtime) and of the eager model (torchao), bf16 detection: measured bounds."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from attnlab.deploy import bf16_choice, export_onnx, native_cpu_bf16, quantize_eager_int8, quantize_onnx
from attnlab.deploy.verify import runner, session
from attnlab.models import Bert, BertConfig

pytest.importorskip("onnxruntime")

#: the loose bound of a tiny random BERT (width 32, 2 layers) in INT8: every sentence
#: embedding keeps cosine >= 0.95 to fp32 (measured >= 0.99 with per-channel weight scales)
INT8_MIN_COSINE = 0.95


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_quantize")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def bert_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = Bert(BertConfig(vocab_size=97, dim=32, layers=2, heads=4,
                            ff_dim=64, max_len=64)).eval()
    return model, export_onnx(model, tmp_path_factory.mktemp("bert")).files["model"]


def _inputs():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 97, (4, 19), generator=gen)
    keep = torch.ones(4, 19, dtype=torch.long)
    keep[1, 12:] = 0
    return {"input_ids": ids, "attention_mask": keep, "token_type_ids": torch.zeros_like(ids)}


def test_onnx_int8_runs_within_a_loose_bound(bert_onnx, tmp_path):
    model, path = bert_onnx
    dst = quantize_onnx(path, tmp_path / "model.int8.onnx")
    assert dst.stat().st_size < path.stat().st_size
    feeds = _inputs()
    fp32 = runner(session(path))(feeds)["sentence_embedding"]
    int8 = runner(session(dst))(feeds)["sentence_embedding"]
    cos = F.cosine_similarity(int8, fp32, dim=1)
    assert cos.min() >= INT8_MIN_COSINE, cos
    assert (int8 - fp32).abs().max() > 0  # it did quantize


def test_quantize_onnx_errors(tmp_path, bert_onnx, monkeypatch):
    with pytest.raises(ValueError, match="src must be an .onnx file"):
        quantize_onnx(tmp_path / "nope.onnx", tmp_path / "x.onnx")
    _, path = bert_onnx
    with pytest.raises(ValueError, match="dst must differ from src"):
        quantize_onnx(path, path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install 'onnxruntime>=1\.18'"):
        quantize_onnx(path, tmp_path / "y.onnx")


def test_torchao_int8_of_the_eager_model(bert_onnx, monkeypatch):
    pytest.importorskip("torchao")
    model, _ = bert_onnx
    q = quantize_eager_int8(model)
    assert q is not model and type(model.pooler.weight) is torch.nn.Parameter  # the original is untouched
    feeds = _inputs()
    with torch.no_grad():
        a, b = model(**feeds).pooler_output, q(**feeds).pooler_output
    assert F.cosine_similarity(a, b, dim=1).min() >= INT8_MIN_COSINE
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ImportError, match=r"pip install 'torchao>=0\.10'"):
        quantize_eager_int8(model)
    with pytest.raises(ValueError, match="nn.Linear"):
        quantize_eager_int8(torch.nn.ReLU())


def test_bf16_is_detected_then_measured(bert_onnx):
    model, _ = bert_onnx
    native, why = native_cpu_bf16()
    assert isinstance(native, bool) and "bf16" in why
    feeds = _inputs()
    low, text = bf16_choice(model, lambda m: m(**feeds), repeats=1)
    if not native:
        assert low is None and text == why
    else:
        assert "measured a forward" in text
        assert (low is None) == text.endswith("-> fp32")
        if low is not None:
            assert next(low.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="repeats"):
        bf16_choice(model, lambda m: None, repeats=0)
