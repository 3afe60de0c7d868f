"""What a manifest job prints (and ``datasets --check``, and a task left without images): exclusions counted by
scope and reason, the per-dataset summary."""
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


def exclusion_lines(exclusions: pd.DataFrame, *, shown: int = 25, scopes: tuple[str, ...] | None = None,
                    indent: str = "    ") -> list[str]:
    """One line per kind of exclusion (scope, count, reason), most frequent first within a scope; the one format
    the manifest job, ``datasets --check`` and the split errors print."""
    if scopes is not None:
        exclusions = exclusions[exclusions["scope"].isin(scopes)]
    summary = exclusion_summary(exclusions, limit=0)
    if not len(summary):
        return []
    width = max(len(x) for x in summary["scope"])
    head = summary.head(shown)
    lines = [f"{indent}{r.scope:<{width}}  {r.n:>7}  {r.reason}" for r in head.itertuples()]
    if len(summary) > len(head):
        lines.append(f"{indent}... {len(summary) - len(head)} more kinds (the exclusions table has every row)")
    return lines


def manifest_report(dataset: str, manifest: pd.DataFrame, exclusions: pd.DataFrame, extra: dict) -> str:
    by_mod = ", ".join(f"{k} {v}" for k, v in manifest["modality"].value_counts().sort_index().items())
    lines = [f"retinabench manifest {dataset}: {len(manifest)} images ({by_mod}), "
             f"{manifest['patient_id'].nunique()} patients; {len(exclusions)} exclusion rows"]
    for key, value in extra.items():
        lines.append(f"  {key}: {value}")
    kinds = exclusion_lines(exclusions)
    lines += ["  exclusions by scope and reason:", *kinds] if kinds else ["  exclusions by scope and reason: none"]
    return "\n".join(lines)
