"""bench/augment_throughput.py on tiny sizes: both crops on both paths and the fine-tuning step with and without
augmentation run, and every rate it reports is a positive number (the script cannot rot between runs)."""
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_augment_throughput_smoke_on_cpu(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # its `common` module, as run_all.py's path
    script = runpy.run_path(str(REPO / "bench/augment_throughput.py"), run_name="augment_throughput")
    out = script["main"](n=4, size=32, repeats=1, name="resnet18_random", batch=2, steps=1)
    assert set(out["augmentation"]) == {"zoom", "random_resized_crop"}
    rates = [v for r in out["augmentation"].values() for v in r.values()] + list(out["step"].values())
    assert len(rates) == 9 and all(v > 0 for v in rates)
    assert capsys.readouterr().out.count("goal") == 3
