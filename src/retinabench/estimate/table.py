"""The printed form of an estimate: the stage x encoder table, per-stage totals, the total, the assumptions and
where each dataset's image count came from."""
from __future__ import annotations


def _table(rows: list[dict], cols: list[str]) -> list[str]:
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return lines


def _hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 0.1 or h == 0 else f"{h:.3f}"


def render(est, cols: list[str]) -> str:
    rows = [{**r, "gpu_hours": _hours(r["gpu_hours"])} for r in est.rows]
    lines = _table(rows, cols)
    totals = [{"stage": s, "jobs": t["jobs"], "gpu_hours": _hours(t["gpu_hours"])}
              for s, t in est.stage_totals().items()]
    totals.append({"stage": "total", "jobs": est.jobs, "gpu_hours": _hours(est.gpu_hours)})
    lines += ["", "per stage:"] + _table(totals, ["stage", "jobs", "gpu_hours"])
    lines += ["", "assumptions (override with --set KEY=VALUE):"] + [f"  {x}" for x in est.assumptions.lines()]
    lines += ["", "images per dataset:"] + [f"  {x}" for x in est.notes]
    lines += ["", f"estimate: {est.jobs} jobs, {_hours(est.gpu_hours)} GPU-hours on {est.assumptions.gpu}"]
    return "\n".join(lines)
