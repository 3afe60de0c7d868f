"""Command line: ``retinabench provenance FILE``, ``encoders``, ``tasks``, ``datasets``, ``targets``,
``pin-encoder``, ``evaluate PREDICTIONS -o METRICS``. The pipeline itself runs through Snakemake (see README)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

DEFAULT_CONFIG = "config/config.yaml"


def _load_config(paths: list[str]) -> dict:
    """Like the Snakefile: config/config.yaml first, then each --configfile overriding its keys."""
    config: dict = {}
    for p in [DEFAULT_CONFIG] + [p for p in (paths or []) if Path(p) != Path(DEFAULT_CONFIG)]:
        if not Path(p).is_file():
            raise SystemExit(f"config file {p} not found (run from the repository root or pass --configfile)")
        config.update(yaml.safe_load(Path(p).read_text()) or {})
    return config


def _registries(args):
    from retinabench.registry import Registries
    return Registries.from_config(_load_config(args.configfile))


def _table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def cmd_provenance(args) -> int:
    from retinabench.provenance import format_chain, read_sidecar
    if not Path(args.file).exists():
        raise FileNotFoundError(f"{args.file} does not exist")
    record = read_sidecar(args.file)  # the artifact asked about must have one; its inputs may be source files
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print(format_chain(args.file))
    return 0


def cmd_encoders(args) -> int:
    reg = _registries(args)
    rows = [{"name": n, "source": e["source"], "architecture": e["architecture"], "domain": e["domain"],
             "method": e["method"], "params_m": e.get("params_m", ""), "init": e.get("init", "pretrained"),
             "pinned": "yes" if e.get("sha256") or e.get("init") == "random" else "NO"} for n, e in reg.encoders.items()]
    print(_table(rows, ["name", "source", "architecture", "domain", "method", "params_m", "init", "pinned"]))
    return 0


def cmd_tasks(args) -> int:
    reg = _registries(args)
    rows = [{"name": n, "dataset": t["dataset"], "modality": t["modality"], "label": t["label"],
             "classes": "/".join(t["classes"]), "ordinal": t["ordinal"], "family": t.get("family", "")}
            for n, t in reg.tasks.items()]
    print(_table(rows, ["name", "dataset", "modality", "label", "classes", "ordinal", "family"]))
    return 0


def cmd_datasets(args) -> int:
    reg = _registries(args)
    rows = [{"name": n, "adapter": d["adapter"], "root": d["root"], "modalities": "/".join(d["modalities"]),
             "exposure_risk": d["web_exposure_risk"]} for n, d in reg.datasets.items()]
    print(_table(rows, ["name", "adapter", "root", "modalities", "exposure_risk"]))
    return 0


def cmd_targets(args) -> int:
    """Output paths for one encoder and/or task under a config: feed them to snakemake to rerun just those."""
    from retinabench.workflow_plan import plan
    config = _load_config(args.configfile)
    p = plan(config)
    encoders = [args.encoder] if args.encoder else p.encoders
    tasks = [args.task] if args.task else p.tasks
    for name, allowed in (("encoder", p.encoders), ("task", p.tasks)):
        value = getattr(args, name)
        if value and value not in allowed:
            raise SystemExit(f"{name} {value!r} is not selected by the config; selected: {allowed}")
    for enc in encoders:
        for task in tasks:
            print(f"{p.results}/metrics/frozen/{enc}/{task}.parquet")
    return 0


def cmd_pin_encoder(args) -> int:
    """Resolve the current hub commit and the weight file's sha256 of an entry (needs network)."""
    from huggingface_hub import HfApi, hf_hub_download
    from retinabench.hashing import sha256_file
    entry = _registries(args).encoder(args.name)
    if "hub_id" not in entry:
        raise SystemExit(f"encoder {args.name!r} has no hub_id: nothing to pin")
    rev = HfApi().model_info(entry["hub_id"]).sha
    path = hf_hub_download(entry["hub_id"], entry["weights_file"], revision=rev)
    print(f"{args.name}:\n  revision: {rev}\n  sha256: {sha256_file(path)}")
    return 0


def cmd_evaluate(args) -> int:
    """The benchmark's metrics table for any file in the predictions schema (e.g. a model run outside the
    pipeline): hard-decision metrics from its y_pred as written, probability metrics from its p_<class> columns."""
    from retinabench.metrics.classification import metrics_table
    from retinabench.provenance import write_sidecar
    from retinabench.registry import load_registry
    from retinabench.schemas import read_table, write_table
    preds = read_table(args.predictions, "predictions")
    if args.tasks:
        tasks, where = load_registry(args.tasks, "tasks"), args.tasks
    else:
        tasks, where = _registries(args).tasks, "the config's task registry"
    unknown = sorted(set(preds["task"]) - set(tasks))
    if unknown:
        raise KeyError(f"{args.predictions}: task(s) {unknown} have no entry in {where}; add them to a task registry "
                       "file (classes in the order of the p_<class> columns, ordinal) and pass it with --tasks FILE")
    metrics = metrics_table(preds, tasks)
    write_table(metrics, args.output, "metrics")
    write_sidecar(args.output, rule="retinabench evaluate", inputs=[args.predictions],
                  config={"tasks": {t: tasks[t] for t in sorted(set(preds["task"]))}},
                  extra={"command": "retinabench evaluate", "n_rows": int(len(preds))})
    summary = (metrics.groupby(["task", "encoder", "protocol", "regime", "split", "metric"], sort=True)["value"]
               .agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n_seeds"}))
    rows = [{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in summary.to_dict("records")]
    print(_table(rows, list(summary.columns)))
    print(f"wrote {args.output} ({len(metrics)} rows)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="retinabench", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("provenance", help="print the chain of an artifact back to raw images and weights")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the artifact's own sidecar as JSON")
    p.set_defaults(fn=cmd_provenance)
    for name, fn, help_ in (("encoders", cmd_encoders, "list the encoder registry"),
                            ("tasks", cmd_tasks, "list the task registry"),
                            ("datasets", cmd_datasets, "list the dataset registry")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--configfile", action="append", help=f"config file(s) (default {DEFAULT_CONFIG})")
        p.set_defaults(fn=fn)
    p = sub.add_parser("targets", help="snakemake targets for one encoder and/or one task")
    p.add_argument("--configfile", action="append")
    p.add_argument("--encoder")
    p.add_argument("--task")
    p.set_defaults(fn=cmd_targets)
    p = sub.add_parser("pin-encoder", help="print revision + sha256 to pin a hub encoder entry (needs network)")
    p.add_argument("name")
    p.add_argument("--configfile", action="append")
    p.set_defaults(fn=cmd_pin_encoder)
    p = sub.add_parser("evaluate", help="metrics table (metrics.parquet format) of a file in the predictions schema")
    p.add_argument("predictions", help="Parquet file in the predictions schema (y_true, y_pred, p_<class>...)")
    p.add_argument("-o", "--output", required=True, help="metrics Parquet file to write")
    p.add_argument("--tasks", help="task registry YAML with the predictions' tasks (default: the config's)")
    p.add_argument("--configfile", action="append")
    p.set_defaults(fn=cmd_evaluate)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"retinabench {args.cmd}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
