"""Command line: ``retinabench provenance FILE``, ``verify DATASET``, ``encoders``, ``tasks``,
``datasets [--check]``, ``targets``, ``pin-encoder``. The pipeline itself runs through Snakemake (see README)."""
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
    """Which datasets are present, complete and readable under data_root (no pipeline run)."""
    from retinabench.data.check import check_dataset, format_checks
    from retinabench.registry import Registries
    config = _load_config(args.configfile)
    reg = Registries.from_config(config)
    data_root = Path(args.data_root or config["data_root"])
    if args.dataset:
        names = list(args.dataset)
        for n in names:
            reg.dataset(n)
    elif args.configfile:  # a config given: the datasets it selects
        names = list(config.get("datasets") or [])
    else:
        names = list(reg.datasets)
    results = [check_dataset(n, reg.dataset(n), data_root, decode=args.decode) for n in names]
    print(f"data_root: {data_root}\n")
    print(format_checks(results))
    explicit = bool(args.dataset or args.configfile)
    bad = [r.name for r in results if r.problem or (explicit and r.status == "absent")]
    if bad:
        print(f"\nnot ready: {', '.join(bad)}", file=sys.stderr)
        return 1
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


def cmd_verify(args) -> int:
    """Re-hash a dataset's raw files against its manifest; name every changed, missing or added file."""
    from retinabench.data.raw_state import compare_to_snapshot
    from retinabench.schemas import read_table
    from retinabench.workflow_plan import plan
    p = plan(_load_config(args.configfile))
    entry = p.registries.dataset(args.dataset)
    data_dir = Path(p.results) / "data" / args.dataset
    manifest = read_table(data_dir / "manifest.parquet", "manifest")
    snap_path = data_dir / "raw_files.parquet"
    snapshot = read_table(snap_path, "raw_files") if snap_path.is_file() and not entry.get("generated") else None
    root = p.dataset_root(args.dataset)
    diff = compare_to_snapshot(root, manifest, snapshot, full=True, threads=args.threads)
    checked = len(set(manifest["path"]) | (set() if snapshot is None else
                                          set(snapshot.loc[snapshot["sha256"].notna(), "path"])))
    if diff.empty:
        print(f"{args.dataset}: {len(manifest)} images under {root} match the manifest "
              f"({data_dir / 'manifest.parquet'})")
        return 0
    for r in diff.itertuples():
        detail = f"sha256 {r.expected[:12]} -> {r.actual[:12]}" if r.status == "changed" else ""
        image = f" (image {r.image_id})" if isinstance(r.image_id, str) else ""
        print(f"{r.status:8} {r.path}{image} {detail}".rstrip())
    counts = diff["status"].value_counts().to_dict()
    print(f"{args.dataset}: {len(diff)} raw file(s) differ from the manifest's record {counts} ({checked} hashed); "
          f"`snakemake` reruns its manifest and everything downstream")
    return 1


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
        p.add_argument("--configfile", action="append", help=f"config file(s) (default {DEFAULT_CONFIG})")
        p.set_defaults(fn=fn)
        if name == "datasets":
            p.add_argument("--check", action="store_true",
                           help="check which datasets are present, complete and readable under data_root")
            p.add_argument("--data-root", help="folder holding the raw dataset folders (default: the config's)")
            p.add_argument("--dataset", action="append",
                           help="check only this dataset (repeatable; default: the --configfile's datasets, "
                                "else every registry entry)")
            p.add_argument("--decode", type=int, default=2, help="images decoded per dataset (default 2)")
    p = sub.add_parser("targets", help="snakemake targets for one encoder and/or one task")
    p.add_argument("--configfile", action="append")
    p.add_argument("--encoder")
    p.add_argument("--task")
    p.set_defaults(fn=cmd_targets)
    p = sub.add_parser("verify", help="re-hash a dataset's raw files against its manifest; exit 1 on a change")
    p.add_argument("dataset")
    p.add_argument("--configfile", action="append")
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("pin-encoder", help="print revision + sha256 to pin a hub encoder entry (needs network)")
    p.add_argument("name")
    p.add_argument("--configfile", action="append")
    p.set_defaults(fn=cmd_pin_encoder)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"retinabench {args.cmd}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
