"""Stages of workflow/rules/lora.smk: LoRA SFT of an MLLM on a source task (one process, or one per GPU through
torchrun: retinabench.protocols.lora_launch), the adapter's inference on its test tasks (the mllm interface's job
function with the adapter: same prompts, scoring, parser), and the adapter − base paired deltas (FOCUS Table 5)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from retinabench.pipeline.job import Job, announce, write_outputs
from retinabench.pipeline.stages import stage


def training_spec(job: Job) -> dict:
    """The JSON-able description of one training job that :func:`retinabench.protocols.lora_launch.train_job`
    runs in every process of the group."""
    p = job.params["job"]
    out_dir = str(Path(job.output["adapter"]).parent)
    inputs = {"array": job.input["array"], "index": job.input["index"], "manifest": job.input["manifest"],
              "split": job.input["split"], "prompts": job.input["prompts"]}
    return {"entry": p["entry"], "task": p["task"], "settings": p["train"], "device": p["device"],
            "dtype": p["dtype"], "threads": job.threads, "weights": job.input.get("weights"), "inputs": inputs,
            "out_dir": out_dir, "rule": job.rule, "wildcards": dict(job.wildcards),
            "provenance_inputs": job.input_files(),
            "config": {"lora": {"train": p["train"], "gpus": p["gpus"], "processes": p["processes"]},
                       "entry": p["entry"]["name"], "task": p["task"]["name"]}}


@stage("mllm_lora_train")
def stage_lora_train(job: Job) -> None:
    from retinabench.protocols.lora_launch import launch, processes
    p = job.params["job"]
    spec = training_spec(job)
    n = processes(p["processes"], p["gpus"])
    announce(f"lora {p['entry']['name']}/{p['task']['name']}: training with {n} process(es) "
             f"(job holds {p['gpus']} GPU(s) on Slurm)")
    t0 = time.perf_counter()
    launch(spec, n)
    for key in ("adapter", "train_log", "compute"):
        if not Path(job.output[key]).exists():
            raise FileNotFoundError(f"rule {job.rule}: the training run wrote no {key} ({job.output[key]})")
    # the adapter folder's sidecar (every file's sha256, base model) was written by rank 0; the log and the
    # compute record get theirs here
    compute = json.loads(Path(job.output["compute"]).read_text())
    write_outputs(job, written=[job.output["train_log"], job.output["compute"]], config=spec["config"],
                  inputs=spec["provenance_inputs"], extra={"compute": compute})
    announce(f"lora {p['entry']['name']}/{p['task']['name']}: {compute['steps']} steps in "
             f"{time.perf_counter() - t0:.1f} s, final loss {compute['final_loss']:.4f}, world size "
             f"{compute['world_size']}, effective batch {compute['effective_batch']}")


@stage("mllm_lora_infer")
def stage_lora_infer(job: Job) -> None:
    import torch

    from retinabench.metrics.classification import metrics_table
    from retinabench.pipeline.interfaces import task_inputs
    from retinabench.prompts import load_prompts
    from retinabench.protocols.interfaces import INTERFACES
    from retinabench.protocols.mllm import answer_counts
    torch.set_num_threads(max(1, job.threads))
    p = job.params["job"]
    spec = INTERFACES["mllm"]
    prompts = load_prompts(job.input["prompts"])
    t0 = time.perf_counter()
    preds = spec.run(p["entry"], task_inputs(job), prompts, spec.section.of(p["settings"]).job(),
                     adapter=job.input["adapter"])
    counts = answer_counts(preds)
    tasks = {t["name"]: t for t in p["tasks"]}
    inputs = job.input_files(whole=(str(job.input["adapter"]),))  # the adapter folder as one input (its digest)
    write_outputs(job, {"predictions": preds, "metrics": metrics_table(preds, tasks)},
                  kinds={"predictions": "predictions", "metrics": "metrics"},
                  config={"entry": p["entry"], "tasks": tasks, "mllm": p["settings"], "source": p["source"]},
                  extra={"seconds": round(time.perf_counter() - t0, 2), "n_rows": int(len(preds)),
                         "adapter": str(preds["adapter"].iloc[0]),
                         "invalid_answers": {"n": int(counts["n"].sum()),
                                             "n_invalid": int(counts["n_invalid"].sum())}},
                  inputs=inputs)


@stage("mllm_lora_deltas")
def stage_lora_deltas(job: Job) -> None:
    import pandas as pd

    from retinabench.reliability.adapter_deltas import adapter_deltas, table5, table5_figure
    from retinabench.schemas import read_table
    p = job.params
    d = p["deltas"]
    adapters = pd.concat([read_table(f, "predictions") for f in job.input["adapters"]], ignore_index=True)
    base = pd.concat([read_table(f, "predictions") for f in job.input["base"]], ignore_index=True)
    manifest = pd.concat([read_table(f, "manifest") for f in job.input["manifests"]], ignore_index=True)
    cal = p["calibration"]  # reliability.n_bins / ece_bin_edges: the ECE deltas bin as the reliability layer
    res = adapter_deltas(base, adapters, manifest, p["tasks"], metrics=d["metrics"], unit=d["unit"],
                         n_boot=d["n_boot"], seed=d["seed"], level=d["level"], n_bins=cal["n_bins"],
                         edges=cal["ece_bin_edges"])
    if len(res["unpaired"]):
        announce(f"lora deltas: {len(res['unpaired'])} adapter results have no base result (table unpaired)")
    protocols = sorted(res["domains"]["protocol"].dropna().unique())
    if not protocols:
        raise ValueError("lora deltas: no comparison could be formed (every adapter result is unpaired)")
    tab = pd.concat([table5(res["domains"], variant=d["variant"], protocol=pr).assign(protocol=pr)
                     for pr in protocols], ignore_index=True)
    out = {k: res[k] for k in ("comparisons", "domains", "pairs", "unpaired")}
    out["table5"] = tab
    # the figure: FOCUS's raw p_yes scoring (protocol mllm) when present, else the first protocol
    figure_protocol = "mllm" if "mllm" in protocols else protocols[0]
    written = table5_figure(res["domains"], job.output["figure"], variant=d["variant"], protocol=figure_protocol)
    write_outputs(job, out, written=written, config={"deltas": d},
                  extra={"n_comparisons": int((~res["comparisons"]["skipped"].astype(bool)).sum()),
                         "figure_protocol": figure_protocol})
    for r in tab.to_dict("records"):
        announce("lora Table 5 " + " | ".join(f"{k}: {v}" for k, v in r.items()))
