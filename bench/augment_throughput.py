"""Augmentation throughput: the batched path (``augment_batch``, the CUDA default) vs the per-image loader path
(``Augment``), and the cost of augmentation inside a fine-tuning step.

1. Images/s per CPU core of both paths on the same uint8 images and seeds, for both crops (``zoom``: config/config.yaml;
   ``random_resized_crop``, ``crop_last``, sharpness: config/ocularbench.yaml). Per image: ``Augment`` one image at a
   time, as a DataLoader worker runs it (one core each). Batched: uint8 -> float on the device, ``augment_batch``
   (what ``Trainer.prepare`` runs); on CPU with ``--threads`` threads (rate divided by them), on CUDA driven by one
   core. Ratio: batched / per image per core (goal >= 4).
2. The fine-tuning step (``Trainer.train_step`` on a pre-loaded uint8 batch) with augmentation batched in the step
   (``where: device``) over the same step without augmentation (goal >= 0.9).

Both arms of each comparison are measured side by side, interleaved with the order alternating
(``common.interleaved_times``); the ratios are medians over the pairs. Defaults (224 px, 64 images, ViT-Tiny batch
16, one thread, CPU) keep a run to about a minute on a shared 2-core machine; on a GPU machine pass
``--device cuda --batch 64``.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from common import encoder, interleaved_times, set_threads
from retinabench.protocols.augment import Augment, augment_batch
from retinabench.protocols.finetune import TrainConfig, Trainer

CROPS = {
    "zoom": {},
    "random_resized_crop": {"crop": "random_resized_crop", "order": "crop_last", "ratio": [0.75, 4 / 3],
                            "sharpness": 0.2, "sharpness_p": 0.5},
}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8))


def augmentation_rates(n: int, size: int, dev: torch.device, threads: int, repeats: int) -> dict[str, dict]:
    """Per crop: images/s per core of the per-image and the batched path, and their ratio."""
    imgs, seeds = _images(n, size), list(range(n))
    out = {}
    for crop, cfg in CROPS.items():
        aug = Augment(cfg)

        def per_image(aug=aug):
            torch.stack([aug(imgs[i], s) for i, s in enumerate(seeds)])

        def batched(cfg=cfg):
            augment_batch(imgs.to(dev).float().div_(255.0), seeds, cfg)
            _sync(dev)

        per_image(), batched()  # warm-up
        t_img, t_batch = interleaved_times(per_image, batched, repeats)
        cores = threads if dev.type == "cpu" else 1
        out[crop] = {"per_image": n / float(np.median(t_img)), "batched": n / float(np.median(t_batch)) / cores,
                     "ratio": float(np.median(np.array(t_img) / np.array(t_batch))) / cores}
    return out


def step_ratio(name: str, batch: int, dev: torch.device, steps: int) -> dict:
    """Images/s of the fine-tuning step with and without the (batched) augmentation, and without / with."""
    enc = encoder(name)
    x = _images(batch, enc.input_size, seed=1)
    y = torch.arange(batch) % 3
    seeds = torch.arange(batch)
    trainers = [Trainer(enc, 3, protocol="finetune", seed=0,
                        cfg=TrainConfig(batch_size=batch, device=str(dev), augment={"enabled": on, "where": "device"}))
                for on in (True, False)]

    def stepper(trainer):
        def step():
            trainer.train_step(x, y, seeds).item()  # .item(): the step is finished when the timer stops
        return step

    with_aug, without = stepper(trainers[0]), stepper(trainers[1])
    with_aug(), without()  # warm-up
    t_with, t_without = interleaved_times(with_aug, without, steps)
    return {"with": batch / float(np.median(t_with)), "without": batch / float(np.median(t_without)),
            "ratio": float(np.median(np.array(t_without) / np.array(t_with)))}


def main(n: int = 64, size: int = 224, repeats: int = 3, name: str = "vit_tiny_random", batch: int = 16,
         steps: int = 4, threads: int = 1, device: str = "cpu") -> dict:
    set_threads(threads)
    dev = torch.device(device)
    rates = augmentation_rates(n, size, dev, threads, repeats)
    for crop, r in rates.items():
        print(f"augmentation, crop {crop}, {n} images {size} px, {dev}, {threads} threads: per image "
              f"{r['per_image']:.1f} img/s per core vs batched {r['batched']:.1f} img/s per core -> ratio "
              f"{r['ratio']:.2f} (goal >= 4)")
    step = step_ratio(name, batch, dev, steps)
    print(f"fine-tuning step, {name}, batch {batch}, {dev}, {threads} threads: with batched augmentation "
          f"{step['with']:.1f} img/s vs without {step['without']:.1f} img/s ({steps} alternating steps) -> ratio "
          f"{step['ratio']:.3f} (goal >= 0.9)")
    return {"augmentation": rates, "step": step}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--encoder", default="vit_tiny_random")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    main(a.images, a.size, a.repeats, a.encoder, a.batch, a.steps, a.threads, a.device)
