"""Exact-answer items from seeded templates: enough of them, reproducible, every answer right (checked
independently: programs are run, documents parsed, sums evaluated), and answer checking that is
strict but fair."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter

import pytest

from llm_bench.quality.exact_items import (
    DIFFICULTIES,
    FAMILIES,
    PROGRAM,
    Item,
    generate_items,
    is_correct,
    normalise,
)


def test_the_default_set_has_at_least_200_distinct_items_in_every_family_and_difficulty() -> None:
    items = generate_items(seed=0)
    assert len(items) >= 200
    cells = Counter((i.family, i.difficulty) for i in items)
    assert set(cells) == {(f, d) for f in FAMILIES for d in DIFFICULTIES}
    assert len(set(cells.values())) == 1
    assert len({i.question for i in items}) == len(items)
    assert len({i.id for i in items}) == len(items)


def test_the_same_seed_gives_the_same_items_and_more_items_keep_the_first_ones() -> None:
    assert generate_items(seed=3) == generate_items(seed=3)
    assert generate_items(seed=3) != generate_items(seed=4)
    fewer = generate_items(seed=3, per_cell=5, difficulties=("easy",))
    more = generate_items(seed=3, per_cell=12, difficulties=("easy",))
    for family in FAMILIES:
        assert [i for i in fewer if i.family == family] == [i for i in more if i.family == family][:5]


def run_program(question: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(question.removeprefix(PROGRAM), {})  # the templates' own programs, nothing from outside
    return out.getvalue().strip()


CONVERSIONS = {("grams", "kilograms"): 1000, ("metres", "kilometres"): 1000, ("millilitres", "litres"): 1000,
               ("kilograms", "tonnes"): 1000, ("millimetres", "centimetres"): 10, ("centimetres", "metres"): 100,
               ("watts", "kilowatts"): 1000, ("years", "decades"): 10, ("years", "centuries"): 100,
               ("minutes", "hours"): 60, ("seconds", "minutes"): 60, ("hours", "days"): 24, ("days", "weeks"): 7,
               ("seconds", "hours"): 3600, ("minutes", "days"): 1440, ("hours", "weeks"): 168}


def independent_answer(question: str) -> str:
    if question.startswith(PROGRAM):
        return run_program(question)
    if m := re.fullmatch(r"What is ([\d +*-]+)\?", question):
        return str(eval(m.group(1)))  # digits and operators only, by the pattern
    if m := re.fullmatch(r'In (\{.*\}), what is the value of "(\w+)"\?', question):
        return str(json.loads(m.group(1))[m.group(2)])
    if m := re.fullmatch(r'In (\{.*\}), what is the "(\w+)" of the order whose "id" is (\d+)\?', question):
        (order,) = [o for o in json.loads(m.group(1))["orders"] if o["id"] == int(m.group(3))]
        return str(order[m.group(2)])
    if m := re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", question):
        return str(int(m.group(2)) * CONVERSIONS[m.group(1), m.group(3)])
    if m := re.fullmatch(r"A car drives at (\d+) km/h\. What is its speed in metres per second\?", question):
        speed = int(m.group(1)) * 1000 / 3600
        assert speed == int(speed)
        return str(int(speed))
    raise AssertionError(f"no independent check for {question!r}")


def test_every_answer_and_example_is_right() -> None:
    for item in generate_items(seed=0, per_cell=40):
        assert independent_answer(item.question) == item.answer, item.id
        for question, answer in item.examples:
            assert independent_answer(question) == answer, item.id


def test_examples_share_the_items_form_and_never_repeat_it() -> None:
    shape = lambda q: re.sub(r"\d+", "#", q.split("{")[0])  # noqa: E731 - numbers and documents vary
    for item in generate_items(seed=1):
        assert len(item.examples) == 2
        assert item.question not in [q for q, _ in item.examples]
        if item.family in ("units", "arithmetic"):
            assert {shape(q) for q, _ in item.examples} == {shape(item.question)}, item.id


def test_messages_ask_after_a_system_message_and_worked_examples() -> None:
    item = generate_items(seed=0, per_cell=1, difficulties=("easy",), families=("units",))[0]
    roles = [role for role, _ in item.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert item.messages()[-1] == ("user", item.question)


def number_item(answer: str, units: tuple[str, ...] = ()) -> Item:
    return Item("t", "units", "easy", "?", answer, (), units)


@pytest.mark.parametrize("answer", ["3000", " 3000\n", "3000.", "`3000`", "```\n3000\n```", '"3000"', "3,000",
                                    "3000.0", "3000 grams", "3000g", "3000 Grams", "3000\nbecause 3 * 1000"])
def test_fair_forms_of_a_right_number_count(answer: str) -> None:
    assert is_correct(number_item("3000", ("grams", "g")), answer)


@pytest.mark.parametrize("answer", ["The answer is 3000", "30000", "300", "3 000", "3000 kilograms", "3000 apples",
                                    "", "3000 grams of flour", "= 3000", "3,00", "3000.."])
def test_anything_else_around_the_value_is_wrong(answer: str) -> None:
    assert not is_correct(number_item("3000", ("grams", "g")), answer)


def test_a_number_without_a_unit_takes_no_unit_and_text_is_compared_exactly() -> None:
    assert not is_correct(number_item("42"), "42 grams")
    word = Item("t", "json", "easy", "?", "Ada", ())
    assert is_correct(word, "Ada") and is_correct(word, "'Ada'.") and is_correct(word, "`Ada`")
    assert not is_correct(word, "ada") and not is_correct(word, "Ada Lovelace")
    upper = Item("t", "code", "hard", "?", "OON", ())
    assert is_correct(upper, "OON") and not is_correct(upper, "oon")


def test_normalise_keeps_the_first_non_empty_line() -> None:
    assert normalise("\n\n  Oslo.\nIt is the capital.") == "Oslo"


def test_unknown_difficulties_and_oversized_sets_are_named() -> None:
    with pytest.raises(ValueError, match="unknown trivial.*easy, medium, hard"):
        generate_items(difficulties=("trivial",))
    with pytest.raises(ValueError, match="fewer than 500 distinct items"):
        generate_items(per_cell=500)
