"""Task plugins: seeded batches, rewards, heavy-tailed lengths, jsonl parsing, tokenizer."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from dynaresize.config import Config
from dynaresize.tasks import CharTokenizer, CountTask, JsonlTask, load_jsonl, make_task
from dynaresize.tasks.count import answer_length


def test_tokenizer_round_trip_and_vocab() -> None:
    tok = CharTokenizer()
    text = "abc xyz: 0123=+-,.9"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.vocab_size <= 64
    assert {tok.pad_id, tok.bos_id, tok.eos_id} == {0, 1, 2}
    assert all(i >= 3 for i in ids)
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
    assert tok.decode([tok.eos_id], skip_special=False) == "<eos>"
    with pytest.raises(ValueError, match="'A'"):
        tok.encode("aA")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_count_batches_are_deterministic_and_ids_unique() -> None:
    task = CountTask()
    assert task.batch(3, 16, seed=7) == task.batch(3, 16, seed=7)
    assert task.batch(3, 16, seed=7) != task.batch(3, 16, seed=8)
    assert task.batch(3, 16, seed=7) != task.batch(4, 16, seed=7)
    ids = [p.id for step in range(20) for p in task.batch(step, 16, seed=0)]
    assert len(ids) == len(set(ids)) == 320
    assert task.batch(3, 16, seed=7)[0].tokens[0] == task.tokenizer.bos_id


def test_count_reward_exact_partial_and_garbage() -> None:
    task = CountTask()
    tok = task.tokenizer
    for prompt in task.batch(0, 32, seed=1):
        exact = tok.encode(prompt.answer) + [tok.eos_id]
        assert task.reward(prompt, exact) == 1.0
        assert task.reward(prompt, tok.encode(prompt.answer)) < 1.0  # never stopped
        assert task.reward(prompt, [tok.eos_id]) == 0.0
        wrong = [tok.encode("z" if prompt.answer[0] != "z" else "y")[0]] * len(prompt.answer)
        assert 0.0 < task.reward(prompt, wrong + [tok.eos_id]) < 1.0
    rng = random.Random(0)
    prompts = task.batch(1, 64, seed=1)
    garbage = [task.reward(p, [rng.randrange(3, tok.vocab_size) for _ in range(40)])
               for p in prompts]
    assert statistics.mean(garbage) < 0.1
    assert all(0.0 <= r <= 1.0 for r in garbage)


def test_count_lengths_are_heavy_tailed() -> None:
    rng = random.Random(0)
    lengths = sorted(answer_length(rng, 1.2, 32) for _ in range(20000))
    median = lengths[len(lengths) // 2]
    p99 = lengths[int(0.99 * len(lengths))]
    assert p99 / median >= 4
    assert 1 <= lengths[0] and lengths[-1] == 32
    task_lengths = [len(p.answer) for s in range(50) for p in CountTask().batch(s, 16, 0)]
    assert max(task_lengths) >= 4 * statistics.median(task_lengths)
    with pytest.raises(ValueError, match="tail_alpha"):
        CountTask(tail_alpha=0)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_task(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(10)]
    path = _write(tmp_path / "d.jsonl", [json.dumps(r) for r in rows] + [""])
    task = JsonlTask(path)
    assert len(task) == 10
    assert task.batch(2, 4, seed=3) == task.batch(2, 4, seed=3)
    epoch0 = [p.answer for s in range(5) for p in task.batch(s, 2, seed=3)]
    assert sorted(epoch0) == sorted(r["answer"] for r in rows)  # one epoch: each row once
    ids = [p.id for s in range(10) for p in task.batch(s, 4, seed=3)]
    assert len(set(ids)) == 40
    tok = task.tokenizer
    prompt = task.batch(0, 1, seed=3)[0]
    assert task.reward(prompt, tok.encode(prompt.answer) + [tok.eos_id]) == 1.0
    assert 0.0 <= task.reward(prompt, tok.encode("zzzz")) < 0.5
    near = task.reward(prompt, tok.encode(prompt.answer + "1") + [tok.eos_id])
    assert 0.5 < near < 1.0


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"prompt": "a"}', r":2: missing field 'answer'"),
        ('{"prompt": 3, "answer": "b"}', r":2: field 'prompt' must be a string"),
        ('{"prompt": "a", "answer": "B"}', r":2: field 'answer' has character 'B'"),
        ("not json", r":2: not valid JSON"),
        ("[1, 2]", r":2: expected an object"),
    ],
)
def test_jsonl_errors_name_file_line_field(tmp_path: Path, line: str, match: str) -> None:
    path = _write(tmp_path / "bad.jsonl", ['{"prompt": "a", "answer": "b"}', line])
    with pytest.raises(ValueError, match=match) as info:
        load_jsonl(path)
    assert "bad.jsonl" in str(info.value)


def test_make_task(tmp_path: Path) -> None:
    cfg = Config()
    assert isinstance(make_task(cfg), CountTask)
    cfg.task.name = "jsonl"
    cfg.task.path = str(_write(tmp_path / "d.jsonl", ['{"prompt": "a", "answer": "b"}']))
    assert isinstance(make_task(cfg), JsonlTask)
    cfg.task.name = "nope"
    with pytest.raises(ValueError, match="task.name"):
        make_task(cfg)
