"""Reward functions (lm/rewards.py): a spec parsed into weighted built-ins and plug-ins, each built-in's value,
the final number of GSM8K answers and model completions, and every bad spec or reward value as one line."""

import json
import math

import numpy as np
import pytest

from lm import rewards
from lm.errors import UserError

PLUGIN = '''
import numpy as np

def brevity(prompt, completion, record):
    return 1.0 / (1 + len(completion))

def passes(prompt, completion, record):
    return completion == record["answer"]

def digits(prompt, completion, record):
    return np.float32(sum(c.isdigit() for c in completion)) if completion else np.bool_(False)

not_a_function = 3
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module of the user's own, importable as reward_plugin."""
    (tmp_path / "reward_plugin.py").write_text(PLUGIN)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "needs_missing.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "reward_plugin"


@pytest.fixture(scope="module")
def gsm8k(data_dir) -> list[dict[str, str]]:
    with (data_dir / "gsm8k" / "test.jsonl").open() as lines:
        return [json.loads(next(lines)) for _ in range(4)]


def test_a_spec_gives_its_rewards_in_order_with_their_weights(plugin_module):
    parsed = rewards.parse_rewards(f"answer, format=0.2,{plugin_module}:brevity=-0.5")
    assert [(r.name, r.weight) for r in parsed] == [("answer", 1.0), ("format", 0.2),
                                                    ("reward_plugin:brevity", -0.5)]
    assert parsed[2].function("p", "abc", {}) == 0.25


@pytest.mark.parametrize("spec, fragments", [
    ("", ["rl.rewards=: ''", "names no reward", "NAME_OR_MODULE:FUNCTION[=WEIGHT]"]),
    ("answer,", ["names no reward"]),
    ("answer=heavy", ["'answer=heavy'", "the weight 'heavy' is not a number"]),
    ("answer=nan", ["the weight 'nan' is not a number"]),
    ("answer=", ["the weight '' is not a number"]),
    ("correct", ["'correct' is neither a built-in nor MODULE:FUNCTION", "answer, format, length"]),
    ("no_such_module_xyz:f", ["no module 'no_such_module_xyz' can be imported", "PYTHONPATH"]),
    ("broken_plugin:f", ["importing broken_plugin fails (RuntimeError: no GPU here)"]),
    ("needs_missing:f", ["importing needs_missing fails (ModuleNotFoundError", "no_such_dependency_xyz"]),
    ("reward_plugin:missing", ["reward_plugin.py defines no 'missing'"]),
    ("reward_plugin:not_a_function", ["has a int, not a function, as 'not_a_function'"]),
    ("answer,format,answer=2", ["answer is named twice", "the sum of the weights"]),
])
def test_a_bad_spec_is_one_line_naming_the_option_and_the_item(spec, fragments, plugin_module):
    with pytest.raises(UserError) as error:
        rewards.parse_rewards(spec)
    message = str(error.value)
    assert message.startswith(f"rl.rewards={spec}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("settings, fragments", [
    (rewards.Settings(format_pattern="(unclosed"), ["grpo.format_pattern='(unclosed' is not a regular expression"]),
    (rewards.Settings(length_limit=100, length_buffer=101), ["grpo.length_limit=100, grpo.length_buffer=101"]),
    (rewards.Settings(length_limit=0, length_buffer=0), ["needs a positive limit"]),
])
def test_bad_settings_of_a_chosen_builtin_name_their_options(settings, fragments):
    with pytest.raises(UserError) as error:
        rewards.parse_rewards("answer,format,length", "grpo.rewards", settings)
    for fragment in fragments:
        assert fragment in str(error.value)
    assert rewards.parse_rewards("answer", "grpo.rewards", settings)  # not read unless chosen


@pytest.mark.parametrize("text, number", [
    ("He makes 9 * 2 = $18 every day.\n#### 18", "18"),
    ("#### 70,000", "70000"),
    ("so the change is -10 degrees\n#### -10", "-10"),
    ("#### $1,450,000", "1450000"),
    ("#### 18 and then some 99", "18"),  # the answer line wins over later numbers
    ("first #### 3, then #### 4", "4"),
    ("The answer is \\boxed{42}. Check: 40 + 2", "42"),
    ("\\boxed{7} no, \\boxed{ 1,234.50 }", "1234.50"),
    ("\\boxed{\\$12}", "12"),
    ("\\boxed{x} so 5 apples", "5"),  # a box without a number: the last number
    ("It costs 3.5 dollars, or 2,125 cents.", "2125"),
    ("temperature fell to -4.25.", "-4.25"),
    ("5-3", "3"),  # a minus sign after a digit is an operator
    ("1,23", "23"),  # commas only between groups of three digits
    ("no number here", None),
    ("", None),
])
def test_final_number(text, number):
    assert rewards.final_number(text) == number


def test_the_answer_reward_checks_the_final_number_of_gsm8k_answers(gsm8k):
    """The first GSM8K test records' own answers score 1 against themselves; a completion ending on the right
    number in any of the forms scores 1, the wrong number 0."""
    answer = rewards.parse_rewards("answer")[0].function
    assert [rewards.final_number(record["answer"]) for record in gsm8k] == ["18", "3", "70000", "540"]
    for record in gsm8k:
        assert answer(record["question"], record["answer"], record) == 1.0
    janet, house = gsm8k[0], gsm8k[2]
    assert answer("", "She sells 9 eggs for $2 each: $18.", janet) == 1.0
    assert answer("", "Profit: \\boxed{70,000}", house) == 1.0
    assert answer("", "#### 70000.00", house) == 1.0  # equal as numbers
    assert answer("", "#### 17", janet) == 0.0
    assert answer("", "I do not know", janet) == 0.0
    settings = rewards.Settings(answer_field="label")
    labelled = rewards.parse_rewards("answer", settings=settings)[0].function
    assert labelled("", "3.0", {"label": "3"}) == 1.0


def test_the_format_reward_matches_the_whole_completion():
    settings = rewards.Settings(format_pattern=r"-?\d+")
    matches = rewards.parse_rewards("format", settings=settings)[0].function
    assert matches("", "168", {}) == 1.0
    assert matches("", "168 apples", {}) == 0.0  # the whole completion, not a part of it
    default = rewards.parse_rewards("format")[0].function
    assert default("", "9 * 2 = 18\nSo she makes 18.\n#### 18\n", {}) == 1.0
    assert default("", "9 * 2 = 18, so 18", {}) == 0.0


def test_the_length_reward_is_dapos_soft_overlong_penalty():
    settings = rewards.Settings(length_limit=100, length_buffer=20)
    length = rewards.parse_rewards("length", settings=settings)[0].function
    values = [length("", "x" * n, {}) for n in (0, 80, 85, 90, 100, 101, 500)]
    assert values == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    hard = rewards.parse_rewards("length", settings=rewards.Settings(length_limit=10, length_buffer=0))[0].function
    assert [hard("", "x" * n, {}) for n in (10, 11)] == [0.0, -1.0]


def test_score_gives_the_weighted_sum_and_each_rewards_values(plugin_module):
    parsed = rewards.parse_rewards("answer=2,reward_plugin:passes=0.5,reward_plugin:digits=0.25",
                                   settings=rewards.Settings())
    records = [{"answer": "168"}, {"answer": "7"}, {"answer": "-3"}]
    total, values = rewards.score(parsed, ["123+45", "3+4", "1-4"], ["168", "#### 7", ""], records)
    np.testing.assert_array_equal(values["answer"], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(values["reward_plugin:passes"], [1.0, 0.0, 0.0])  # a bool counts as 0 or 1
    np.testing.assert_array_equal(values["reward_plugin:digits"], [3.0, 1.0, 0.0])  # numpy's numbers and bools
    np.testing.assert_array_equal(total, [3.25, 2.25, 0.0])
    assert total.dtype == np.float64 and values[rewards.ACCURACY] is values["answer"]


@pytest.mark.parametrize("returned, fragment", [
    (math.nan, "returned nan (float)"),
    (math.inf, "returned inf (float)"),
    (None, "returned None (NoneType)"),
    ("1.0", "returned '1.0' (str)"),
])
def test_a_reward_that_returns_no_finite_number_is_one_line_naming_it_and_the_record(returned, fragment):
    parsed = [rewards.Reward("mine:check", lambda prompt, completion, record: returned)]
    with pytest.raises(UserError) as error:
        rewards.score(parsed, ["What is 2+2?", "Name a colour, any colour you like: ..."], ["4", "x"], [{}, {}])
    assert str(error.value) == (f"the reward mine:check on record 0 (prompt 'What is 2+2?') {fragment}: a reward "
                                "returns a finite float")


def test_a_reward_that_raises_is_one_line_naming_it_the_record_and_the_exception():
    parsed = rewards.parse_rewards("answer")
    long_prompt = "Janet's ducks lay 16 eggs per day. " * 5
    with pytest.raises(UserError) as error:
        rewards.score(parsed, ["fine", long_prompt], ["#### 1", "#### 2"], [{"answer": "1"}, {"question": "?"}])
    message = str(error.value)
    assert message.startswith(f"the reward answer on record 1 (prompt {long_prompt[:60]!r}) raised ValueError: "
                              "the record has no field 'answer' (its fields: question)")
    with pytest.raises(UserError, match="raised ValueError: the record's answer has no number: 'none'"):
        rewards.score(parsed, ["p"], ["#### 1"], [{"answer": "none"}])
