"""Quality beside speed, at report time: agreement of greedy outputs with a reference configuration,
recall and exact-answer accuracy per configuration, and the speculation check.

The public API (also used by ``llm-bench tune``):

- ``agreement(reference_outputs, outputs) -> Agreement``: compare two configurations' greedy answers
  to the same prompts (token ids where both have them, else characters).
- ``quality_rows(rows, reference) -> list[QualityRow]``: one per configuration measured with the
  ``quality`` workload; ``quality_table(rows, reference)`` renders them; ``quality_cell`` is the main
  table's column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm_bench.preset_args import is_speculative, parse_args, preset_facts, without_speculation
from llm_bench.quality.divergence import Divergence, Estimate, compare
from llm_bench.quality.paired import WORSE, PairedVerdict, paired_verdict
from llm_bench.results import AliasRecord
from llm_bench.tables import Cell, Row, Section, Table
from llm_bench.workloads.quality.record import (
    QUALITY_RECORDS,
    ExactAnswer,
    QualityOutput,
    QualityResults,
    QuestionResult,
    RecallProbe,
    quality_results,
)

# Speculative decoding is lossless by design: its greedy output must equal its control's. A first
# difference this early (or earlier) is flagged; later ones can come from a GPU's batched verification
# rounding differently at a near-tie, which is not what the flag is about.
SPEC_EARLY = {"tokens": 32, "characters": 128}
SPECULATION_CHANGED = "speculation changed the output"

# Arguments that differ between any two instances the router starts.
_INSTANCE_FLAGS = ("--port", "--alias")


# The verdicts on a configuration's quality against the reference (docs/quality.md: "Quality verdicts").
LOSSLESS, NEAR_LOSSLESS, LOSSY = "lossless", "near-lossless", "lossy"
VERDICTS = (LOSSLESS, NEAR_LOSSLESS, LOSSY)  # best first
# Mean KLD (nats) at or below which a configuration is "lossless": zero, up to the rounding of the
# log-probabilities the server sends.
ZERO_KLD = 1e-6
# The upper end of the mean KLD's 95 % interval at or below which a configuration is "near-lossless".
# Measured on the CPU bed (SmolLM2-135M, docs/quality.md): KV q8_0 0.0028 [0.0024, 0.0032], KV q4_0
# 0.046 [0.038, 0.056]; 0.01 lies three times above the first interval and four times below the second.
NEAR_LOSSLESS_KLD = 0.01


@dataclass(frozen=True)
class Distributions:
    """A configuration's token distributions against the reference's: the figures, or why none."""

    divergence: Divergence | None
    problem: str | None = None  # a comparison that could not be made, named

    def describe(self) -> str:
        if self.divergence is None:
            return f"not scored: {self.problem}" if self.problem else "-"
        d = self.divergence
        return (f"mean KLD {estimate_text(d.mean_kld, '.3g')} nats, p99 {estimate_text(d.p99_kld, '.3g')}, "
                f"same top token {estimate_text(d.same_top, '.1%')} over {d.positions} positions")


def estimate_text(e: Estimate, spec: str) -> str:
    if e.low is None or e.high is None:
        return format(e.value, spec)
    return f"{format(e.value, spec)} [{format(e.low, spec)}, {format(e.high, spec)}]"


def distributions(reference: AliasRecord, record: AliasRecord) -> Distributions | None:
    """``record``'s distributions against ``reference``'s over the same text; None when neither was measured."""
    mine, theirs = quality_results(record), quality_results(reference)
    if mine.forced_error:
        return Distributions(None, mine.forced_error)
    if not mine.forced:
        return None
    if theirs.forced_error:
        return Distributions(None, f"the reference {reference.alias}: {theirs.forced_error}")
    if not theirs.forced:
        return Distributions(None, f"the reference {reference.alias} has no token distributions")
    ref_segments = {f.segment: f for f in theirs.forced}
    refs: list[dict[int, float]] = []
    cfgs: list[dict[int, float]] = []
    for forced in mine.forced:
        ref = ref_segments.get(forced.segment)
        if ref is None or ref.token_ids != forced.token_ids or ref.first != forced.first:
            return Distributions(None, f"{record.alias} was forced over other tokens than the reference "
                                       f"{reference.alias} ({forced.segment}): another text or another tokeniser")
        refs += [dict(zip(i, lp, strict=True)) for i, lp in zip(ref.top_ids, ref.top_logprobs, strict=True)]
        cfgs += [dict(zip(i, lp, strict=True)) for i, lp in zip(forced.top_ids, forced.top_logprobs, strict=True)]
    return Distributions(compare(refs, cfgs))


def answers_verdict(reference: AliasRecord, record: AliasRecord) -> PairedVerdict | None:
    """The paired verdict on the exact-answer items both answered (None when they share none)."""
    mine = {a.item_id: a.correct for a in quality_results(record).exact_answers}
    shared = [a for a in quality_results(reference).exact_answers if a.item_id in mine]
    if not shared:
        return None
    return paired_verdict([a.correct for a in shared], [mine[a.item_id] for a in shared])


def same_answers(reference: AliasRecord, record: AliasRecord) -> bool:
    mine = {a.item_id: a.answer for a in quality_results(record).exact_answers}
    return all(mine.get(a.item_id) == a.answer for a in quality_results(reference).exact_answers)


def quality_verdict(dist: Distributions | None, answers: PairedVerdict | None, identical_answers: bool) -> str | None:
    """lossless, near-lossless or lossy; None without token distributions to judge by."""
    if dist is None or dist.divergence is None:
        return None
    mean = dist.divergence.mean_kld
    if answers is not None and answers.kind == WORSE:
        return LOSSY
    if mean.value <= ZERO_KLD and identical_answers:
        return LOSSLESS
    upper = mean.high if mean.high is not None else mean.value
    return NEAR_LOSSLESS if upper <= NEAR_LOSSLESS_KLD else LOSSY


def verdict_text(verdict: str | None, dist: Distributions | None, answers: PairedVerdict | None) -> str:
    """The verdict as people read it: lossy with its KLD and top-token share, and the answers' verdict."""
    parts = []
    if verdict is not None and dist is not None and dist.divergence is not None:
        d = dist.divergence
        parts.append(verdict if verdict == LOSSLESS else
                     f"{verdict} (KLD {d.mean_kld.value:.3g}, same top {d.same_top.value:.0%})")
    elif dist is not None and dist.problem:
        parts.append(f"not scored: {dist.problem}")
    if answers is not None:
        parts.append(f"{answers.kind} ({answers.configuration_right}/{answers.items} vs "
                     f"{answers.reference_right}/{answers.items}, p = {answers.p_value:.2g})")
    return "; ".join(parts)


