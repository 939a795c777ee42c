"""ONNX export of every model kind, checked against ONNX Runtime with dynamic shapes; its errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from attnlab.cli import main
from attnlab.deploy import ExportMismatchError, export_onnx, kinds, session, verify_export
from attnlab.deploy.graphs import kind_of
from attnlab.models import (
    Bert,
    BertConfig,
    CausalLM,
    CausalLMConfig,
    ClassifierConfig,
    EncoderDecoder,
    Seq2SeqConfig,
    SequenceClassifier,
    ViT,
    ViTConfig,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOL = 1e-4


def tiny(kind: str, **kw) -> torch.nn.Module:
    """A tiny model of ``kind`` (2 layers, width 16, awkward 9-row vocabularies), seeded."""
    torch.manual_seed(0)
    small = dict(dim=16, heads=2, layers=2, max_len=48)
    if kind == "Bert":
        return Bert(BertConfig(vocab_size=37, dim=16, layers=2, heads=2,
                               ff_dim=32, max_len=48)).eval()
    if kind == "CausalLM":
        return CausalLM(CausalLMConfig(vocab_size=29, **{**small, **kw})).eval()
    if kind == "EncoderDecoder":
        return EncoderDecoder(Seq2SeqConfig(src_vocab_size=31, tgt_vocab_size=23, **{**small, **kw})).eval()
    if kind == "SequenceClassifier":
        return SequenceClassifier(ClassifierConfig(vocab_size=29, num_classes=3, **{**small, **kw})).eval()
    if kind == "ViT":
        return ViT(ViTConfig(image_size=8, patch_size=4, num_classes=5, **{**small, **kw})).eval()
    raise AssertionError(kind)


# its module fixture is built once: every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_export")


class _Exports(dict):
    """name -> (model, report), each kind exported on first use (a few seconds each)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp = tmp_path_factory

    def __missing__(self, name):
        model = tiny(name)
        self[name] = (model, export_onnx(model, self.tmp.mktemp(name)))
        return self[name]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Each kind exported once per worker, when a test first asks for it: name -> (model, report).

    Session-scoped: a module fixture is rebuilt whenever the worker's queue moves to another
    module and back, and these exports are the slowest setup of the suite."""
    return _Exports(tmp_path_factory)


def test_every_registered_kind_has_a_tiny_model():
    assert sorted(kinds()) == ["Bert", "CausalLM", "EncoderDecoder", "SequenceClassifier", "ViT"]


@pytest.mark.parametrize("name", ["Bert", "CausalLM", "EncoderDecoder", "SequenceClassifier", "ViT"])
def test_onnxruntime_equals_eager_on_held_out_shapes(exported, name):
    model, report = exported[name]
    assert sorted(report.files) == sorted(kind_of(model).graph_names)
    assert all(p.is_file() for p in report.files.values())
    assert report.checks, "the export ran no held-out check"
    assert report.max_abs <= TOL, [c for c in report.checks if c.max_abs > TOL]
    cases = " ".join(c.case for c in report.checks)
    assert "batch 3" in cases and "batch 1" in cases  # batch sizes other than the traced 2
    if name != "ViT":
        assert "right-padded" in cases and "length 11" in cases  # padding, and a length other than the traced 7
    manifest = json.loads((report.out / "export.json").read_text())
    assert manifest["model_type"] == name and manifest["verification"]["max_abs"] <= TOL


def test_decoder_graphs_take_and_return_the_kv_cache(exported):
    model, report = exported["CausalLM"]
    decode = session(report.files["decode"])
    names = [i.name for i in decode.get_inputs()]
    assert names[:2] == ["tokens", "attention_mask"] and names[2:] == [
        f"past.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [o.name for o in decode.get_outputs()][1:] == [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    steps = [c for c in report.checks if c.graph == "decode"]
    assert {c.case.split("step ")[-1] for c in steps} == {"1", "2", "3"}  # fed its own presents three times
    _, s2s = exported["EncoderDecoder"]
    assert any(c.graph == "decoder_step" and "step 1" in c.case for c in s2s.checks)  # from an empty past (T = 0)


def test_verification_reports_a_model_that_differs(exported):
    """The check is real: the graphs of one model against another model's weights fail with the numbers."""
    model, report = exported["SequenceClassifier"]
    torch.manual_seed(1)
    other = tiny("SequenceClassifier")
    torch.nn.init.normal_(other.head.weight)
    checks = verify_export(other, kind_of(other), report.files)
    err = ExportMismatchError(checks, TOL)
    assert err.checks and err.checks[0].max_abs > 1e-2
    assert "max abs" in str(err) and "logits" in str(err)


@pytest.mark.slow  # two more exports (40-50 s); the default run exports every model kind above
@pytest.mark.parametrize("settings", [{"positional": "rotary", "kv_heads": 1}, {"positional": "alibi"}])
def test_causal_lm_with_other_positions_and_grouped_heads(tmp_path, settings):
    report = export_onnx(tiny("CausalLM", layers=1, **settings), tmp_path)
    assert report.max_abs <= TOL


def test_a_mechanism_onnx_cannot_express_is_named(tmp_path):
    model = tiny("SequenceClassifier", mechanism="reformer", mechanism_settings={"bucket_size": 4})
    with pytest.raises(ValueError, match="mechanism 'reformer' cannot be exported to ONNX"):
        export_onnx(model, tmp_path / "out")
    assert not any((tmp_path / "out").iterdir())


def test_non_empty_out_dir_needs_force(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty; pass --force"):
        export_onnx(tiny("ViT"), tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert main(["export", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab export: ") and "--force" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("module", ["onnxruntime", "onnx", "onnxscript"])
def test_missing_package_names_the_pip_line(tmp_path, monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(ImportError, match=rf"pip install '{module}>="):
        export_onnx(tiny("ViT"), tmp_path)


@pytest.mark.slow  # 14 s: a third export of a model and its INT8 quantization; test_quantize covers INT8 by default
def test_cli_exports_a_checkpoint_with_int8(tmp_path, capsys):
    model = tiny("SequenceClassifier")
    model.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "onnx"
    assert main(["export", str(tmp_path / "ckpt"), "--format", "onnx", "--out", str(out), "--int8"]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime = eager within" in text and (out / "model.int8.onnx").is_file()
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out), "--force"]) == 0
    assert not (out / "model.int8.onnx").exists()  # --force replaced the directory's contents
