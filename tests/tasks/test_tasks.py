"""Task data: generators and readers are deterministic, splits are disjoint, labels are right
(ListOps against an independent evaluator), missing files give errors that say what to pass."""

from __future__ import annotations

import gzip
import inspect
import math
import statistics
from pathlib import Path

import pytest
import torch

from attnlab.tasks import MissingDataError, create_task, tasks
from attnlab.tasks.base import EpochBatcher, read_lines, slice_batch
from attnlab.tasks.listops import VOCAB, generate_listops


def test_registry_lists_every_task():
    assert set(tasks()) == {"copy", "reverse", "sort", "associative-recall", "mqar", "listops", "chars", "passkey",
                            "translation", "sentiment", "digits", "cora", "citeseer", "moving-digits", "icl-linear",
                            "cluttered-digits"}
    with pytest.raises(ValueError, match="task must be one of"):
        create_task("nope")
    with pytest.raises(ValueError, match="unknown options"):
        create_task("copy", bogus=1)
    with pytest.raises(ValueError, match="length must be a int|must be a int"):
        create_task("copy", length="abc")


# -- synthetic ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_transform_tasks_targets(name):
    t = create_task(name, seed=3, length=7, vocab=5)
    t.ensure_setup()
    b = t.train_batch(4, 9)
    tok, m = b["tokens"], b["target_mask"]
    assert tok.shape == (9, 15) and m.shape == (9, 14)
    x, sep, y = tok[:, :7], tok[:, 7], tok[:, 8:]
    assert bool((sep == 1).all()) and bool(((x >= 2) & (x < 7)).all())
    want = {"copy": x, "reverse": x.flip(1), "sort": x.sort(1).values}[name]
    torch.testing.assert_close(y, want)
    assert bool(m[:, 7:].all()) and not bool(m[:, :7].any())
    torch.testing.assert_close(t.train_batch(4, 9)["tokens"], tok)  # a function of (seed, step)
    assert not torch.equal(t.train_batch(5, 9)["tokens"], tok)


@pytest.mark.parametrize("queries", [1, 3])
def test_associative_recall_answer_is_the_querys_value(queries):
    t = create_task("associative-recall", seed=1, pairs=5, keys=7, values=4, queries=queries)
    t.ensure_setup()
    b = t.train_batch(0, 50)
    tok, mask = b["tokens"], b["target_mask"]
    assert tok.shape == (50, 10 + 2 * queries)
    for row, m in zip(tok.tolist(), mask.tolist()):
        keys, values = row[0:10:2], row[1:10:2]
        assert len(set(keys)) == 5 and all(1 <= k <= 7 for k in keys) and all(8 <= v <= 11 for v in values)
        asked = row[10::2]
        assert len(set(asked)) == queries
        for j, q in enumerate(asked):
            assert q in keys and row[11 + 2 * j] == values[keys.index(q)]
        assert [i + 1 for i, x in enumerate(m) if x] == [11 + 2 * j for j in range(queries)]  # loss on answers only


def test_rank_slices_tile_the_global_batch():
    t = create_task("copy", seed=0, length=3)
    whole = t.train_batch(2, 8)["tokens"]
    parts = [t.train_batch(2, 8, rank=r, world=4)["tokens"] for r in range(4)]
    torch.testing.assert_close(torch.cat(parts), whole)
    with pytest.raises(ValueError, match="divisible"):
        slice_batch({"x": torch.zeros(6)}, 0, 4)


def test_epoch_batcher_covers_each_epoch_and_is_deterministic():
    lengths = [i % 13 for i in range(97)]
    b = EpochBatcher(97, 8, seed=5, lengths=lengths, pool=3)
    assert b.per_epoch == 12
    seen = [i for s in range(12) for i in b.indices(s)]
    assert len(seen) == 96 and len(set(seen)) == 96
    again = EpochBatcher(97, 8, seed=5, lengths=lengths, pool=3)
    assert [again.indices(s) for s in range(30)] == [b.indices(s) for s in range(30)]
    assert b.indices(12) != b.indices(0)  # a new epoch, a new order
    assert b.position(13) == {"epoch": 1, "batch_in_epoch": 1, "batches_per_epoch": 12}


