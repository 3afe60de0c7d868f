"""``retinabench estimate``: job counts and GPU-hours per stage and encoder of a config, before a launch.

Jobs are counted from the torch-free plan (retinabench.plan.WorkflowPlan: the same job lists the rules are built
from), their work (images, runs, steps, prompts x images x new tokens) from the config and the datasets' sizes
(:func:`retinabench.estimate.model.dataset_images`), and GPU time from measured throughput where the compute
benchmark or finished fine-tuning runs have it (training stages of that encoder and protocol), else from parameter
counts under the printed assumptions (:class:`~retinabench.estimate.model.Assumptions`). Frozen probes run on CPUs:
counted, no GPU-hours. A GPU job's hours = (work / rate) x (1 + data overhead) + start-up, times its GPUs.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from retinabench.estimate.model import Assumptions, Measured, dataset_images, declared_sizes, decode_flops, forward_flops
from retinabench.regimes import train_sides

__all__ = ["HELP", "Assumptions", "Estimate", "add_options", "before_launch", "estimate", "format_estimate", "run"]

COLUMNS = ["stage", "encoder", "jobs", "gpu_hours", "source"]


@dataclass
class Estimate:
    rows: list[dict]
    assumptions: Assumptions
    images: dict[str, tuple[int, str]]   # dataset -> (images, source)
    notes: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return sum(r["jobs"] for r in self.rows)

    @property
    def gpu_hours(self) -> float:
        return sum(r["gpu_hours"] for r in self.rows)

    def stage_totals(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for r in self.rows:
            t = out.setdefault(r["stage"], {"jobs": 0, "gpu_hours": 0.0})
            t["jobs"] += r["jobs"]
            t["gpu_hours"] += r["gpu_hours"]
        return out

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return {"rows": self.rows, "totals": {"jobs": self.jobs, "gpu_hours": self.gpu_hours,
                                              "stages": self.stage_totals()},
                "assumptions": asdict(self.assumptions), "assumption_lines": self.assumptions.lines(),
                "images": {d: {"images": n, "source": s} for d, (n, s) in self.images.items()}, "notes": self.notes}


@dataclass
class _Cell:
    jobs: int = 0
    seconds: float = 0.0
    sources: set[str] = field(default_factory=set)


class _Acc:
    """Per (stage, encoder): jobs, GPU seconds and where the numbers came from."""

    def __init__(self, a: Assumptions):
        self.a = a
        self.cells: defaultdict[tuple[str, str], _Cell] = defaultdict(_Cell)

    def job(self, stage: str, encoder: str, *, flops: float = 0.0, seconds: float = 0.0, source: str,
            gpus: int = 1, gpu: bool = True) -> None:
        cell = self.cells[(stage, encoder)]
        cell.jobs += 1
        cell.sources.add(source)
        if gpu:
            work = seconds + flops / (self.a.sustained_tflops * 1e12)
            cell.seconds += (work * (1 + self.a.data_overhead) + self.a.startup_s) * gpus

    def rows(self) -> list[dict]:
        return [{"stage": s, "encoder": e, "jobs": c.jobs, "gpu_hours": c.seconds / 3600,
                 "source": "; ".join(sorted(c.sources))} for (s, e), c in self.cells.items()]


def estimate(p, a: Assumptions, *, sizes: dict | None = None) -> Estimate:
    """The estimate of plan ``p`` (a retinabench.plan.WorkflowPlan) under assumptions ``a``."""
    reg = p.reg
    sizes = declared_sizes(reg.datasets) if sizes is None else sizes
    fr = p.settings.split.fractions
    datasets = list(dict.fromkeys(list(p.datasets) + [p.task_dataset(t) for t in p.tasks]))
    images = {d: dataset_images(d, p.path("manifest", dataset=d), reg.datasets, sizes, a) for d in datasets}
    measured = Measured.read(p.path("compute_table"), p.path("finetune_compute"))
    acc = _Acc(a)

    def n(dataset: str, share: float = 1.0) -> float:
        return images[dataset][0] * share

    def src(dataset_list) -> str:
        kinds = sorted({images[d][1].split(" (")[0] for d in dataset_list})
        return "/".join(kinds)

    def forward(encoder: str) -> tuple[float, str | None]:
        """(seconds per image forward, measured source) or (FLOPs per image, None)."""
        hit = measured.forward_rate(encoder, a)
        return (1.0 / hit[0], hit[1]) if hit else (forward_flops(reg.encoder(encoder), a), None)

    def forward_job(stage, encoder, count: float, data: list[str], factor: float = 1.0, gpus: int = 1) -> None:
        per, how = forward(encoder)
        if how:
            acc.job(stage, encoder, seconds=per * count * factor, source=f"{how}; images {src(data)}", gpus=gpus)
        else:
            acc.job(stage, encoder, flops=per * count * factor, source=f"params; images {src(data)}", gpus=gpus)

    # features: one job per (encoder, dataset); frozen probes: one CPU job per (encoder, task)
    for e in p.encoders:
        for d in p.datasets:
            forward_job("features", e, n(d), [d])
        for _task in p.tasks:
            acc.job("frozen", e, source="CPU job (no GPU)", gpu=False)

    ft = p.finetune
    if ft.on:
        s = ft.settings
        for protocol, e, t, _seed in ft.grid():
            _train_job(acc, a, measured, "finetune", protocol, e, t, p, images, len(train_sides(ft.regimes)),
                       s.epochs, s.steps_per_epoch, s.batch_size, src([p.task_dataset(t)]))
        sw = ft.sweep
        for e in ft.encoders if ft.sweep_on else []:
            for t in ft.encoder_sweep_tasks(e):
                for protocol, lr_name in ft.stages.values():
                    runs = len(sw.grid(e)[lr_name]) * len(sw.seeds) * len(train_sides(ft.sweep_regimes(t)))
                    _train_job(acc, a, measured, "sweep", protocol, e, t, p, images, runs,
                               sw.epochs or s.epochs, sw.steps_per_epoch or s.steps_per_epoch, s.batch_size,
                               src([p.task_dataset(t)]))
    _interfaces(p, a, acc, images, n, src, forward_job)
    sal = p.saliency
    if sal.on:
        ss = sal.settings
        for e in sal.encoders:
            for t in sal.tasks:
                count = len(reg.task(t)["classes"]) * ss.images_per_class * len(sal.protocols) * ss.nt_samples * ss.n_steps
                forward_job("saliency", e, count, [p.task_dataset(t)], factor=a.saliency_factor)
    cp = p.compute
    if cp.on:
        job = cp.job_settings
        tr, inf = job["training"], job["inference"]
        steps = (tr["warmup"] + tr["steps"]) * tr["batch_size"]
        d = p.task_dataset(cp.task)
        for e in cp.encoders:
            count = inf["images"] or n(d, fr.test)
            factors = {"finetune": a.train_factor, "linear_aug": a.frozen_train_factor}
            train = sum(factors.get(proto, a.train_factor) for proto in tr["protocols"]) * steps
            forward_job("compute", e, count + inf["warmup"] + train, [d])
    notes = [f"dataset {d}: {k} images ({s})" for d, (k, s) in images.items()]
    return Estimate(sorted(acc.rows(), key=lambda r: (r["stage"], r["encoder"])), a, images, notes)


def _train_job(acc, a, measured, stage, protocol, encoder, task, p, images, runs, epochs, steps, batch, data_src):
    """A fine-tuning or sweep job: ``runs`` runs of epochs x steps x batch training images, validation every epoch
    and one test pass per run."""
    fr = p.settings.split.fractions
    d = p.task_dataset(task)
    trained = runs * epochs * steps * batch
    evaluated = runs * (epochs * images[d][0] * fr.val + images[d][0] * fr.test)
    factor = a.train_factor if protocol == "finetune" else a.frozen_train_factor
    hit = measured.train_rate(encoder, protocol)
    fwd = measured.forward_rate(encoder, a)
    if hit:
        seconds = trained / hit[0] + (evaluated / fwd[0] if fwd else evaluated * hit[0] ** -1 / factor)
        acc.job(stage, encoder, seconds=seconds, source=f"{hit[1]}; images {data_src}")
    else:
        flops = forward_flops(p.reg.encoder(encoder), a) * (trained * factor + evaluated)
        acc.job(stage, encoder, flops=flops, source=f"params; images {data_src}")


def _interfaces(p, a, acc, images, n, src, forward_job) -> None:
    """Zero-shot (image tower over each test split), MLLM prompting (prompt sets x test images x (prefill +
    max_new_tokens)), LoRA training (its GPUs) and adapter inference."""
    from retinabench.prompts import load_prompts
    fr = p.settings.split.fractions
    iface = p.interfaces
    prompts = load_prompts(iface.prompts_path) if iface.jobs else None
    for (interface, e, _set), job in sorted(iface.jobs.items()):
        entry = p.reg.encoder(e)
        tests = {t: n(p.task_dataset(t), fr.test) for t in job.tasks}
        if interface == "mllm" and prompts is not None:
            s = iface.settings["mllm"]
            per = forward_flops(entry, a) + decode_flops(entry, s.max_new_tokens, a)
            passes = 0.0
            for t, k in tests.items():
                sets = prompts.sets_for("mllm", p.reg.task(t))
                sets = [x for x in sets if s.prompt_sets is None or x in s.prompt_sets]
                passes += len(sets) * k
            acc.job("mllm", e, flops=per * passes, source=f"params; images {src(job.datasets)}")
        else:
            forward_job(interface, e, sum(tests.values()), list(job.datasets))
    lora = p.lora
    if not lora.jobs:
        return
    tr = lora.train
    for (e, source), job in sorted(lora.jobs.items()):
        entry = p.reg.encoder(e)
        d = p.task_dataset(source)
        answer = 8  # tokens of a supervised answer (with label_mask full, the prompt's are supervised too)
        per = 2.0 * float(entry["params_m"]) * 1e6 * (a.mllm_image_tokens + a.prompt_tokens + answer)
        acc.job("lora_train", e, flops=per * a.train_factor * n(d, fr.train) * tr.epochs,
                source=f"params; images {src([d])}", gpus=lora.settings.gpus)
        infer = forward_flops(entry, a) + decode_flops(entry, iface.settings["mllm"].max_new_tokens, a)
        data = lora.datasets(job)
        acc.job("lora_infer", e, flops=infer * sum(n(p.task_dataset(t), fr.test) for t in job.test_tasks),
                source=f"params; images {src(data)}")


def format_estimate(est: Estimate) -> str:
    """One table (stage x encoder), per-stage totals, the total, the assumptions and the images' sources."""
    from retinabench.estimate.table import render
    return render(est, COLUMNS)


