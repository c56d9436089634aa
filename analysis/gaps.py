"""Ours against the published rows: the gap of each cell in std units where the runs follow
the published protocol, else the one line that says what the runs are instead."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from analysis.cells import DASH, Cell, md_table, partners
from analysis.specs import TableSpec


def off_protocol(spec: TableSpec, experiment: dict | None) -> str:
    """'' where our cells may be set against the published rows; else the line that says what
    the runs are instead. Results without a recorded preset are compared: nothing says not."""
    record = experiment or {}
    preset = record.get("preset")
    if spec.protocol is None or not isinstance(preset, str):
        return ""
    values = record.get("values")
    values = values if isinstance(values, dict) else {}
    protocol = spec.protocol
    if preset in protocol.comparable and all(
            values.get(key, value) == value for key, value in protocol.settings.items()):
        return ""
    rows = protocol.rows.get(str(values.get("source")))
    # a setting an older record lacks reads "?"
    fields = defaultdict(lambda: "?", {**values, "preset": preset,
                                       "train_rows": f"{rows:,}" if rows is not None else "?"})
    return protocol.notes.get(preset, protocol.other).format_map(fields) + "\n"


GAP_STDS = 2.0  # a gap is flagged when it exceeds this many stds


def gap_section(cells: Sequence[Cell]) -> str:
    """Per block: each of our fixed-lambda rows minus its published row, per column, in units
    of the larger of the two rows' stds (a row with no std leaves the other's). Rule rows are
    left out: their lambda changes with the data."""
    by_block: dict[str, list[Cell]] = {}
    for c in cells:
        by_block.setdefault(c.block, []).append(c)
    parts: list[str] = []
    for block, block_cells in by_block.items():
        grid = {(c.row, c.column): c for c in block_cells}
        columns = list(dict.fromkeys(c.column for c in block_cells))
        rows = list(dict.fromkeys(c.row for c in block_cells))
        body: list[list[str]] = []
        flagged = compared = 0
        for ours, pub in partners(rows).items():
            if not any(grid[k].rule.startswith("fixed") for k in grid if k[0] == ours):
                continue
            line = [ours]
            for col in columns:
                mine, theirs = grid.get((ours, col)), grid.get((pub, col))
                if mine is None or theirs is None or not mine.n or not (
                        np.isfinite(mine.mean) and np.isfinite(theirs.mean)):
                    line.append(DASH)
                    continue
                gap = mine.mean - theirs.mean
                stds = [s for s in (mine.std, theirs.std) if np.isfinite(s) and s > 0]
                compared += 1
                if not stds:
                    line.append(f"{gap:+.3f} (no std)")
                    continue
                units = gap / max(stds)
                over = abs(units) > GAP_STDS
                flagged += over
                line.append(f"{gap:+.3f} ({units:+.1f} std){' **>2**' if over else ''}")
            body.append(line)
        if body:
            parts.append(
                f"### {block}: ours − published\n\nIn brackets: the gap over the larger of "
                f"the two rows' stds (ours over seeds, the paper's as printed). "
                f"{flagged} of {compared} cells differ by more than {GAP_STDS:g} std.\n\n"
                + md_table(["Row (ours)", *columns], body))
    return "\n".join(parts)
