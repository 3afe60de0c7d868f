"""config/mllm_demo.yaml through Snakemake (target `lora`; the run is shared with the interfaces demo's tests:
tests/workflow/conftest.py `prompted_demo`): the tiny random Qwen2-VL is trained with LoRA on the phantom's glaucoma training split, the base model and the adapter answer the phantom's
test split (in-domain) and phantom_siteb's (out-of-domain) through the same job function, and the paired adapter −
base deltas form Table 5. A random model: the pairing, counts, provenance and files are what is pinned."""
import json

import numpy as np
import pandas as pd
import pytest

ENTRY, SOURCE, OOD = "tiny_qwen2_vl", "phantom_cfp_glaucoma", "phantom_siteb_cfp_glaucoma"


@pytest.fixture(scope="module")
def demo(prompted_demo, run_snakemake, report_builder):
    """The shared run of config/interfaces_demo.yaml + config/mllm_demo.yaml (tests/workflow/conftest.py)."""
    return {**prompted_demo, "run": run_snakemake, "report": report_builder}


def test_the_demo_trains_infers_and_compares_and_nothing_else(demo):
    c = demo["counts"]
    assert (c["mllm"], c["mllm_lora_train"], c["mllm_lora_infer"], c["mllm_lora_deltas"]) == (1, 1, 1, 1), c
    assert not any(k in c for k in ("features", "frozen", "collect_metrics")), c
    log = (demo["R"] / f"logs/mllm_lora_train/{ENTRY}/{SOURCE}.log").read_text()
    assert "training with 1 process(es)" in log and log.rstrip().splitlines()[-1].startswith("[done] mllm_lora_train")
    # a rerun has nothing to do: the adapter folder, its sidecar and every table are up to date
    again = demo["run"](demo["work"], "-n", "interfaces", "lora")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_the_adapter_is_recorded_file_by_file_and_the_loss_falls(demo):
    from retinabench.hashing import sha256_file
    from retinabench.provenance import read_sidecar
    d = demo["R"] / f"lora/{ENTRY}/{SOURCE}"
    rec = read_sidecar(d / "adapter")
    assert set(rec["files"]) == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    assert all(sha256_file(d / "adapter" / f) == h for f, h in rec["files"].items())
    # the adapter names its base model by registry entry, not by the temporary folder the loader read it from
    cfg = json.loads((d / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == ENTRY and "/tmp" not in (d / "adapter" / "README.md").read_text()
    info = rec["extra"]["adapter"]
    assert info["base"]["name"] == ENTRY and info["task"] == SOURCE and info["prompt_set"] == "focus"
    assert info["settings"]["lr"] == 5e-3 and info["effective_batch"] == 4
    inputs = {i["path"] for i in rec["inputs"]}
    assert any(p.endswith(f"splits/phantom/{SOURCE}.parquet") for p in inputs)
    assert any(p.endswith("tiny_qwen2_vl/model.safetensors") for p in inputs)
    assert not any(p.endswith(".snakemake_timestamp") for p in inputs)  # Snakemake's folder marker is no input
    log = pd.read_parquet(d / "train_log.parquet")
    assert list(log["step"]) == list(range(1, 21)) and (log["protocol"] == "mllm_lora").all()
    assert log["train_loss"].tail(5).mean() < log["train_loss"].iloc[0]
    compute = json.loads((d / "compute.json").read_text())
    assert compute["steps"] == 20 and compute["world_size"] == 1 and compute["train_seconds"] > 0
    assert not (d / "checkpoints").exists()  # removed once the adapter is written (keep_checkpoints: false)


def test_the_adapter_answers_the_same_questions_as_the_base_model(demo):
    R = demo["R"]
    base = pd.read_parquet(R / f"predictions/mllm/{ENTRY}/all.parquet")
    adapted = pd.read_parquet(R / f"predictions/mllm_lora/{ENTRY}/{SOURCE}.parquet")
    assert set(adapted["protocol"]) == {"mllm_lora", "mllm_lora_renorm"}
    assert set(adapted["task"]) == {SOURCE, OOD} and (adapted["train_task"] == SOURCE).all()
    assert (adapted["train_dataset"] == "phantom").all() and adapted["adapter"].nunique() == 1
    key = ["image_id", "task", "regime", "split"]
    b = base[(base["protocol"] == "mllm") & base["task"].isin([SOURCE, OOD])].set_index(key).sort_index()
    a = adapted[adapted["protocol"] == "mllm_lora"].set_index(key).sort_index()
    assert a.index.equals(b.index)            # the same rows ...
    assert (a["prompt"] == b["prompt"]).all()  # ... asked the same question; only the model differs
    assert not np.allclose(a["prob_yes"], b["prob_yes"])
    metrics = pd.read_parquet(R / f"metrics/mllm_lora/{ENTRY}/{SOURCE}.parquet")
    assert {"invalid_rate", "accuracy"} <= set(metrics["metric"])


def test_paired_deltas_have_in_and_out_of_domain_rows_with_counts_and_a_table5(demo):
    R = demo["R"] / "lora/deltas"
    pairs = pd.read_parquet(R / "pairs.parquet")
    assert sorted(zip(pairs["protocol"], pairs["domain"])) == [
        ("mllm", "in-domain"), ("mllm", "out-of-domain"), ("mllm_renorm", "in-domain"),
        ("mllm_renorm", "out-of-domain")]
    assert len(pd.read_parquet(R / "unpaired.parquet")) == 0
    comp = pd.read_parquet(R / "comparisons.parquet")
    done = comp[~comp["skipped"]]
    assert set(done["metric"]) == {"auroc", "auprc", "accuracy", "f1", "ece", "invalid_rate"}
    assert (done["unit"] == "patient").all() and (done["n_clusters"] < done["n_images"]).all()
    assert np.allclose(done["delta"], done["value_adapter"] - done["value_base"])
    assert done["p_bh"].between(0, 1).all() and (done["n_boot"] == 1000).all()
    table = pd.read_csv(R / "table5.csv")
    assert set(zip(table["model"], table["domain"])) == {(ENTRY, "in-domain"), (ENTRY, "out-of-domain"),
                                                         ("all", "in-domain"), ("all", "out-of-domain")}
    assert (table["n"] == 1).all() and set(table["protocol"]) == {"mllm", "mllm_renorm"}
    from PIL import Image
    with Image.open(demo["R"] / "figures/lora/table5.png") as im:
        assert im.width <= 1418  # 180 mm at 200 dpi
    log = (demo["R"] / "logs/mllm_lora_deltas.log").read_text()
    assert "lora Table 5 model: tiny_qwen2_vl | domain: out-of-domain" in log


def test_every_delta_traces_back_to_the_adapter_and_the_base_predictions(demo, monkeypatch):
    from retinabench.provenance import provenance_chain
    monkeypatch.chdir(demo["work"])  # sidecars record paths relative to the workflow folder
    chain = provenance_chain(demo["R"].relative_to(demo["work"]) / "lora/deltas/comparisons.parquet")
    paths = [n["path"] for n in chain]
    assert not [n["path"] for n in chain if n["stale"]]
    assert any(p.endswith(f"lora/{ENTRY}/{SOURCE}/adapter") for p in paths)
    assert any(p.endswith(f"predictions/mllm/{ENTRY}/all.parquet") for p in paths)
    assert any(p.endswith(f"splits/phantom/{SOURCE}.parquet") for p in paths)


def test_the_report_has_a_lora_section_with_table5(demo):
    report = demo["R"] / "report.html"
    demo["report"](demo["work"], report, "--keep-going", "interfaces", "lora")
    html = report.read_text(errors="replace")
    assert "9. LoRA fine-tuning of MLLMs" in html and "table5.png" in html and "table5.csv" in html
