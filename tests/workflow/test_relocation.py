"""Content, not location, decides a rerun: moving the raw data folder (and pointing data_root at it) reruns nothing;
changing one raw image reruns exactly its dataset's data jobs (manifest onward), not the other dataset's.

Two raw datasets (phantom images written under data_root, registered as real datasets of the phantom adapter) run
through the data layer (manifest, duplicates, split, task splits, image cache, cross-dataset duplicates): the layer
whose params carried the raw folder. The tiny workflow fixture cannot serve here: its phantom is generated under the
results folder, never under data_root.
"""
import re
import shutil
from pathlib import Path

import yaml
from PIL import Image

from retinabench.data.phantom import generate_phantom
from retinabench.plan.paths import Paths


DATASETS = ("raw_a", "raw_b")
RESULTS = "results/relocation"


def _registries(work: Path) -> dict:
    """Datasets raw_a / raw_b (the phantom adapter on folders under data_root) and their copies of phantom's tasks."""
    datasets = yaml.safe_load((work / "config/datasets.yaml").read_text())
    tasks = yaml.safe_load((work / "config/tasks.yaml").read_text())
    out_d, out_t = {}, {}
    for name in DATASETS:
        entry = {k: v for k, v in datasets["phantom"].items() if k != "generated"}
        out_d[name] = {**entry, "root": name}
        for t in ("phantom_cfp_dr3", "phantom_cfp_glaucoma"):
            out_t[t.replace("phantom", name)] = {**tasks[t], "dataset": name}
    (work / "config/reloc_datasets.yaml").write_text(yaml.safe_dump(out_d))
    (work / "config/reloc_tasks.yaml").write_text(yaml.safe_dump(out_t))
    return out_t


def _targets(tasks: dict) -> list[str]:
    p = Paths(RESULTS, cache_tag="224_squash")
    out = [p.path("cross_duplicates")]
    for d in DATASETS:
        out += [p.path(k, dataset=d) for k in ("manifest", "duplicates", "assignment", "image_cache")]
    out += [p.path("task_split", dataset=t["dataset"], task=name) for name, t in tasks.items()]
    return out


def _planned(proc) -> list[tuple[str, str]]:
    """(rule, output) of every job a dry run lists."""
    text = proc.stdout + proc.stderr
    return re.findall(r"^rule (\w+):\n(?:.*\n)*?\s+output: (.+)$", text, re.M)


def test_moving_data_reruns_nothing_and_one_image_reruns_its_dataset(tmp_path, make_workflow_copy, run_snakemake):
    work = tmp_path / "repo"
    config = {"data_root": str(tmp_path / "data"), "results": RESULTS, "datasets": list(DATASETS), "tasks": [],
              "encoders": ["efficientnet_lite0_in1k"],
              "registries": {"datasets": "config/reloc_datasets.yaml", "tasks": "config/reloc_tasks.yaml",
                             "encoders": "config/encoders.yaml"}}
    make_workflow_copy(work, config)
    tasks = _registries(work)
    for seed, name in enumerate(DATASETS):
        generate_phantom(tmp_path / "data" / name, n_patients=40, seed=seed, image_size=96)
    targets = _targets(tasks)
    run_snakemake(work, "--keep-going", *targets)  # a flag first: --configfile takes several files

    # the same files in another folder: data_root follows them, nothing reruns
    shutil.move(tmp_path / "data", tmp_path / "moved")
    config["data_root"] = str(tmp_path / "moved")
    (work / "config/tiny.yaml").write_text(yaml.safe_dump(config))
    dry = run_snakemake(work, "-n", *targets)
    assert "Nothing to be done" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-4000:]

    # one image of raw_a redrawn: raw_a's manifest and what depends on it, and the cross-dataset duplicates
    image = sorted((tmp_path / "moved/raw_a/cfp").glob("*.png"))[0]
    with Image.open(image) as img:
        img.rotate(90).save(image)
    jobs = _planned(run_snakemake(work, "-n", *targets))
    rules = sorted(r for r, _ in jobs)
    expected = sorted(["manifest", "duplicates", "split", "image_cache", "cross_duplicates"]
                      + ["task_split"] * sum(t["dataset"] == "raw_a" for t in tasks.values()))
    assert rules == expected, jobs
    assert not [o for r, o in jobs if "raw_b" in o], jobs
