"""Stages of workflow/rules/interfaces.smk: the `prompts` protocols (retinabench.protocols.interfaces) — one
(registry entry, task set) job per interface, the interface tables (prompt-variant spread, ECE difference), and
the demo's tiny random models (rule tiny_model)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.stages import stage


def task_inputs(job: Job) -> list:
    """One TaskInput per task of the job: its split, its dataset's manifest and images — the image cache
    (memory-mapped; the interface's ``inputs: cache``) or the original files under the dataset's raw folder
    (``inputs: native``: the job's ``roots``, decoded as the model reaches them and passed through its own
    processor)."""
    from retinabench.protocols.interfaces import TaskInput
    from retinabench.protocols.native_inputs import original_images
    from retinabench.schemas import read_table
    p = job.params["job"]
    datasets = p["datasets"]
    manifests = dict(zip(datasets, (read_table(path, "manifest") for path in job.input["manifests"])))
    mode = (p.get("settings") or {}).get("inputs", "cache")
    if mode == "native":
        roots = p.get("roots") or {}
        lacking = [d for d in datasets if d not in roots]
        if lacking:
            raise KeyError(f"rule {job.rule}: inputs native needs the raw folder of dataset(s) {lacking} (job "
                           f"params `roots`: {roots})")
        images: dict[str, tuple[list[str], Any]] = {d: original_images(manifests[d], d, roots[d]) for d in datasets}
    else:
        from retinabench.data.image_cache import open_image_cache
        images = {}
        for d in datasets:
            arr, index = open_image_cache(job.input[f"array_{d}"], job.input[f"index_{d}"])
            images[d] = (list(index["image_id"]), arr)
    out = []
    for task, split_path in zip(p["tasks"], job.input["splits"]):
        ids, arr = images[task["dataset"]]
        out.append(TaskInput(task, read_table(split_path, "split"), ids, arr, manifests[task["dataset"]]))
    return out


@stage("zeroshot", "mllm")
def stage_interface(job: Job) -> None:
    import torch
    from retinabench.metrics.classification import metrics_table
    from retinabench.prompts import load_prompts
    from retinabench.protocols.interfaces import INTERFACES
    torch.set_num_threads(max(1, job.threads))
    interface = job.rule
    p = job.params["job"]
    spec, entry, section = INTERFACES[interface], p["entry"], p["settings"]
    prompts = load_prompts(job.input["prompts"])
    t0 = time.perf_counter()
    # input `weights` is the entry's own weights_path (a dependency only): the loader reads and verifies it
    # against the entry's sha256 pins, so the run is checked like every registry load
    preds = spec.run(entry, task_inputs(job), prompts, spec.section.of(section).job())
    extra: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 2), "n_rows": int(len(preds)),
                             "inputs": preds.attrs.get("inputs")}  # mode (+ processor key: native)
    if interface == "mllm":
        from retinabench.protocols.mllm import answer_counts
        counts = answer_counts(preds)
        extra["invalid_answers"] = {"n": int(counts["n"].sum()), "n_invalid": int(counts["n_invalid"].sum())}
        extra["throughput"] = preds.attrs.get("throughput")  # backend, prompts, seconds, prompts/s
    tasks = {t["name"]: t for t in p["tasks"]}
    inputs = job.input_files()  # a local weights folder (the demo's tiny models) file by file
    write_outputs(job, {"predictions": preds, "metrics": metrics_table(preds, tasks)},
                  kinds={"predictions": "predictions", "metrics": "metrics"},
                  config={"entry": entry, "tasks": tasks, interface: section}, extra=extra, inputs=inputs)


@stage("interface_tables")
def stage_interface_tables(job: Job) -> None:
    import pandas as pd

    from retinabench.analysis.prompts import prompt_sensitivity
    from retinabench.protocols.zeroshot import ece_difference
    from retinabench.schemas import read_table
    metrics = pd.concat([read_table(p, "metrics") for p in job.input["metrics"]], ignore_index=True)
    out = {"prompt_sensitivity": prompt_sensitivity(metrics)}
    if "zeroshot_ece_difference" in job.output.keys():
        preds = pd.concat([read_table(p, "predictions") for p in job.input["zeroshot"]], ignore_index=True)
        out["zeroshot_ece_difference"] = ece_difference(preds, job.params["tasks"])
    write_outputs(job, out)


@stage("tiny_model")
def stage_tiny_model(job: Job) -> None:
    """One tiny random model of retinabench.models.tiny (seeded: the same files, hence the same sha256
    pins, on every build) into the folder the demo registry's entry names as its weights_path."""
    from retinabench.atomic import atomic_folder
    from retinabench.models.tiny import BUILDERS
    spec = job.params["build"]
    out = Path(job.output["folder"])
    with atomic_folder(out) as built:  # a folder of this writer's own beside `out`, renamed when complete
        BUILDERS[spec["builder"]](built, seed=spec["seed"])
    files = sorted(f.name for f in out.iterdir())
    print(f"tiny_model {job.wildcards.get('name')}: {spec} -> {out} ({len(files)} files: {files})")
