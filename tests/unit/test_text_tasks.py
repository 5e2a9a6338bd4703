"""Text tasks with verifiable rewards: reasoning-gym generators and a local math dataset,
scored on known right and wrong answers through a real (tiny, character-level) tokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import write_tokenizer  # noqa: E402

from dynaresize.config.schema import ConfigError  # noqa: E402
from dynaresize.tasks.text import extract_answer  # noqa: E402

ADDITIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
             "operators": ["+"], "allow_parentheses": False, "allow_negation": False}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from dynaresize.tasks.model_tokenizer import ModelTokenizer

    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path)
    return ModelTokenizer(path)


def gym(tokenizer, generator: str = "basic_arithmetic", args: dict | None = None, **kw):
    pytest.importorskip("reasoning_gym")
    from dynaresize.tasks.rgym import ReasoningGymTask

    return ReasoningGymTask(generator, ADDITIONS if args is None else args, tokenizer,
                            question_template=kw.pop("question_template", "{expression} ="),
                            **kw)


def test_extract_answer_formats() -> None:
    assert extract_answer(" 84\n12 + 3", "completion") == "84"
    assert extract_answer("\n\n", "completion") == ""
    assert extract_answer("so <answer>7</answer> or <answer> 8 </answer>", "chat") == "8"
    assert extract_answer(" no tags ", "chat") == "no tags"


def test_reasoning_gym_reward_right_and_wrong(tokenizer) -> None:
    task = gym(tokenizer, num_eval=8)
    prompt = task.batch(0, 1, seed=0)[0]
    a, b = prompt.meta[1]["metadata"]["expression"].split(" + ")
    assert prompt.answer == str(int(a) + int(b))
    enc, eos = tokenizer.encode, tokenizer.eos_id
    assert task.reward(prompt, enc(f" {prompt.answer}\n1")) == 1.0  # first line only
    assert task.reward(prompt, [*enc(prompt.answer), eos, *enc("99")]) == 1.0  # EOS ends it
    assert task.reward(prompt, enc(f" {int(prompt.answer) + 1}\n")) == 0.0
    assert task.reward(prompt, enc("\n")) == 0.0
    assert task.reward(prompt, []) == 0.0
    text = tokenizer.decode(prompt.tokens)  # few-shot completion prompt
    assert text.endswith(f"{a} + {b} =") and text.count("\n") == 3


def test_chain_sum_uses_its_score_answer(tokenizer) -> None:
    task = gym(tokenizer, "chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 2,
                                        "max_digits": 2})
    prompt = task.batch(3, 2, seed=5)[1]
    ds, entry = prompt.meta
    for answer in (prompt.answer, "12345", "x"):
        want = ds.score_answer(answer, entry)
        assert task.reward(prompt, tokenizer.encode(f" {answer}\n")) == want
    assert want == 0.0


def test_prompts_are_seeded_and_held_out_set_is_disjoint(tokenizer) -> None:
    task = gym(tokenizer, num_eval=64)
    again = gym(tokenizer, num_eval=64)
    train = [p for k in range(40) for p in task.batch(k, 8, seed=1)]
    assert [p.tokens for p in train] == [p.tokens for k in range(40)
                                         for p in again.batch(k, 8, seed=1)]
    held = task.eval_prompts(64, seed=1)
    assert all(p.id < 0 for p in held) and len({p.id for p in held}) == 64
    held_q = {p.meta[1]["metadata"]["expression"] for p in held}
    train_q = {p.meta[1]["metadata"]["expression"] for p in train}
    assert not held_q & train_q
    assert task.batch(0, 8, seed=1) != task.batch(0, 8, seed=2)


def test_chat_format_uses_the_template_and_answer_tags(tokenizer) -> None:
    from dynaresize.tasks.rgym import ReasoningGymTask

    class ChatTok(type(tokenizer)):  # the tiny tokenizer has no chat template: stand one in
        def chat(self, messages):
            return tuple(self.encode("<user>" + messages[0]["content"] + "</user>"))

    chat_tok = ChatTok.__new__(ChatTok)
    chat_tok.__dict__.update(tokenizer.__dict__)
    task = ReasoningGymTask("basic_arithmetic", ADDITIONS, chat_tok, fmt="chat")
    prompt = task.batch(0, 1, 0)[0]
    text = chat_tok.decode(prompt.tokens)
    assert text.startswith("<user>") and text.endswith("</user>") and "<answer>" in text
    assert task.reward(prompt, tokenizer.encode(f"<answer>{prompt.answer}</answer>")) == 1.0
    assert task.reward(prompt, tokenizer.encode("<answer>1</answer>")) == 0.0


def test_unknown_generator_and_bad_args_name_the_field(tokenizer) -> None:
    with pytest.raises(ConfigError, match="task.generator = 'no_such_gen'.*chain_sum"):
        gym(tokenizer, "no_such_gen")
    with pytest.raises(ConfigError, match="task.generator_args"):
        gym(tokenizer, "chain_sum", {"bogus": 1})
    with pytest.raises(ConfigError, match="task.question_template.*expression"):
        gym(tokenizer, question_template="{nope} =")


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math_task_reward_with_math_verify(tokenizer, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    pytest.importorskip("math_verify")
    from dynaresize.tasks.math_task import MathTask

    rows = [{"problem": f"what is {i}/{2 * i}?", "answer": "1/2"} for i in range(1, 9)]
    rows.append({"problem": "what is 3+4?", "answer": "\\boxed{7}"})
    task = MathTask(str(write_rows(tmp_path / "m.jsonl", rows)), "problem", "answer",
                    tokenizer, fmt="completion", num_fewshot=0, num_eval=2)
    half = next(p for k in range(9) for p in task.batch(k, 1, 0) if p.answer == "1/2")
    assert task.reward(half, tokenizer.encode("0.5\n")) == 1.0  # equivalent, not equal text
    assert task.reward(half, tokenizer.encode("1/2")) == 1.0
    assert task.reward(half, tokenizer.encode("0.25")) == 0.0
    assert task.reward(half, tokenizer.encode("abc")) == 0.0
    seven = next(p for k in range(9) for p in task.batch(k, 1, 0) if "7" in p.answer)
    assert task.reward(seven, tokenizer.encode("7")) == 1.0
    held = {p.answer + tokenizer.decode(p.tokens) for p in task.eval_prompts(2, 0)}
    train = {p.answer + tokenizer.decode(p.tokens) for k in range(7) for p in task.batch(k, 1, 0)}
    assert len(held) == 2 and not held & train and len(train) == 7


def test_math_dataset_missing_field_names_file_row_and_field(tokenizer, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    pytest.importorskip("math_verify")
    from dynaresize.tasks.math_task import MathTask

    path = write_rows(tmp_path / "bad.jsonl", [{"problem": "1+1", "answer": "2"},
                                               {"problem": "2+2", "solution": "4"}])
    with pytest.raises(ValueError, match=r"bad.jsonl: row 2: missing field 'answer'"):
        MathTask(str(path), "problem", "answer", tokenizer)


def test_math_dataset_parquet(tokenizer, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("math_verify")
    from dynaresize.tasks.math_task import MathTask

    path = tmp_path / "d.parquet"
    datasets.Dataset.from_list([{"q": f"{i}+{i}", "a": str(2 * i)} for i in range(5)]) \
        .to_parquet(str(path))
    task = MathTask(str(path), "q", "a", tokenizer, fmt="completion", num_fewshot=1, num_eval=1)
    p = task.batch(0, 1, 0)[0]
    assert task.reward(p, tokenizer.encode(p.answer)) == 1.0


@pytest.mark.parametrize("generator", ["chain_sum", "basic_arithmetic", "gsm_symbolic",
                                       "countdown", "leg_counting"])
def test_any_generator_scores_its_reference_right_and_junk_wrong(tokenizer,
                                                                 generator: str) -> None:
    task = gym(tokenizer, generator, {}, question_template="{question}", num_eval=4)
    for prompt in task.batch(2, 2, seed=3):
        assert task.reward(prompt, tokenizer.encode(f" {prompt.answer}\n")) == 1.0
        assert task.reward(prompt, tokenizer.encode(" zzz\n")) < 1.0
