"""Fine-tuning / augmented linear probe trainer on CPU with micro random-init models and tiny image caches."""
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader

from retinabench.data.image_dataset import (CachedImageDataset, SequentialBatchSampler, StreamBatchSampler,
                                            worker_init)
from retinabench.protocols.augment import Augment, augment_batch, build_train_transform
from retinabench.protocols.common import warmup_cosine
from retinabench.protocols.finetune import CheckpointError, DivergedError, TrainConfig, Trainer, run_finetune
from retinabench.protocols.finetune_checkpoints import load_checkpoint
from retinabench.protocols.finetune_train import fit
from retinabench.schemas import conform
from retinabench.settings import ConfigError, FinetuneSettings

REPO = Path(__file__).resolve().parents[2]
TASK = {"name": "t", "dataset": "d", "classes": ["a", "b"], "ordinal": False}
VIT = {"name": "vit_micro", "source": "timm", "architecture": "test_vit", "init": "random", "input_size": 32,
       "normalization": "imagenet", "pooling": "cls", "size_class": "tiny"}
CNN = {"name": "resnet_micro", "source": "timm", "architecture": "test_resnet", "init": "random", "input_size": 32,
       "normalization": "imagenet", "pooling": "avg", "size_class": "tiny"}
CFG = TrainConfig(epochs=4, steps_per_epoch=3, batch_size=8, eval_batch_size=32, lr_encoder=1e-3,
                  lr_classifier=1e-2, checkpoint_every=2)



