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

from llm_bench.preset_args import parse_args, preset_facts, speculation
from llm_bench.results import QualityOutput, QuestionResult, RecallProbe
from llm_bench.tables import Cell, Row, Section, Table

# The ``workload`` of the quality workload's records (``QUALITY`` in measure.py writes them).
QUALITY_RECORDS = "quality"

# Speculative decoding is lossless by design: its greedy output must equal its control's. A first
# difference this early (or earlier) is flagged; later ones can come from a GPU's batched verification
# rounding differently at a near-tie, which is not what the flag is about.
SPEC_EARLY = {"tokens": 32, "characters": 128}
SPECULATION_CHANGED = "speculation changed the output"

# Preset arguments that only concern speculative decoding; the rest must match for a control.
_SPEC_FLAGS = ("--spec-", "--model-draft", "-md", "--draft", "-ngld", "--n-gpu-layers-draft", "-td", "-tbd",
               "-ctkd", "-ctvd", "-devd", "--device-draft", "--cache-type-k-draft", "--cache-type-v-draft")
# Arguments that differ between any two instances the router starts.
_INSTANCE_FLAGS = ("--port", "--alias")


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


def is_speculative(row: Row) -> bool:
    return speculation(row.record.preset_args) != "-"


def _model_path(row: Row) -> str | None:
    parsed = parse_args(row.record.preset_args)
    return parsed.get("--model") or parsed.get("-m") or parsed.get("--hf-repo") or parsed.get("-hf")


def _non_spec_args(row: Row) -> dict[str, str]:
    return {k: v for k, v in parse_args(row.record.preset_args).items()
            if not k.startswith(_SPEC_FLAGS) and k not in _SPEC_FLAGS and k not in _INSTANCE_FLAGS}


def control_for(row: Row, candidates: Sequence[Row]) -> Row | None:
    """The non-speculative configuration of the same build and model that a speculative one must match:
    the one whose other preset arguments are the same, else one with the same KV cache types."""
    if not is_speculative(row) or _model_path(row) is None:
        return None
    same = [c for c in candidates if not is_speculative(c) and c.label == row.label
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

    @property
    def recall(self) -> dict[int, float | None]:
        return recall_by_length(self.row.record.recall)

    @property
    def recall_share(self) -> float | None:
        return recall_share(self.row.record.recall)

    @property
    def accuracy(self) -> float | None:
        return accuracy(self.row.record.questions)

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
    chosen = [r for r in rows if r.record.workload == QUALITY_RECORDS and r.record.quality_outputs]
    ref = None if reference is None else quality_of(reference, rows)
    out = []
    for row in chosen:
        agree = None
        if ref is not None and row is not ref:
            agree = agreement(ref.record.quality_outputs, row.record.quality_outputs)
        control = control_for(row, chosen)
        spec = None if control is None else agreement(control.record.quality_outputs, row.record.quality_outputs)
        out.append(QualityRow(_display_name(row), row, None if ref is None else _display_name(ref), agree,
                              None if control is None else _display_name(control), spec,
                              None if spec is None else speculation_change(spec)))
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
                elif q.differs and q.agreement is not None:
                    marks[row.configuration] = f"quality differs ({q.agreement.identical_share:.0%} identical)"
    return marks


def quality_cell(q: QualityRow) -> Cell:
    """Agreement with the reference and recall, and the speculation flag."""
    parts = []
    if q.agreement is not None:
        parts.append(f"agree {_pct(q.agreement.identical_share)}")
    elif q.reference == q.configuration:
        parts.append("reference")
    if q.recall_share is not None:
        parts.append(f"recall {_pct(q.recall_share)}")
    if q.flagged is not None:
        parts.append("!! " + q.flag_text())
    return Cell(", ".join(parts) or "-", {
        "agreement": None if q.agreement is None else q.agreement.identical_share,
        "recall": q.recall_share, "quality_flag": q.flag_text() or None})


def quality_tables(rows: Sequence[Row], reference: Row | None = None) -> list[Table]:
    table = quality_table(rows, reference)
    return [] if table is None else [table]


def quality_summary(rows: Sequence[Row], reference: Row | None) -> list[Section]:
    changed = [f"{q.configuration}: {q.flag_text() or (q.agreement.describe() if q.agreement else '')}"
               for q in quality_rows(rows, reference) if q.differs]
    return [Section("Answers that differ from the reference (quality workload)", changed)] if changed else []


def quality_table(rows: Sequence[Row], reference: Row | None = None) -> Table | None:
    """Per configuration: agreement with the reference, first difference, recall by length, accuracy."""
    qrows = quality_rows(rows, reference)
    if not qrows:
        return None
    ref_name = qrows[0].reference
    header = ["Configuration", f"Agreement with {ref_name}" if ref_name else "Agreement", "Mean identical prefix",
              "First difference", "Recall by length (tokens)", "Exact answers", "Compared by", "Notes"]
    lines = []
    for q in qrows:
        a = q.agreement
        first = None if a is None else a.earliest
        notes = [q.flag_text()] if q.flagged else []
        if q.speculation is not None and not q.flagged:
            notes.append(f"speculation kept the output of {q.control} "
                         f"({sum(p.identical for p in q.speculation.prompts)}/{len(q.speculation.prompts)} identical)")
        skipped = sorted({p.skipped for p in q.row.record.recall if p.skipped})
        notes += skipped
        questions = q.row.record.questions
        lines.append([
            Cell(q.configuration, {"configuration": q.configuration}),
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
            Cell(a.unit if a is not None else (q.row.record.quality_comparison or "-"),
                 {"compared_by": None if a is None else a.unit}),
            Cell("; ".join(notes), {"quality_flag": q.flag_text() or None}),
        ])
    return Table("Quality", "quality", header, lines,
                 frozenset({"Configuration", "First difference", "Recall by length (tokens)", "Compared by", "Notes"}))
