"""The interfaces demo on the phantom (python -m retinabench.testing.interfaces_demo): one tiny model per
interface, every prompt set, the files and tables it writes agree with its predictions."""
import pandas as pd
import pytest

from retinabench.schemas import read_table
from retinabench.testing.interfaces_demo import run_demo

from tests.conftest import REPO


@pytest.mark.slow
def test_demo_runs_both_interfaces_on_the_phantom(tmp_path):
    lines = []
    res = run_demo(tmp_path, n_patients=30, repo=REPO, log=lines.append, zeroshot_models=("tiny_open_clip",),
                   mllm_models=("tiny_qwen2_vl",))
    preds = res["predictions"]
    assert {p.split("@")[0] for p in preds["protocol"]} == {"zeroshot", "zeroshot_focus", "mllm", "mllm_renorm"}
    for f in ("predictions_zeroshot_tiny_open_clip.parquet", "predictions_mllm_tiny_qwen2_vl.parquet"):
        assert len(read_table(tmp_path / f, "predictions"))
    m = read_table(tmp_path / "metrics.parquet", "metrics")
    inv = m[m["metric"] == "invalid_rate"]
    assert set(inv["encoder"]) == {"tiny_qwen2_vl"}  # answer metrics only where answers were generated
    counts = pd.read_csv(tmp_path / "answer_counts.csv")
    mllm = preds[preds["protocol"].isin(counts["protocol"])]
    assert counts["n"].sum() == len(mllm) and counts["n_invalid"].sum() == int((mllm["y_pred"] == -1).sum())
    ps = pd.read_csv(tmp_path / "prompt_sensitivity.csv")
    assert set(ps["base_protocol"]) == {"zeroshot", "zeroshot_focus", "mllm", "mllm_renorm"}
    assert (ps["n_prompt_sets"] >= 2).all()
    ed = pd.read_csv(tmp_path / "ece_difference.csv")
    assert set(ed["encoder"]) == {"tiny_open_clip"} and ed["ece_diff"].notna().all()
    sub = pd.read_csv(tmp_path / "subgroups.csv")
    assert {p.split("@")[0] for p in sub["protocol"]} == {"zeroshot", "zeroshot_focus", "mllm", "mllm_renorm"}
    assert any("chance level expected" in line for line in lines)
