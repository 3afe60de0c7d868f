"""The two crops of finetune.augment: the geometric zoom (config/config.yaml) and the OcularBench authors'
torchvision pipeline (`random_resized_crop`, `crop_last`: config/ocularbench.yaml), on the per-image loader path
and the batched device path. The zoom's own tests are in test_finetune.py."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import ks_2samp
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from retinabench.cli import _load_config
from retinabench.data.image_cache import load_image
from retinabench.protocols import augment as A
from retinabench.protocols.augment import Augment, augment_batch, crop_box, draw_params, settings_of
from retinabench.settings import ConfigError

REPO = Path(__file__).resolve().parents[2]
STILL = {"rotation": 0.0, "hflip": 0, "vflip": 0, "brightness": 0, "contrast": 0, "saturation": 0, "hue": 0}
RRC = {"crop": "random_resized_crop", "order": "crop_last"}
AUTHORS = {**RRC, "scale": [0.8, 1.2], "ratio": [0.75, 4 / 3], "rotation": 5.0, "hflip": 0.5, "vflip": 0.5,
           "sharpness": 0.2, "sharpness_p": 0.5, "brightness": 0.2, "contrast": 0.2, "saturation": 0.1, "hue": 0.1}


def smooth_images(n=6, size=64, seed=0):
    base = torch.from_numpy(np.random.default_rng(seed).integers(0, 255, (n, 3, 12, 12), dtype=np.uint8)).float()
    return torch.nn.functional.interpolate(base, size=(size, size), mode="bilinear").round().to(torch.uint8)


def test_ocularbench_runs_the_authors_pipeline_and_config_keeps_the_zoom(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    ob = _load_config(["config/ocularbench.yaml"])
    aug = ob["finetune"]["augment"]
    assert {k: aug[k] for k in AUTHORS} == AUTHORS and aug["enabled"]
    # the authors resize to the input size bicubically first: the image cache squashes with PIL's bicubic
    assert ob["image_cache"]["resize"] == "squash"
    raw = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    Image.fromarray(raw).save(tmp_path / "x.png")
    want = np.asarray(Image.fromarray(raw).resize((32, 32), Image.Resampling.BICUBIC))
    assert np.array_equal(load_image(tmp_path / "x.png", 32, "squash"), want)
    # RandomRotation's and RandomResizedCrop's default interpolations (the authors pass none)
    assert (A.ROTATE_INTERPOLATION, A.CROP_INTERPOLATION) == (InterpolationMode.NEAREST, InterpolationMode.BILINEAR)
    default = _load_config([])["finetune"]["augment"]
    assert (default["crop"], default["order"], default["sharpness"]) == ("zoom", "geometry_first", 1.0)


def test_crop_options_are_validated():
    with pytest.raises(ConfigError, match="finetune.augment.ratio .* needs crop: random_resized_crop"):
        Augment({"ratio": [0.5, 2.0]})
    with pytest.raises(ConfigError, match=r"finetune.augment.ratio must be \[min, max\]"):
        Augment({**RRC, "ratio": [2.0, 0.5]})
    with pytest.raises(ConfigError, match="finetune.augment.crop"):
        Augment({"crop": "random_crop"})


def test_random_resized_crop_is_torchvisions_transform_seeded_per_sample():
    img = smooth_images(1, size=48)[0]
    aug = Augment({**RRC, **STILL})
    for seed in range(20):
        torch.default_generator.manual_seed(draw_params(aug.a, seed)["crop_seed"])
        want = v2.RandomResizedCrop((48, 48), scale=[0.8, 1.2])(img)  # the authors' call, defaults otherwise
        assert torch.equal(aug(img, seed), want)


def test_crop_boxes_follow_torchvisions_distribution_and_never_exceed_the_image():
    a = settings_of(AUTHORS)
    h = w = 224
    ours = np.array([crop_box(a, draw_params(a, s), h, w) for s in range(2000)], dtype=float)
    state = torch.get_rng_state()
    torch.manual_seed(12345)
    ref = np.array([v2.RandomResizedCrop.get_params(torch.empty(3, h, w), [0.8, 1.2], [0.75, 4 / 3])
                    for _ in range(2000)], dtype=float)
    torch.set_rng_state(state)
    for boxes in (ours, ref):
        top, left, bh, bw = boxes.T
        assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    area = lambda b: b[:, 2] * b[:, 3] / (h * w)  # noqa: E731
    aspect = lambda b: np.log(b[:, 3] / b[:, 2])  # noqa: E731
    # in effect the area scale is 0.8-1.0 (a larger crop is retried), the aspect 3/4-4/3 (up to pixel rounding)
    assert 0.79 < area(ours).min() and area(ours).max() <= 1.0 and (area(ours) > 0.99).mean() > 0.01
    assert np.abs(aspect(ours)).max() <= np.log(4 / 3) + 0.01
    assert ks_2samp(area(ours), area(ref)).pvalue > 0.01 and ks_2samp(aspect(ours), aspect(ref)).pvalue > 0.01
    # our stream is not theirs (the per-sample seeds), yet the same distribution
    assert not np.array_equal(ours, ref)


def test_no_crop_fits_falls_back_to_torchvisions_centre_crop():
    a = settings_of({**RRC, "scale": [1.1, 1.2]})
    assert {crop_box(a, draw_params(a, s), 64, 64) for s in range(20)} == {(0, 0, 64, 64)}
    # a wide image (ratio 3 > 4/3): full height, width at the largest ratio, centred
    assert {crop_box(a, draw_params(a, s), 60, 180) for s in range(20)} == {(0, 50, 60, 80)}


def test_crop_box_leaves_the_global_generator_alone_and_is_a_function_of_the_seed():
    img = smooth_images(1)[0]
    aug = Augment(AUTHORS)
    state = torch.get_rng_state()
    a, b, c = aug(img, 7), aug(img, 7), aug(img, 8)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.dtype == torch.uint8 and a.shape == img.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    x = smooth_images(4).float() / 255
    assert torch.equal(augment_batch(x.clone(), [1, 2, 3, 4], AUTHORS), augment_batch(x.clone(), [1, 2, 3, 4], AUTHORS))


def test_sharpness_is_randomadjustsharpness():
    img = smooth_images(1)[0]
    ident = {**RRC, **STILL, "scale": [1.0, 1.0], "ratio": [1.0, 1.0], "sharpness": 0.2}
    assert torch.equal(Augment({**ident, "sharpness_p": 0.0})(img, 3), img)  # the whole-image crop: identity
    assert torch.equal(Augment({**ident, "sharpness_p": 1.0})(img, 3), TF.adjust_sharpness(img, 0.2))
    x = img.unsqueeze(0).float() / 255
    out = augment_batch(x, [3], {**ident, "sharpness_p": 1.0})
    assert ((out - TF.adjust_sharpness(x, 0.2)).abs() * 255).max() < 1e-3
    draws = [draw_params(settings_of({"sharpness": 0.2}), s)["sharpen"] for s in range(2000)]
    assert 0.45 < np.mean(draws) < 0.55
    assert not any(draw_params(settings_of({}), s)["sharpen"] for s in range(200))  # factor 1: off


def test_inside_image_crop_never_shows_a_border_on_either_path():
    img = torch.full((3, 64, 64), 200, dtype=torch.uint8)
    cfg = {**RRC, **STILL, "scale": [1.2, 1.2]}  # the authors' upper bound: retried, never zooms out
    assert all((Augment(cfg)(img, s) == 200).all() for s in range(10))
    out = augment_batch(img.expand(10, 3, 64, 64).float() / 255, list(range(10)), cfg)
    assert ((out * 255 - 200).abs() < 1e-3).all()


@pytest.mark.parametrize("cfg", [AUTHORS, {**AUTHORS, "order": "geometry_first"},
                                 {**AUTHORS, "crop": "zoom", "ratio": [0.75, 4 / 3]}])
def test_device_path_equals_the_loader_path(cfg):
    imgs = smooth_images(8)
    seeds = list(range(100, 108))
    ref = torch.stack([Augment(cfg)(imgs[i], s) for i, s in enumerate(seeds)]).float() / 255
    diff = (augment_batch(imgs.float() / 255, seeds, cfg) - ref).abs() * 255
    assert diff.mean() < 2.5 and diff.max() < 12  # uint8 rounding after every reference op
    geo = {**cfg, "brightness": 0, "contrast": 0, "saturation": 0, "hue": 0, "sharpness": 1.0}
    ref = torch.stack([Augment(geo)(imgs[i], s) for i, s in enumerate(seeds)]).float() / 255
    diff = (augment_batch(imgs.float() / 255, seeds, geo) - ref).abs() * 255
    assert diff.max() <= 1.0 and diff.mean() < 0.35  # same crop boxes and warps; uint8 antialias rounding


def test_device_crop_is_the_loader_crop_in_float():
    x = torch.rand(3, 3, 64, 48, dtype=torch.float64)
    boxes = [(3, 5, 50, 40), (0, 0, 64, 48), (10, 2, 33, 45)]
    ref = torch.stack([TF.resized_crop(x[i], *b, size=[64, 48], interpolation=A.CROP_INTERPOLATION, antialias=True)
                       for i, b in enumerate(boxes)])
    assert (A._resized_crops(x, boxes) - ref).abs().max() < 1e-9
    params = [{"angle": 3.3}, {"angle": -4.9}, {"angle": 0.0}]
    ref = torch.stack([TF.rotate(x[i], p["angle"], interpolation=A.ROTATE_INTERPOLATION) for i, p in enumerate(params)])
    assert torch.equal(A._batch_rotate(x, params), ref)


# -- the batched path on public API: deterministic given the parameters, same distributions ----------------------

def test_per_sample_colour_ops_equal_torchvisions_public_ops():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 20, 24, generator=g)
    x[0] = 0.4  # grey: no hue
    x[1, :, :4] = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)  # pure red and a tie between two largest channels
    x[1, :, 4:8] = torch.tensor([0.7, 0.7, 0.1]).view(3, 1, 1)
    hue = torch.rand(16, generator=g) - 0.5
    hue[:3] = torch.tensor([-0.5, 0.5, 0.0])
    out = A.shift_hue(x, hue)
    ref = torch.stack([TF.adjust_hue(x[i], float(hue[i])) for i in range(16)])
    assert (out - ref).abs().max() < 2e-6
    factors = 0.5 + torch.rand(16, generator=g)
    for k, fn in enumerate((TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)):
        ref = torch.stack([fn(x[i], float(factors[i])) for i in range(16)])
        assert (A._jitter_op(k, x.clone(), factors) - ref).abs().max() < 2e-6, fn.__name__


def test_inverse_affine_is_torchvisions_affine_per_sample():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(6, 3, 30, 40, generator=g, dtype=torch.float64)
    angle = (torch.rand(6, generator=g, dtype=torch.float64) - 0.5) * 20
    shift = (torch.rand(6, 2, generator=g, dtype=torch.float64) - 0.5) * 10
    zoom = 0.8 + 0.5 * torch.rand(6, generator=g, dtype=torch.float64)
    out = A._warp(x, A.inverse_affine(angle, shift, zoom), "bilinear")
    ref = torch.stack([TF.affine(x[i], angle=float(angle[i]), translate=shift[i].tolist(), scale=float(zoom[i]),
                                 shear=[0.0, 0.0], interpolation=InterpolationMode.BILINEAR) for i in range(6)])
    assert (out - ref).abs().max() < 1e-9


def _stats(x: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-image summaries that each augmentation moves: colour (channel means, chroma), contrast (spread), the
    flips and the crop (left-right and top-bottom differences of the gradients)."""
    x = x.double()
    h, w = x.shape[-2:]
    out = {f"mean{c}": x[:, c].mean(dim=(1, 2)) for c in range(3)}
    out["chroma"] = (x.amax(dim=1) - x.amin(dim=1)).mean(dim=(1, 2))
    out["spread"] = x.mean(dim=1).flatten(1).std(dim=1)
    out["left_right"] = x[:, 0, :, : w // 2].mean(dim=(1, 2)) - x[:, 0, :, w // 2:].mean(dim=(1, 2))
    out["top_bottom"] = x[:, 1, : h // 2].mean(dim=(1, 2)) - x[:, 1, h // 2:].mean(dim=(1, 2))
    return {k: v.numpy() for k, v in out.items()}


def _gradient_image(size=40):
    ramp = torch.linspace(0.1, 0.9, size)
    img = torch.stack((ramp.expand(size, size), ramp.view(-1, 1).expand(size, size), torch.full((size, size), 0.3)))
    return (img * 255).round().to(torch.uint8)


REFERENCE = {  # torchvision's own random transforms, as the configs' pipelines read them
    "authors": (AUTHORS, lambda s: v2.Compose([
        v2.RandomHorizontalFlip(0.5), v2.RandomVerticalFlip(0.5), v2.RandomRotation(5), v2.RandomAdjustSharpness(0.2),
        v2.ColorJitter(0.2, 0.2, 0.1, 0.1), v2.RandomResizedCrop((s, s), scale=[0.8, 1.2])])),
    "jitter_first": ({"scale": [1.0, 1.0], "rotation": 0.0}, lambda s: v2.Compose([
        v2.RandomHorizontalFlip(0.5), v2.RandomVerticalFlip(0.5), v2.ColorJitter(0.2, 0.2, 0.1, 0.1)])),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_device_path_draws_torchvisions_distributions(name):
    cfg, pipeline = REFERENCE[name]
    img, n = _gradient_image(), 400
    ours = _stats(augment_batch(img.expand(n, -1, -1, -1).float() / 255, list(range(n)), cfg))
    state = torch.get_rng_state()
    torch.manual_seed(2024)
    ref_tf = pipeline(img.shape[-1])
    ref = _stats(torch.stack([ref_tf(img) for _ in range(n)]).float() / 255)
    torch.set_rng_state(state)
    for k in ours:
        assert ks_2samp(ours[k], ref[k]).pvalue > 1e-3, k
    # the test has the power to see a wrong distribution: no horizontal flips, or twice the hue range
    no_flip = _stats(augment_batch(img.expand(n, -1, -1, -1).float() / 255, list(range(n)), {**cfg, "hflip": 0}))
    assert ks_2samp(no_flip["left_right"], ref["left_right"]).pvalue < 1e-6
    big = _stats(augment_batch(img.expand(n, -1, -1, -1).float() / 255, list(range(n)),
                               {**cfg, "hue": 0.3, "saturation": 0.5}))
    assert min(ks_2samp(big[k], ref[k]).pvalue for k in ("mean0", "mean1", "mean2", "chroma")) < 1e-6


def test_trainer_uses_fused_adamw_on_cuda_only():
    from retinabench.protocols.finetune import TrainConfig, Trainer

    class Enc(torch.nn.Module):
        input_size, embed_dim, mean, std = 8, 4, (0.5,) * 3, (0.5,) * 3

        def __init__(self):
            super().__init__()
            self.module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                              torch.nn.Flatten())

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        t = Trainer(Enc(), 2, protocol="finetune", seed=0, cfg=TrainConfig(batch_size=2, device=dev))
        assert bool(t.optimizer.defaults["fused"]) == (dev == "cuda")
