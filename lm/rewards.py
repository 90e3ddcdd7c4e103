"""Reward functions for online RL post-training (GRPO): built-ins and plug-ins, weighted and summed.

A reward function is any callable `(prompt: str, completion: str, record: dict[str, str]) -> float`, called
positionally: the prompt the model was given, the text it generated, and the fields of the source record the
prompt came from ({"question": ..., "answer": ...}, say). It returns a finite real number: a float or an int
(numpy's too); a bool (numpy's too) counts as 0 or 1, so that a check can return one. NaN, an infinity, None or a
string is an error, as is an exception: score() reports either as one UserError line naming the function and the
record.

A spec (the rl.rewards option, say) lists the rewards, comma-separated, each `NAME_OR_MODULE:FUNCTION[=WEIGHT]`
(WEIGHT a float, default 1.0): a built-in's short name, or a function of any importable module (the user's
own: installed, on PYTHONPATH, or under the folder the command runs in), e.g.
`answer=1.0,format=0.2,mypkg.rewards:brevity=0.5`. A row's reward is the weighted sum. The built-ins read their
settings from Settings, which the experiment fills from its config; messages name the format and length settings
as options beside the spec's (rl.format_pattern, rl.length_limit, rl.length_buffer for rl.rewards):

  answer  1.0 when the completion's final number (final_number) equals the final number of the record's
          answer field, as numbers (commas dropped, 3.0 == 3), else 0.0; a record whose answer has no number
          is an error. Its values are the run's accuracy (ACCURACY).
  format  1.0 when the format pattern (a Python regular expression, no flags: `.` stops at a newline unless
          it says (?s)) matches the whole completion (re.fullmatch), else 0.0.
  length  DAPO's soft overlong penalty, in characters: 0 up to limit - buffer, falling linearly to -1 at the
          limit, -1 beyond it.

final_number(text) is the number a text ends on: the last `#### N` (GSM8K's answer line; a `$` after the
hashes allowed), else the last `\\boxed{N}` (N alone in the braces, a `$` allowed), else the last number
anywhere in the text. A number is an optional minus sign, digits (commas allowed between groups of three) and
an optional decimal part: `-1,234.5`; it comes back without commas.
"""

import dataclasses
import decimal
import importlib
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from lm.errors import UserError

RewardFunction = Callable[[str, str, Mapping[str, str]], float]
ACCURACY = "answer"  # the built-in whose values are logged as accuracy: score()'s values[ACCURACY] where present
FORMS = "NAME_OR_MODULE:FUNCTION[=WEIGHT],... (a built-in: answer, format, length)"
NUMBER = r"(?<![\d.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\d.])-?\d+(?:\.\d+)?"
ENDINGS = (  # final_number's places, the first that matches wins (its last match)
    re.compile(rf"####\s*\$?\s*({NUMBER})"),
    re.compile(rf"\\boxed\{{\s*\\?\$?\s*({NUMBER})\s*\}}"),
    re.compile(f"({NUMBER})"),
)
PREVIEW = 60  # characters of a prompt an error shows


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the built-ins read (module docstring): the record's field holding the answer, the format pattern,
    and the length penalty's limit and buffer (characters)."""

    answer_field: str = "answer"
    format_pattern: str = r"(?s).*####\s*-?[\d,]+(?:\.\d+)?\s*"  # ends on GSM8K's answer line
    length_limit: int = 2048
    length_buffer: int = 512


@dataclasses.dataclass(frozen=True)
class Reward:
    """One item of a spec: its name (the built-in's, or MODULE:FUNCTION as given), function and weight."""

    name: str
    function: RewardFunction
    weight: float = 1.0


def final_number(text: str) -> str | None:
    """The number text ends on (module docstring), without commas; None when it has no number."""
    for pattern in ENDINGS:
        found = pattern.findall(text)
        if found:
            return found[-1].replace(",", "")
    return None


def answer_reward(answer_field: str) -> RewardFunction:
    """The answer built-in: 1.0 when the completion's final number equals record[answer_field]'s."""

    def answer(prompt: str, completion: str, record: Mapping[str, str]) -> float:
        del prompt
        if answer_field not in record:
            raise ValueError(f"the record has no field {answer_field!r} (its fields: {', '.join(record)})")
        expected = final_number(record[answer_field])
        if expected is None:
            raise ValueError(f"the record's {answer_field} has no number: {record[answer_field][:PREVIEW]!r}")
        found = final_number(completion)
        return float(found is not None and decimal.Decimal(found) == decimal.Decimal(expected))

    return answer


