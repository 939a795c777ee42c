"""Configs round-trip through JSON and reject bad values; save -> load reproduces outputs bit for bit."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attnlab.models import (
    Bert,
    BertConfig,
    CausalLM,
    CausalLMConfig,
    ClassifierConfig,
    EncoderDecoder,
    Seq2SeqConfig,
    SequenceClassifier,
    TransformerConfig,
    ViT,
    ViTConfig,
    from_pretrained,
)
from attnlab.models.io import CorruptCheckpointError

CONFIGS = [
    TransformerConfig(dim=48, heads=6, kv_heads=2, positional="alibi", mechanism_settings={"backend": "math"}),
    CausalLMConfig(vocab_size=33, dim=32, heads=4, positional="rotary", eos_id=3, tie_embeddings=False),
    Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=21, dim=32, heads=4, decoder_layers=3, positional="t5",
                  scale_embeddings=True),
    ClassifierConfig(vocab_size=20, num_classes=5, pooling="mean", norm_first=False, activation="relu"),
    ViTConfig(image_size=12, patch_size=4, channels=2, num_classes=3, dim=32, heads=4, positional="learned",
              max_len=10),
    BertConfig(vocab_size=50, dim=36, layers=2, heads=9, ff_dim=59),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: type(c).__name__)
def test_config_json_round_trip(cfg):
    text = cfg.to_json()
    back = type(cfg).from_json(text)
    assert back == cfg
    assert json.loads(text) == cfg.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls,kwargs,match",
    [
        (TransformerConfig, {"dim": 30, "heads": 4}, r"dim=30 and heads=4"),
        (TransformerConfig, {"positional": "relative"}, r"positional must be one of .*'relative'"),
        (TransformerConfig, {"mechanism": "magic"}, r"mechanism must be one of .*'magic'"),
        (TransformerConfig, {"dropout": 1.0}, r"dropout must be .* got 1.0"),
        (TransformerConfig, {"kv_heads": 3}, r"kv_heads=3 and heads=4"),
        (TransformerConfig, {"dim": 36, "heads": 4, "positional": "rotary"}, r"even head dim.*9"),
        (TransformerConfig, {"mechanism_settings": {"x": object()}}, r"JSON-serializable"),
        (TransformerConfig, {"activation": "tanh"}, r"activation must be one of .*'tanh'"),
        (CausalLMConfig, {"vocab_size": 0}, r"vocab_size must be a positive int, got 0"),
        (CausalLMConfig, {"vocab_size": 10, "eos_id": 10}, r"eos_id must be a token id in \[0, 10\), got 10"),
        (ViTConfig, {"image_size": 10, "patch_size": 4, "num_classes": 2}, r"image_size=10 and patch_size=4"),
        (ViTConfig, {"image_size": 8, "patch_size": 2, "num_classes": 2, "positional": "learned", "max_len": 8},
         r"max_len=8 .* 17 tokens"),
        (ClassifierConfig, {"vocab_size": 5, "num_classes": 2, "pooling": "max"}, r"pooling must be one of .*'max'"),
        (CausalLMConfig, {"vocab_size": 5, "scale_embeddings": 1}, r"scale_embeddings must be a bool, got 1"),
        (Seq2SeqConfig, {"src_vocab_size": 5, "tgt_vocab_size": 5, "scale_embeddings": "yes"},
         r"scale_embeddings must be a bool, got 'yes'"),
        (BertConfig, {"dim": 30, "heads": 4}, r"30 and 4"),
    ],
)
def test_config_validation_names_the_offending_value(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_from_dict_rejects_unknown_fields():
    data = CausalLMConfig(vocab_size=5).to_dict()
    data["widht"] = 3
    with pytest.raises(ValueError, match=r"unknown CausalLMConfig fields \['widht'\]"):
        CausalLMConfig.from_dict(data)


def _models():
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(3, 20, (2, 7), generator=g)
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    images = torch.randn(2, 2, 12, 12, generator=g)
    return [
        (CausalLM(CONFIGS[1]), lambda m: m(tok).logits),
        (EncoderDecoder(CONFIGS[2]), lambda m: m(tok, tok[:, :5], keep).logits),
        (SequenceClassifier(CONFIGS[3]), lambda m: m(tok, keep).logits),
        (ViT(CONFIGS[4]), lambda m: m(images).logits),
        (Bert(CONFIGS[5]), lambda m: m(tok, keep, return_weights=True).attentions[-1]),
    ]


@pytest.mark.parametrize("index", range(5))
def test_save_load_is_bit_for_bit(tmp_path, index):
    torch.manual_seed(index)
    model, run = _models()[index]
    model.eval()
    with torch.no_grad():
        for p in model.parameters():  # move off the initial values (zeros/ones) so loading matters
            p.add_(torch.randn_like(p) * 0.01)
        before = run(model)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = type(model).from_pretrained(tmp_path / "m")
    generic = from_pretrained(tmp_path / "m")
    assert loaded.config == model.config and type(generic) is type(model)
    with torch.no_grad():
        assert torch.equal(run(loaded), before)
        assert torch.equal(run(generic), before)


def test_load_errors(tmp_path):
    model = CausalLM(CausalLMConfig(vocab_size=9, dim=32, heads=4, layers=1))
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a CausalLM, not a ViT"):
        ViT.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="config.json"):
        from_pretrained(tmp_path / "nowhere")
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["config"]["layers"] = 2  # weights no longer match
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="do not match the config"):
        from_pretrained(tmp_path)


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "one byte short": data[:-1],
                      "cut header": data[:5], "not JSON": b'{"format": "attn'}[how])


@pytest.mark.parametrize("how", ["empty", "truncated", "one byte short", "cut header"])
@pytest.mark.parametrize("index", range(5))
def test_damaged_weights_name_the_file_and_what_to_do(tmp_path, index, how):
    """Every model's loaders turn safetensors' own error into a one-line ValueError about the file."""
    model, _ = _models()[index]
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    _damage(weights, how)
    for load in (type(model).from_pretrained, from_pretrained):
        with pytest.raises(CorruptCheckpointError) as e:
            load(tmp_path)
        msg = str(e.value)
        assert isinstance(e.value, ValueError) and e.value.path == weights
        assert msg.startswith(str(weights)) and "\n" not in msg
        assert ("is empty (0 bytes)" if how == "empty" else "damaged or truncated") in msg
        assert msg.endswith("re-save it or point to another checkpoint")


@pytest.mark.parametrize("how,words", [("empty", "is empty"), ("not JSON", "is not valid JSON")])
def test_damaged_config_names_the_file(tmp_path, how, words):
    model = CausalLM(CausalLMConfig(vocab_size=9, dim=32, heads=4, layers=1))
    model.save_pretrained(tmp_path)
    _damage(tmp_path / "config.json", how)
    with pytest.raises(CorruptCheckpointError, match=words) as e:
        CausalLM.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value) and "re-save" in str(e.value)


def test_corrupt_checkpoint_error_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(CorruptCheckpointError("d/model.safetensors", "is empty (0 bytes)")))
    assert str(e) == "d/model.safetensors is empty (0 bytes); re-save it or point to another checkpoint"
