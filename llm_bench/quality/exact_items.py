"""Exact-answer items generated at run time from seeded templates, and the checking of answers.

Four families, each in three difficulties: arithmetic, a value out of a JSON document, what a short
Python program prints, and unit conversions. Every item's answer is computed by the template itself,
so nothing is copied from an existing benchmark, and the set can be sized to the model: ``easy`` is
within reach of a 135M-parameter model (a number times ten, a value out of a one-key document, a
program that prints a variable, kilograms to grams), ``hard`` takes several steps. The same seed gives
the same items on every machine (each family and difficulty draws from its own generator, seeded by
name, so asking for more items keeps the first ones and leaves the other kinds as they were).

An item is asked after a system message and two worked examples drawn from the same form of
question (the same conversion, the same kind of program), so a model that knows the answer also
gives it in the expected form; a small model leans on them heavily. Checking is strict but fair
(``is_correct``): the first non-empty line of the answer counts, without surrounding whitespace, wrapping quotes,
backticks or a code fence, and one final full stop; a number may be written with thousands
separators or a trailing ``.0``, and a conversion's answer may carry its unit ("3000 grams");
anything else around the value ("The answer is 42") makes it wrong.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

FAMILIES = ("arithmetic", "json", "code", "units")
DIFFICULTIES = ("easy", "medium", "hard")
PER_CELL = 20  # 4 families x 3 difficulties x 20 = 240 items

SYSTEM = "Answer with the value only: no words, no explanation."
EXAMPLES_PER_ITEM = 2
Messages = tuple[tuple[str, str], ...]  # (role, content)


@dataclass(frozen=True)
class Item:
    id: str
    family: str
    difficulty: str
    question: str
    answer: str
    examples: tuple[tuple[str, str], ...]  # worked (question, answer) pairs of the same form
    unit_words: tuple[str, ...] = ()  # a conversion's unit, as an answer may name it

    def messages(self) -> Messages:
        shots: list[tuple[str, str]] = []
        for question, answer in self.examples:
            shots += [("user", question), ("assistant", answer)]
        return (("system", SYSTEM), *shots, ("user", self.question))


Drawn = tuple[str, str, tuple[str, ...]]  # question, answer, unit words
Form = Callable[[random.Random], Drawn]  # one shape of question; its examples share it

NAMES = ("Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jill", "Kai", "Lena", "Max",
         "Nora", "Omar", "Pia", "Rosa", "Sam", "Tara", "Uma")
WORDS = ("cat", "sun", "tree", "book", "milk", "rain", "ship", "bird", "lamp", "rock", "fish", "door",
         "bell", "cake", "fox", "hat", "king", "moon", "road", "star")
KEYS = ("name", "city", "color", "pet", "food", "team", "code", "size", "level", "score")
PROGRAM = "What does this Python program print?\n"


def _times_ten(r: random.Random) -> Drawn:
    a = r.randint(2, 99)
    return f"What is {a} * 10?", str(a * 10), ()


def _ten_plus(r: random.Random) -> Drawn:
    a = r.randint(1, 9)
    return f"What is 10 + {a}?", str(10 + a), ()


def _sum_of_digits(r: random.Random) -> Drawn:
    a, b = r.randint(1, 9), r.randint(1, 9)
    return f"What is {a} + {b}?", str(a + b), ()


def _sum(r: random.Random) -> Drawn:
    a, b = r.randint(10, 99), r.randint(10, 99)
    return f"What is {a} + {b}?", str(a + b), ()


def _difference(r: random.Random) -> Drawn:
    a, b = sorted(r.sample(range(10, 100), 2), reverse=True)
    return f"What is {a} - {b}?", str(a - b), ()


def _product_plus(r: random.Random) -> Drawn:
    a, b, c = r.randint(12, 99), r.randint(3, 9), r.randint(10, 99)
    return f"What is {a} * {b} + {c}?", str(a * b + c), ()


def _one_key(r: random.Random) -> Drawn:
    key = r.choice(KEYS)
    value: str | int = r.choice(NAMES + WORDS) if r.random() < 0.5 else r.randint(10, 999)
    return f'In {json.dumps({key: value})}, what is the value of "{key}"?', str(value), ()


def _four_keys(r: random.Random) -> Drawn:
    keys = r.sample(KEYS, 4)
    values: list[str | int] = [r.choice(WORDS) if r.random() < 0.5 else r.randint(100, 999) for _ in keys]
    asked = r.randrange(4)
    return f'In {json.dumps(dict(zip(keys, values, strict=True)))}, what is the value of "{keys[asked]}"?', str(values[asked]), ()


def _order_lookup(r: random.Random) -> Drawn:
    ids = r.sample(range(100, 1000), 3)
    orders = [{"id": i, "owner": r.choice(NAMES), "total": r.randint(10, 500)} for i in ids]
    asked, field = r.choice(orders), r.choice(("owner", "total"))
    return (f'In {json.dumps({"orders": orders})}, what is the "{field}" of the order whose "id" is '
            f'{asked["id"]}?', str(asked[field]), ())


def _print_variable(r: random.Random) -> Drawn:
    n = r.randint(10, 999)
    return f"{PROGRAM}x = {n}\nprint(x)", str(n), ()


def _print_word(r: random.Random) -> Drawn:
    word = r.choice(WORDS)
    return f'{PROGRAM}print("{word}")', word, ()


def _two_steps(r: random.Random) -> Drawn:
    a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(1, 9)
    return f"{PROGRAM}x = {a}\ny = x * {b}\nprint(y + {c})", str(a * b + c), ()


def _loop_sum(r: random.Random) -> Drawn:
    n, step = r.randint(4, 9), r.randint(1, 3)
    program = f"total = 0\nfor i in range(0, {n * step}, {step}):\n    total += i\nprint(total)"
    return PROGRAM + program, str(sum(range(0, n * step, step))), ()


def _slice_upper(r: random.Random) -> Drawn:
    word = r.choice(WORDS) + r.choice(WORDS)
    start = r.randint(0, 2)
    end = start + r.randint(2, 4)
    return f'{PROGRAM}word = "{word}"\nprint(word[{start}:{end}].upper())', word[start:end].upper(), ()


def _conversion(src: str, dst: str, factor: int, numbers: range, words: tuple[str, ...]) -> Form:
    def draw(r: random.Random) -> Drawn:
        n = r.choice(numbers)
        return f"How many {dst} are in {n} {src}?", str(n * factor), words
    return draw


def _speed(r: random.Random) -> Drawn:
    ms = 5 * r.randint(1, 12)  # a multiple of 5 m/s is a whole number of km/h (x 3.6)
    return (f"A car drives at {ms * 18 // 5} km/h. What is its speed in metres per second?", str(ms),
            ("m/s", "metres per second", "meters per second"))


ONE_DIGIT, UP_TO_15, UP_TO_30 = range(2, 10), range(2, 16), range(2, 31)
FORMS: dict[tuple[str, str], tuple[Form, ...]] = {
    ("arithmetic", "easy"): (_times_ten, _ten_plus),
    ("arithmetic", "medium"): (_sum_of_digits, _sum, _difference),
    ("arithmetic", "hard"): (_product_plus,),
    ("json", "easy"): (_one_key,),
    ("json", "medium"): (_four_keys,),
    ("json", "hard"): (_order_lookup,),
    ("code", "easy"): (_print_variable, _print_word),
    ("code", "medium"): (_two_steps,),
    ("code", "hard"): (_loop_sum, _slice_upper),
    ("units", "easy"): (_conversion("kilograms", "grams", 1000, ONE_DIGIT, ("grams", "g")),
                        _conversion("kilometres", "metres", 1000, ONE_DIGIT, ("metres", "meters", "m")),
                        _conversion("litres", "millilitres", 1000, ONE_DIGIT, ("millilitres", "milliliters", "ml")),
                        _conversion("tonnes", "kilograms", 1000, ONE_DIGIT, ("kilograms", "kg")),
                        _conversion("centimetres", "millimetres", 10, ONE_DIGIT, ("millimetres", "millimeters", "mm")),
                        _conversion("metres", "centimetres", 100, ONE_DIGIT, ("centimetres", "centimeters", "cm")),
                        _conversion("kilowatts", "watts", 1000, ONE_DIGIT, ("watts", "W")),
                        _conversion("decades", "years", 10, ONE_DIGIT, ("years",)),
                        _conversion("centuries", "years", 100, ONE_DIGIT, ("years",))),
    ("units", "medium"): (_conversion("hours", "minutes", 60, UP_TO_15, ("minutes", "min")),
                          _conversion("minutes", "seconds", 60, UP_TO_15, ("seconds", "s")),
                          _conversion("days", "hours", 24, UP_TO_15, ("hours", "h")),
                          _conversion("weeks", "days", 7, UP_TO_15, ("days",)),
                          _conversion("hours", "seconds", 3600, UP_TO_15, ("seconds", "s"))),
    ("units", "hard"): (_speed, _conversion("days", "minutes", 1440, UP_TO_30, ("minutes", "min")),
                        _conversion("weeks", "hours", 168, UP_TO_30, ("hours", "h"))),
}


def _draw_item(rng: random.Random, forms: tuple[Form, ...], taken: set[str]) -> tuple[Drawn, list[Drawn]] | None:
    """One new item and its worked examples, drawn from the same form; None when the forms yield
    nothing new within a few tries."""
    for _ in range(50):
        form = rng.choice(forms)
        item = form(rng)
        if item[0] not in taken:
            break
    else:
        return None
    examples: list[Drawn] = []
    for _ in range(50):
        if len(examples) == EXAMPLES_PER_ITEM:
            return item, examples
        drawn = form(rng)
        if drawn[0] != item[0] and all(drawn[0] != e[0] for e in examples):
            examples.append(drawn)
    return None


def generate_items(seed: int = 0, per_cell: int = PER_CELL, difficulties: tuple[str, ...] = DIFFICULTIES,
                   families: tuple[str, ...] = FAMILIES) -> list[Item]:
    """``per_cell`` distinct items of every family at every difficulty, the same for the same seed."""
    unknown = [d for d in difficulties if d not in DIFFICULTIES] + [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)}: the difficulties are {', '.join(DIFFICULTIES)}, "
                         f"the families {', '.join(FAMILIES)}")
    items = []
    for difficulty in difficulties:
        for family in families:
            rng = random.Random(f"llm-bench exact items {seed} {family} {difficulty}")
            taken: set[str] = set()
            for n in range(1, per_cell + 1):
                drawn = _draw_item(rng, FORMS[family, difficulty], taken)
                if drawn is None:
                    raise ValueError(f"the {difficulty} {family} templates have fewer than {per_cell} distinct items")
                (question, answer, words), examples = drawn
                taken.add(question)
                items.append(Item(f"{family}-{difficulty}-{n}", family, difficulty, question, answer,
                                  tuple((q, a) for q, a, _ in examples), words))
    return items


_FENCE = re.compile(r"^```[\w+-]*\s*\n?(.*?)\n?```$", re.DOTALL)


def normalise(text: str) -> str:
    """The first non-empty line, without wrapping whitespace, quotes, backticks or code fence, and
    without one final full stop."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    text = next((line.strip() for line in text.splitlines() if line.strip()), "")
    stopped = False
    for _ in range(3):  # the stop may sit inside or outside the quotes: "'Ada'." and "'Ada.'"
        text = text.strip("`").strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            text = text[1:-1].strip()
        if not stopped and text.endswith("."):
            text, stopped = text[:-1].rstrip(), True
    return text


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def _number(text: str) -> Decimal | None:
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if not re.fullmatch(r"[+-]?\d+(\.\d+)?", text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _without_unit(text: str, units: tuple[str, ...]) -> str:
    lowered = text.lower()
    for unit in sorted(units, key=len, reverse=True):
        if lowered.endswith(unit.lower()):
            return text[: -len(unit)].rstrip()
    return text


def is_correct(item: Item, answer: str) -> bool:
    text = normalise(answer)
    expected = _number(item.answer)
    if expected is None:
        return text == item.answer
    value = _number(_without_unit(text, item.unit_words))
    return value is not None and value == expected
