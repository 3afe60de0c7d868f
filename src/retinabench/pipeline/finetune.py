"""Stages of workflow/rules/finetune.smk.

* ``finetune`` — one (encoder, task, protocol, seed): every training regime; predictions, training log, metrics,
  compute record (time per step, peak memory); with a ``weights`` output also the trained weights (saliency).
  Resumes from its checkpoint directory after a kill.
* ``sweep_stage`` — one stage of the learning-rate sweep for one (encoder, task), looping over the grid.
* ``sweep_choose`` — the chosen (lr_classifier, lr_encoder) of an encoder, a JSON artifact.
* ``sweep_sensitivity`` — the per-encoder sensitivity table (optimal vs mean of sub-optimal learning rates).
* ``finetune_predictions`` — a protocol's predictions of one (encoder, task), all seeds (the frozen layout).
* ``sweep_collect`` / ``finetune_compute`` — tables over all encoders for the analysis layer."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pandas as pd

from retinabench.atomic import write_text_atomic
from retinabench.pipeline.job import Job, write_artifact, write_outputs
from retinabench.pipeline.stages import stage
from retinabench.schemas import read_table


def _log(msg: str) -> None:
    print(msg, flush=True)


def _load_data(job: Job):
    split = read_table(job.input["split"], "split")
    index = read_table(job.input["index"], "image_index")
    if not Path(job.input["array"]).is_file():
        raise FileNotFoundError(f"image cache {job.input['array']} does not exist")
    return index, split


@stage("finetune", "finetune_keep_weights")
def stage_finetune(job: Job) -> None:
    import torch
    from retinabench.metrics.classification import metrics_table
    from retinabench.protocols.finetune import run_finetune
    from retinabench.protocols.sweep import read_chosen
    from retinabench.settings.finetune import FinetuneSettings
    torch.set_num_threads(max(1, job.threads))
    p, task, entry = job.params["finetune"], job.params["task"], job.params["encoder"]
    ft = FinetuneSettings.of(p)
    protocol, seed = job.wildcards["protocol"], int(job.wildcards["seed"])
    if "lr" in job.input:  # the sweep's choice
        chosen = read_chosen(job.input["lr"])
        if chosen["encoder"] != entry["name"]:
            raise ValueError(f"{job.input['lr']} holds the learning rates of {chosen['encoder']!r}, "
                             f"not {entry['name']!r}")
        lrs = {"lr_encoder": float(chosen["lr_encoder"]), "lr_classifier": float(chosen["lr_classifier"])}
    else:
        lrs = {"lr_encoder": ft.lr_encoder, "lr_classifier": ft.lr_classifier}
    cfg = ft.model_copy(update=lrs)
    index, split = _load_data(job)
    t0 = time.perf_counter()
    ckpt = job.params["checkpoints"]
    keep = "weights" in job.output  # the saliency maps need this job's trained model (workflow/rules/saliency.smk)
    out = run_finetune(job.input["array"], index, split, task, entry, protocol=protocol, seed=seed,
                       regimes=job.params["regimes"], cfg=cfg, ckpt_dir=ckpt, threads=job.threads, log=_log,
                       keep_weights=keep)
    write_artifact(out.predictions, job.output["predictions"], "predictions")
    write_artifact(out.log, job.output["log"], "training_log")
    write_artifact(out.compute, job.output["compute"])
    outputs = [job.output["predictions"], job.output["log"], job.output["compute"]]
    if keep:
        from retinabench.protocols.finetune import save_weights
        save_weights(job.output["weights"], out.weights, protocol=protocol, encoder_entry=entry, task=task, seed=seed)
        outputs.append(job.output["weights"])
    conf = {"task": task, "finetune": p, "regimes": job.params["regimes"], "learning_rates": lrs}
    extra = {"seconds": round(time.perf_counter() - t0, 2), "checkpoints": ckpt,
             "compute": out.compute.to_dict("records")}
    write_outputs(job, written=outputs, config=conf, seed=seed, extra=extra)
    metrics = metrics_table(out.predictions, {task["name"]: task})
    write_artifact(metrics, job.output["metrics"], "metrics")
    write_outputs(job, written=[job.output["metrics"]], config={"task": task}, inputs=[job.output["predictions"]])
    if not ft.keep_checkpoints and Path(ckpt).exists():
        shutil.rmtree(ckpt)  # the outputs are written: the checkpoints' only use (resuming) is over


@stage("sweep_linear", "sweep_finetune")
def stage_sweep_stage(job: Job) -> None:
    import torch
    from retinabench.protocols.sweep import choose_lr, run_sweep_stage
    from retinabench.settings.finetune import FinetuneSettings, SweepSettings
    torch.set_num_threads(max(1, job.threads))
    p, s, task, entry = job.params["finetune"], job.params["sweep"], job.params["task"], job.params["encoder"]
    ft, sweep = FinetuneSettings.of(p), SweepSettings.of({k: v for k, v in s.items() if k != "grid"})
    stage = int(job.params["sweep_stage"])
    lr_classifier = None
    if stage == 2:
        lr_classifier, _ = choose_lr(pd.read_parquet(job.input["stage1"]))
        _log(f"stage 2 with lr_classifier {lr_classifier:g} (stage 1's choice)")
    cfg = sweep.train_config(ft)
    index, split = _load_data(job)
    t0 = time.perf_counter()
    ckpt = job.params["checkpoints"]
    metrics, runs = run_sweep_stage(stage, job.input["array"], index, split, task, entry, grid=s["grid"],
                                    seeds=sweep.seeds, regimes=sweep.regimes, cfg=cfg, lr_classifier=lr_classifier,
                                    ckpt_dir=ckpt, threads=job.threads, log=_log)
    write_artifact(metrics, job.output["metrics"], "metrics_part")
    write_artifact(runs, job.output["runs"])
    write_outputs(job, written=[job.output["metrics"], job.output["runs"]], config={"task": task, "finetune": p, "sweep": s},
              seed=s["seeds"], extra={"seconds": round(time.perf_counter() - t0, 2),
                                      "lr_classifier_fixed": lr_classifier})
    if not ft.keep_checkpoints and Path(ckpt).exists():
        shutil.rmtree(ckpt)


@stage("sweep_choose")
def stage_sweep_choose(job: Job) -> None:
    from retinabench.protocols.sweep import chosen_record
    rec = chosen_record(job.wildcards["encoder"], job.params["task"], pd.read_parquet(job.input["stage1"]),
                        pd.read_parquet(job.input["stage2"]))
    out = Path(job.output["chosen"])
    write_text_atomic(out, json.dumps(rec, indent=1, sort_keys=True, default=float))
    _log(f"{rec['encoder']}: lr_classifier {rec['lr_classifier']:g}, lr_encoder {rec['lr_encoder']:g} "
         f"({rec['criterion']})")
    write_outputs(job, written=[str(out)], config={"criterion": rec["criterion"]},
              extra={"lr_classifier": rec["lr_classifier"], "lr_encoder": rec["lr_encoder"]})


@stage("sweep_sensitivity")
def stage_sweep_sensitivity(job: Job) -> None:
    from retinabench.protocols.sweep import sensitivity_table
    metrics = pd.concat([pd.read_parquet(f) for f in job.input["metrics"]], ignore_index=True)
    runs = pd.concat([pd.read_parquet(f) for f in job.input["runs"]], ignore_index=True)
    table = sensitivity_table(metrics, runs)
    write_artifact(table, job.output["sensitivity"])
    write_outputs(job, written=[job.output["sensitivity"]], config={})


@stage("sweep_collect")
def stage_sweep_collect(job: Job) -> None:
    metrics = pd.concat([pd.read_parquet(f) for f in job.input["metrics"]], ignore_index=True)
    sens = pd.concat([pd.read_parquet(f) for f in job.input["sensitivity"]], ignore_index=True)
    write_artifact(metrics, job.output["metrics"], "metrics_part")
    write_artifact(sens, job.output["sensitivity"])
    write_outputs(job, written=[job.output["metrics"], job.output["sensitivity"]], config={})


@stage("finetune_predictions")
def stage_finetune_predictions(job: Job) -> None:
    preds = pd.concat([read_table(f, "predictions") for f in job.input["predictions"]], ignore_index=True)
    write_artifact(preds, job.output["predictions"], "predictions")
    write_outputs(job, written=[job.output["predictions"]], config={})


@stage("finetune_compute")
def stage_finetune_compute(job: Job) -> None:
    table = pd.concat([pd.read_parquet(f) for f in job.input["compute"]], ignore_index=True)
    write_artifact(table, job.output["compute"])
    write_outputs(job, written=[job.output["compute"]], config={})
