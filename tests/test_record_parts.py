"""A workload's own part of a record: declared by the workload, kept in ``AliasRecord.part``, written under
``[aliases.<workload>]``, read back by the part type the workload registers; and a workload's table groups
its rows by the configuration they belong to, never by taking its name apart."""

from __future__ import annotations

import tomllib

import tomli_w

from llm_bench.report import load_rows, rows_of
from llm_bench.results import AliasRecord, ResultSet, RunRecord, load_results
from llm_bench.workloads import PARTS, REGISTRY
from llm_bench.workloads.categories import PromptCategory, category_of
from llm_bench.workloads.concurrency import CONCURRENCY, ConcurrencyLevel, level_of
from llm_bench.workloads.depth import DEPTH, DepthPoint, depth_tables, point_of
from llm_bench.workloads.prefix_cache import PrefixCacheHit, hit_of
from llm_bench.workloads.quality.record import QualityResults
from llm_bench.workloads.session import SESSION, SessionResult, result_of

# A depth record and a session record as files of the current format hold them (written before the
# part types moved to their workloads): read the same way now.
CURRENT_FILE = '''\
[meta]
format = "llm-bench/1"
label = "bed"

[[aliases]]
alias = "smol"
workload = "depth"
comparable = true
warnings = []

[aliases.depth]
tokens = 4096
filler_chars = 16000
chars_per_token = 3.9

[[aliases.runs]]
decode_tps = 40.0
prompt_tokens = 4120

[[aliases]]
alias = "smol"
workload = "session"
comparable = true

[aliases.session]
source = "shipped"
messages = 27
tools = 4
turns = 13
warm_s = 2.5
cold = []

[[aliases.session.warm]]
turn = 1
added = "system, user"
ttft_ms = 120.0
prompt_tokens = 900
cache_n = 0
'''


def test_the_workloads_that_store_data_register_their_part_types():
    assert PARTS == {"category": PromptCategory, "concurrency": ConcurrencyLevel, "prefix-cache": PrefixCacheHit,
                     "depth": DepthPoint, "session": SessionResult, "quality": QualityResults}
    assert [w.name for w in REGISTRY if w.part is None] == ["standard"]


def test_a_file_of_the_current_format_reads_into_the_workloads_parts(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(CURRENT_FILE)
    depth, session = load_results(path, PARTS).aliases
    assert point_of(depth) == DepthPoint(4096, 16000, 3.9) and result_of(depth) is None
    assert result_of(session).warm[0].ttft_ms == 120.0 and result_of(session).warm_s == 2.5
    assert [r.configuration for r in (depth, session)] == ["smol [depth 4096]", "smol [session]"]
    # written again, each part stays under [aliases.<workload>], figure for figure
    again = tomllib.loads(path.read_text())
    rewritten = ResultSet(again["meta"], [depth, session]).to_toml()
    assert rewritten["aliases"][0]["depth"] == again["aliases"][0]["depth"]
    assert rewritten["aliases"][1]["session"] == again["aliases"][1]["session"]
    # without the part types, a record keeps its runs and has no part (nothing is guessed)
    assert load_results(path, {}).aliases[0].part is None


def test_a_depth_row_split_by_backend_keeps_its_configuration():
    """Behind a proxy a depth record answered by two backends is two rows; each is the alias at its
    backend in the depth table (a name taken apart with removesuffix would have kept the depth in it)."""
    runs = [RunRecord(decode_tps=40.0, backend="http://10.0.0.1:8080"), RunRecord(decode_tps=20.0,
                                                                                 backend="http://10.0.0.2:8080")]
    record = AliasRecord("smol", workload=DEPTH.record_name, part=DepthPoint(4096), runs=runs)
    rows = rows_of([ResultSet({"label": "bed"}, [record])])
    assert [r.configuration for r in rows] == ["smol [depth 4096] @ 10.0.0.1:8080", "smol [depth 4096] @ 10.0.0.2:8080"]
    (table,) = depth_tables(rows)
    assert [line[0].text for line in table.rows] == ["smol @ 10.0.0.1:8080", "smol @ 10.0.0.2:8080"]


def test_rows_of_several_labels_group_by_the_label_and_alias(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text(CURRENT_FILE)
    second.write_text(CURRENT_FILE.replace('label = "bed"', 'label = "box"'))
    rows = load_rows([first, second])
    assert {r.configuration: r.group for r in rows} == {
        "bed / smol [depth 4096]": "bed / smol", "bed / smol [session]": "bed / smol",
        "box / smol [depth 4096]": "box / smol", "box / smol [session]": "box / smol"}
    (session_summary, _turns) = SESSION.tables(rows, None)
    assert [line[0].text for line in session_summary.rows] == ["bed / smol", "box / smol"]


# A categories, a concurrency and a prefix-cache record as files written before their parts were the workloads'
# kept them: flat keys of the record (category, concurrency, total_tps, prefix_*).
FLAT_FILE = '''\
[meta]
format = "llm-bench/1"
label = "bed"

[[aliases]]
alias = "smol"
workload = "category"
category = "code"
decode_tps_median = 41.0

[[aliases.runs]]
decode_tps = 41.0

[[aliases]]
alias = "smol"
workload = "concurrency"
concurrency = 4
total_tps = 96.5
ttft_ms_p50 = 210.0

[[aliases.runs]]
decode_tps = 24.0
ttft_ms = 200.0
batch = 1

[[aliases.runs]]
decode_tps = 25.0
ttft_ms = 220.0
batch = 1

[[aliases]]
alias = "smol"
workload = "prefix-cache"
prefix_cold_ttft_ms = 900.0
prefix_warm_ttft_ms = 60.0
prefix_cached_tokens = 10990
prefix_evidence = "server reported 10990 of 11001 prompt tokens from cache"
'''


def test_flat_category_and_concurrency_keys_are_migrated_once_on_read(tmp_path):
    path = tmp_path / "flat.toml"
    path.write_text(FLAT_FILE)
    category, level, prefix = load_results(path, PARTS).aliases
    assert category_of(category) == "code" and category.configuration == "smol [code]"
    assert level_of(level) == ConcurrencyLevel(4, 96.5) and level.configuration == "smol [x4]"
    assert hit_of(prefix) == PrefixCacheHit(900.0, 60.0, 10990, "server reported 10990 of 11001 prompt tokens "
                                            "from cache") and prefix.configuration == "smol [prefix-cache]"
    # written again: each under its workload's table, the flat keys gone, the figures the same
    again = ResultSet({"format": "llm-bench/1", "label": "bed"}, [category, level, prefix]).to_toml()["aliases"]
    assert again[2]["prefix-cache"]["warm_ttft_ms"] == 60.0 and "prefix_warm_ttft_ms" not in again[2]
    assert again[0]["category"] == {"name": "code"}
    assert again[1]["concurrency"] == {"streams": 4, "total_tps": 96.5} and "total_tps" not in again[1]
    assert again[1]["ttft_ms_p50"] == 210.0  # the tail of its two runs, as the older file had it
    path.write_text(tomli_w.dumps({"meta": {"format": "llm-bench/1", "label": "bed"}, "aliases": again}))
    assert load_results(path, PARTS).aliases == [category, level, prefix]
    # the report shows the migrated records as it showed the flat ones
    rows = load_rows([path])
    (table,) = CONCURRENCY.tables(rows, None)
    assert [[c.text for c in line[:3]] for line in table.rows] == [["smol [x4]", "4", "96.5"]]