def recall_by_length(probes: Sequence[RecallProbe]) -> dict[int, float | None]:
    """Length -> share of its needles found (None: every probe of that length was skipped)."""
    lengths: dict[int, list[bool]] = {}
    for probe in probes:
        lengths.setdefault(probe.length_tokens, [])
        if probe.found is not None:
            lengths[probe.length_tokens].append(probe.found)
    return {n: (sum(found) / len(found) if found else None) for n, found in lengths.items()}


def recall_share(probes: Sequence[RecallProbe]) -> float | None:
    measured = [p.found for p in probes if p.found is not None]
    return sum(measured) / len(measured) if measured else None


def accuracy(questions: Sequence[QuestionResult]) -> float | None:
    return sum(q.correct for q in questions) / len(questions) if questions else None


@dataclass(frozen=True)
class PromptAgreement:
    prompt_id: str
    identical: bool
    prefix: int  # length of the identical prefix, in the Agreement's unit
    length: int  # the reference output's length, in the same unit

    @property
    def first_difference(self) -> int | None:
        """Where the outputs part (0-based), None when identical."""
        return None if self.identical else self.prefix


@dataclass(frozen=True)
class Agreement:
    unit: str  # "tokens" when both sides reported token ids for every prompt, else "characters"
    prompts: tuple[PromptAgreement, ...]

    @property
    def identical_share(self) -> float | None:
        return sum(p.identical for p in self.prompts) / len(self.prompts) if self.prompts else None

    @property
    def mean_prefix(self) -> float | None:
        return sum(p.prefix for p in self.prompts) / len(self.prompts) if self.prompts else None

    @property
    def earliest(self) -> PromptAgreement | None:
        """The prompt whose outputs part soonest, None when all are identical."""
        differing = [p for p in self.prompts if not p.identical]
        return min(differing, key=lambda p: p.prefix) if differing else None

    def describe(self) -> str:
        if not self.prompts:
            return "no prompts in common"
        same = sum(p.identical for p in self.prompts)
        text = f"{same}/{len(self.prompts)} identical"
        first = self.earliest
        if first is not None:
            text += f", first difference at {self._unit_one()} {first.prefix} ({first.prompt_id})"
        return text

    def _unit_one(self) -> str:
        return "token" if self.unit == "tokens" else "character"


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # the common prefix of two answers of any lengths
        if x != y:
            break
        n += 1
    return n


