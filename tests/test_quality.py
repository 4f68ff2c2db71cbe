"""The quality workload's pieces that need no model: scoring, agreement, the speculation check's control,
the results format, and the OpenAI engine against vLLM's wire format (logprobs with token ids)."""

from __future__ import annotations

from pathlib import Path

from llm_bench.engines.completion import CompletionRequest, parse_completion
from llm_bench.engines.openai import OpenAIEngine
from llm_bench.plan import Protocol
from llm_bench.report import load_rows, markdown_table
from llm_bench.report.rows import Row
from llm_bench.results import AliasRecord, ResultSet, ResultsWriter, load_results, read_toml, write_toml
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality import QUALITY, code_found, load_quality_set, quality, recall_prompt, trim_answer
from llm_bench.workloads.quality.record import (
    ExactAnswer,
    ForcedText,
    QualityOutput,
    QualityResults,
    QuestionResult,
    RecallProbe,
    quality_results,
)
from llm_bench.workloads.quality.score import agreement, control_for, quality_rows
from tests.fake_vllm import FakeVllm, FakeVllmConfig


def test_exact_answers_forgive_only_trimming():
    assert trim_answer('  "42."\n') == "42"
    assert trim_answer("`Ada`") == "Ada"
    assert trim_answer("12") == "12"
    assert trim_answer("The answer is 42.") == "The answer is 42"  # not 42: no hunting for a number
    assert trim_answer("42!") == "42!"


def test_a_code_counts_only_as_a_whole_number():
    assert code_found("The secret access code mentioned in the text is 2533.", "2533")
    assert not code_found("253.", "2533")  # what KV q4_0 answered in the measurement
    assert not code_found("25334", "2533")


def test_the_needle_sits_at_its_depth_on_a_sentence_boundary():
    recall = load_quality_set().recall
    for depth in (0.0, 0.5, 0.9):
        prompt = recall_prompt(recall, 4000, depth, "7194")
        needle = recall.needle.format(code="7194")
        at = prompt.index(needle)
        assert abs(at - depth * 4000) < 400  # the nearest sentence boundary below the depth
        assert at == 0 or prompt[at - 2:at] == ". "
        assert prompt.endswith(recall.question)


def test_the_shipped_set_has_every_kind_of_question():
    qset = load_quality_set()
    assert {q.kind for q in qset.questions} == {"arithmetic", "json", "code", "units"}
    assert len(qset.agreement) >= 3 and all(a.max_tokens > 0 for a in qset.agreement)


def out(prompt_id: str, text: str, ids: list[int] | None = None) -> QualityOutput:
    return QualityOutput(prompt_id, text, None if ids is None else len(ids), ids, "length")


def test_agreement_by_tokens_when_both_sides_have_ids():
    ref = [out("a", "x y z", [1, 2, 3]), out("b", "p q", [7, 8])]
    same = agreement(ref, [out("a", "x y z", [1, 2, 3]), out("b", "p q", [7, 8])])
    assert same.unit == "tokens" and same.identical_share == 1.0 and same.earliest is None
    other = agreement(ref, [out("a", "x y w", [1, 2, 9]), out("b", "p q", [7, 8])])
    assert other.identical_share == 0.5
    assert other.earliest.prompt_id == "a" and other.earliest.first_difference == 2
    assert other.mean_prefix == (2 + 2) / 2


def test_agreement_falls_back_to_characters_when_one_side_has_no_ids():
    result = agreement([out("a", "hello world", [1, 2])], [out("a", "hello there")])
    assert result.unit == "characters"
    assert result.prompts[0].first_difference == len("hello ")


def test_agreement_compares_only_prompts_both_answered():
    result = agreement([out("a", "x"), out("b", "y")], [out("b", "y")])
    assert [p.prompt_id for p in result.prompts] == ["b"] and result.identical_share == 1.0


def quality_record(alias: str, args: list[str], outputs: list[QualityOutput], build: str = "b1") -> AliasRecord:
    return AliasRecord(alias=alias, target="t", workload="quality", server_build=build,
                       preset_args=["llama-server", "--port", "1234", "--alias", alias, *args],
                       part=QualityResults(comparison="tokens", outputs=outputs))