def before_launch(p, gpu: str | None = None) -> str:
    """The Snakefile's onstart on a cluster run (not local, not a dry run: Snakemake calls onstart only when jobs
    execute): print the estimate and keep it as ``<results>/estimate.txt`` beside the run's outputs (its path; ""
    when the estimate failed: a warning names the error, the launch goes on). Costs the plan already built plus one
    Parquet footer per built manifest."""
    import sys
    from pathlib import Path

    from retinabench.atomic import write_text_atomic
    if gpu is None:  # profiles/slurm-gh200 runs on GH200 nodes; every other profile is taken as H100
        gpu = "gh200" if any("gh200" in arg for arg in sys.argv) else "h100"
    try:
        text = format_estimate(estimate(p, Assumptions(gpu=gpu)))
    except Exception as err:  # noqa: BLE001 - an estimate is advice: it must not stop the launch, but says why
        print(f"retinabench: WARNING: no cost estimate for this run ({type(err).__name__}: {err}); "
              f"`retinabench estimate` shows the same error", file=sys.stderr)
        return ""
    path = Path(p.R) / "estimate.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text + "\n")
    print(f"retinabench: estimate of this run (written to {path}; `retinabench estimate` to recompute)\n{text}",
          file=sys.stderr)
    return str(path)


HELP = ("jobs and GPU-hours per stage and encoder of the config (measured throughput where it exists, else parameter "
        "counts under printed assumptions)")


def add_options(p) -> None:
    """The command line of ``retinabench estimate`` (beside --configfile / --config)."""
    p.add_argument("--gpu", default="h100", help="the GPU whose sustained TFLOP/s is assumed: h100, gh200, h200")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="override an assumption, e.g. startup_s=30 data_overhead=0.3 tflops=h100:350")
    p.add_argument("--json", action="store_true", help="print the rows, totals and assumptions as JSON")


def run(args, config: dict) -> int:
    """``retinabench estimate``: print the table (or ``--json``) of the validated ``config``."""
    import json

    from retinabench.plan import WorkflowPlan
    a = Assumptions(gpu=args.gpu).override(list(args.set or []))
    est = estimate(WorkflowPlan(config), a)
    print(json.dumps(est.to_dict(), indent=1) if args.json else format_estimate(est))
    return 0
