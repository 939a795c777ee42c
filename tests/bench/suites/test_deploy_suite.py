"""The deploy bench suite: a tiny run in-process, its records, verdicts and report; its quality helpers."""

from __future__ import annotations

import json
import os

import pytest
import torch

from attnlab.bench import run
from attnlab.bench.suites.deploy import DeploySuite, quality, read_sentences, spearman
from helpers import bench_options, fetched

pytest.importorskip("onnxruntime")
pytest.importorskip("torchao")


def test_spearman_and_quality_are_measured():
    a = torch.arange(10.0)
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    torch.manual_seed(0)
    ref = torch.randn(50, 8)
    same = quality(ref.clone(), ref)
    assert same["mean_cosine"] == pytest.approx(1.0) and same["spearman"] == pytest.approx(1.0)
    assert same["pairs"] == 50 * 49 // 2
    noisy = quality(ref + 0.5 * torch.randn(50, 8), ref)
    assert noisy["min_cosine"] < noisy["mean_cosine"] < 0.999 and noisy["spearman"] < 0.99


def test_sentences_come_from_the_review_files(tmp_path):
    s = read_sentences(fetched("sentiment"), 60)
    assert len(s) == 60 and all(isinstance(x, str) and x for x in s)
    assert s[0] != s[1]  # one file after another: Amazon, IMDB, Yelp
    with pytest.raises(ValueError, match="sentiment"):
        read_sentences(tmp_path, 10)


@pytest.mark.slow  # about a minute on 2 busy cores: two exports, an INT8 graph, torchao
def test_tiny_deploy_run(tmp_path):
    fetched("sentiment")
    try:
        from attnlab.models.bert import minilm_path

        minilm_path()
    except ImportError:
        pytest.skip("the MiniLM tokenizer package is not installed")
    opts = {**DeploySuite().tiny_options(), "names": None}
    res = run("deploy", bench_options(tmp_path, isolate=False, budget_s=0.1, lengths=None, **opts))
    cases = {c["name"]: c for c in res["cases"] if c["suite"] == "deploy"}
    assert set(cases) == {"eager_fp32", "ort_fp32", "ort_fp32_optimized", "ort_int8", "torchao_int8", "eager_bf16",
                          "decode_eager", "decode_ort"}
    for name in ("eager_fp32", "ort_fp32", "ort_fp32_optimized", "ort_int8", "torchao_int8"):
        c = cases[name]
        assert c["status"] == "ok", c
        assert c["sentences_per_s"] > 0 and c["pairs"] >= 1000 and c["speedup_vs_eager"] > 0
    assert cases["eager_fp32"]["mean_cosine"] == pytest.approx(1.0, abs=1e-6)
    assert cases["ort_fp32"]["min_cosine"] > 0.9999  # the same function
    assert cases["ort_int8"]["mean_cosine"] > 0.9  # loose: a random tiny BERT, INT8 weights and activations
    assert cases["decode_ort"]["status"] == "ok" and cases["decode_ort"]["same_tokens"] is True
    texts = [v["text"] for v in res["verdicts"] if v["suite"] == "deploy"]
    assert any("ONNX Runtime INT8" in t for t in texts) and not any("target" in t for t in texts)
    assert "transformer optimizer fused" in cases["ort_fp32_optimized"]["note"]
    with open(os.path.join(tmp_path, "results.json")) as f:
        assert json.load(f)["cases"]
    assert "Deploy" in (tmp_path / "report.md").read_text()