# -- ListOps --------------------------------------------------------------------------
def _independent_value(tokens: list[str]) -> int:
    """Evaluate a ListOps string with a stack (no recursion, no code shared with the generator)."""
    stack: list[tuple[str, list[int]]] = []
    result = None
    for tok in tokens:
        if tok.startswith("["):
            stack.append((tok[1:], []))
        elif tok == "]":
            op, args = stack.pop()
            if op == "MIN":
                v = min(args)
            elif op == "MAX":
                v = max(args)
            elif op == "MED":
                v = math.floor(statistics.median(args))
            else:
                assert op == "SM"
                v = sum(args) % 10
            if stack:
                stack[-1][1].append(v)
            else:
                result = v
        else:
            d = int(tok)
            if stack:
                stack[-1][1].append(d)
            else:
                result = d
    assert not stack
    return result


def test_listops_labels_match_an_independent_evaluator():
    data = generate_listops(300, seed=11, min_length=5, max_length=60, max_depth=5, max_args=6)
    for toks, label in data:
        assert 5 <= len(toks) <= 60 and set(toks) <= set(VOCAB[2:])
        assert toks.count("]") == sum(t.startswith("[") for t in toks)
        assert label == _independent_value(toks)
    assert len({" ".join(t) for t, _ in data}) == 300  # duplicates removed
    assert {y for _, y in data} == set(range(10))
    ops = {t for toks, _ in data for t in toks if t.startswith("[")}
    assert ops == {"[MIN", "[MAX", "[MED", "[SM"}


def test_listops_labels_at_lra_length_match_the_independent_evaluator():
    data = generate_listops(12, seed=5, min_length=500, max_length=1999)
    for toks, label in data:
        assert 500 <= len(toks) <= 1999
        assert label == _independent_value(toks)


def test_listops_med_rounds_down():
    from attnlab.tasks.listops import apply_op

    assert apply_op("[MED", [1, 4]) == 2 and apply_op("[MED", [9, 0, 4]) == 4 and apply_op("[SM", [9, 8]) == 7


def test_listops_splits_fixed_by_seed_and_disjoint():
    opts = dict(train_size=120, val_size=30, test_size=30, min_length=5, max_length=50, max_depth=4)
    a, b, c = (create_task("listops", seed=s, **opts) for s in (2, 2, 3))
    for t in (a, b, c):
        t.ensure_setup()
    key = {k: {" ".join(x) for x, _ in v} for k, v in a.splits.items()}
    assert len(key["train"]) == 120 and not (key["train"] & key["val"]) and not (key["train"] & key["test"])
    assert not (key["val"] & key["test"])
    assert a.splits == b.splits and a.splits != c.splits
    batch = a.train_batch(0, 16)
    assert bool((batch["tokens"][:, 0] == 1).all()) and batch["mask"].shape == batch["tokens"].shape
    with pytest.raises(ValueError, match="min_length"):
        generate_listops(3, seed=0, min_length=10, max_length=5)


# -- file-based tasks -----------------------------------------------------------------
def test_chars_reads_any_text_file(tmp_path):
    text = "".join(chr(97 + (i * 7) % 26) for i in range(1000))
    (tmp_path / "t.txt").write_text(text)
    t = create_task("chars", data=str(tmp_path / "t.txt"), context=8)
    t.ensure_setup()
    assert len(t.train_ids) == 900 and len(t.val_ids) == 100
    assert t.vocab.decode(t.train_ids[:20].tolist()) == text[:20]
    assert t.vocab.decode(t.val_ids.tolist()) == text[900:]
    b = t.train_batch(3, 5)["tokens"]
    assert b.shape == (5, 9)
    torch.testing.assert_close(t.train_batch(3, 5)["tokens"], b)


