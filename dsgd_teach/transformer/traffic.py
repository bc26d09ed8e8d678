"""Bytes sent per rank on each mesh axis, traced: every message of every collective, as its Comm logged it.

Each axis's Comm (mesh.join_mesh) logs every send with its bytes and phase before the transport moves it, so what is
counted here is what the ring allreduce, the pipeline's send/recv, the ring attention and the all-to-all actually
sent, not what a formula says they should. The gradient allreduce of the experts runs on the "edp" groups (the
ranks that hold the same experts, part of the data axis), so its bytes count on the data axis. The step's loss is
summed by a library allreduce outside these logs (it reports the step; it is not part of training's traffic).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .mesh import AXES, Mesh

#: The axis each group's bytes count on: the experts' data-parallel groups are part of the data axis.
COUNTS_ON = {**{axis: axis for axis in AXES}, "edp": "dp"}


def take_traffic(mesh: Mesh) -> list[dict[str, Any]]:
    """This rank's messages since the last call, summed by (axis, phase): axis, phase, messages, bytes_sent.

    Clears the logs (so a Comm serving two names, edp being dp when N_ep = 1, is counted once).
    """
    totals: dict[tuple[str, str], list[int]] = {}
    for name, comm in mesh.comms.items():
        for message in comm.take_log():
            if message["direction"] != "send":
                continue
            entry = totals.setdefault((COUNTS_ON[name], message["phase"]), [0, 0])
            entry[0] += 1
            entry[1] += message["bytes"]
    return [{"axis": axis, "phase": phase, "messages": n, "bytes_sent": nbytes}
            for (axis, phase), (n, nbytes) in sorted(totals.items())]


def bytes_per_axis(rows: list[dict[str, Any]]) -> dict[str, int]:
    """take_traffic's rows summed per axis, every axis present (0 where nothing was sent)."""
    out = dict.fromkeys(AXES, 0)
    for row in rows:
        out[row["axis"]] += row["bytes_sent"]
    return out


def traffic_frame(trace: pd.DataFrame) -> pd.DataFrame:
    """A run's "traffic" events as a table: one row per rank, step, axis and phase (messages, bytes_sent)."""
    rows = trace[trace.event == "traffic"]
    cols = ["worker", "step", "axis", "phase", "messages", "bytes_sent"]
    return rows[cols].reset_index(drop=True) if len(rows) else pd.DataFrame(columns=cols)


def axis_table(trace: pd.DataFrame) -> pd.DataFrame:
    """Bytes each rank sent on each axis in each step: rows (worker, step), one column per axis."""
    frame = traffic_frame(trace)
    table = frame.pivot_table(index=["worker", "step"], columns="axis", values="bytes_sent", aggfunc="sum",
                              fill_value=0)
    for axis in AXES:
        if axis not in table.columns:
            table[axis] = 0
    return table[list(AXES)].astype(int)
