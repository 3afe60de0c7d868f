"""The zeroshot / mllm stages as a rule runs them (a Job over files on disk: the phantom's manifest, a task split,
its memory-mapped image cache, the prompt registry), on the tiny models: predictions and metrics written with
their sidecars, every split row kept, the interface tables from those files."""
import json
from pathlib import Path

import pytest

from retinabench.pipeline import Job, run_stage
from retinabench.schemas import read_table, write_table

from tests.conftest import REPO

TASK = "phantom_cfp_anydr"


@pytest.fixture(scope="module")
def phantom_files(tmp_path_factory, registries):
    from retinabench.data.adapters.phantom import adapt_phantom
    from retinabench.data.image_cache import build_image_cache
    from retinabench.data.phantom import generate_phantom
    from retinabench.data.splits import make_split
    root = tmp_path_factory.mktemp("ph")
    generate_phantom(root / "raw", n_patients=16, seed=0, image_size=64)
    manifest, _ = adapt_phantom(root / "raw", registries.dataset("phantom"))
    task = dict(registries.task(TASK), name=TASK)
    write_table(manifest, root / "manifest.parquet", "manifest")
    write_table(make_split(manifest, task, seed=0), root / "split.parquet", "split")
    build_image_cache(manifest, root / "raw", root / "images.npy", root / "images.index.parquet", size=32,
                      threads=1, progress=False)
    return root, task


def job_for(rule, root, task, entry, weights, out):
    """The rule's job for a local-weights entry: its weights_path folder pinned file by file (the loader verifies
    every sha256; the rule's `weights` input is only the dependency on that folder)."""
    from retinabench.hashing import sha256_file
    entry = dict(entry, weights_path=str(weights),
                 sha256={f.name: sha256_file(f) for f in sorted(Path(weights).iterdir()) if f.is_file()})
    section = {"enabled": True, "encoders": None, "task_sets": None, "prompt_sets": ["focus", "plain"],
               "regimes": ["u-u"], "batch_size": 8, "device": "cpu"}
    if rule == "mllm":
        section |= {"max_new_tokens": 3, "dtype": "auto"}
    return Job(rule=rule, input={"prompts": str(REPO / "config/prompts.yaml"), "splits": [str(root / "split.parquet")],
                                 "manifests": [str(root / "manifest.parquet")], "array_phantom": str(root / "images.npy"),
                                 "index_phantom": str(root / "images.index.parquet"), "weights": str(weights)},
               output={"predictions": str(out / "predictions.parquet"), "metrics": str(out / "metrics.parquet")},
               params={"job": {"entry": entry, "tasks": [task], "datasets": ["phantom"], "settings": section}},
               wildcards={"encoder": entry["name"], "task_set": "all"})


def test_zeroshot_and_mllm_stages_write_predictions_metrics_and_sidecars(phantom_files, tiny_mllms, tmp_path):
    from retinabench.models.tiny import build_tiny_siglip
    root, task = phantom_files
    split = read_table(root / "split.parquet", "split")
    sig = build_tiny_siglip(tmp_path / "sig")
    entry, folder = tiny_mllms["tiny_qwen2_vl"]
    outs = {}
    for rule, e, w in (("zeroshot", sig, tmp_path / "sig"), ("mllm", entry, folder)):
        out = tmp_path / rule
        run_stage(rule, job_for(rule, root, task, e, w, out))
        preds = read_table(out / "predictions.parquet", "predictions")
        metrics = read_table(out / "metrics.parquet", "metrics")
        n_rows = int(split["split"].isin(["val", "test"]).sum())
        for proto, g in preds.groupby("protocol"):
            assert len(g) == n_rows, proto  # every validation / test image, invalid answers included
        assert set(metrics["protocol"]) == set(preds["protocol"])
        side = json.loads((out / "predictions.parquet.prov.json").read_text())
        assert side["rule"] == rule and side["config"]["entry"]["name"] == e["name"]
        outs[rule] = (preds, metrics)
    assert {p.split("@")[0] for p in outs["zeroshot"][0]["protocol"]} == {"zeroshot", "zeroshot_focus"}
    assert "invalid_rate" in set(outs["mllm"][1]["metric"]) and "answer" in outs["mllm"][0].columns
    side = json.loads((tmp_path / "mllm" / "predictions.parquet.prov.json").read_text())
    assert side["extra"]["invalid_answers"]["n"] == len(outs["mllm"][0])
    tables = Job(rule="interface_tables",
                 input={"metrics": [str(tmp_path / r / "metrics.parquet") for r in outs],
                        "zeroshot": [str(tmp_path / "zeroshot" / "predictions.parquet")]},
                 output={"prompt_sensitivity": str(tmp_path / "ps.parquet"),
                         "zeroshot_ece_difference": str(tmp_path / "ece.parquet")},
                 params={"tasks": {TASK: task}})
    run_stage("interface_tables", tables)
    ps = read_table(tmp_path / "ps.parquet")
    assert set(ps["base_protocol"]) == {"zeroshot", "zeroshot_focus", "mllm", "mllm_renorm"}
    assert set(read_table(tmp_path / "ece.parquet")["prompt_set"]) == {"focus", "plain"}


