"""Command line: ``retinabench provenance FILE``, ``verify [DATASET]``, ``encoders``, ``tasks``,
``datasets [--check]``, ``targets``, ``lock-encoders``, ``check-encoder``, ``evaluate PREDICTIONS -o METRICS``,
``estimate``, ``report FILE [snakemake arguments]`` (the HTML report, escaped: retinabench.report_build).
The pipeline itself runs through Snakemake (see README.md and docs/)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

DEFAULT_CONFIG = "config/config.yaml"


def _load_config(paths: list[str], overrides: list[str] | None = None) -> dict:
    """As Snakemake builds it: config/config.yaml first, then each --configfile merged over it (nested mappings key
    by key), then the --config KEY=VALUE overrides (parsed as Snakemake parses them); loaded by
    retinabench.settings (every problem in one message, an unknown key with a "did you mean"), returned as the
    validated plain data the workflow reads."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    from retinabench.settings import ConfigError, load
    config: dict = {}
    for p in [DEFAULT_CONFIG] + [p for p in (paths or []) if Path(p) != Path(DEFAULT_CONFIG)]:
        if not Path(p).is_file():
            raise SystemExit(f"config file {p} not found (run from the repository root or pass --configfile)")
        update_config(config, yaml.safe_load(Path(p).read_text()) or {})
    try:
        update_config(config, parse_config(overrides or []))
    except ValueError as err:
        raise SystemExit(f"retinabench: --config {' '.join(overrides or [])}: {err}") from None
    try:
        return load(config).plain()
    except ConfigError as err:
        raise SystemExit(f"retinabench: {err}") from None


def _config(args) -> dict:
    return _load_config(args.configfile, getattr(args, "config", None))


def _registries(args):
    from retinabench.registry import Registries
    return Registries.from_config(_config(args))


def _config_options(p: argparse.ArgumentParser, overrides: bool = True) -> None:
    """--configfile and --config as Snakemake takes them: several values after one flag, or the flag repeated."""
    p.add_argument("--configfile", nargs="+", action="extend", metavar="FILE",
                   help=f"config file(s) merged in order over {DEFAULT_CONFIG}")
    if overrides:
        p.add_argument("--config", nargs="+", action="extend", metavar="KEY=VALUE",
                       help="config values overriding the files' (as snakemake --config)")


def _table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def cmd_provenance(args) -> int:
    """The chain of an artifact; exit 1 when anything in it is flagged (changed, stale, missing, raw changes)."""
    from retinabench.provenance import chain_flags, format_chain, provenance_chain, read_sidecar
    if not Path(args.file).exists():
        raise FileNotFoundError(f"{args.file} does not exist")
    record = read_sidecar(args.file)  # the artifact asked about must have one; its inputs may be source files
    nodes = provenance_chain(args.file)
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print(format_chain(args.file, nodes))
    flagged = chain_flags(nodes)
    if flagged:
        print(f"retinabench provenance: {flagged} item(s) flagged in the chain of {args.file} "
              "(changed, stale or missing); `retinabench verify` lists everything under the results folder",
              file=sys.stderr)
    return 1 if flagged else 0


def cmd_encoders(args) -> int:
    from retinabench.registry.lockfile import lock_state
    reg = _registries(args)
    rows = [{"name": n, "source": e["source"], "domain": e["domain"], "method": e["method"],
             "params_m": e.get("params_m", ""), "size_class": e["size_class"], "pooling": e.get("pooling", "-"),
             "interfaces": "/".join(e.get("interfaces") or ["features"]),
             "studies": "/".join(e.get("studies") or []) or "-",
             "lock": "random init" if e.get("init") == "random" else lock_state(e, e.get("lock"))}
            for n, e in reg.encoders.items()]
    print(_table(rows, ["name", "source", "domain", "method", "params_m", "size_class", "pooling", "interfaces",
                        "studies", "lock"]))
    return 0


def cmd_tasks(args) -> int:
    reg = _registries(args)
    rows = [{"name": n, "dataset": t["dataset"], "modality": t["modality"], "label": t["label"],
             "classes": "/".join(t["classes"]), "ordinal": t["ordinal"], "family": t.get("family", "")}
            for n, t in reg.tasks.items()]
    print(_table(rows, ["name", "dataset", "modality", "label", "classes", "ordinal", "family"]))
    return 0


