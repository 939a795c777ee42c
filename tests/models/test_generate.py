"""Generation: KV-cached decoding equals full recomputation; greedy, beam search and
sampling agree where they must; learned positions refuse to run past max_len."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from attnlab.models import (
    CausalLM,
    CausalLMConfig,
    EncoderDecoder,
    Generative,
    Seq2SeqConfig,
    generate,
)
from attnlab.models.generate import filter_logits
from helpers import TOL


def lm(positional="sinusoidal", vocab=37, **kw) -> CausalLM:
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=vocab, dim=40, heads=5, layers=2, positional=positional, max_len=64, **kw)
    return CausalLM(cfg).eval()


def s2s(positional="sinusoidal", **kw) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=23, tgt_vocab_size=19, dim=32, heads=4, layers=2, decoder_layers=3,
                        positional=positional, max_len=64, **kw)
    return EncoderDecoder(cfg).eval()


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi", "t5", "none"])
def test_causal_lm_cache_equals_full_forward(positional):
    model = lm(positional, kv_heads=1 if positional == "rotary" else None)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 37, (3, 13), generator=g)
    with torch.no_grad():
        full = model(tokens).logits  # (B, N, V)
        cache = model.new_cache(capacity=2)  # forces the cache to grow
        steps = [model(tokens[:, :5], cache=cache).logits]  # a prompt chunk, then one token at a time
        for t in range(5, 13):
            steps.append(model(tokens[:, t : t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL[torch.float32])
    assert cache.length == 13


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi"])
def test_causal_lm_cached_greedy_equals_recompute(positional):
    model = lm(positional)
    prompt = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(2))
    fast = generate(model, prompt, max_new_tokens=12, eos_id=None)
    slow = generate(model, prompt, max_new_tokens=12, eos_id=None, use_cache=False)
    assert fast.shape == (2, 18)
    assert torch.equal(fast, slow)
    assert torch.equal(fast[:, :6], prompt)
    # greedy really takes the argmax of the full forward at every step
    with torch.no_grad():
        logits = model(fast[:, :-1]).logits[:, 5:]  # (B, 12, V)
    assert torch.equal(logits.argmax(-1), fast[:, 6:])


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "t5"])
def test_seq2seq_cache_equals_full_decode(positional):
    model = s2s(positional)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, 23, (2, 9), generator=g)
    src_mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    tgt = torch.randint(3, 19, (2, 7), generator=g)
    with torch.no_grad():
        full = model(src, tgt, src_mask).logits  # (B, T, V)
        memory = model.encode(src, src_mask).last_hidden_state
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache).logits for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL[torch.float32])
    fast = generate(model, src, max_new_tokens=10, src_mask=src_mask, eos_id=None)
    slow = generate(model, src, max_new_tokens=10, src_mask=src_mask, eos_id=None, use_cache=False)
    assert torch.equal(fast, slow)
    assert fast.shape == (2, 11) and bool((fast[:, 0] == model.config.bos_id).all())


def test_seq2seq_padding_does_not_change_translation():
    model = s2s()
    src = torch.randint(3, 23, (1, 5), generator=torch.Generator().manual_seed(4))
    padded = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    alone = generate(model, src, max_new_tokens=6, eos_id=None)
    batch = generate(model, torch.cat([padded, padded]), max_new_tokens=6, eos_id=None,
                     src_mask=torch.tensor([[1] * 5 + [0] * 4, [1] * 5 + [0] * 4]))
    assert torch.equal(batch[0], alone[0]) and torch.equal(batch[1], alone[0])


def test_greedy_stops_at_eos_and_pads():
    model = lm()
    prompt = torch.randint(0, 37, (4, 3), generator=torch.Generator().manual_seed(5))
    ref = generate(model, prompt, max_new_tokens=8, eos_id=None)
    eos = int(ref[0, 5])  # the third generated token of row 0 becomes "end of sequence"
    out = generate(model, prompt, max_new_tokens=8, eos_id=eos, pad_id=36)
    for row_out, row_ref in zip(out, ref):
        new = row_ref[3:].tolist()
        stop = new.index(eos) + 1 if eos in new else len(new)
        assert row_out[3 : 3 + stop].tolist() == new[:stop]
        assert bool((row_out[3 + stop :] == 36).all())


@pytest.mark.parametrize("use_eos", [False, True])
def test_beam_one_equals_greedy(use_eos):
    model = lm()
    prompt = torch.randint(0, 37, (3, 4), generator=torch.Generator().manual_seed(6))
    ref = generate(model, prompt, max_new_tokens=10, eos_id=None)
    eos = int(ref[1, 7]) if use_eos else None
    greedy = generate(model, prompt, max_new_tokens=10, eos_id=eos)
    beam = generate(model, prompt, max_new_tokens=10, eos_id=eos, num_beams=1, early_stopping=True)
    width = beam.shape[1]
    assert torch.equal(beam, greedy[:, :width]) and bool((greedy[:, width:] == 0).all())


def _seq_logprob(model, prompt, new):
    with torch.no_grad():
        logits = model(torch.cat([prompt, new], dim=1)[:, :-1]).logits[:, prompt.shape[1] - 1 :]
    return logits.log_softmax(-1).gather(-1, new[..., None]).sum().item()


def test_wide_beam_finds_the_most_likely_sequence():
    """With num_beams >= V^(L-1) beam search is exhaustive: it must find the brute-force argmax."""
    model = lm(vocab=5)
    prompt = torch.tensor([[1, 4, 2]])
    L = 3
    best = max(
        itertools.product(range(5), repeat=L),
        key=lambda seq: _seq_logprob(model, prompt, torch.tensor([seq])),
    )
    out = generate(model, prompt, max_new_tokens=L, eos_id=None, num_beams=25, length_penalty=0.0)
    assert out[0, 3:].tolist() == list(best)


def test_beam_search_cache_reorder_matches_recompute():
    model = s2s()
    src = torch.randint(3, 23, (3, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3])
    kw = dict(max_new_tokens=7, num_beams=4, src_mask=mask, eos_id=3, length_penalty=0.7)
    fast = generate(model, src, **kw)
    slow = generate(model, src, use_cache=False, **kw)
    assert torch.equal(fast, slow)
    # beam search (no eos, no length penalty) never scores below greedy on this model
    lmod = lm()
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(8))
    greedy = generate(lmod, prompt, max_new_tokens=6, eos_id=None)
    beam = generate(lmod, prompt, max_new_tokens=6, eos_id=None, num_beams=5, length_penalty=0.0)
    assert _seq_logprob(lmod, prompt, beam[:, 4:]) >= _seq_logprob(lmod, prompt, greedy[:, 4:]) - 1e-5


def test_sampling_top_k_one_is_greedy_and_seed_reproducible():
    model = lm()
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(9))
    greedy = generate(model, prompt, max_new_tokens=9, eos_id=None)
    k1 = generate(model, prompt, max_new_tokens=9, eos_id=None, do_sample=True, top_k=1, temperature=3.0, seed=0)
    assert torch.equal(k1, greedy)
    a = generate(model, prompt, max_new_tokens=20, eos_id=None, do_sample=True, temperature=2.0, seed=11)
    b = generate(model, prompt, max_new_tokens=20, eos_id=None, do_sample=True, temperature=2.0, seed=11)
    c = generate(model, prompt, max_new_tokens=20, eos_id=None, do_sample=True, temperature=2.0, seed=12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    nocache = generate(model, prompt, max_new_tokens=20, eos_id=None, do_sample=True, temperature=2.0, seed=11,
                       use_cache=False)
    assert torch.equal(a, nocache)


def test_filter_logits_top_k_and_nucleus():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    kept = filter_logits(logits, top_p=0.7).isfinite()
    assert kept.tolist() == [[False, True, False, True]]  # 0.5 < 0.7 <= 0.5 + 0.3
    assert filter_logits(logits, top_p=0.5).isfinite().tolist() == [[False, True, False, False]]
    assert filter_logits(logits, top_k=3).isfinite().tolist() == [[False, True, True, True]]
    assert filter_logits(logits, top_k=2, top_p=0.99).isfinite().sum().item() == 2
    # a sample with a nucleus never picks a token outside it
    model = lm()
    prompt = torch.randint(0, 37, (4, 3), generator=torch.Generator().manual_seed(10))
    out = generate(model, prompt, max_new_tokens=1, eos_id=None, do_sample=True, top_p=0.3, seed=1)
    with torch.no_grad():
        allowed = filter_logits(model(prompt).logits[:, -1], top_p=0.3).isfinite()
    assert bool(allowed.gather(1, out[:, -1:]).all())


def test_learned_positions_beyond_max_len_raise():
    model = lm("learned")
    prompt = torch.randint(0, 37, (1, 60))
    with pytest.raises(ValueError, match="max_len=64"):
        generate(model, prompt, max_new_tokens=10, eos_id=None)
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.randint(0, 37, (1, 65)))


def test_generate_argument_errors():
    model = lm()
    prompt = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, max_new_tokens=0)
    with pytest.raises(ValueError, match="num_beams"):
        generate(model, prompt, max_new_tokens=2, do_sample=True, num_beams=2)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt, max_new_tokens=2, do_sample=True, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, max_new_tokens=2, do_sample=True, temperature=0)
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.full((1, 2), 37), max_new_tokens=2)
    model.train()
    generate(model, prompt, max_new_tokens=2)
    assert model.training  # mode restored


class _Counter(torch.nn.Module):
    """The smallest :class:`Generative` model: the token after ``t`` is ``t + 1`` (mod ``vocab``).

    It is neither a CausalLM nor an EncoderDecoder: ``generate`` must drive it through
    the protocol alone. Its state records the reorders beam search asks for.
    """

    def __init__(self, vocab: int = 7):
        super().__init__()
        self.vocab = vocab
        self.config = SimpleNamespace(eos_id=None, pad_id=0)
        self.reorders: list = []

    def start_generation(self, inputs, *, max_new_tokens, use_cache=True, src_mask=None):
        return inputs, SimpleNamespace(reorder=self.reorders.append)

    def generation_step(self, tokens, state):
        return torch.nn.functional.one_hot((tokens[:, -1] + 1) % self.vocab, self.vocab).float()  # (B, V)


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_drives_any_model_through_the_protocol(beams):
    model = _Counter()
    assert isinstance(model, Generative) and isinstance(lm(), Generative) and isinstance(s2s(), Generative)
    out = generate(model, torch.tensor([[3], [6]]), max_new_tokens=4, num_beams=beams)
    assert out.tolist() == [[3, 4, 5, 6, 0], [6, 0, 1, 2, 3]]
    assert bool(model.reorders) == (beams > 1)  # beams expand the batch, then follow the survivors


def test_generate_rejects_a_model_without_the_protocol():
    with pytest.raises(ValueError, match="start_generation and generation_step.*got Linear"):
        generate(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)