def row(record: AliasRecord) -> Row:
    return Row(record.configuration, record, record.target, record.engine)


def test_a_speculative_preset_is_checked_against_the_same_build_and_models_plain_preset():
    model = ["--model", "/m/smol.gguf", "--ctx-size", "4096"]
    plain = row(quality_record("plain", model, []))
    q4 = row(quality_record("q4", [*model, "--cache-type-k", "q4_0", "--cache-type-v", "q4_0"], []))
    other_build = row(quality_record("plain-b2", model, [], build="b2"))
    spec = row(quality_record("spec", [*model, "--spec-type", "draft-simple", "--model-draft", "/m/d.gguf",
                                       "--spec-draft-n-max", "4"], []))
    spec_q4 = row(quality_record("spec-q4", [*model, "--cache-type-k", "q4_0", "--cache-type-v", "q4_0",
                                             "--spec-type", "ngram-simple"], []))
    rows = [other_build, q4, plain, spec, spec_q4]
    assert control_for(spec, rows) is plain
    assert control_for(spec_q4, rows) is q4
    assert control_for(plain, rows) is None  # not speculative: nothing to check


def test_only_an_early_difference_from_the_control_is_flagged():
    model = ["--model", "/m/smol.gguf"]
    ids = list(range(100))
    plain = quality_record("plain", model, [out("code", "", ids)])
    early = quality_record("synth", [*model, "--spec-type", "draft-simple"], [out("code", "", ids[:3] + [0] * 97)])
    late = quality_record("late", [*model, "--spec-type", "ngram-simple"], [out("code", "", ids[:90] + [0] * 10)])
    same = quality_record("self", [*model, "--spec-type", "draft-simple", "--spec-draft-n-max", "2"],
                          [out("code", "", ids)])
    qrows = {q.configuration: q for q in quality_rows([row(r) for r in (plain, early, late, same)], row(plain))}
    assert qrows["synth"].flagged is not None and qrows["synth"].flagged.prefix == 3
    assert "speculation changed the output" in qrows["synth"].flag_text()
    assert qrows["late"].flagged is None and qrows["late"].differs  # differs from the reference, not flagged
    assert qrows["self"].flagged is None and not qrows["self"].differs
    assert qrows["plain"].agreement is None and qrows["plain"].reference == "plain"


def test_quality_records_round_trip_and_old_files_still_load(tmp_path: Path):
    record = quality_record("plain", ["--model", "/m.gguf"], [out("code", "def f():\n    return 1", [5, 6, 7])])
    results = quality_results(record)
    results.questions = [QuestionResult("arithmetic", "arithmetic", "42", "32", False)]
    results.recall = [RecallProbe(1536, 0.5, "2533", 1400, "The code is 2533.", True),
                      RecallProbe(32768, 0.5, "7194", skipped="beyond the context")]
    results.forced = [ForcedText("code", "ab", "", 1, [5, 6], [[6, 9]], [[-0.1, -2.5]])]
    results.forced_seconds, results.exact_answers = 1.5, [ExactAnswer("arithmetic-easy-1", "470", True)]
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": "t"}), "q")
    writer.add(record)
    written = read_toml(writer.path)["aliases"][0]
    assert written["quality"]["comparison"] == "tokens" and written["quality"]["outputs"][0]["token_ids"] == [5, 6, 7]
    assert "quality_outputs" not in written and "recall" not in written  # the part alone holds them
    loaded = load_results(writer.path, PARTS).aliases[0]
    assert loaded.part == results and loaded.configuration == "plain [quality]"

    # a file written before the workload owned its part: the same figures in the record's flat keys
    flat = {k: v for k, v in written.items() if k != "quality"}
    flat |= {"quality_comparison": "tokens", "quality_outputs": written["quality"]["outputs"],
             **{k: written["quality"][k] for k in ("questions", "recall", "forced", "forced_seconds", "exact_answers")}}
    before = tmp_path / "flat.toml"
    write_toml(before, {"meta": {"format": "llm-bench/1", "label": "t"}, "aliases": [flat]})
    (migrated,) = load_results(before, PARTS).aliases
    assert migrated.part == results and migrated.configuration == "plain [quality]"

    old = tmp_path / "old.toml"  # a file written before the quality workload existed
    old.write_text('[meta]\nformat = "llm-bench/1"\nlabel = "x"\n\n[[aliases]]\nalias = "a"\nworkload = "protocol"\n'
                   'comparable = true\n\n[[aliases.runs]]\ndecode_tps = 10.0\n')
    (a,) = load_results(old, PARTS).aliases
    assert a.part is None and a.workload == "standard"
    assert "Quality" not in markdown_table(load_rows([old]))