def agreement(reference_outputs: Sequence[QualityOutput], outputs: Sequence[QualityOutput]) -> Agreement:
    """Greedy outputs compared prompt by prompt (only prompts both sides answered)."""
    by_id = {o.prompt_id: o for o in outputs}
    pairs = [(r, by_id[r.prompt_id]) for r in reference_outputs if r.prompt_id in by_id]
    tokens = bool(pairs) and all(r.token_ids is not None and o.token_ids is not None for r, o in pairs)
    prompts = []
    for ref, out in pairs:
        a, b = (ref.token_ids, out.token_ids) if tokens else (ref.text, out.text)
        assert a is not None and b is not None
        prompts.append(PromptAgreement(ref.prompt_id, list(a) == list(b), _common_prefix(a, b), len(a)))
    return Agreement("tokens" if tokens else "characters", tuple(prompts))


def _model_path(row: Row) -> str | None:
    parsed = parse_args(row.record.preset_args)
    return parsed.get("--model") or parsed.get("-m") or parsed.get("--hf-repo") or parsed.get("-hf")


def _non_spec_args(row: Row) -> dict[str, str]:
    """The arguments a control must share: all but speculation's and the instance's own."""
    return {k: v for k, v in without_speculation(row.record.preset_args).items() if k not in _INSTANCE_FLAGS}


def control_for(row: Row, candidates: Sequence[Row]) -> Row | None:
    """The non-speculative configuration of the same build and model that a speculative one must match:
    the one whose other preset arguments are the same, else one with the same KV cache types."""
    if not is_speculative(row.record.preset_args) or _model_path(row) is None:
        return None
    same = [c for c in candidates if not is_speculative(c.record.preset_args) and c.label == row.label
            and c.record.server_build == row.record.server_build and _model_path(c) == _model_path(row)]
    exact = [c for c in same if _non_spec_args(c) == _non_spec_args(row)]
    if exact:
        return exact[0]
    facts = preset_facts(row.record.preset_args)
    kv = [c for c in same if all(preset_facts(c.record.preset_args).get(k) == facts.get(k)
                                 for k in ("cache_k", "cache_v"))]
    return kv[0] if kv else None


def speculation_change(spec: Agreement) -> PromptAgreement | None:
    """The early difference that flags a speculative configuration, None when there is none."""
    first = spec.earliest
    return first if first is not None and first.prefix < SPEC_EARLY[spec.unit] else None


@dataclass(frozen=True)
class QualityRow:
    configuration: str  # as the main table names the configuration (without " [quality]")
    row: Row
    reference: str | None
    agreement: Agreement | None  # with the reference; None for the reference itself or without one
    control: str | None = None
    speculation: Agreement | None = None  # with the control, for a speculative configuration
    flagged: PromptAgreement | None = None  # set when speculation changed the output early
    distributions: Distributions | None = None  # against the reference
    answers: PairedVerdict | None = None  # the exact-answer items against the reference
    verdict: str | None = None  # lossless, near-lossless or lossy

    def verdict_text(self) -> str:
        return verdict_text(self.verdict, self.distributions, self.answers)

    @property
    def results(self) -> QualityResults:
        return quality_results(self.row.record)

    @property
    def recall(self) -> dict[int, float | None]:
        return recall_by_length(self.results.recall)

    @property
    def recall_share(self) -> float | None:
        return recall_share(self.results.recall)

    @property
    def accuracy(self) -> float | None:
        return accuracy(self.results.questions)

    @property
    def differs(self) -> bool:
        """Its greedy output is not the reference's on every prompt, or speculation changed it."""
        return self.flagged is not None or (self.agreement is not None and self.agreement.identical_share != 1.0)

    def flag_text(self) -> str:
        if self.flagged is None or self.speculation is None:
            return ""
        unit = "token" if self.speculation.unit == "tokens" else "character"
        return (f"{SPECULATION_CHANGED}: the {self.flagged.prompt_id} prompt differs from {self.control} "
                f"at {unit} {self.flagged.prefix}")


def _display_name(row: Row) -> str:
    return row.configuration.removesuffix(" [quality]")


def quality_of(row: Row, rows: Sequence[Row]) -> Row | None:
    """The quality record of the configuration a speed row (or a quality row) belongs to."""
    for other in rows:
        if (other.record.workload == QUALITY_RECORDS and other.label == row.label
                and other.record.alias == row.record.alias):
            return other
    return None


