"""The synthetic verifiable tasks (synthetic:TASK[:SPLIT], lm/data/sources.py): fixed records, disjoint splits,
right answers, the usual field errors; and supervised fine-tuning on them with the byte tokenizer
(data.tokenizer=bytes)."""

import itertools

import numpy as np
import pytest

from configs import sft as sft_config
from experiments import sft
from lm.data import packing, sources
from lm.data.bpe import END_OF_TEXT
from lm.data.sources import Source
from lm.errors import UserError

FIELDS = {"data.prompt_field": "prompt", "data.response_field": "response", "data.answer_field": "answer"}


def first(spec: str, count: int) -> list[tuple[str, tuple[str, ...]]]:
    return list(itertools.islice(Source(spec, FIELDS), count))


def test_the_records_are_fixed_and_named_by_task_split_and_index():
    """The same records on every read and every machine (the first ones written down here), each named."""
    assert first("synthetic:addition", 2) == [("synthetic:addition train record 0", ("411+682", "1093", "1093")),
                                              ("synthetic:addition train record 1", ("960+845", "1805", "1805"))]
    assert first("synthetic:reverse:val", 2) == [("synthetic:reverse val record 0", ("175651", "156571", "156571")),
                                                 ("synthetic:reverse val record 1", ("034568", "865430", "865430"))]
    assert first("synthetic:addition:test", 300) == first("synthetic:addition:test", 300)
    assert first("synthetic:addition:train", 5) == first("synthetic:addition", 5)  # train is the default


@pytest.mark.parametrize("task", sources.SYNTHETIC_TASKS)
def test_the_splits_are_disjoint_and_hold_every_problem_once(task):
    order = sources.synthetic_order(task)
    _, count = sources.SYNTHETIC_TASKS[task]
    np.testing.assert_array_equal(np.sort(order), np.arange(count))  # a permutation: train is all that is left
    prompts = {split: {texts[0] for _, texts in first(f"synthetic:{task}:{split}", 3000)}
               for split in ("train", "val", "test")}
    assert [len(p) for p in prompts.values()] == [3000, 2000, 2000]  # (distinct problems, distinct prompts)
    assert not prompts["train"] & prompts["val"] and not prompts["train"] & prompts["test"]
    assert not prompts["val"] & prompts["test"]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_every_answer_is_right(split):
    for _, (prompt, response, answer) in first(f"synthetic:addition:{split}", 1000):
        a, b = prompt.split("+")
        assert response == answer == str(int(a) + int(b))
        assert {len(a), len(b)} <= {2, 3} and a[0] != "0" and b[0] != "0"
    for _, (prompt, response, answer) in first(f"synthetic:reverse:{split}", 1000):
        assert response == answer == prompt[::-1] and prompt.isdigit() and answer[0] != "0"
        assert 3 <= len(prompt) <= 6


@pytest.mark.parametrize("spec, fields, fragment", [
    ("synthetic:multiply", "prompt", "source=synthetic:multiply: use synthetic:TASK[:SPLIT], TASK one of addition, "
                                     "reverse and SPLIT one of train, test, val (default train)"),
    ("synthetic:addition:dev", "prompt", "use synthetic:TASK[:SPLIT]"),
    ("synthetic:", "prompt", "use files:GLOB, tfds:NAME[/CONFIG][:SPLIT], hf:NAME_OR_DIR[:CONFIG][:SPLIT] or "
                             "synthetic:TASK[:SPLIT]"),
    ("synthetic:addition", "text", "source=synthetic:addition: the synthetic task has no field 'text' (its fields: "
                                   "prompt, response, answer): set --config.data.text_field"),
    ("synthetic:reverse", {"data.prompt_field": "prompt", "data.response_field": "output"},
     "has no field 'output' (its fields: prompt, response, answer): set --config.data.response_field"),
])
def test_a_bad_spec_or_field_is_one_line(spec, fields, fragment):
    with pytest.raises(UserError) as error:
        Source(spec, fields)
    assert fragment in str(error.value)


def test_sft_learns_the_responses_of_a_synthetic_task_in_byte_ids(data_dir):
    """data.tokenizer=bytes: 257 ids (<|endoftext|> 0); the assistant's tokens of each packed conversation are
    the response's bytes and the end of text, nothing of the prompt."""
    config = sft_config.get_config("test")
    config.data.update(tokenizer="bytes", source="synthetic:addition", val_source="synthetic:addition:val",
                       prompt_field="prompt", response_field="response", max_records=20)
    built = sft.build(config)
    assert built.config.data.vocab_size == 257 and built.tokenizer.end_of_text_id == 0
    rows = packing.examples(built.train_rows[0])
    targets, weights = rows["targets"], rows["weights"]
    assert targets.max() < 257
    learnt = built.tokenizer.decode(targets[weights > 0])
    responses = [response for _, (_, response, _) in first("synthetic:addition", 20)]
    assert sorted(learnt.split(END_OF_TEXT)[:-1]) == sorted(f" {response}" for response in responses)
