"""Saliency: IG + NoiseTunnel puts attribution where the label lives; grayscale / CLAHE; image selection; the job
runner on weights kept by a real fine-tuning run, with its verification."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torch import nn

from retinabench.data.phantom import generate_phantom
from retinabench.protocols.finetune import CheckpointError, Classifier
from retinabench.saliency import (CacheInput, clahe, integrated_gradients_nt, normalise, postprocess, read_maps,
                                  run_saliency, scale_unit, select_images, to_grayscale, write_maps)
from retinabench.settings import ConfigError, SaliencySettings

SIZE = 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# The label lives in one of two known boxes (row0, row1, col0, col1): an exudate-like patch in it means class 1.
BOXES = {"upper_left": (8, 24, 8, 24), "lower_right": (40, 56, 40, 56)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread (module scope: also for the module fixtures)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def phantom_fundus(tmp: Path, n: int) -> np.ndarray:
    """``n`` real phantom colour fundus photographs at SIZE² (uint8 HWC)."""
    meta = generate_phantom(tmp / "raw", n_patients=max(2, n // 2), seed=0, image_size=96)
    files = [tmp / "raw" / f for f in meta.loc[meta["modality"] == "cfp", "file"]]
    imgs = [np.asarray(Image.open(f).convert("RGB").resize((SIZE, SIZE), Image.Resampling.BICUBIC)) for f in files]
    return np.stack([imgs[i % len(imgs)] for i in range(n)])


def with_lesion(img: np.ndarray, box, rng) -> np.ndarray:
    """A bright yellow 6-px patch at a random place inside ``box``."""
    r0, r1, c0, c1 = box
    r, c = rng.integers(r0, r1 - 6), rng.integers(c0, c1 - 6)
    out = img.copy()
    out[r:r + 6, c:c + 6] = (250, 230, 60)
    return out


class Trunk(nn.Module):
    """A tiny CNN encoder ([B, 3, H, W] -> [B, 16]): local features, global max pool."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 5, padding=2), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveMaxPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def lesion_model(tmp_path_factory):
    """A tiny classifier trained to tell phantom fundus photos with a lesion in either box from those without."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    backgrounds = phantom_fundus(tmp_path_factory.mktemp("phantom"), 24)
    model = Classifier(Trunk(), 16, 2, frozen=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    boxes = list(BOXES.values())
    for _ in range(150):
        idx = rng.integers(0, len(backgrounds), 32)
        y = rng.integers(0, 2, 32)
        batch = np.stack([with_lesion(backgrounds[i], boxes[rng.integers(0, 2)], rng) if c else backgrounds[i]
                          for i, c in zip(idx, y)])
        x = torch.cat([normalise(b, MEAN, STD, torch.device("cpu")) for b in batch])
        loss = nn.functional.cross_entropy(model(x), torch.as_tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, backgrounds


def box_mass(gray: np.ndarray, box) -> tuple[float, float]:
    r0, r1, c0, c1 = box
    inside = gray[r0:r1, c0:c1].sum()
    return float(inside), float(gray.sum() - inside)


@pytest.mark.slow
@pytest.mark.parametrize("where", list(BOXES))
def test_attribution_mass_lies_in_the_region_that_carries_the_label(lesion_model, where):
    model, backgrounds = lesion_model
    rng = np.random.default_rng(123)  # images the model never saw (new lesion places)
    for k in range(3):
        img = with_lesion(backgrounds[(5 * k + 1) % len(backgrounds)], BOXES[where], rng)
        x = normalise(img, MEAN, STD, torch.device("cpu"))
        with torch.no_grad():
            pred = int(model(x).argmax())
        assert pred == 1, "the tiny model should have learnt the lesion"
        attr, delta = integrated_gradients_nt(model, x, pred, nt_samples=8, stdev=0.3, n_steps=16, seed=k)
        gray = to_grayscale(attr)
        inside, outside = box_mass(gray, BOXES[where])
        # The box is 6 % of the image: more mass inside it than in the other 94 % is a strong localisation.
        assert inside > outside, (where, k, inside, outside)
        other = next(b for n, b in BOXES.items() if n != where)
        assert box_mass(gray, other)[0] < inside / 4  # the empty box, where the model also looks, gets little
        assert np.isfinite(delta)


@pytest.mark.slow
def test_attribution_is_reproducible_and_follows_the_noise_seed(lesion_model):
    model, backgrounds = lesion_model
    x = normalise(with_lesion(backgrounds[0], BOXES["upper_left"], np.random.default_rng(1)), MEAN, STD,
                  torch.device("cpu"))
    kw = dict(nt_samples=4, stdev=0.3, n_steps=8)
    a1, _ = integrated_gradients_nt(model, x, 1, seed=7, **kw)
    a2, _ = integrated_gradients_nt(model, x, 1, seed=7, **kw)
    a3, _ = integrated_gradients_nt(model, x, 1, seed=8, **kw)
    assert np.array_equal(a1, a2) and not np.array_equal(a1, a3)
    assert all(p.requires_grad for p in model.parameters())  # restored after the attribution


def test_cache_input_resizes_inside_the_attributed_function(lesion_model):
    model, backgrounds = lesion_model
    net = CacheInput(model, 32)
    x = normalise(backgrounds[0], MEAN, STD, torch.device("cpu"))
    attr, _ = integrated_gradients_nt(net, x, 0, nt_samples=2, stdev=0.1, n_steps=4)
    assert attr.shape == (3, SIZE, SIZE)  # on the displayed image's grid, not the model's 32 px
    small = nn.functional.interpolate(x, size=(32, 32), mode="bicubic", align_corners=False)
    assert torch.allclose(net(x), model(small))


# -- post-processing --------------------------------------------------------------------------------------------

def test_grayscale_conventions():
    a = np.zeros((3, 4, 5), np.float32)
    a[0, 1, 1], a[1, 1, 1], a[2, 2, 2] = 2.0, -3.0, 4.0
    g = to_grayscale(a)
    assert g.shape == (4, 5) and g[1, 1] == 1.0 and g[2, 2] == 4.0  # |sum over channels|
    assert to_grayscale(a, "positive")[1, 1] == 0.0
    assert np.array_equal(to_grayscale(np.moveaxis(a, 0, -1)), g)  # HWC too
    with pytest.raises(ValueError, match="sign"):
        to_grayscale(a, "negative")
    with pytest.raises(ValueError, match="attribution"):
        to_grayscale(np.zeros((4, 5)))


def test_scale_unit_saturates_above_the_percentile():
    g = np.r_[np.linspace(0, 1, 99), 100.0].reshape(10, 10)
    s = scale_unit(g, 99.0)
    assert s.min() == 0.0 and s.max() == 1.0 and s.dtype == np.float32
    assert s[0, 1] > 0.005  # the outlier does not crush the rest to ~0
    assert not scale_unit(np.zeros((3, 3))).any()
    with pytest.raises(ValueError, match="non-negative"):
        scale_unit(-g)


@pytest.mark.parametrize("shape", [(224, 224), (64, 96)])
def test_clahe_output_range_and_shape(shape):
    rng = np.random.default_rng(0)
    low_contrast = 0.4 + 0.1 * rng.random(shape)
    out = clahe(low_contrast)
    assert out.shape == shape and out.dtype == np.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert out.std() > 2 * low_contrast.std()  # equalisation stretches a low-contrast map
    blob = np.zeros(shape)
    blob[20:40, 20:40] = 1.0
    eq = clahe(blob)
    assert eq[30, 30] == pytest.approx(1.0) and eq[0, 0] < 0.01  # zeros stay dark
    assert not clahe(np.full(shape, 0.3)).any()  # constant map: all zero, not CLAHE's degenerate all-one
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        clahe(low_contrast * 3)
    with pytest.raises(ValueError, match="2-D"):
        clahe(np.zeros((2, 3, 4)))


def test_postprocess_follows_the_settings():
    s = SaliencySettings()
    a = np.random.default_rng(0).normal(size=(3, 32, 32))
    gray, eq = postprocess(a, s)
    assert gray.shape == eq.shape == (32, 32) and 0 <= eq.min() and eq.max() <= 1


def test_settings_defaults_are_the_papers_and_bad_keys_fail():
    s = SaliencySettings.from_config({})
    assert (s.nt_samples, s.stdev, s.n_steps, s.nt_type) == (50, 0.3, 50, "smoothgrad")
    assert s.clahe.plain() == {"clip_limit": 0.01, "kernel_size": None, "nbins": 256}
    assert SaliencySettings.from_config({"saliency": {"clahe": {"clip_limit": 0.02}}}).clahe.nbins == 256
    with pytest.raises(ConfigError, match="saliency.samples: unknown key; did you mean 'saliency.nt_samples'"):
        SaliencySettings.from_config({"saliency": {"samples": 3}})
    with pytest.raises(ConfigError, match="saliency.clahe.clip: unknown key"):
        SaliencySettings.from_config({"saliency": {"clahe": {"clip": 3}}})
    with pytest.raises(ConfigError, match="saliency.baseline: Input should be 'zeros' or 'black'"):
        SaliencySettings.from_config({"saliency": {"baseline": "blur"}})


# -- image selection --------------------------------------------------------------------------------------------

def split_table(n=30, classes=3):
    ids = [f"img{k:03d}" for k in range(n)]
    y = np.arange(n) % classes
    part = np.where(np.arange(n) < n // 2, "train", "test")
    return pd.DataFrame({"image_id": ids, "y": y, "split": part, "label": [f"c{v}" for v in y]})


def test_selection_is_deterministic_per_class_and_order_free():
    split = split_table()
    sel, missing = select_images(split, ["c0", "c1", "c2"], seed=0, per_class=1)
    assert list(sel["class_index"]) == [0, 1, 2] and not missing
    assert (split.set_index("image_id").loc[sel["image_id"], "split"] == "test").all()
    shuffled, _ = select_images(split.sample(frac=1, random_state=3), ["c0", "c1", "c2"], seed=0, per_class=1)
    assert shuffled.equals(sel)
    other, _ = select_images(split, ["c0", "c1", "c2"], seed=1, per_class=1)
    assert not other["image_id"].equals(sel["image_id"])  # the seed is the only knob
    two, _ = select_images(split, ["c0", "c1", "c2"], seed=0, per_class=2)
    assert len(two) == 6 and set(sel["image_id"]) <= set(two["image_id"])
    sel4, missing4 = select_images(split, ["c0", "c1", "c2", "c3"], seed=0, per_class=1)
    assert missing4 == ["c3"] and len(sel4) == 3


# -- the job runner on weights a fine-tuning run kept --------------------------------------------------------------

CNN = {"name": "resnet_micro", "source": "timm", "architecture": "test_resnet", "init": "random", "input_size": 32,
       "normalization": "imagenet", "pooling": "avg", "size_class": "tiny"}
TASK = {"name": "t", "dataset": "d", "classes": ["a", "b"], "ordinal": False}


@pytest.fixture(scope="module")
def kept_weights(tmp_path_factory):
    """Weights files of both fine-tuning protocols from run_finetune(keep_weights=True), on a tiny image cache."""
    from retinabench.protocols.finetune import TrainConfig, run_finetune, save_weights
    tmp = tmp_path_factory.mktemp("kept")
    rng = np.random.default_rng(0)
    n, size = 48, 48
    y = (np.arange(n) % 2).astype(int)
    imgs = rng.integers(0, 80, (n, size, size, 3), dtype=np.uint8)
    imgs[y == 1, 8:20, 8:20, 0] = 230
    arr = tmp / "images.npy"
    np.save(arr, imgs)
    ids = [f"img{k:03d}" for k in range(n)]
    index = pd.DataFrame({"image_id": ids, "row": np.arange(n, dtype="int64")})
    part = np.array(["train"] * 24 + ["val"] * 12 + ["test"] * 12)
    split = pd.DataFrame({"image_id": ids, "patient_id": ids, "dataset": "d", "task": "t",
                          "label": np.array(["a", "b"])[y], "y": y, "split": part, "balanced": True})
    cfg = TrainConfig(epochs=2, steps_per_epoch=2, batch_size=8, eval_batch_size=32, lr_encoder=1e-3,
                      lr_classifier=1e-2, augment={"enabled": False})
    weights = {}
    for protocol in ("finetune", "linear_aug"):
        out = run_finetune(arr, index, split, TASK, CNN, protocol=protocol, seed=0, regimes=["u-u"], cfg=cfg,
                           log=lambda m: None, keep_weights=True)
        assert set(out.weights["regimes"]) == {"u"}
        weights[protocol] = str(save_weights(tmp / f"{protocol}.pt", out.weights, protocol=protocol,
                                             encoder_entry=CNN, task=TASK, seed=0))
    return arr, index, split, weights


def test_run_saliency_on_kept_weights(kept_weights, tmp_path):
    arr, index, split, weights = kept_weights
    s = SaliencySettings.from_config({"saliency": {"nt_samples": 2, "n_steps": 4, "internal_batch_size": 8}})
    table, maps, missing = run_saliency(arr, index, split, TASK, CNN, weights, s, log=lambda m: None)
    assert not missing and len(table) == 4  # 2 protocols x 2 classes
    assert set(table["protocol"]) == {"finetune", "linear_aug"}
    sel, _ = select_images(split, TASK["classes"], seed=s.selection_seed, per_class=s.images_per_class)
    for _, g in table.groupby("protocol"):
        assert list(g["image_id"]) == list(sel["image_id"])  # the same images for every protocol
    assert table["weights_sha256"].str.len().eq(64).all() and table["ig_delta"].notna().all()
    assert maps["clahe"].shape == (2, 2, 48, 48) and maps["attribution"].shape == (2, 2, 3, 48, 48)
    assert maps["image"].dtype == np.uint8 and 0 <= maps["clahe"].min() and maps["clahe"].max() <= 1
    path = write_maps(tmp_path / "m.npz", maps)
    back = read_maps(path)
    assert all(np.array_equal(back[k], maps[k]) for k in ("clahe", "image", "image_ids", "protocols"))
    again, maps2, _ = run_saliency(arr, index, split, TASK, CNN, weights, s, log=lambda m: None)
    assert np.array_equal(maps2["attribution"], maps["attribution"])  # deterministic on CPU


def test_loading_kept_weights_is_verified(kept_weights, tmp_path):
    import shutil
    from retinabench.protocols.finetune import load_finetuned
    _, _, _, weights = kept_weights
    model, enc, info = load_finetuned(weights["linear_aug"], CNN, TASK, protocol="linear_aug")
    assert info["sha256"] and not model.frozen and not model.training
    with pytest.raises(CheckpointError, match="protocol is 'finetune', expected 'linear_aug'"):
        load_finetuned(weights["finetune"], CNN, TASK, protocol="linear_aug")
    with pytest.raises(CheckpointError, match="classes"):
        load_finetuned(weights["finetune"], CNN, {**TASK, "classes": ["b", "a"]}, protocol="finetune")
    with pytest.raises(CheckpointError, match="entry_digest"):
        load_finetuned(weights["finetune"], {**CNN, "input_size": 48}, TASK, protocol="finetune")
    with pytest.raises(CheckpointError, match="training regime 'b'"):
        load_finetuned(weights["finetune"], CNN, TASK, protocol="finetune", train_regime="b")
    bad = tmp_path / "bad.pt"
    shutil.copy(weights["finetune"], bad)
    shutil.copy(weights["finetune"] + ".sha256", str(bad) + ".sha256")
    with open(bad, "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x00\x01")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_finetuned(bad, CNN, TASK, protocol="finetune")
    Path(str(bad) + ".sha256").unlink()
    with pytest.raises(CheckpointError, match="no sha256 sidecar"):
        load_finetuned(bad, CNN, TASK, protocol="finetune")