def test_native_inputs_stage_decodes_the_originals_and_records_the_processor_key(phantom_files, tiny_mllms, tmp_path):
    """inputs: native as the rule runs it: no image cache among the inputs, the raw folder in the params, the
    originals through the model's processor; the mode and the processor key in the provenance."""
    from retinabench.models.tiny import build_tiny_siglip
    root, task = phantom_files
    sig = build_tiny_siglip(tmp_path / "sig")
    entry, folder = tiny_mllms["tiny_qwen2_vl"]
    for rule, e, w in (("zeroshot", sig, tmp_path / "sig"), ("mllm", entry, folder)):
        out = tmp_path / rule
        job = job_for(rule, root, task, e, w, out)
        for key in ("array_phantom", "index_phantom"):
            del job.input[key]
        job.params["job"]["settings"]["inputs"] = "native"
        with pytest.raises(KeyError, match="inputs native needs the raw folder"):
            run_stage(rule, job)
        job.params["job"]["roots"] = {"phantom": str(root / "raw")}
        run_stage(rule, job)
        side = json.loads((out / "predictions.parquet.prov.json").read_text())
        rec = side["extra"]["inputs"]
        assert rec["mode"] == "native" and len(rec["key"]) == 64, rec
        assert side["config"][rule]["inputs"] == "native"
        assert len(read_table(out / "predictions.parquet", "predictions"))


def test_the_plan_gives_native_jobs_the_raw_files_and_roots_instead_of_the_cache():
    import yaml

    from retinabench.plan import WorkflowPlan
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}

    class WC:
        encoder, task_set = "clip_vitb32_openai", "all"
    jobs = {}
    for mode in ("cache", "native"):
        c["zeroshot"] = dict(c["zeroshot"], enabled=True, encoders=["clip_vitb32_openai"], inputs=mode)
        p = WorkflowPlan(c)
        jobs[mode] = (p.interfaces.job_inputs("zeroshot", WC), p.interfaces.job_params("zeroshot", WC), p)
    (ci, cp, _), (ni, np_, p) = jobs["cache"], jobs["native"]
    datasets = np_["datasets"]
    assert {k for k in ci if k.startswith("array_")} == {f"array_{d}" for d in datasets} and "roots" not in cp
    assert not any(k.startswith(("array_", "index_")) for k in ni)
    assert {k: v for k, v in ni.items() if k.startswith("raw_files_")} == {
        f"raw_files_{d}": p.interfaces.core.path("raw_files", dataset=d) for d in datasets}
    # the raw folders are a location: a `locations` param (kept out of the params rerun trigger), merged into `job`
    from retinabench.plan.core import merge_locations
    assert "roots" not in np_
    merged = merge_locations({"job": np_, "locations": p.interfaces.locations("zeroshot")(WC, [])})
    assert merged["job"]["roots"] == {d: p.interfaces.core.selection.dataset_root(d) for d in datasets}
    assert np_["settings"]["inputs"] == "native" and cp["settings"]["inputs"] == "cache"
