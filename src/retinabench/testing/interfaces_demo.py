"""Both prompt-based interfaces on the phantom with the tiny offline models, through the job functions the
pipeline calls (retinabench.protocols.interfaces.INTERFACES), until the protocol registry's rules run them:

    python -m retinabench.testing.interfaces_demo OUT [--n-patients 40]

Generates the phantom, its manifest and the split of its harmonised any-DR task, an image cache in memory, builds
the tiny SigLIP, open_clip, LLaVA and Qwen2-VL models (random weights: chance-level results are expected; the
plumbing, counts and tables are what is shown), runs every prompt set, and writes to OUT: predictions per
(interface, model), ``metrics.parquet`` (with ``invalid_rate`` and ``accuracy_valid``), the reliability
subgroup and gap tables, ``prompt_sensitivity.csv`` (AUROC spread across prompt sets) and
``ece_difference.csv`` (zeroshot_focus vs zeroshot). Prints the invalid-answer counts and the tables.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

TASK_NAME = "phantom_cfp_anydr"
ZEROSHOT_MODELS = ("tiny_siglip", "tiny_open_clip")
MLLM_MODELS = ("tiny_llava", "tiny_qwen2_vl")


def phantom_inputs(root: Path, registries, n_patients: int, image_size: int = 64):
    """The phantom's manifest, the any-DR task's split and its images (uint8, ``image_size`` squash) in memory."""
    from retinabench.data.adapters.phantom import adapt_phantom
    from retinabench.data.image_cache import load_image
    from retinabench.data.phantom import generate_phantom
    from retinabench.data.splits import make_split
    generate_phantom(root, n_patients=n_patients, seed=0, image_size=max(64, image_size))
    manifest, _ = adapt_phantom(root, registries.dataset("phantom"))
    task = dict(registries.task(TASK_NAME), name=TASK_NAME)
    split = make_split(manifest, task, seed=0)
    rows = manifest.set_index("image_id").loc[split["image_id"]]
    images = np.stack([load_image(root / p, image_size, "squash") for p in rows["path"]])
    return task, manifest, split, list(split["image_id"]), images


def run_demo(out: str | Path, *, n_patients: int = 40, repo: str | Path | None = None, log=print,
             zeroshot_models=ZEROSHOT_MODELS, mllm_models=MLLM_MODELS) -> dict:
    from retinabench.metrics.classification import metrics_table
    from retinabench.analysis.prompts import prompt_sensitivity
    from retinabench.prompts import load_prompts
    from retinabench.protocols.interfaces import INTERFACES, TaskInput
    from retinabench.protocols.mllm import answer_counts
    from retinabench.protocols.zeroshot import ece_difference
    from retinabench.registry import Registries
    from retinabench.schemas import write_table
    from retinabench.reliability import evaluate_predictions
    from retinabench.settings.reliability import ReliabilitySettings
    from retinabench.models import tiny as tm
    repo = Path(repo) if repo else Path(__file__).resolve().parents[3]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reg = Registries(repo / "config/datasets.yaml", repo / "config/tasks.yaml", repo / "config/encoders.yaml")
    prompts = load_prompts(repo / "config/prompts.yaml")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        task, manifest, split, ids, images = phantom_inputs(tmp / "phantom", reg, n_patients)
        inputs = [TaskInput(task, split, ids, images, manifest)]
        builders = {"tiny_siglip": tm.build_tiny_siglip, "tiny_open_clip": tm.build_tiny_open_clip,
                    "tiny_llava": tm.build_tiny_llava, "tiny_qwen2_vl": tm.build_tiny_qwen2_vl}
        frames = []
        for interface, models, settings in (("zeroshot", zeroshot_models, {"device": "cpu"}),
                                            ("mllm", mllm_models, {"device": "cpu", "max_new_tokens": 4})):
            for name in models:
                folder = tmp / name
                entry = builders[name](folder)
                weights = folder if entry["source"] == "transformers" else folder / entry["weights_file"]
                preds = INTERFACES[interface].run(entry, inputs, prompts, settings, weights=weights, log=log)
                write_table(preds, out / f"predictions_{interface}_{name}.parquet", "predictions")
                frames.append(preds)
    tasks = {TASK_NAME: task}
    preds = pd.concat(frames, ignore_index=True)
    metrics = metrics_table(preds, tasks)
    write_table(metrics, out / "metrics.parquet", "metrics")
    excl = pd.DataFrame(columns=["dataset", "source", "image_id", "scope", "reason"])
    rel: dict[str, list[pd.DataFrame]] = {"subgroups": [], "gaps": []}
    for interface in ("zeroshot", "mllm"):
        part = pd.concat([f for f in frames if f["protocol"].str.split("@").str[0].isin(
            INTERFACES[interface].protocols).all()], ignore_index=True)
        tables = evaluate_predictions(part, manifest, excl, {TASK_NAME: split}, tasks, ReliabilitySettings(),
                                      source=interface)
        for k in rel:
            rel[k].append(tables[k])
    result = {"predictions": preds, "metrics": metrics,
              "subgroups": pd.concat(rel["subgroups"], ignore_index=True),
              "gaps": pd.concat(rel["gaps"], ignore_index=True),
              "prompt_sensitivity": prompt_sensitivity(metrics),
              "ece_difference": ece_difference(preds, tasks),
              "answer_counts": answer_counts(preds[preds["protocol"].str.startswith("mllm")
                                                   & ~preds["protocol"].str.startswith("mllm_renorm")])}
    from retinabench.atomic import atomic_write
    for k in ("subgroups", "gaps", "prompt_sensitivity", "ece_difference", "answer_counts"):
        atomic_write(out / f"{k}.csv", lambda tmp: result[k].to_csv(tmp, index=False))  # noqa: B023 (called at once)
    test = metrics[(metrics["split"] == "test")]
    wide = test.pivot_table(index=["encoder", "protocol"], columns="metric", values="value")
    cols = [c for c in ("accuracy", "accuracy_valid", "invalid_rate", "auroc", "ece") if c in wide.columns]
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_rows", 100):
        log(f"\n{TASK_NAME} test split ({int(test['n'].max())} images), chance level expected (random models):")
        log(wide[cols].round(3).to_string())
        log("\nprompt-variant AUROC spread (test):")
        ps = result["prompt_sensitivity"]
        log(ps[ps["split"] == "test"][["encoder", "base_protocol", "n_prompt_sets", "min", "max", "range"]]
            .round(3).to_string(index=False))
        log("\nECE zeroshot_focus - zeroshot (test):")
        ed = result["ece_difference"]
        log(ed[ed["split"] == "test"][["encoder", "prompt_set", "ece_focus", "ece_native", "ece_diff"]]
            .round(3).to_string(index=False))
        log(f"\nsubgroup rows {len(result['subgroups'])}, gap rows {len(result['gaps'])}; wrote {out}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n-patients", type=int, default=40)
    args = ap.parse_args(argv)
    run_demo(args.out, n_patients=args.n_patients)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
