"""Agreement between greedy answers and the speculation check, decided both ways on answers built so that a
wrong rule gives a visible wrong answer: a prefix is not the whole answer, the first difference is at an exact
position, and "speculation changed the output" fires up to its 32-token (128-character) mark and not after."""

from __future__ import annotations

from llm_bench.report.rows import Row
from llm_bench.results import AliasRecord
from llm_bench.workloads.quality.record import QualityOutput, QualityResults
from llm_bench.workloads.quality.score import (
    SPEC_EARLY,
    SPECULATION_CHANGED,
    agreement,
    quality_cell,
    quality_rows,
    quality_table,
    speculation_change,
)

MODEL = ["--model", "/m/smol.gguf"]


def out(prompt_id: str, ids: list[int] | None = None, text: str = "") -> QualityOutput:
    return QualityOutput(prompt_id, text, None if ids is None else len(ids), ids, "length")


def test_an_answer_that_is_a_prefix_of_the_other_is_not_identical():
    ref = [out("a", [1, 2, 3, 4])]
    shorter = agreement(ref, [out("a", [1, 2, 3])])
    assert shorter.unit == "tokens"
    assert shorter.identical_share == 0.0 and not shorter.prompts[0].identical
    assert shorter.prompts[0].first_difference == 3  # where the shorter one stops
    longer = agreement(ref, [out("a", [1, 2, 3, 4, 5])])
    assert longer.identical_share == 0.0 and longer.prompts[0].first_difference == 4
    assert agreement(ref, [out("a", [1, 2, 3, 4])]).identical_share == 1.0
    # by characters as well, when one side has no token ids
    chars = agreement([out("a", text="The answer is 42")], [out("a", text="The answer is 4")])
    assert chars.unit == "characters" and chars.identical_share == 0.0
    assert chars.prompts[0].first_difference == len("The answer is 4")
    assert agreement([out("a", text="")], [out("a", text="x")]).identical_share == 0.0


def test_the_first_difference_is_the_exact_position():
    ref = [out("a", [5, 6, 7, 8, 9]), out("b", [1, 2, 3, 4, 5]), out("c", [9, 9])]
    result = agreement(ref, [out("a", [5, 6, 7, 0, 9]), out("b", [1, 0, 3, 4, 5]), out("c", [9, 9])])
    assert [p.first_difference for p in result.prompts] == [3, 1, None]
    assert [p.prefix for p in result.prompts] == [3, 1, 2]
    assert result.earliest.prompt_id == "b"  # the soonest parting, not the first listed
    assert result.identical_share == 1 / 3
    assert result.mean_prefix == (3 + 1 + 2) / 3
    assert result.describe() == "1/3 identical, first difference at token 1 (b)"
    first = agreement([out("a", [1, 2])], [out("a", [7, 2])])
    assert first.prompts[0].first_difference == 0 and first.describe() == \
        "0/1 identical, first difference at token 0 (a)"


def quality_record(alias: str, args: list[str], outputs: list[QualityOutput]) -> AliasRecord:
    return AliasRecord(alias=alias, target="t", workload="quality", server_build="b1",
                       preset_args=["llama-server", "--port", "1", "--alias", alias, *args],
                       part=QualityResults(comparison="tokens", outputs=outputs))


def row(record: AliasRecord) -> Row:
    return Row(record.configuration, record, record.target, record.engine)


def checked(ids_plain: list[int], ids_spec: list[int], spec: list[str] | None = None):
    plain = row(quality_record("plain", MODEL, [out("code", ids_plain)]))
    drafted = row(quality_record("spec", [*MODEL, *(spec or ["--spec-type", "ngram-simple"])],
                                 [out("code", ids_spec)]))
    qrows = {q.configuration: q for q in quality_rows([plain, drafted], plain)}
    return qrows["spec"]


def test_speculation_that_changes_the_output_within_32_tokens_is_flagged():
    assert SPEC_EARLY == {"tokens": 32, "characters": 128}
    ids = list(range(100, 200))
    at_31 = checked(ids, ids[:31] + [0] * 69)
    assert at_31.control == "plain"
    assert at_31.flagged is not None and at_31.flagged.prefix == 31
    assert at_31.flag_text() == f"{SPECULATION_CHANGED}: the code prompt differs from plain at token 31"
    cell = quality_cell(at_31)
    assert cell.values["quality_flag"] == at_31.flag_text() and "!! " + at_31.flag_text() in cell.text
    at_0 = checked(ids, [0] + ids[1:])
    assert at_0.flagged is not None and at_0.flagged.prefix == 0
    # a drafted answer that stops early is a change too
    cut = checked(ids, ids[:10])
    assert cut.flagged is not None and cut.flagged.prefix == 10


def test_speculation_that_keeps_the_output_or_changes_it_late_is_not_flagged():
    ids = list(range(100, 200))
    at_32 = checked(ids, ids[:32] + [0] * 68)
    assert at_32.flagged is None and at_32.flag_text() == ""
    assert at_32.differs  # it still differs from the reference, and the quality table says so
    same = checked(ids, list(ids))
    assert same.flagged is None and not same.differs
    table = quality_table([row(quality_record("plain", MODEL, [out("code", ids)])),
                           row(quality_record("spec", [*MODEL, "--spec-type", "ngram-simple"],
                                              [out("code", list(ids))]))],
                          row(quality_record("plain", MODEL, [out("code", ids)])))
    notes = {line[0].text: line[-1].text for line in table.rows}
    assert notes["spec"] == "speculation kept the output of plain (1/1 identical)"


def test_the_speculation_mark_in_characters_is_128():
    from llm_bench.workloads.quality.score import Agreement, PromptAgreement

    early = Agreement("characters", (PromptAgreement("p", False, 127, 300),))
    late = Agreement("characters", (PromptAgreement("p", False, 128, 300),))
    assert speculation_change(early) is not None and speculation_change(late) is None
    tokens_127 = Agreement("tokens", (PromptAgreement("p", False, 127, 300),))
    assert speculation_change(tokens_127) is None  # 127 is late in tokens
    assert speculation_change(Agreement("tokens", (PromptAgreement("p", True, 300, 300),))) is None


def test_a_configuration_without_speculation_is_never_flagged():
    plain = row(quality_record("plain", MODEL, [out("code", [1, 2, 3])]))
    q4 = row(quality_record("q4", [*MODEL, "--cache-type-k", "q4_0"], [out("code", [9, 9, 9])]))
    qrows = {q.configuration: q for q in quality_rows([plain, q4], plain)}
    assert qrows["q4"].control is None and qrows["q4"].flagged is None
    assert qrows["q4"].differs and qrows["q4"].agreement.identical_share == 0.0