def quality_rows(rows: Sequence[Row], reference: Row | None = None) -> list[QualityRow]:
    """One per configuration measured with the quality workload. ``reference`` is a row of the reference
    configuration (the baseline's speed row will do); without one, agreement is left out."""
    chosen = [r for r in rows if r.record.workload == QUALITY_RECORDS and quality_results(r.record).measured]
    ref = None if reference is None else quality_of(reference, rows)
    out = []
    for row in chosen:
        mine = quality_results(row.record)
        agree = None
        if ref is not None and row is not ref:
            agree = agreement(quality_results(ref.record).outputs, mine.outputs)
        dist = answers = verdict = None
        if ref is not None and row is not ref:
            dist = distributions(ref.record, row.record)
            answers = answers_verdict(ref.record, row.record)
            verdict = quality_verdict(dist, answers, same_answers(ref.record, row.record))
        elif mine.forced_error:
            dist = Distributions(None, mine.forced_error)
        control = control_for(row, chosen)
        spec = None if control is None else agreement(quality_results(control.record).outputs, mine.outputs)
        out.append(QualityRow(_display_name(row), row, None if ref is None else _display_name(ref), agree,
                              None if control is None else _display_name(control), spec,
                              None if spec is None else speculation_change(spec), dist, answers, verdict))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def recall_text(q: QualityRow) -> str:
    parts = [f"{length}: {'skipped' if share is None else f'{share:.0%}'}" for length, share in q.recall.items()]
    return ", ".join(parts) or "-"


def quality_cells(rows: Sequence[Row], reference: Row | None) -> dict[str, Cell]:
    """The main table's quality column, by speed row configuration (only rows with a quality record)."""
    qrows = quality_rows(rows, reference)
    cells = {}
    for row in rows:
        if row.record.workload == QUALITY_RECORDS:
            continue
        for q in qrows:
            if q.row.label == row.label and q.row.record.alias == row.record.alias:
                cells[row.configuration] = quality_cell(q)
    return cells


def quality_marks(rows: Sequence[Row], reference: Row | None) -> dict[str, str]:
    """Speed row configuration -> a short mark, for configurations whose quality differs from the reference
    (or whose speculation changed the output): what the chart writes beside their bars."""
    qrows = quality_rows(rows, reference)
    marks = {}
    for row in rows:
        for q in qrows:
            if row.record.workload != QUALITY_RECORDS and q.row.label == row.label and q.row.record.alias == row.record.alias:
                if q.flagged is not None:
                    marks[row.configuration] = "speculation changed the output"
                elif q.verdict == LOSSY:
                    marks[row.configuration] = q.verdict_text().split(";")[0]
                elif q.differs and q.agreement is not None:
                    marks[row.configuration] = f"quality differs ({q.agreement.identical_share:.0%} identical)"
    return marks


def quality_cell(q: QualityRow) -> Cell:
    """Agreement with the reference and recall, and the speculation flag."""
    parts = [q.verdict_text()] if q.verdict_text() else []
    if q.agreement is not None:
        parts.append(f"agree {_pct(q.agreement.identical_share)}")
    elif q.reference == q.configuration:
        parts.append("reference")
    if q.recall_share is not None:
        parts.append(f"recall {_pct(q.recall_share)}")
    if q.flagged is not None:
        parts.append("!! " + q.flag_text())
    return Cell(", ".join(parts) or "-", {
        **verdict_data(q),
        "agreement": None if q.agreement is None else q.agreement.identical_share,
        "recall": q.recall_share, "quality_flag": q.flag_text() or None})


def verdict_data(q: QualityRow) -> dict[str, object]:
    """The verdicts and their figures as JSON and CSV carry them."""
    d = None if q.distributions is None else q.distributions.divergence
    a = q.answers
    return {
        "quality_verdict": q.verdict,
        "mean_kld": None if d is None else d.mean_kld.value,
        "mean_kld_low": None if d is None else d.mean_kld.low,
        "mean_kld_high": None if d is None else d.mean_kld.high,
        "p99_kld": None if d is None else d.p99_kld.value,
        "same_top": None if d is None else d.same_top.value,
        "same_top_low": None if d is None else d.same_top.low,
        "same_top_high": None if d is None else d.same_top.high,
        "kld_positions": None if d is None else d.positions,
        "distributions_not_scored": None if q.distributions is None else q.distributions.problem,
        "answers_verdict": None if a is None else a.kind,
        "answers_right": None if a is None else a.configuration_right,
        "answers_reference_right": None if a is None else a.reference_right,
        "answers_items": None if a is None else a.items,
        "answers_lost": None if a is None else a.lost,
        "answers_gained": None if a is None else a.gained,
        "answers_p": None if a is None else a.p_value,
    }


def quality_tables(rows: Sequence[Row], reference: Row | None = None) -> list[Table]:
    table = quality_table(rows, reference)
    return [] if table is None else [table]


