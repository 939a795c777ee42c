"""Models: layer parity with torch, padding invariance, attention weights, checkpointing,
efficient mechanisms from config, and a few training steps with falling loss."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from attnlab.layers import MultiHeadAttention
from attnlab.models import (
    Bert,
    BertConfig,
    CausalLM,
    CausalLMConfig,
    ClassifierConfig,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    Seq2SeqConfig,
    SequenceClassifier,
    TransformerConfig,
    ViT,
    ViTConfig,
)
from helpers import TOL


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- layers ---------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch_transformer_layer(norm_first):
    """Post-norm is ``norm(x + attn(x))``; pre-norm ``x + attn(norm(x))``: the torch layer computes both."""
    ref = nn.TransformerEncoderLayer(36, 9, dim_feedforward=59, dropout=0.0, activation="gelu",
                                     batch_first=True, norm_first=norm_first).eval()
    cfg = TransformerConfig(dim=36, heads=9, ff_dim=59, norm_first=norm_first, positional="none")
    ours = EncoderLayer(cfg).eval()
    with torch.no_grad():
        ours.self_attn = MultiHeadAttention.from_torch(ref.self_attn)
        ours.ff.fc1.load_state_dict(ref.linear1.state_dict())
        ours.ff.fc2.load_state_dict(ref.linear2.state_dict())
        ours.norm1.load_state_dict(ref.norm1.state_dict())
        ours.norm2.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(2, 7, 36)
    keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    from attnlab import masks

    out, _ = ours(x, masks.key_mask(keep))
    expect = ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(out[0], expect[0], **TOL[torch.float32])
    torch.testing.assert_close(out[1, :4], expect[1, :4], **TOL[torch.float32])  # torch's fast path may zero padded rows


# -- padding ----------------------------------------------------------------------------
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi", "t5"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padded_batch_equals_one_by_one(positional, pooling):
    cfg = ClassifierConfig(vocab_size=30, num_classes=3, dim=32, heads=4, layers=2, positional=positional,
                           pooling=pooling, max_len=16)
    model = SequenceClassifier(cfg).eval()
    g = torch.Generator().manual_seed(1)
    lengths = [5, 1, 9]
    seqs = [torch.randint(1, 30, (n,), generator=g) for n in lengths]
    tokens = torch.zeros(3, 9, dtype=torch.long)
    keep = torch.zeros(3, 9, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        tokens[i, len(s) :] = torch.randint(1, 30, (9 - len(s),), generator=g)  # junk under the padding
        keep[i, : len(s)] = True
    with torch.no_grad():
        batch = model(tokens, keep)
        for i, s in enumerate(seqs):
            alone = model(s[None])
            torch.testing.assert_close(batch.logits[i], alone.logits[0], **TOL[torch.float32])
            torch.testing.assert_close(batch.last_hidden_state[i, : len(s)], alone.last_hidden_state[0], **TOL[torch.float32])


def test_seq2seq_padded_batch_equals_one_by_one():
    cfg = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=20, dim=32, heads=4, layers=1, positional="alibi")
    model = EncoderDecoder(cfg).eval()
    g = torch.Generator().manual_seed(2)
    src = torch.randint(3, 20, (2, 8), generator=g)
    tgt = torch.randint(3, 20, (2, 5), generator=g)
    src_mask = torch.tensor([[1] * 8, [1] * 3 + [0] * 5])
    with torch.no_grad():
        batch = model(src, tgt, src_mask).logits
        alone = model(src[1:, :3], tgt[1:]).logits
    torch.testing.assert_close(batch[1], alone[0], **TOL[torch.float32])


# -- attention weights --------------------------------------------------------------------
def test_return_weights_shapes_and_masking():
    cfg = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=21, dim=32, heads=4, layers=2, decoder_layers=3)
    model = EncoderDecoder(cfg).eval()
    src = torch.randint(3, 20, (2, 6))
    tgt = torch.randint(3, 21, (2, 4))
    src_mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4])
    with torch.no_grad():
        out = model(src, tgt, src_mask, return_weights=True)
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == 3 and len(out.cross_attentions) == 3
    assert out.encoder_attentions[0].shape == (2, 4, 6, 6)
    assert out.decoder_attentions[0].shape == (2, 4, 4, 4)
    assert out.cross_attentions[0].shape == (2, 4, 4, 6)
    for w in out.encoder_attentions + out.decoder_attentions + out.cross_attentions:
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), **TOL[torch.float32])
    assert bool((out.cross_attentions[1][1, :, :, 2:] == 0).all())  # padded source never attended
    assert bool((out.encoder_attentions[0][1, :, :, 2:] == 0).all())
    assert bool((out.decoder_attentions[2].triu(1) == 0).all())  # causal

    vit = ViT(ViTConfig(image_size=8, patch_size=4, channels=1, num_classes=2, dim=32, heads=4, layers=2)).eval()
    with torch.no_grad():
        vo = vit(torch.randn(3, 1, 8, 8), return_weights=True)
    assert [w.shape for w in vo.attentions] == [(3, 4, 5, 5)] * 2

    lm = CausalLM(CausalLMConfig(vocab_size=11, dim=32, heads=4, layers=2, positional="rotary")).eval()
    cache = lm.new_cache()
    with torch.no_grad():
        lm(torch.randint(0, 11, (1, 5)), cache=cache)
        step = lm(torch.randint(0, 11, (1, 1)), cache=cache, return_weights=True)
    assert [w.shape for w in step.attentions] == [(1, 4, 1, 6)] * 2


# -- the old weights-flag spellings ---------------------------------------------------------
_TINY = TransformerConfig(dim=24, heads=6, kv_heads=2, layers=2, ff_dim=40)
_S2S = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=21, dim=24, heads=6, layers=2, decoder_layers=2)
_TOKENS = torch.randint(3, 20, (2, 5), generator=torch.Generator().manual_seed(4))
_STATES, _MEMORY = torch.randn(2, 5, 24), torch.randn(2, 7, 24)


def _weights(out) -> tuple[torch.Tensor, ...]:
    """Every weight tensor an output holds, in a fixed order."""
    if isinstance(out, tuple):  # EncoderLayer / DecoderLayer: (x, weights...)
        return tuple(w for w in out[1:] if w is not None)
    groups = ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions")
    return tuple(w for g in groups for w in (getattr(out, g, None) or ()))


# (name, model, call(model, **flag))
_FLAG_CASES = [
    ("CausalLM", lambda: CausalLM(CausalLMConfig(vocab_size=20, dim=24, heads=6, layers=2)),
     lambda m, **f: m(_TOKENS, **f)),
    ("Encoder", lambda: Encoder(_TINY), lambda m, **f: m(_STATES, **f)),
    ("Decoder", lambda: Decoder(_TINY, cross_attention=True),
     lambda m, **f: m(_STATES, memory=_MEMORY, **f)),
    ("EncoderDecoder", lambda: EncoderDecoder(_S2S), lambda m, **f: m(_TOKENS, _TOKENS[:, :4], **f)),
    ("EncoderDecoder.encode", lambda: EncoderDecoder(_S2S), lambda m, **f: m.encode(_TOKENS, **f)),
    ("EncoderDecoder.decode", lambda: EncoderDecoder(_S2S),
     lambda m, **f: m.decode(_TOKENS[:, :4], _MEMORY, **f)),
    ("SequenceClassifier", lambda: SequenceClassifier(ClassifierConfig(vocab_size=20, num_classes=3, dim=24, heads=6)),
     lambda m, **f: m(_TOKENS, **f)),
    ("ViT", lambda: ViT(ViTConfig(image_size=8, patch_size=4, channels=1, num_classes=2, dim=24, heads=6, layers=2)),
     lambda m, **f: m(torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5)), **f)),
    ("EncoderLayer", lambda: EncoderLayer(_TINY), lambda m, **f: m(_STATES, **f)),
    ("DecoderLayer", lambda: DecoderLayer(_TINY, cross_attention=True),
     lambda m, **f: m(_STATES, memory=_MEMORY, **f)),
]


@pytest.mark.parametrize("make,call", [c[1:] for c in _FLAG_CASES], ids=[c[0] for c in _FLAG_CASES])
def test_return_weights_gives_rows_that_sum_to_one_and_nothing_without_it(make, call):
    model = make().eval()
    with torch.no_grad():
        weights, plain = _weights(call(model, return_weights=True)), _weights(call(model))
    assert weights and plain == ()
    for w in weights:  # every row of real keys is a distribution
        sums = w.sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), **TOL[torch.float32])


def test_bert_keeps_output_attentions_and_takes_return_weights():
    model = Bert(BertConfig(vocab_size=50, dim=36, layers=2, heads=9,
                            ff_dim=59)).eval()
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(6))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", DeprecationWarning)  # the Hugging Face name is not deprecated here
        hf = model(ids, output_attentions=True).attentions
        ours = model(ids, return_weights=True).attentions
        assert model(ids).attentions is None
    assert len(hf) == len(ours) == 2
    for a, b in zip(hf, ours):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


# -- mechanisms and checkpointing ----------------------------------------------------------
@pytest.mark.parametrize(
    "mechanism,settings",
    [("exact", {"backend": "chunked"}), ("performer", {"features": 16, "seed": 0}),
     ("local", {"block_size": 4}), ("nystrom", {"num_landmarks": 4})],
)
def test_mechanism_from_config(mechanism, settings):
    cfg = ClassifierConfig(vocab_size=20, num_classes=2, dim=32, heads=4, layers=1, positional="sinusoidal",
                           mechanism=mechanism, mechanism_settings=settings)
    model = SequenceClassifier(cfg)
    assert type(model.encoder.layers[0].self_attn.mechanism).name == mechanism
    tokens = torch.randint(0, 20, (2, 12))
    loss = model.loss(tokens, torch.tensor([0, 1]))
    loss.backward()
    assert loss.isfinite() and model.embed.weight.grad is not None


def test_checkpointing_gives_same_loss_and_gradients():
    base = dict(vocab_size=17, dim=32, heads=4, layers=2, positional="t5")
    plain = CausalLM(CausalLMConfig(**base))
    ckpt = CausalLM(CausalLMConfig(**base, checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 17, (3, 10))
    l1, l2 = plain.loss(tokens), ckpt.loss(tokens)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    for (name, p1), p2 in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, **TOL[torch.float32], msg=name)
    # the encoder stack, with a padding mask and a rotary transform
    enc = dict(vocab_size=17, num_classes=3, dim=32, heads=4, layers=2, positional="rotary", pooling="mean")
    plain = SequenceClassifier(ClassifierConfig(**enc))
    ckpt = SequenceClassifier(ClassifierConfig(**enc, checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    keep = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 2 + [0] * 8])
    labels = torch.tensor([0, 2, 1])
    l1, l2 = plain.loss(tokens, labels, keep), ckpt.loss(tokens, labels, keep)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    for (name, p1), p2 in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, **TOL[torch.float32], msg=name)


# -- training --------------------------------------------------------------------------------
def _train(step_loss, params, steps, lr=3e-3) -> list[float]:
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = step_loss()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _falls(losses, factor=0.6):
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < factor * first, f"loss did not fall enough: {first:.3f} -> {last:.3f}"


@pytest.mark.parametrize("norm_first", [True, False])
def test_causal_lm_learns_copy_task(norm_first):
    """Sequences ``a b c | a b c``: the second half is predictable from the first."""
    cfg = CausalLMConfig(vocab_size=12, dim=48, heads=4, layers=2, positional="rotary", norm_first=norm_first)
    model = CausalLM(cfg)
    g = torch.Generator().manual_seed(3)

    def loss():
        half = torch.randint(2, 12, (16, 6), generator=g)
        seq = torch.cat([half, torch.ones(16, 1, dtype=torch.long), half], dim=1)
        logits = model(seq).logits[:, 6:-1]  # predict the copy only
        return nn.functional.cross_entropy(logits.reshape(-1, 12), seq[:, 7:].reshape(-1))

    _falls(_train(loss, model.parameters(), 40))


def test_seq2seq_learns_reversal_task():
    cfg = Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=10, dim=48, heads=4, layers=1, positional="learned",
                        max_len=16)
    model = EncoderDecoder(cfg)
    g = torch.Generator().manual_seed(4)

    def loss():
        src = torch.randint(3, 10, (16, 5), generator=g)
        tgt = torch.cat([torch.ones(16, 1, dtype=torch.long), src.flip(1), torch.full((16, 1), 2)], dim=1)
        return model.loss(src, tgt)

    _falls(_train(loss, model.parameters(), 40))


def test_classifier_learns_majority_task():
    cfg = ClassifierConfig(vocab_size=4, num_classes=2, dim=32, heads=4, layers=1, pooling="mean",
                           positional="alibi")
    model = SequenceClassifier(cfg)
    g = torch.Generator().manual_seed(5)

    def loss():
        tokens = torch.randint(1, 3, (32, 9), generator=g)  # ids 1 and 2
        labels = ((tokens == 2).sum(1) > 4).long()
        return model.loss(tokens, labels)

    _falls(_train(loss, model.parameters(), 30))


def test_vit_learns_bright_half_task():
    """Class = which half (left/right) of a random 8x8 image is brighter (that half gets +0.5)."""
    cfg = ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=2, dim=32, heads=4, layers=1)
    model = ViT(cfg)
    g = torch.Generator().manual_seed(6)

    def loss():
        labels = torch.randint(0, 2, (32,), generator=g)
        images = torch.rand(32, 1, 8, 8, generator=g)
        images[labels == 1, :, :, :4] += 0.5
        images[labels == 0, :, :, 4:] += 0.5
        return model.loss(images, labels)

    _falls(_train(loss, model.parameters(), 40))


def test_model_input_errors():
    lm = CausalLM(CausalLMConfig(vocab_size=11, dim=32, heads=4, layers=1))
    with pytest.raises(ValueError, match="tokens"):
        lm(torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        lm(torch.tensor([[3, 11]]))
    clf = SequenceClassifier(ClassifierConfig(vocab_size=11, num_classes=2, dim=32, heads=4, layers=1))
    with pytest.raises(ValueError, match="attention_mask"):
        clf(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool))
    vit = ViT(ViTConfig(image_size=8, patch_size=4, channels=1, num_classes=2, dim=32, heads=4, layers=1))
    with pytest.raises(ValueError, match=r"images must have shape \(batch, 1, 8, 8\)"):
        vit(torch.randn(2, 3, 8, 8))
    s2s = EncoderDecoder(Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, dim=32, heads=4, layers=1))
    with pytest.raises(ValueError, match="memory"):
        s2s.decode(torch.ones(1, 2, dtype=torch.long), None)


@pytest.mark.parametrize("kind", ["causal_lm", "seq2seq", "classifier"])
def test_scale_embeddings_inits_and_scales_like_vaswani(kind):
    """``scale_embeddings``: weights N(0, dim^-1/2), inputs multiplied by sqrt(dim), tied logits unscaled."""
    dim = 64
    torch.manual_seed(0)
    if kind == "causal_lm":
        model = CausalLM(CausalLMConfig(vocab_size=500, dim=dim, heads=4, layers=1, scale_embeddings=True))
        embeds, stack = [model.embed], model.decoder
    elif kind == "classifier":
        model = SequenceClassifier(ClassifierConfig(vocab_size=500, num_classes=3, dim=dim, heads=4, layers=1,
                                                    scale_embeddings=True))
        embeds, stack = [model.embed], model.encoder
    else:
        model = EncoderDecoder(Seq2SeqConfig(src_vocab_size=500, tgt_vocab_size=500, dim=dim, heads=4, layers=1,
                                             scale_embeddings=True))
        embeds, stack = [model.src_embed, model.tgt_embed], model.encoder
    for e in embeds:
        assert abs(e.weight.std().item() - dim**-0.5) < 0.01
    model.eval()
    captured = []
    handle = stack.register_forward_pre_hook(lambda mod, args: captured.append(args[0].detach()))
    tokens = torch.tensor([[5, 7, 9]])
    with torch.no_grad():
        if kind == "causal_lm":
            out = model(tokens, output_hidden_states=True)
            torch.testing.assert_close(out.logits, out.hidden_states[-1] @ model.embed.weight.T, atol=1e-4, rtol=1e-4)
        elif kind == "classifier":
            model(tokens)
        else:
            model.encode(tokens)
    handle.remove()
    torch.testing.assert_close(captured[0], embeds[0].weight[tokens] * dim**0.5)
    default = CausalLM(CausalLMConfig(vocab_size=500, dim=dim, heads=4, layers=1))
    assert default.embed_scale == 1.0 and abs(default.embed.weight.std().item() - 0.02) < 0.005


def test_eval_mode_restores_the_mode_even_after_an_error():
    """``eval_mode`` turns dropout off for the block and gives back the mode the model was in."""
    from attnlab.models.blocks import eval_mode

    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    for start in (True, False):
        model.train(start)
        with eval_mode(model):
            assert not model.training and not model[1].training
        assert model.training is start and model[1].training is start
    model.train()
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        raise RuntimeError("boom")
    assert model.training
