"""benchmarks/pass_table.py and the table it wrote into docs/optimizer.md."""
from __future__ import annotations

import re
from pathlib import Path

from neurovec.benchmarks import pass_table
from neurovec.compiler.pipeline import PIPELINE, enabled_passes
from neurovec.compiler.settings import Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "optimizer.md"


def _doc_rows() -> list[tuple[str, int, str]]:
    """``(entry, programs changed, why it stays)`` of each row of the table in docs/optimizer.md."""
    text = DOC.read_text()
    section = text[text.index(pass_table.BEGIN):text.index(pass_table.END)]
    rows = []
    for line in section.splitlines():
        match = re.match(r"\| `(.+?)` \| (\d+) of \d+ \|.*\|(.*)\|$", line)
        if match:
            rows.append((match[1], int(match[2]), match[3].strip()))
    return rows


def test_the_documented_table_lists_every_default_entry_and_why_the_idle_ones_stay():
    # A pass added to the pipeline (or renamed) without regenerating the table fails here:
    # python benchmarks/pass_table.py --write docs/optimizer.md
    rows = _doc_rows()
    assert [name for name, _, _ in rows] == enabled_passes(Settings.preset("default"))
    idle = {name for name, changed, _ in rows if changed == 0}
    assert all(why for name, changed, why in rows if changed == 0)
    assert not any(why for name, changed, why in rows if changed > 0)
    # No reason for an entry that changes programs now (a stale one), none missing; reasons for
    # entries the pipeline lacks wait for them.
    assert {name for name in pass_table.WHY_IT_STAYS if name in {entry for entry, _, _ in PIPELINE}} == idle


def test_leaving_out_a_pass_on_one_program(tu_dir):
    entries, rows = pass_table.leave_one_out(tu_dir.parent, programs=[("MUTAG", "gcn", "labels")])
    assert entries == enabled_passes(Settings.preset("default"))
    changed, work, nodes, default_work, default_nodes = rows["deduplicate"][0]
    assert changed and work > default_work > 0
    assert rows["choose_kernels"][0][0]
    # An entry that changes nothing here (checks, clean-ups), and the table says why it stays.
    assert rows["clean_up"][0][:3] == (False, default_work, default_nodes)
    text = pass_table.table(entries, rows)
    assert f"| `clean_up` | 0 of 1 | 100.0% | 1.00x | 100.0% | {pass_table.WHY_IT_STAYS['clean_up']} |" \
        in text.splitlines()
    assert re.search(r"\| `deduplicate` \| 1 of 1 \| \d+\.\d% \| \d+\.\d\dx \| \d+\.\d% \|  \|", text)