def quality_summary(rows: Sequence[Row], reference: Row | None) -> list[Section]:
    qrows = quality_rows(rows, reference)
    sections = []
    verdicts = [f"{q.configuration}: {q.verdict_text()}" for q in qrows if q.verdict_text()]
    if verdicts:
        sections.append(Section(f"Quality verdicts against {qrows[0].reference} (token distributions, exact-answer items)"
                                if qrows[0].reference else "Quality (token distributions)", verdicts))
    changed = [f"{q.configuration}: {q.flag_text() or (q.agreement.describe() if q.agreement else '')}"
               for q in qrows if q.differs]
    if changed:
        sections.append(Section("Answers that differ from the reference (quality workload)", changed))
    return sections


def quality_table(rows: Sequence[Row], reference: Row | None = None) -> Table | None:
    """Per configuration: agreement with the reference, first difference, recall by length, accuracy."""
    qrows = quality_rows(rows, reference)
    if not qrows:
        return None
    ref_name = qrows[0].reference
    header = ["Configuration", "Verdict", "Mean KLD (95 % CI)", "p99 KLD", "Same top token",
              "Exact items (paired)", f"Agreement with {ref_name}" if ref_name else "Agreement", "Mean identical prefix",
              "First difference", "Recall by length (tokens)", "Exact answers", "Compared by", "Notes"]
    lines = []
    for q in qrows:
        a = q.agreement
        first = None if a is None else a.earliest
        notes = [q.flag_text()] if q.flagged else []
        if q.speculation is not None and not q.flagged:
            notes.append(f"speculation kept the output of {q.control} "
                         f"({sum(p.identical for p in q.speculation.prompts)}/{len(q.speculation.prompts)} identical)")
        skipped = sorted({p.skipped for p in q.results.recall if p.skipped})
        notes += skipped
        questions = q.results.questions
        dist = None if q.distributions is None else q.distributions.divergence
        data = verdict_data(q)
        if q.distributions is not None and q.distributions.problem:
            notes.append(f"token distributions not scored: {q.distributions.problem}")
        items = q.results.exact_answers
        lines.append([
            Cell(q.configuration, {"configuration": q.configuration}),
            Cell("reference" if q.reference == q.configuration and q.verdict is None else q.verdict or "-",
                 {"quality_verdict": q.verdict}),
            Cell("-" if dist is None else estimate_text(dist.mean_kld, ".3g"),
                 {k: data[k] for k in ("mean_kld", "mean_kld_low", "mean_kld_high", "kld_positions")}),
            Cell("-" if dist is None else estimate_text(dist.p99_kld, ".3g"), {"p99_kld": data["p99_kld"]}),
            Cell("-" if dist is None else estimate_text(dist.same_top, ".1%"),
                 {k: data[k] for k in ("same_top", "same_top_low", "same_top_high")}),
            Cell(answers_cell(q.answers, items), {k: v for k, v in data.items() if k.startswith("answers_")}),
            Cell("reference" if a is None and q.reference == q.configuration else
                 "-" if a is None else f"{a.identical_share:.0%} identical",
                 {"agreement": None if a is None else a.identical_share}),
            Cell("-" if a is None else f"{a.mean_prefix:.1f} {a.unit}",
                 {"mean_identical_prefix": None if a is None else a.mean_prefix}),
            Cell("-" if first is None else f"{first.prompt_id} at {first.prefix}",
                 {"first_difference_prompt": None if first is None else first.prompt_id,
                  "first_difference_at": None if first is None else first.prefix}),
            Cell(recall_text(q), {"recall": q.recall_share,
                                  **{f"recall_{n}": share for n, share in q.recall.items()}}),
            Cell("-" if not questions else f"{sum(x.correct for x in questions)}/{len(questions)}",
                 {"accuracy": q.accuracy}),
            Cell(a.unit if a is not None else (q.results.comparison or "-"),
                 {"compared_by": None if a is None else a.unit}),
            Cell("; ".join(notes), {"quality_flag": q.flag_text() or None}),
        ])
    return Table("Quality", "quality", header, lines,
                 frozenset({"Configuration", "Verdict", "Exact items (paired)", "First difference",
                            "Recall by length (tokens)", "Compared by", "Notes"}))


def answers_cell(answers: PairedVerdict | None, items: Sequence[ExactAnswer]) -> str:
    if answers is None:
        return f"{sum(a.correct for a in items)}/{len(items)} right" if items else "-"
    return (f"{answers.kind}: {answers.configuration_right}/{answers.items} vs {answers.reference_right} "
            f"({answers.lost} lost, {answers.gained} gained, p = {answers.p_value:.2g})")
