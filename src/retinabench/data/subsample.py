"""``subsample`` on a dataset entry: a seeded subset of patients for a quick first run on a large dataset.

``subsample: {patients: 200, seed: 0}`` (or ``{fraction: 0.1, seed: 0}``) keeps every image of the patients with
the smallest seeded hashes of their patient id — both eyes and every visit of a kept patient, so the subset is
still patient-complete, and a larger subsample contains every smaller one (the same seed ranks patients the same
way). Images without a patient id count as one patient each. Every dropped image is an ``image`` exclusion with
reason ``subsample: ...``, and the setting is part of the dataset entry, so it is in the manifest's provenance.
"""
from __future__ import annotations

import math

import pandas as pd

from retinabench.hashing import unit_hash


def apply_subsample(manifest: pd.DataFrame, exclusions: pd.DataFrame, spec: dict | None, *, dataset: str
                    ) -> tuple[pd.DataFrame, pd.DataFrame, dict | None]:
    if not spec:
        return manifest, exclusions, None
    pid = manifest["patient_id"].astype("string")
    unit = ("p:" + pid).fillna("i:" + manifest["image_id"])
    units = sorted(unit.unique())
    n_units = len(units)
    if "patients" in spec:
        n_keep = int(spec["patients"])
    elif "fraction" in spec:
        n_keep = math.ceil(float(spec["fraction"]) * n_units)
    else:
        raise ValueError(f"dataset {dataset!r}: subsample needs `patients` or `fraction`, got {spec}")
    if n_keep < 1:
        raise ValueError(f"dataset {dataset!r}: subsample keeps no patient ({spec})")
    seed = int(spec.get("seed", 0))
    ranked = sorted(units, key=lambda k: (unit_hash("retinabench-subsample-v1", seed, k), k))
    keep = set(ranked[:n_keep])
    kept = unit.isin(keep).to_numpy()
    how = f"subsample: patient not drawn ({min(n_keep, n_units)} of {n_units} patients, seed {seed})"
    dropped = manifest.loc[~kept]
    rows = pd.DataFrame({"dataset": dataset, "source": dropped["path"].to_numpy(),
                         "image_id": dropped["image_id"].to_numpy(), "scope": "image", "reason": how})
    info = {"spec": dict(spec), "patients_total": n_units, "patients_kept": min(n_keep, n_units),
            "images_total": int(len(manifest)), "images_kept": int(kept.sum())}
    return (manifest.loc[kept].reset_index(drop=True), pd.concat([exclusions, rows], ignore_index=True), info)