def test_parse_completion_reads_llama_server_ids_and_rejects_a_partial_list():
    llama = {"choices": [{"message": {"content": "ab"}, "finish_reason": "stop",
                          "logprobs": {"content": [{"id": 64, "token": "a"}, {"id": 65, "token": "b"}]}}],
             "usage": {"completion_tokens": 2, "prompt_tokens": 9}}
    c = parse_completion(llama)
    assert c.token_ids == [64, 65] and c.text == "ab" and c.output_tokens == 2 and c.prompt_tokens == 9
    # llama-server with synthetic acceptance reported 95 entries for 96 tokens: compare characters then
    llama["usage"]["completion_tokens"] = 3
    assert parse_completion(llama).token_ids is None


def test_the_openai_engine_gets_token_ids_from_vllms_format_and_a_unique_salt():
    protocol = Protocol(workloads=("quality",), recall_lengths=(1024, 65536), recall_depths=(0.5,)).with_settings(
        QUALITY, {"exact_items_per_kind": 0})
    with FakeVllm(FakeVllmConfig(reply="The secret code is 2533.", max_model_len=32768)) as fake:
        engine = OpenAIEngine(fake.url, timeout=30)
        c = engine.complete(CompletionRequest.of(fake.config.model, "hi", 8))
        assert c.text == "The secret code is 2533." and c.token_ids is not None and len(c.token_ids) == 5
        assert engine.context_length(fake.config.model) == 32768
        base = AliasRecord(alias=fake.config.model, engine="openai", decode_source="stream")
        kept: list[AliasRecord] = []
        quality(engine, fake.config.model, protocol, base, lambda _m: None, kept.append)
        (record,) = kept
        engine.close()
        salts = {salt for salt, _prompt in fake.state.seen_prompts}
    results = quality_results(record)
    assert results.comparison == "tokens"
    assert len(salts) == fake.state.chat_calls == 1 + 3 + 4 + 1  # every request its own salt: no cached prefix
    found, skipped = results.recall
    assert found.length_tokens == 1024 and found.expected == "2533" and found.found is True
    assert skipped.length_tokens == 65536 and "32768" in skipped.skipped and skipped.found is None
    assert all(not q.correct for q in results.questions)
    # this stand-in has no /tokenize: the distributions are named as not scored, the rest is measured
    assert "a request for log-probabilities failed" in results.forced_error and "404" in results.forced_error


def test_the_chart_marks_configurations_whose_answers_differ(tmp_path: Path):
    from llm_bench.report.chart import draw_chart
    from llm_bench.results import RunRecord
    from llm_bench.workloads.quality.score import quality_marks

    model = ["--model", "/m/smol.gguf"]
    ids = list(range(40))
    speed = [AliasRecord(alias=a, target="t", preset_args=["llama-server", *args], runs=[RunRecord(decode_tps=v)])
             for a, args, v in (("plain", model, 10.0), ("synth", [*model, "--spec-type", "draft-simple"], 14.0),
                                ("q4", [*model, "--cache-type-k", "q4_0"], 12.0))]
    quality_records = [quality_record("plain", model, [out("code", "", ids)]),
                       quality_record("synth", [*model, "--spec-type", "draft-simple"], [out("code", "", ids[:2] + [0] * 38)]),
                       quality_record("q4", [*model, "--cache-type-k", "q4_0"], [out("code", "", ids[:35] + [0] * 5)])]
    rows = [row(r) for r in speed + quality_records]
    marks = quality_marks(rows, rows[0])
    assert marks == {"synth": "speculation changed the output", "q4": "quality differs (0% identical)"}
    assert draw_chart(rows, tmp_path / "chart.png", rows[0]).stat().st_size > 0
