"""What a manifest job prints: exclusions counted by scope and reason, the per-dataset summary."""
from __future__ import annotations

import pandas as pd


def exclusion_summary(exclusions: pd.DataFrame, *, limit: int = 25) -> pd.DataFrame:
    """Counts of exclusion rows by scope and reason, with per-row details (file names, quoted values, numbers)
    folded so that one kind of decision is one line (the rows themselves are in exclusions.parquet)."""
    if exclusions.empty:
        return pd.DataFrame(columns=["scope", "reason", "n"])
    reason = exclusions["reason"].astype(str)
    folded = (reason.str.replace(r"'[^']*'|\"[^\"]*\"", "'…'", regex=True)
              .str.replace(r"(?<![\w])[\w.-]*[/\\.][\w./\\-]*[\w/]", "…", regex=True)
              .str.replace(r"\b\d+\b", "N", regex=True))
    # Verbatim where a scope has few distinct reasons; folded where they differ row by row (file names).
    many = reason.groupby(exclusions["scope"]).transform("nunique") > 12
    out = (exclusions.assign(reason=reason.where(~many, folded)).groupby(["scope", "reason"]).size()
           .reset_index(name="n")
           .sort_values(["scope", "n"], ascending=[True, False]).reset_index(drop=True))
    return out.head(limit) if limit else out


def manifest_report(dataset: str, manifest: pd.DataFrame, exclusions: pd.DataFrame, extra: dict) -> str:
    by_mod = ", ".join(f"{k} {v}" for k, v in manifest["modality"].value_counts().sort_index().items())
    lines = [f"retinabench manifest {dataset}: {len(manifest)} images ({by_mod}), "
             f"{manifest['patient_id'].nunique()} patients; {len(exclusions)} exclusion rows"]
    for key, value in extra.items():
        lines.append(f"  {key}: {value}")
    summary = exclusion_summary(exclusions, limit=0)
    if len(summary):
        width = max(len(x) for x in summary["scope"])
        lines.append("  exclusions by scope and reason:")
        shown = summary.head(25)
        lines += [f"    {r.scope:<{width}}  {r.n:>7}  {r.reason}" for r in shown.itertuples()]
        if len(summary) > len(shown):
            lines.append(f"    ... {len(summary) - len(shown)} more kinds (exclusions.parquet has every row)")
    else:
        lines.append("  exclusions by scope and reason: none")
    return "\n".join(lines)