def make_data(tmp: Path, n: int = 96, size: int = 48, seed: int = 0):
    """Image cache + index + split: class 1 has a bright square (learnable), patient = image."""
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 3 == 0).astype(int)  # 1/3 positives: unbalanced, so u and b regimes differ
    imgs = rng.integers(0, 80, (n, size, size, 3), dtype=np.uint8)
    imgs[y == 1, size // 4: size // 2, size // 4: size // 2, 0] = 230
    arr = tmp / "images.npy"
    np.save(arr, imgs)
    ids = [f"img{k:03d}" for k in range(n)]
    index = pd.DataFrame({"image_id": ids, "row": np.arange(n, dtype="int64")})
    part = np.array(["train", "val", "test"])[np.r_[np.zeros(n // 2, int), np.ones(n // 4, int),
                                                    np.full(n - n // 2 - n // 4, 2)]]
    split = pd.DataFrame({"image_id": ids, "patient_id": ids, "dataset": "d", "task": "t",
                          "label": np.array(["a", "b"])[y], "y": y, "split": part, "balanced": False})
    for p in ("train", "val", "test"):
        for c in (0, 1):
            rows = split.index[(split["split"] == p) & (split["y"] == c)]
            k = min(((split["split"] == p) & (split["y"] == cc)).sum() for cc in (0, 1))
            split.loc[rows[:k], "balanced"] = True
    return arr, index, split


@pytest.fixture
def data(tmp_path):
    return make_data(tmp_path)


def datasets(arr, split, trainer):
    tr = split[split["split"] == "train"]
    va = split[split["split"] == "val"]
    rows = {i: k for k, i in enumerate(split["image_id"])}
    return (CachedImageDataset(arr, tr["image_id"].map(rows).to_numpy(), tr["y"].to_numpy(),
                               trainer.loader_transform()),
            CachedImageDataset(arr, va["image_id"].map(rows).to_numpy(), va["y"].to_numpy()))


def train(entry, data, *, protocol="finetune", seed=0, cfg=CFG, ckpt=None, hook=None):
    from retinabench.models import build_encoder
    arr, _, split = data
    trainer = Trainer(build_encoder(entry), 2, protocol=protocol, seed=seed, cfg=cfg,
                      class_weight=np.array([0.4, 0.6]))
    tr, va = datasets(arr, split, trainer)
    res = fit(trainer, tr, va, ckpt_dir=ckpt, fingerprint="fp", on_epoch_end=hook, log=lambda m: None)
    return trainer, res


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- augmentation -------------------------------------------------------------------------------------------------

def smooth_images(n=6, size=64, seed=0):
    base = torch.from_numpy(np.random.default_rng(seed).integers(0, 255, (n, 3, 12, 12), dtype=np.uint8)).float()
    return torch.nn.functional.interpolate(base, size=(size, size), mode="bilinear").round().to(torch.uint8)


def test_augment_is_a_function_of_the_sample_seed():
    img = smooth_images(1)[0]
    aug = Augment({})
    a, b, c = aug(img, 7), aug(img, 7), aug(img, 8)
    assert a.dtype == torch.uint8 and a.shape == img.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert build_train_transform({"enabled": False}) is None
    with pytest.raises(ConfigError, match="finetune.augment.sclae: unknown key; did you mean .finetune.augment.scale."):
        Augment({"sclae": [0.8, 1.2]})


def test_area_scale_above_one_zooms_out_and_below_one_zooms_in():
    img = torch.full((3, 64, 64), 200, dtype=torch.uint8)
    fixed = {"rotation": 0.0, "hflip": 0, "vflip": 0, "brightness": 0, "contrast": 0, "saturation": 0, "hue": 0}
    out = Augment({**fixed, "scale": [1.2, 1.2]})(img, 0)  # crop 20 % larger than the image: black border
    assert out[:, 0, :].float().mean() < 100 and out[:, 32, 32].float().mean() == 200
    out = Augment({**fixed, "scale": [0.8, 0.8]})(img, 0)  # crop inside the image: no border at all
    assert (out == 200).all()


def test_batched_device_augmentation_matches_the_per_sample_reference():
    imgs = smooth_images(8)
    seeds = list(range(100, 108))
    ref = torch.stack([Augment({})(imgs[i], s) for i, s in enumerate(seeds)]).float() / 255
    out = augment_batch(imgs.float() / 255, seeds, {})
    diff = (out - ref).abs() * 255
    # uint8 rounding after every reference op vs float throughout: a few grey levels at most.
    assert diff.mean() < 2.5 and diff.max() < 12
    geo = {"brightness": 0, "contrast": 0, "saturation": 0, "hue": 0}
    ref = torch.stack([Augment(geo)(imgs[i], s) for i, s in enumerate(seeds)]).float() / 255
    assert ((augment_batch(imgs.float() / 255, seeds, geo) - ref).abs() * 255).max() <= 0.51  # same warp


# -- data order ---------------------------------------------------------------------------------------------------

def test_stream_sampler_is_a_pure_function_of_the_step():
    full = list(StreamBatchSampler(10, 4, seed=3, start_step=0, end_step=8))
    assert list(StreamBatchSampler(10, 4, seed=3, start_step=5, end_step=8)) == full[5:]
    flat = [i for b in full for i, _ in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))  # each pass: all once
    seeds = [s for b in full for _, s in b]
    assert len(set(seeds)) == len(seeds)
    assert full != list(StreamBatchSampler(10, 4, seed=4, start_step=0, end_step=8))
    small = list(StreamBatchSampler(3, 8, seed=0, start_step=0, end_step=1))[0]  # batch > dataset: passes chain
    assert len(small) == 8 and set(i for i, _ in small) == {0, 1, 2}


def test_loader_workers_give_the_same_batches(tmp_path):
    arr, _, _ = make_data(tmp_path, n=24)
    ds = CachedImageDataset(arr, np.arange(24), np.zeros(24), Augment({}))
    batches = []
    for workers in (0, 2):
        dl = DataLoader(ds, batch_sampler=StreamBatchSampler(24, 6, 1, 0, 6), num_workers=workers,
                        worker_init_fn=worker_init if workers else None, generator=torch.Generator().manual_seed(0))
        batches.append([x for x, _, _ in dl])
    assert all(torch.equal(a, b) for a, b in zip(*batches))


# -- training -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", [VIT, CNN], ids=["vit", "cnn"])
def test_training_is_deterministic_per_seed(entry, data):
    t1, r1 = train(entry, data, seed=0)
    t2, r2 = train(entry, data, seed=0)
    assert r1.log == r2.log and states_equal(t1.trainable_state(), t2.trainable_state())
    t3, r3 = train(entry, data, seed=1)
    assert r3.log != r1.log


def test_training_with_loader_workers_equals_training_without(data):
    t0, r0 = train(VIT, data, cfg=CFG.model_copy(update=dict(epochs=2)))
    t2, r2 = train(VIT, data, cfg=CFG.model_copy(update=dict(epochs=2, num_workers=2)))
    assert r2.compute["num_workers"] == 2
    assert r0.log == r2.log and states_equal(t0.trainable_state(), t2.trainable_state())


def test_schedule_warmup_then_cosine_on_both_groups(data):
    cfg = CFG.model_copy(update=dict(epochs=10, steps_per_epoch=2, warmup_frac=0.2))
    trainer, res = train(VIT, data, cfg=cfg)
    f = warmup_cosine(cfg.total_steps, cfg.warmup_frac)
    lrs = [r["lr"] for r in res.log]
    np.testing.assert_allclose(lrs, [cfg.lr_classifier * f(r["step"]) for r in res.log], rtol=1e-12)
    # 20 steps, warm-up 4: 3/4 of the peak after epoch 0 (step 2), the peak after epoch 1 (step 4), then cosine.
    assert lrs[0] == pytest.approx(0.75 * cfg.lr_classifier) and lrs[1] == pytest.approx(cfg.lr_classifier)
    assert all(b < a for a, b in zip(lrs[1:], lrs[2:])) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    enc, head = trainer.optimizer.param_groups
    assert (enc["name"], head["name"]) == ("encoder", "classifier")
    assert enc["initial_lr"] == cfg.lr_encoder and head["initial_lr"] == cfg.lr_classifier
    first = warmup_cosine(cfg.total_steps, cfg.warmup_frac)(0)
    assert first == pytest.approx(1 / 4)  # linear warm-up over the first 10 % (here 20 %) of steps


def test_returned_weights_are_the_best_validation_epoch(data):
    cfg = CFG.model_copy(update=dict(epochs=6, lr_encoder=3e-3, lr_classifier=3e-2))
    trainer, res = train(CNN, data, cfg=cfg)
    losses = [r["val_loss"] for r in res.log]
    assert res.best_epoch == int(np.argmin(losses)) and res.best_val_loss == min(losses)
    running = np.minimum.accumulate(losses)
    assert [r["best"] for r in res.log] == [i == 0 or losses[i] < running[i - 1] for i in range(len(losses))]
    _, va = datasets(data[0], data[2], trainer)
    val_loader = DataLoader(va, batch_sampler=SequentialBatchSampler(len(va), 7))
    assert trainer.loss_of(*trainer.logits(val_loader)) == pytest.approx(res.best_val_loss, rel=1e-6)


def test_linear_aug_keeps_the_encoder_frozen(data):
    from retinabench.models import build_encoder
    before = {k: v.clone() for k, v in build_encoder(CNN).module.state_dict().items()}
    trainer, res = train(CNN, data, protocol="linear_aug")
    after = trainer.model.encoder.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and BatchNorm statistics
    assert res.compute["n_trainable"] == 2 * 96 + 2  # test_resnet: 96-d pooled features -> 2 classes
    assert len(trainer.optimizer.param_groups) == 1


def test_resume_after_an_interruption_equals_an_uninterrupted_run(data, tmp_path):
    ref, ref_res = train(VIT, data, ckpt=tmp_path / "a")

    def die(epoch):
        if epoch == 2:  # checkpoint at 2 epochs done; epoch 2 (the third) is lost and must be redone
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(VIT, data, ckpt=tmp_path / "b", hook=die)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["epoch00002.pt", "epoch00002.pt.sha256"]
    resumed, res = train(VIT, data, ckpt=tmp_path / "b")
    assert res.compute["resumed_from_epoch"] == 2
    assert res.log == ref_res.log and res.best_epoch == ref_res.best_epoch
    assert states_equal(resumed.trainable_state(), ref.trainable_state())
    assert states_equal(resumed.optimizer.state_dict()["state"][0], ref.optimizer.state_dict()["state"][0])


def test_checkpoint_integrity_and_staleness(data, tmp_path):
    train(VIT, data, ckpt=tmp_path)
    ckpt = tmp_path / "epoch00004.pt"
    assert load_checkpoint(tmp_path, "fp")["epoch"] == 4
    raw = bytearray(ckpt.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    ckpt.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt: sha256"):
        load_checkpoint(tmp_path, "fp")
    ckpt.with_name(ckpt.name + ".sha256").unlink()  # a write interrupted before its sidecar: ignored
    assert load_checkpoint(tmp_path, "fp", log=lambda m: None) is None
    train(VIT, data, ckpt=tmp_path / "c")
    assert load_checkpoint(tmp_path / "c", "other settings", log=lambda m: None) is None  # stale: start over
    assert not (tmp_path / "c").exists()


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    from test_finetune import VIT, CFG, TASK, make_data
    from retinabench.protocols.finetune import run_finetune
    from pathlib import Path
    torch.set_num_threads(1)
    arr, index, split = make_data(Path({tmp!r}))
    def hook(regime, epoch):
        if epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    run_finetune(arr, index, split, TASK, VIT, protocol="finetune", seed=0, regimes=["u-u"], cfg=CFG,
                 ckpt_dir={ckpt!r}, on_epoch_end=hook, log=lambda m: None)
""")


@pytest.mark.slow
def test_sigkilled_job_resumes_to_the_same_predictions(tmp_path):
    arr, index, split = make_data(tmp_path)
    kw = dict(protocol="finetune", seed=0, regimes=["u-u"], cfg=CFG, log=lambda m: None)
    ref = run_finetune(arr, index, split, TASK, VIT, ckpt_dir=tmp_path / "ref", **kw)
    script = KILL_SCRIPT.format(tests=str(Path(__file__).parent), tmp=str(tmp_path), ckpt=str(tmp_path / "ck"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert (tmp_path / "ck" / "u" / "epoch00002.pt.sha256").is_file()
    out = run_finetune(arr, index, split, TASK, VIT, ckpt_dir=tmp_path / "ck", **kw)
    assert out.compute["resumed_from_epoch"].tolist() == [2]
    pd.testing.assert_frame_equal(out.predictions, ref.predictions, check_exact=True)
    pd.testing.assert_frame_equal(out.log, ref.log, check_exact=True)


def test_run_finetune_outputs_follow_the_schemas(data):
    from retinabench.metrics.classification import metrics_table
    arr, index, split = data
    out = run_finetune(arr, index, split, TASK, CNN, protocol="linear_aug", seed=3, regimes=["u-u", "u-b", "b-b"],
                       cfg=CFG.model_copy(update=dict(epochs=2)), log=lambda m: None)
    conform(out.predictions, "predictions")
    conform(out.log, "training_log")
    p = out.predictions
    assert set(p["protocol"]) == {"linear_aug"} and set(p["seed"]) == {3}
    assert set(zip(p["regime"], p["split"])) == {(r, s) for r in ("u-u", "u-b", "b-b") for s in ("val", "test")}
    n_test_bal = int((split["balanced"] & (split["split"] == "test")).sum())
    assert (p[(p["regime"] == "u-b") & (p["split"] == "test")].shape[0]) == n_test_bal
    assert (p[(p["regime"] == "u-u") & (p["split"] == "test")].shape[0]) == int((split["split"] == "test").sum())
    assert list(out.compute["train_regime"]) == ["b", "u"] and set(out.log["train_regime"]) == {"b", "u"}
    c = out.compute.iloc[0]
    assert c["peak_mem_mb"] > 0 and c["seconds_per_step"] > 0 and c["peak_mem_kind"] == "process_max_rss"
    m = metrics_table(p, {"t": TASK})
    assert set(m["metric"]) >= {"accuracy", "auroc"}


@pytest.mark.parametrize("nan_from_step", [7, 1])
def test_a_diverging_run_stops_and_keeps_its_best_epoch(data, nan_from_step):
    from retinabench.models import build_encoder
    arr, _, split = data
    trainer = Trainer(build_encoder(VIT), 2, protocol="finetune", seed=0, cfg=CFG.model_copy(update=dict(epochs=6)))
    step = trainer.train_step

    def blow_up(*batch):  # what a far too high learning rate does: the weights go non-finite
        loss = step(*batch)
        if trainer.step >= nan_from_step:
            with torch.no_grad():
                trainer.model.head.weight.fill_(float("nan"))
        return loss

    trainer.train_step = blow_up
    tr, va = datasets(arr, split, trainer)
    if nan_from_step == 1:  # non-finite before any validation: nothing to keep
        with pytest.raises(DivergedError, match="no epoch produced a finite validation loss"):
            fit(trainer, tr, va, log=lambda m: None)
        return
    res = fit(trainer, tr, va, log=lambda m: None)
    assert res.compute["diverged"] and len(res.log) == 3  # epochs 0, 1 fine; NaN in epoch 2 -> stop
    assert res.best_epoch in (0, 1) and torch.isfinite(trainer.model.head.weight).all()


def test_settings_reject_unknown_keys():
    assert FinetuneSettings.from_config({}).epochs == 100
    with pytest.raises(ConfigError, match="finetune.epoch: unknown key; did you mean 'finetune.epochs'"):
        FinetuneSettings.from_config({"finetune": {"epoch": 3}})
    # the vision fine-tuning layer has no LoRA protocol; MLLM LoRA SFT is the `lora:` stage (tests/pipeline/test_plan_lora.py)
    with pytest.raises(ConfigError, match=r"finetune.protocols.*its own stage: config `lora:`"):
        FinetuneSettings.from_config({"finetune": {"protocols": ["mllm_lora"]}})


def test_stage_writes_outputs_sidecars_and_records_the_chosen_lr(data, tmp_path):
    import json
    from retinabench.provenance import read_sidecar
    from retinabench.schemas import write_table
    from retinabench.pipeline import Job, run_stage
    arr, index, split = data
    write_table(index, tmp_path / "index.parquet", "image_index")
    write_table(split, tmp_path / "split.parquet", "split")
    chosen = tmp_path / "chosen.json"
    chosen.write_text(json.dumps({"encoder": "vit_micro", "lr_classifier": 0.01, "lr_encoder": 0.001}))
    out = {k: str(tmp_path / "out" / f"{k}.parquet") for k in ("predictions", "log", "metrics", "compute")}
    settings = FinetuneSettings(epochs=2, steps_per_epoch=2, batch_size=8).plain(
        exclude={*FinetuneSettings.NOT_RESULT, "lr_encoder", "lr_classifier"})
    job = Job(rule="finetune", input={"array": str(arr), "index": str(tmp_path / "index.parquet"),
                                      "split": str(tmp_path / "split.parquet"), "lr": str(chosen)},
              output=out, params={"finetune": settings, "task": TASK, "encoder": VIT, "regimes": ["u-u"],
                                  "checkpoints": str(tmp_path / "ck")},
              wildcards={"protocol": "finetune", "encoder": "vit_micro", "task": "t", "seed": "0"}, threads=1)
    run_stage("finetune", job)
    for path in out.values():
        assert Path(path).is_file() and Path(path + ".prov.json").is_file()
    side = read_sidecar(out["predictions"])
    assert str(chosen) in [i["path"] for i in side["inputs"]]
    assert side["config"]["learning_rates"] == {"lr_encoder": 0.001, "lr_classifier": 0.01}
    compute = pd.read_parquet(out["compute"])
    assert compute["lr_encoder"].tolist() == [0.001] and compute["timed_steps"].tolist() == [4]
    assert not (tmp_path / "ck").exists()  # keep_checkpoints false: removed once the outputs exist
    chosen.write_text(json.dumps({"encoder": "other", "lr_classifier": 0.01, "lr_encoder": 0.001}))
    with pytest.raises(ValueError, match="learning rates of 'other'"):
        run_stage("finetune", job)


# -- a real fine-tune -----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.shared
def test_real_finetune_on_tvhl_oct_dme_learns(tvhl_root, tmp_path):
    """EfficientNet-Lite0 (ImageNet weights) fine-tuned for a few dozen steps on a small TVHL OCT subsample."""
    import yaml
    from retinabench.data.image_cache import load_image
    table = pd.read_csv(tvhl_root / "OCT.csv")
    table = table[table["DME"].isin([0, 1])]
    paths = {p.stem: p for p in (tvhl_root / "OCT").rglob("*.jpg")}
    table = table[table["Name"].isin(list(paths))]
    rng = np.random.default_rng(0)
    pick = pd.concat([table[table["DME"] == c].sample(50, random_state=0) for c in (0, 1)]).reset_index(drop=True)
    size = 96
    imgs = np.stack([load_image(paths[n], size, "squash") for n in pick["Name"]])
    np.save(tmp_path / "a.npy", imgs)
    ids = pick["Name"].tolist()
    index = pd.DataFrame({"image_id": ids, "row": np.arange(len(ids))})
    patient = pick["Name"].str.split("_").str[0]
    # Patient-disjoint 60/20/20 split of the 80 images.
    pats = rng.permutation(patient.unique())
    where = {p: ("train" if k < 0.6 * len(pats) else "val" if k < 0.8 * len(pats) else "test")
             for k, p in enumerate(pats)}
    split = pd.DataFrame({"image_id": ids, "patient_id": patient, "dataset": "tvhl", "task": "tvhl_oct_dme",
                          "label": np.where(pick["DME"] == 1, "yes", "no"), "y": pick["DME"].astype(int),
                          "split": patient.map(where), "balanced": True})
    entries = yaml.safe_load((REPO / "config/encoders.yaml").read_text())
    entry = {"name": "efficientnet_lite0_in1k", **entries["efficientnet_lite0_in1k"], "input_size": size}
    task = {"name": "tvhl_oct_dme", "dataset": "tvhl", "classes": ["no", "yes"], "ordinal": False}
    cfg = TrainConfig(epochs=6, steps_per_epoch=5, batch_size=16, eval_batch_size=64, lr_encoder=1e-4,
                      lr_classifier=1e-2, warmup_frac=0.1)
    out = run_finetune(tmp_path / "a.npy", index, split, task, entry, protocol="finetune", seed=0,
                       regimes=["u-u"], cfg=cfg, log=lambda m: None)
    log = out.log
    val = out.predictions[out.predictions["split"] == "val"]
    acc = (val["y_true"] == val["y_pred"]).mean()
    majority = max(val["y_true"].mean(), 1 - val["y_true"].mean())
    assert log["train_loss"].iloc[-2:].mean() < log["train_loss"].iloc[0], log
    assert log["val_loss"].min() < log["val_loss"].iloc[0] and acc > majority, (acc, majority, log)