def cmd_datasets(args) -> int:
    if args.check:
        return _check_datasets(args)
    reg = _registries(args)
    rows = [{"name": n, "adapter": d["adapter"], "root": d["root"], "modalities": "/".join(d["modalities"]),
             "access": d.get("access", ""), "exposure_risk": d["web_exposure_risk"],
             "papers": "/".join(d.get("papers", [])), "status": d.get("status", "established")}
            for n, d in reg.datasets.items()]
    print(_table(rows, ["name", "adapter", "root", "modalities", "access", "exposure_risk", "papers", "status"]))
    return 0


def _check_datasets(args) -> int:
    """Which datasets are present, complete, readable and large enough for the config under data_root (no
    pipeline run)."""
    from retinabench.data.check import check_dataset, format_checks, sizing
    from retinabench.registry import Registries
    config = _config(args)
    reg = Registries.from_config(config)
    data_root = Path(args.data_root or config["data_root"])
    if args.dataset:
        names = list(args.dataset)
        for n in names:
            reg.dataset(n)
    elif args.configfile:  # a config given: the datasets it selects
        names = list(config["datasets"])
    else:
        names = list(reg.datasets)
    min_side = config["images"]["min_side"]
    sizes = sizing(config, list(reg.tasks.values()), config["tasks"])  # the same checks as the workflow's start-up
    results = [check_dataset(n, reg.dataset(n), data_root, decode=args.decode, min_side=min_side, sizes=sizes)
               for n in names]
    print(f"data_root: {data_root}\n")
    print(format_checks(results))
    explicit = bool(args.dataset or args.configfile)
    bad = [r.name for r in results if r.problem or (explicit and r.status == "absent")]
    if bad:
        print(f"\nnot ready: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def cmd_targets(args) -> int:
    """Every output of the config's plan that depends on the given encoders and / or tasks (features, probe
    predictions and metrics, fine-tuning runs and sweeps, transfer, interface and LoRA jobs, reliability tables,
    and the tables and figures that aggregate them): feed them to snakemake (`-f` / `--forcerun`) to rebuild."""
    from retinabench.plan import WorkflowPlan
    from retinabench.plan.targets import dependent_outputs
    p = WorkflowPlan(_config(args))
    encoders, tasks = list(args.encoder or []), list(args.task or [])
    if not encoders and not tasks:
        raise SystemExit("targets: give --encoder and / or --task (each takes several names)")
    for what, given, allowed in (("encoder", encoders, p.weight_entries), ("task", tasks, p.tasks)):
        unknown = [v for v in given if v not in allowed]
        if unknown:
            raise SystemExit(f"{what}(s) {unknown} not selected by the config; selected: {allowed}")
    for path in dependent_outputs(p, encoders, tasks):
        print(path)
    return 0


def _raw_findings(p, dataset: str, threads: int) -> tuple[list, str]:
    """A dataset's raw files against its manifest: findings (CHANGED / MISSING / ADDED ...) and a summary line."""
    from retinabench.data.raw_state import compare_to_snapshot
    from retinabench.integrity import Finding
    from retinabench.schemas import read_table
    entry = p.registries.dataset(dataset)
    data_dir = Path(p.results) / "data" / dataset
    manifest_path = data_dir / "manifest.parquet"
    manifest = read_table(manifest_path, "manifest")
    snap_path = data_dir / "raw_files.parquet"
    snapshot = read_table(snap_path, "raw_files") if snap_path.is_file() and not entry.get("generated") else None
    root = Path(p.dataset_root(dataset))
    if not root.is_dir():
        return ([Finding("MISSING", str(root), f"raw folder of {dataset} is gone; its manifest {manifest_path} lists "
                                               f"{len(manifest)} images (is data_root right?)")],
                f"{dataset}: raw folder {root} missing")
    diff = compare_to_snapshot(root, manifest, snapshot, full=True, threads=threads)
    checked = len(set(manifest["path"]) | (set() if snapshot is None else
                                          set(snapshot.loc[snapshot["sha256"].notna(), "path"])))
    if diff.empty:
        return [], f"{dataset}: {len(manifest)} images under {root} match the manifest ({manifest_path})"
    findings = []
    for r in diff.itertuples():
        detail = f"sha256 {r.expected[:12]} -> {r.actual[:12]}" if r.status == "changed" else ""
        image = f"image {r.image_id}" if isinstance(r.image_id, str) else ""
        findings.append(Finding(r.status.upper() if r.status != "missing" else "MISSING", f"{root / r.path}",
                                f"raw file of {dataset} {image} {detail}".rstrip()))
    counts = diff["status"].value_counts().to_dict()
    return findings, (f"{dataset}: {len(diff)} raw file(s) differ from the manifest's record {counts} ({checked} "
                      "hashed); `snakemake` reruns its manifest and everything downstream")


def cmd_verify(args) -> int:
    """With a dataset: re-hash its raw files against its manifest. Without: every artifact under the results folder
    against its sidecar, every artifact's inputs against the hashes it was built from, and every dataset's raw
    files against its manifest. Prints each CHANGED / MISSING / STALE item; exit 1 if there is any."""
    from retinabench.integrity import results_findings
    from retinabench.plan.selection import plan
    p = plan(_config(args))
    if args.dataset:
        findings, summary = _raw_findings(p, args.dataset, args.threads)
        for f in findings:
            print(f.line())
        print(summary)
        return 1 if findings else 0
    findings, n_artifacts = results_findings(p.results)
    datasets = sorted(d.name for d in (Path(p.results) / "data").glob("*") if (d / "manifest.parquet").is_file()
                      and d.name in p.registries.datasets)
    summaries = []
    for dataset in datasets:
        raw, summary = _raw_findings(p, dataset, args.threads)
        findings += raw
        summaries.append(summary)
    for f in findings:
        print(f.line())
    for line in summaries:
        print(line)
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    what = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing flagged"
    print(f"verify {p.results}: {n_artifacts} artifact(s) against their sidecars and inputs, {len(datasets)} "
          f"dataset(s) against their manifests: {what}")
    return 1 if findings else 0


def cmd_lock_encoders(args) -> int:
    """Resolve and hash every file the named (default: all) hub / url / manual entries load; write the lock."""
    from retinabench.models.lock import lock_entry
    from retinabench.registry.lockfile import LockError, lock_name, needs_lock, read_lock, write_lock
    reg = _registries(args)
    names = args.names or [n for n, e in reg.encoders.items() if needs_lock(e) and "variant_of" not in e]
    entries = [reg.encoder(n) for n in names]
    records: dict = {}  # per lock file: each registry file's lock sits beside it
    failed = []
    for entry in entries:
        if not needs_lock(entry):
            print(f"{entry['name']}: nothing to lock ({'random init' if entry.get('init') == 'random' else 'sha256 in the registry'})")
            continue
        base = lock_name(entry)
        path = reg.lock_path(base)
        file_records = records.setdefault(path, read_lock(path))
        try:
            file_records[base] = lock_entry(reg.encoder(base))
        except LockError as err:
            failed.append(base)
            print(f"{base}: NOT LOCKED: {err}", file=sys.stderr)
            continue
        rec = file_records[base]
        print(f"{base}: " + (f"{rec['pins']['hub_id']}@{rec['revision']}" if "revision" in rec else rec["pins"]["url"]))
        for fname, sha in sorted(rec["files"].items()):
            print(f"    {fname}  {sha}")
        write_lock(path, file_records)  # after each entry: a long run keeps what it resolved
    for path in records or [reg.encoders_lock_path]:
        print(f"lock file: {path}")
    return 1 if failed else 0


def cmd_check_encoder(args) -> int:
    """Load one entry through the real load path; non-zero exit on any mismatch."""
    from retinabench.models.check import check_encoder
    entry = _registries(args).encoder(args.name)
    ok, lines = check_encoder(entry, weights=args.weights)
    print("\n".join(lines))
    return 0 if ok else 1


def cmd_evaluate(args) -> int:
    """The benchmark's metrics table for any file in the predictions schema (e.g. a model run outside the
    pipeline): hard-decision metrics from its y_pred as written, probability metrics from its p_<class> columns."""
    from retinabench.metrics.classification import metrics_table
    from retinabench.provenance import write_sidecar
    from retinabench.registry import load_registry
    from retinabench.schemas import read_table, write_table
    from retinabench.integrity import verify_inputs
    verify_inputs([args.predictions], consumer="retinabench evaluate")  # a workflow artifact: as its sidecar says
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


def cmd_report(args) -> int:
    from retinabench.report_build import ReportBuildError, build_report
    try:
        print(f"report: {build_report(args.report, args.snakemake_args)}")
    except ReportBuildError as err:
        print(f"retinabench report: error: {err}", file=sys.stderr)
        return 1
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
                            ("datasets", cmd_datasets, "list the dataset registry (--check: which are present)")):
        p = sub.add_parser(name, help=help_)
        _config_options(p)
        p.set_defaults(fn=fn)
        if name == "datasets":
            p.add_argument("--check", action="store_true",
                           help="check which datasets are present, complete and readable under data_root")
            p.add_argument("--data-root", help="folder holding the raw dataset folders (default: the config's)")
            p.add_argument("--dataset", nargs="+", action="extend",
                           help="check only these datasets (default: the --configfile's datasets, "
                                "else every registry entry)")
            p.add_argument("--decode", type=int, default=2, help="images decoded per dataset (default 2)")
    p = sub.add_parser("targets", help="every output of the config that depends on the given encoders and / or tasks "
                                       "(features, probes, fine-tunes, transfer, interfaces, figures)")
    _config_options(p, overrides=True)
    p.add_argument("--encoder", nargs="+", action="extend", help="encoder name(s)")
    p.add_argument("--task", nargs="+", action="extend", help="task name(s)")
    p.set_defaults(fn=cmd_targets)
    p = sub.add_parser("verify", help="check every artifact under the results folder against its sidecar, every "
                                      "aggregate against its inputs and every dataset's raw files against its "
                                      "manifest (or one dataset's raw files); exit 1 on any finding")
    p.add_argument("dataset", nargs="?", help="check only this dataset's raw files against its manifest")
    _config_options(p)
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("lock-encoders", help="pin revision + sha256 of every file the encoders load "
                                              "(needs network once); writes <encoders registry>.lock.yaml")
    p.add_argument("names", nargs="*", help="encoders to lock (default: every entry that needs a lock)")
    _config_options(p)
    p.set_defaults(fn=cmd_lock_encoders)
    p = sub.add_parser("check-encoder", help="load an encoder through the real load path and report keys, "
                                             "sha256 and embedding dimension (exit 1 on any mismatch)")
    p.add_argument("name")
    p.add_argument("--weights", help="a local file (folder for transformers) in the published layout, used "
                                     "instead of the pinned source")
    _config_options(p)
    p.set_defaults(fn=cmd_check_encoder)
    p = sub.add_parser("evaluate", help="metrics table (metrics.parquet format) of a file in the predictions schema")
    p.add_argument("predictions", help="Parquet file in the predictions schema (y_true, y_pred, p_<class>...)")
    p.add_argument("-o", "--output", required=True, help="metrics Parquet file to write")
    p.add_argument("--tasks", help="task registry YAML with the predictions' tasks (default: the config's)")
    _config_options(p)
    p.set_defaults(fn=cmd_evaluate)
    from retinabench import estimate  # jobs and GPU-hours per stage and encoder, before a launch
    p = sub.add_parser("estimate", help=estimate.HELP)
    _config_options(p)
    estimate.add_options(p)
    p.set_defaults(fn=lambda a: estimate.run(a, _config(a)))
    p = sub.add_parser("report", help="the Snakemake HTML report with every string escaped for its context "
                                      "(retinabench.report_build)")
    p.add_argument("report", help="the report to write, e.g. results/report.html")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                   help="passed to snakemake, e.g. --profile profiles/local --configfile F")
    p.set_defaults(fn=cmd_report)
    args = parser.parse_args(argv)
    from retinabench.integrity import ArtifactChanged
    try:
        return args.fn(args)
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"retinabench {args.cmd}: error: {err}", file=sys.stderr)
        return 2
    except ArtifactChanged as err:
        print(f"retinabench {args.cmd}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `retinabench ... | head`: the reader left; no traceback (Python docs' recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