def format_reward(pattern: str, option: str) -> RewardFunction:
    """The format built-in: 1.0 when pattern matches the whole completion; a bad pattern is a UserError."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise UserError(f"{option}={pattern!r} is not a regular expression ({e}): give a Python one, e.g. "
                        f"{Settings.format_pattern!r}") from None

    def matches_format(prompt: str, completion: str, record: Mapping[str, str]) -> float:
        del prompt, record
        return float(compiled.fullmatch(completion) is not None)

    return matches_format


def length_reward(limit: int, buffer: int, option: str) -> RewardFunction:
    """The length built-in: DAPO's soft overlong penalty, 0 up to limit - buffer characters, falling linearly to
    -1 at limit, -1 beyond; limit > 0 and 0 <= buffer <= limit, else a UserError."""
    if not 0 <= buffer <= limit or limit <= 0:
        raise UserError(f"{option}_limit={limit}, {option}_buffer={buffer}: the length reward needs a positive "
                        "limit and a buffer from 0 to the limit (characters)")

    def length(prompt: str, completion: str, record: Mapping[str, str]) -> float:
        del prompt, record
        over = len(completion) - (limit - buffer)
        return 0.0 if over <= 0 else -over / buffer if len(completion) <= limit else -1.0

    return length


def builtin_rewards(settings: Settings, section: str) -> dict[str, Callable[[], RewardFunction]]:
    """The built-ins by name, each made (its settings checked) only when a spec names it; section names the
    settings' options in messages (rl: rl.format_pattern)."""
    return {
        "answer": lambda: answer_reward(settings.answer_field),
        "format": lambda: format_reward(settings.format_pattern, f"{section}.format_pattern"),
        "length": lambda: length_reward(settings.length_limit, settings.length_buffer, f"{section}.length"),
    }


def parse_rewards(spec: str, option: str = "rl.rewards", settings: Settings = Settings()) -> list[Reward]:
    """The rewards of spec (module docstring), in its order; option names the spec in messages, and the options
    beside it name the settings (rl.rewards: rl.format_pattern). A bad item (an unknown name, a module that does
    not import, a missing or uncallable function, a weight that is not a finite float, a name given twice) or an
    empty spec is a UserError naming the option and the item."""
    section = option.rpartition(".")[0] or option
    builtins = builtin_rewards(settings, section)
    rewards = []
    for item in spec.split(","):
        name, equals, weight_text = (part.strip() for part in item.partition("="))
        fix = f"{option}={spec}: {item.strip()!r}"
        if not name:
            raise UserError(f"{fix} names no reward: use {FORMS}")
        try:
            weight = float(weight_text) if equals else 1.0
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight):
            raise UserError(f"{fix}: the weight {weight_text!r} is not a number; use {FORMS}")
        if any(reward.name == name for reward in rewards):
            raise UserError(f"{fix}: {name} is named twice: give it once, with the sum of the weights")
        function = builtins[name]() if name in builtins else plugin(name, fix)
        rewards.append(Reward(name, function, weight))
    return rewards


def plugin(name: str, fix: str) -> RewardFunction:
    """The function MODULE:FUNCTION names, imported; a UserError (fix: the option and item) otherwise."""
    module_name, colon, attribute = name.partition(":")
    if not colon or not module_name or not attribute:
        raise UserError(f"{fix} is neither a built-in nor MODULE:FUNCTION: use {FORMS}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UserError(f"{fix}: importing {module_name} fails ({type(e).__name__}: {e}): install what it "
                            "imports") from None
        raise UserError(f"{fix}: no module {module_name!r} can be imported: install its package, or put its folder "
                        "on PYTHONPATH") from None
    except Exception as e:  # noqa: BLE001 (the module's own code raised: a syntax error, whatever it runs)
        raise UserError(f"{fix}: importing {module_name} fails ({type(e).__name__}: {e}): fix the module") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        what = "defines no" if function is None else f"has a {type(function).__name__}, not a function, as"
        raise UserError(f"{fix}: {module.__file__} {what} {attribute!r}: give a function (prompt, completion, "
                        "record) -> float")
    return function


def score(rewards: Sequence[Reward], prompts: Sequence[str], completions: Sequence[str],
          records: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the weighted sum (N,) float64, {name: its values (N,) float64}) of every reward on every row. A function
    that raises or returns no finite real number (module docstring) is a UserError naming it and the row."""
    if not len(prompts) == len(completions) == len(records):
        raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and {len(records)} records")
    values = {reward.name: np.empty(len(prompts), np.float64) for reward in rewards}
    for index, row in enumerate(zip(prompts, completions, records, strict=True)):
        for reward in rewards:
            values[reward.name][index] = call(reward, index, *row)
    total = np.zeros(len(prompts), np.float64)
    for reward in rewards:
        total += reward.weight * values[reward.name]
    return total, values


def call(reward: Reward, index: int, prompt: str, completion: str, record: Mapping[str, str]) -> float:
    """reward's function on one row, its value checked."""
    where = f"the reward {reward.name} on record {index} (prompt {prompt[:PREVIEW]!r})"
    try:
        value = reward.function(prompt, completion, record)
    except Exception as e:  # noqa: BLE001 (a plug-in raises whatever it raises)
        raise UserError(f"{where} raised {type(e).__name__}: {e}") from None
    if not isinstance(value, numbers.Real | np.bool_) or not math.isfinite(value):
        raise UserError(f"{where} returned {value!r} ({type(value).__name__}): a reward returns a finite float")
    return float(value)
