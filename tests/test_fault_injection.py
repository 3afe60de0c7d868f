"""Issue 23, "Nothing changes a result silently": each fault reproduced on generated fixtures (no downloads), with
the behaviour that replaces it."""
import numpy as np
from PIL import Image

from retinabench.pipeline import Job, run_stage
from retinabench.provenance import read_sidecar
from retinabench.schemas import read_table


# --- fault 4: images are decoded wrongly or accepted when useless ---
def test_fault4_16bit_grey_png_keeps_its_mean_in_the_image_cache(tmp_path):
    """A 16-bit grey PNG (an OCT export) of mean 12207.5/65535 is 47.5 on the 8-bit scale in the image cache, not
    clipped to near-white."""
    import pandas as pd

    from retinabench.data.image_cache import build_image_cache, open_image_cache
    arr = np.full((64, 64), 48 * 257, np.uint16)
    arr[:32] = 47 * 257
    Image.fromarray(arr).save(tmp_path / "oct16.png")
    assert Image.open(tmp_path / "oct16.png").mode == "I;16"
    manifest = pd.DataFrame({"image_id": ["oct16"], "path": ["oct16.png"]})
    build_image_cache(manifest, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", size=64, progress=False)
    cache, _ = open_image_cache(tmp_path / "c.npy", tmp_path / "c.parquet")
    assert cache[0].mean() == 47.5


def test_fault4_a_1x1_image_is_excluded_counted_and_printed(tmp_path, registries, capfd):
    """A 1x1 image named by the index is no sample: the manifest job excludes it with its reason, counts it in
    its summary and prints it; changing images.min_side takes effect without re-decoding."""
    from retinabench.data.raw_fixtures import write_fixture
    from retinabench.settings import images_settings
    entry = registries.datasets["aptos2019"]
    root = write_fixture("aptos2019", tmp_path / "raw", registries.datasets)
    Image.new("RGB", (1, 1), (90, 40, 20)).save(root / "train_images" / "000c1434d8d7.png")
    Image.new("RGB", (40, 48), (90, 40, 20)).save(root / "train_images" / "001639a390f0.png")
    d = tmp_path / "results" / "data" / "aptos2019"

    def job(images):
        return Job(rule="manifest", input={"index": [str(root / f) for f in entry["index_files"]]},
                   output={k: str(d / f"{k}.parquet") for k in ("manifest", "exclusions", "raw_files")}
                   | {"hashes": str(d / "image_hashes.parquet")},
                   params={"dataset": entry, "root": str(root), "images": images},
                   wildcards={"dataset": "aptos2019"}, threads=1)

    first = job(images_settings({}))
    run_stage("manifest", first)
    manifest = read_table(first.output["manifest"], "manifest")
    excl = read_table(first.output["exclusions"], "exclusions")
    assert "train_images/000c1434d8d7.png" not in set(manifest["path"]) and len(manifest) == 4
    small = excl[excl["reason"].str.startswith("too_small")]
    assert list(small["source"]) == ["train_images/000c1434d8d7.png"] and list(small["scope"]) == ["image"]
    assert list(small["reason"]) == ["too_small (1x1 < 32 px short side)"]
    summary = read_sidecar(first.output["manifest"])["extra"]["summary"]
    assert summary["too_small"] == {"min_side": 32, "excluded": 1}
    out, _ = capfd.readouterr()
    assert "1 image(s) under 32 px on the short side excluded" in out and "too_small (1x1 < 32 px" in out
    # a larger minimum: the 40x48 image goes too, from the cached sizes (nothing decoded again)
    second = job(images_settings({"images": {"min_side": 48}}))
    run_stage("manifest", second)
    summary = read_sidecar(second.output["manifest"])["extra"]["summary"]
    assert summary["too_small"] == {"min_side": 48, "excluded": 2} and summary["decode"]["decoded"] == 0
    excl = read_table(second.output["exclusions"], "exclusions")
    assert "too_small (40x48 < 48 px short side)" in set(excl["reason"])
    assert len(read_table(second.output["manifest"], "manifest")) == 3
