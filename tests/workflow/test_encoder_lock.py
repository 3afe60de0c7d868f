"""A selected encoder that the lock file does not pin is refused when the workflow starts (snakemake -n), with the
command that pins it; once locked it plans normally, and relocking it reruns exactly its jobs."""
import yaml

from retinabench.registry.lockfile import pins_of, write_lock
from retinabench.registry import load_registry

OVERRIDES = {"datasets": ["phantom"], "encoders": ["vit_tiny_random", "dinov2_vitb14"]}


def _record(entry, sha="0" * 64, rev="c" * 40):
    return {"pins": pins_of(entry), "revision": rev, "files": {f: sha for f in pins_of(entry)["files"]},
            "locked_at": "2026-01-01T00:00:00Z"}


def test_unlocked_selected_encoder_is_refused_at_dry_run(tmp_path, make_workflow_copy, run_snakemake):
    work = make_workflow_copy(tmp_path / "repo", OVERRIDES)
    proc = run_snakemake(work, "-n", check=False)
    out = proc.stdout + proc.stderr  # snakemake prints the workflow error on stdout
    assert proc.returncode != 0
    assert "encoder 'dinov2_vitb14' is not locked (hub weights): run `retinabench lock-encoders dinov2_vitb14`" in out
    assert "vit_tiny_random" not in out.split("encoders without a valid lock record")[1]
    entry = load_registry(work / "config/encoders.yaml", "encoders")["dinov2_vitb14"]
    write_lock(work / "config/encoders.lock.yaml", {"dinov2_vitb14": _record(entry)})
    plan = run_snakemake(work, "-n").stdout
    assert "results/features/dinov2_vitb14/phantom.parquet" in plan
    # a stale record (the entry now names another file) is refused like a missing one
    text = (work / "config/encoders.yaml").read_text().replace(
        "  hub_id: timm/vit_base_patch14_dinov2.lvd142m\n  weights_file: model.safetensors",
        "  hub_id: timm/vit_base_patch14_dinov2.lvd142m\n  weights_file: pytorch_model.bin")
    (work / "config/encoders.yaml").write_text(text)
    proc = run_snakemake(work, "-n", check=False)
    assert proc.returncode != 0 and "encoder 'dinov2_vitb14' is stale" in proc.stdout + proc.stderr
    lock = yaml.safe_load((work / "config/encoders.lock.yaml").read_text())
    assert lock["version"] == 1