@pytest.mark.parametrize("name,hint", [("chars", "tinyshakespeare"), ("translation", "multi30k"),
                                       ("sentiment", "sentiment")])
def test_missing_data_says_which_path_and_how(name, hint, tmp_path, no_data):
    with pytest.raises(MissingDataError, match=rf"run: attnlab data fetch {hint} "):
        create_task(name).ensure_setup()
    with pytest.raises(MissingDataError, match="does not exist"):
        create_task(name, data=str(tmp_path / "absent")).ensure_setup()


def _write_pairs(directory: Path, n: int, gz: bool) -> None:
    de = ["ein", "mann", "hund", "frau", "sieht", "rot", "blau", "katze"]
    en = ["a", "man", "dog", "woman", "sees", "red", "blue", "cat"]
    g = torch.Generator().manual_seed(0)
    for split, count in (("train", n), ("val", 20), ("test", 20)):
        src, tgt = [], []
        for _ in range(count):
            idx = torch.randint(0, 8, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
            src.append(" ".join(de[i] for i in idx) + ".")
            tgt.append(" ".join(en[i] for i in idx).capitalize() + ".")
        for lang, lines in (("de", src), ("en", tgt)):
            data = ("\n".join(lines) + "\n").encode()
            if gz:
                (directory / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / f"{split}.{lang}").write_bytes(data)


def test_translation_reads_aligned_files_and_batches(tmp_path):
    _write_pairs(tmp_path, 200, gz=True)
    t = create_task("translation", data=str(tmp_path), test="test", vocab_size=60)
    t.ensure_setup()
    assert len(t.ids["train"]) == 200 and len(t.ids["test"]) == 20
    src, tgt = t.text["val"][0][3], t.text["val"][1][3]
    ids = t.tgt_tok.encode(tgt).ids
    assert t.tgt_tok.decode(ids) == tgt  # decoding restores the raw text
    s_ids, t_ids = t.ids["val"][3]
    assert s_ids[-1] == 2 and t_ids[0] == 1 and t_ids[-1] == 2 and t.src_tok.decode(s_ids[:-1]) == src
    b = t.train_batch(0, 16)
    assert b["src"].shape[0] == 16 and bool((b["tgt"][:, 0] == 1).all())
    assert bool((b["src_mask"] == (b["src"] != 0)).all())
    cfg = t.model_config()
    assert cfg["src_vocab_size"] <= 60 and cfg["bos_id"] == 1 and cfg["eos_id"] == 2


def test_translation_errors_name_the_missing_file(tmp_path):
    _write_pairs(tmp_path, 30, gz=False)
    (tmp_path / "test_2016_flickr.de").write_text("x\n")
    with pytest.raises(MissingDataError, match="test_2016_flickr.en"):
        create_task("translation", data=str(tmp_path)).ensure_setup()
    (tmp_path / "test.en").write_text("only one line\n")
    with pytest.raises(ValueError, match="as many lines"):
        create_task("translation", data=str(tmp_path), test="test").ensure_setup()


def test_sentiment_reads_tsv_and_keeps_nel_inside_lines(tmp_path):
    rows = [f"review {i} was {'good' if i % 2 else 'bad'}\u0085 really\t{i % 2}" for i in range(50)]
    (tmp_path / "a.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("fine\t1\nawful\t0\n", encoding="utf-8")
    assert len(read_lines(tmp_path / "a.txt")) == 50
    t = create_task("sentiment", data=str(tmp_path), seed=4)
    t.ensure_setup()
    sizes = {k: len(v) for k, v in t.text.items()}
    assert sizes == {"train": 42, "val": 5, "test": 5}
    all_rows = [r for v in t.text.values() for r in v]
    assert len({s for s, _ in all_rows}) == 52 and t.num_classes == 2
    (tmp_path / "c.txt").write_text("no label here\n")
    with pytest.raises(ValueError, match="c.txt:1"):
        create_task("sentiment", data=str(tmp_path)).ensure_setup()


def test_digits_splits():
    pytest.importorskip("sklearn")
    t = create_task("digits", seed=0)
    t.ensure_setup()
    n = {k: len(v[1]) for k, v in t.splits.items()}
    assert sum(n.values()) == 1797 and n["val"] == 180
    imgs = t.train_batch(0, 10)["images"]
    assert imgs.shape == (10, 1, 8, 8)
    train_images = t.splits["train"][0]
    torch.testing.assert_close(train_images.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)  # standardized
    torch.testing.assert_close(train_images.std(), torch.tensor(1.0), atol=1e-5, rtol=0)


def test_translation_from_two_files_cuts_its_own_splits(tmp_path, monkeypatch):
    src = [f"wort{i % 7} nummer{i % 5}" for i in range(300)]
    tgt = [f"word{i % 7} number{i % 5}" for i in range(300)]
    (tmp_path / "a.de").write_text("\n".join(src) + "\n")
    (tmp_path / "a.en").write_text("\n".join(tgt) + "\n")
    monkeypatch.chdir(tmp_path)
    t = create_task("translation", data="a.de,a.en", vocab_size=50, seed=1)
    t.ensure_setup()
    sizes = {k: len(v[0]) for k, v in t.text.items()}
    assert sizes == {"train": 294, "val": 3, "test": 3}
    for split in ("train", "val", "test"):  # still aligned after the shuffle
        for s, g in zip(*t.text[split]):
            assert s.replace("wort", "word").replace("nummer", "number") == g


# -- MQAR ---------------------------------------------------------------------------------


def _mqar_block(tokens: torch.Tensor, pairs: int, keys: int) -> int:
    """Where the block of pairs starts: the first key token (keys are ids 1..keys; queries come after the block)."""
    return int(((tokens >= 1) & (tokens <= keys)).nonzero()[0])


def _mqar_answers(tokens: torch.Tensor, pairs: int, keys: int) -> list[tuple[int, int]]:
    """``(position of the answer's input, expected answer)`` recomputed from one sequence's pairs."""
    start = _mqar_block(tokens, pairs, keys)
    table = {int(tokens[start + 2 * i]): int(tokens[start + 2 * i + 1]) for i in range(pairs)}
    out = []
    for pos in range(start + 2 * pairs, tokens.shape[0] - 1):
        t = int(tokens[pos])
        if t in table and (pos - start - 2 * pairs) % 2 == 0:
            out.append((pos, table[t]))
    return out


@pytest.mark.parametrize("length,pairs,layout,placement", [(64, 8, "random", "uniform"), (200, 16, "random", "power"),
                                                           (67, 16, "start", "uniform"), (301, 7, "random", "power")])
def test_mqar_answers_are_the_queried_keys_values(length, pairs, layout, placement):
    t = create_task("mqar", seed=3, length=length, pairs=pairs, keys=2 * pairs, values=5, fillers=2, layout=layout,
                    placement=placement)
    b = t.train_batch(7, 6)
    tokens, mask = b["tokens"], b["target_mask"]
    assert tokens.shape == (6, length) and mask.shape == (6, length - 1)
    for row, m in zip(tokens, mask):
        start = _mqar_block(row, pairs, 2 * pairs)
        assert start == 0 or layout == "random"
        keys = row[start: start + 2 * pairs: 2]
        assert len(set(keys.tolist())) == pairs and bool(((keys >= 1) & (keys <= 2 * pairs)).all())
        answers = _mqar_answers(row, pairs, 2 * pairs)
        assert len(answers) == pairs  # every key asked exactly once, after the pairs
        assert sorted(int(row[p]) for p, _ in answers) == sorted(keys.tolist())
        assert m.nonzero().flatten().tolist() == [p for p, _ in answers]  # the loss counts only the answers
        for p, want in answers:
            assert int(row[p + 1]) == want
        inside = torch.zeros(length, dtype=torch.bool)
        inside[start: start + 2 * pairs] = True
        for p, _ in answers:
            inside[p: p + 2] = True
        assert bool((row[~inside] > 2 * pairs + 5).all())  # everything else is filler


def test_mqar_blocks_sit_at_random_offsets_and_queries_follow_the_power_law():
    t = create_task("mqar", seed=0, length=512, pairs=8, keys=16, placement="power")
    tokens = t.train_batch(0, 256)["tokens"]
    starts = torch.tensor([_mqar_block(r, 8, 16) for r in tokens])
    assert starts.min() < 64 and starts.max() > 400 and len(set(starts.tolist())) > 100  # spread over the sequence
    assert all(_mqar_block(r, 8, 16) == 0 for r in create_task("mqar", length=512, pairs=8, keys=16,
                                                               layout="start").train_batch(0, 8)["tokens"])
    gaps_power, gaps_uniform = [], []
    for placement, gaps in (("power", gaps_power), ("uniform", gaps_uniform)):
        task = create_task("mqar", seed=1, length=512, pairs=8, keys=16, layout="start", placement=placement)
        for row in task.train_batch(0, 128)["tokens"]:
            gaps += [p - 16 for p, _ in _mqar_answers(row, 8, 16)]
    assert sorted(gaps_power)[len(gaps_power) // 2] < sorted(gaps_uniform)[len(gaps_uniform) // 2] / 3  # most near


def test_a_reader_of_the_first_64_positions_scores_at_chance():
    """With the pairs at a random offset, knowing the first 64 tokens tells almost nothing: no layout artefact."""
    values = 16
    t = create_task("mqar", seed=0, length=1024, pairs=16, keys=32, values=values, val_size=512)
    tokens, mask = t.example_batch("test", 512).values()
    right = total = 0
    for row, m in zip(tokens, mask):
        seen = {int(row[i]): int(row[i + 1]) for i in range(63) if 1 <= int(row[i]) <= 32}
        for p in m.nonzero().flatten().tolist():  # the answer is row[p + 1], its key row[p]
            guess = seen.get(int(row[p]), 33)  # a key it saw: its value; else the first value id
            right += guess == int(row[p + 1])
            total += 1
    chance = 1 / values
    assert right / total < chance + 0.08, (right / total, chance)
    start = create_task("mqar", seed=0, length=1024, pairs=16, keys=32, values=values, val_size=64, layout="start")
    tokens, mask = start.example_batch("test", 64).values()
    hits = sum(int(row[int(p) + 1]) == {int(row[i]): int(row[i + 1]) for i in range(0, 32, 2)}[int(row[int(p)])]
               for row, m in zip(tokens, mask) for p in m.nonzero().flatten())
    assert hits == 64 * 16  # the old layout: the first 64 positions held every answer


def test_mqar_is_deterministic_per_seed_and_checks_its_options():
    a, b, c = (create_task("mqar", seed=s, length=128, pairs=8) for s in (1, 1, 2))
    assert torch.equal(a.train_batch(4, 8)["tokens"], b.train_batch(4, 8)["tokens"])
    assert not torch.equal(a.train_batch(4, 8)["tokens"], c.train_batch(4, 8)["tokens"])
    assert not torch.equal(a.train_batch(4, 8)["tokens"], a.train_batch(5, 8)["tokens"])
    a.ensure_setup()
    assert not torch.equal(a._val[0], a._test[0])  # validation and test are different draws
    with pytest.raises(ValueError, match="length >= 4 \\* pairs"):
        create_task("mqar", length=60, pairs=16).model_config()
    with pytest.raises(ValueError, match="pairs <= keys"):
        create_task("mqar", length=256, pairs=16, keys=8).model_config()
    with pytest.raises(ValueError, match="layout must be 'random' or 'start'"):
        create_task("mqar", layout="middle").model_config()
    assert a.baseline() == pytest.approx(max(torch.bincount(a._test[0][:, 1:][a._test[1]]).tolist()) / (512 * 8))


def test_chars_reports_bits_per_char_and_accuracy(tmp_path):
    from torch import nn

    text = tmp_path / "t.txt"
    text.write_text("abcabcabdabcabc" * 40)
    task = create_task("chars", data=str(text), context=8)
    task.ensure_setup()

    class Uniform(nn.Module):
        def __init__(self, v):
            super().__init__()
            self.v = v
            self.p = nn.Parameter(torch.zeros(1))

        def forward(self, t):
            from types import SimpleNamespace

            return SimpleNamespace(logits=torch.zeros(*t.shape, self.v) + self.p)

    m = task.evaluate(Uniform(len(task.vocab)), "val", batch_size=4, max_batches=2)
    assert m["loss"] == pytest.approx(math.log(len(task.vocab)))
    assert m["bits_per_char"] == pytest.approx(math.log2(len(task.vocab)))
    assert 0.0 <= m["accuracy"] <= 1.0


# -- the loss's weights flag ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(tasks()))
def test_every_task_loss_takes_return_weights(name):
    params = inspect.signature(tasks()[name].loss).parameters
    assert "return_weights" in params and "output_attentions" not in params


# -- passkey ------------------------------------------------------------------------------


def _shakespeare():
    from helpers import fetched

    return str(fetched("tinyshakespeare") / "input.txt")


def test_passkey_key_is_recoverable_and_every_depth_decile_is_present():
    from attnlab.tasks.passkey import NEEDLE, QUESTION, find_key

    t = create_task("passkey", data=_shakespeare(), length=300, digits=5, val_size=50)
    t.ensure_setup()
    rows = t.texts_of("test", 50)
    for text, key, _depth in rows:
        assert len(text) == 300 and find_key(text) == key and text.endswith(QUESTION + key)
        assert text.count(NEEDLE.format(key=key)) == 1 and len(key) == 5 and key.isdigit()
    assert sorted({int(10 * d) for _, _, d in rows}) == list(range(10))  # stratified depths
    batch = t.example_batch("test", 50)
    for (text, key, _), tokens, mask in zip(rows, batch["tokens"], batch["target_mask"]):
        assert t.vocab.decode(tokens.tolist()) == text  # the batch holds exactly these texts
        assert t.vocab.decode(tokens[1:][mask].tolist()) == key  # the loss counts only the key's digits
    assert t.baseline() <= 2 / 50  # a constant guess: chance
    assert t.texts_of("val", 5)[0][0] != rows[0][0]  # validation and test are other passages
    assert t.at_length(2048).options["length"] == 2048


def test_passkey_checks_its_options():
    with pytest.raises(ValueError, match="passkey needs length >="):
        create_task("passkey", data="x", length=128, digits=12).at_length(128)
    with pytest.raises(ValueError, match="beyond what task 'passkey' supports"):
        create_task("passkey", data="x").at_length(64)


def test_chars_baseline_is_a_smoothed_bigram(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abababababab" * 30 + "ab" * 20)
    t = create_task("chars", data=str(text), context=16, train_fraction=0.8)
    # a perfectly alternating text: the bigram model is nearly certain of every next character
    assert t.baseline() < 0.2
    assert t.lower_is_better and t.score_metric == "bits_per_char" and t.attention_mask == "causal"


def test_mqar_short_phases_ask_the_pairs_that_fit():
    t = create_task("mqar", pairs=16, keys=32, length=1024)
    assert t.at_length(32).options["pairs"] == 8 and t.at_length(64).options["pairs"] == 16
    assert t.at_length(32).options["keys_used"] == 16 and t.at_length(64).options["keys_used"] == 0  # all 32
    assert t.at_length(32).model_config()["vocab_size"] == t.model_config()["vocab_size"]  # every id keeps its role
    def keys_in(task):
        tokens = task.train_batch(0, 64)["tokens"]
        return tokens[(tokens >= 1) & (tokens <= 32)]

    assert int(keys_in(t.at_length(32)).max()) <= 16 < int(keys_in(t).max())  # a short phase draws half the keys
    assert t.at_length(1024) is t  # already that long
    dense = t.at_length(32).train_batch(0, 4)["target_mask"]
    assert int(dense.sum()) == 4 * 8  # every pair asked, the queries fill the rest of the sequence
