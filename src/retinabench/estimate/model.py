"""The cost model of ``retinabench estimate``: named, overridable assumptions, how many images a dataset has (its
built manifest, else its declared size, else an assumption, each with its source), the forward FLOPs of an encoder
from its parameter count, and the throughput the compute benchmark and the fine-tuning runs measured. Torch-free."""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields


PEAK_BF16_TFLOPS = 989.0  # dense bf16 peak of one Hopper GPU (H100 SXM, the GH200's H100, H200): NVIDIA's data sheets


@dataclass
class Assumptions:
    """Every number the estimate assumes where nothing was measured; each is printed and overridable (``--set``)."""

    gpu: str = "h100"
    # sustained bf16 TFLOP/s: 40 % model-FLOPs utilisation of the dense peak (H100 / GH200 / H200 share the SMs;
    # the H200's and GH200's larger memory bandwidth helps decoding, not the dense peak)
    tflops: dict[str, float] = field(default_factory=lambda: {g: 0.4 * PEAK_BF16_TFLOPS for g in
                                                               ("h100", "gh200", "h200")})
    train_factor: float = 3.0        # a training step (forward + backward) = 3 forward passes
    frozen_train_factor: float = 1.0  # linear_aug: the encoder frozen, forward only (the head is negligible)
    saliency_factor: float = 3.0      # integrated gradients: forward + backward per point
    data_overhead: float = 0.15       # decoding, augmentation and host-device copies beyond the model's time
    startup_s: float = 60.0           # per job: import torch, build the model, load weights, map the image cache
    cnn_patch: int = 16               # CNNs: FLOPs counted as a ViT with this patch (ResNet-50 at 224: 9 vs 8 GFLOPs)
    mllm_image_tokens: int = 576      # an MLLM's visual tokens per image (its processor decides; LLaVA-style 24 x 24)
    prompt_tokens: int = 64           # text tokens of a prompt (system, question, options)
    decode_efficiency: float = 0.1    # decoding is memory-bound: the share of the sustained TFLOP/s it reaches
    default_images: int = 10000       # a dataset with no manifest, no declared size and no parent's

    @property
    def sustained_tflops(self) -> float:
        if self.gpu not in self.tflops:
            raise ValueError(f"--gpu {self.gpu!r}: no sustained TFLOP/s assumed for it (known: {sorted(self.tflops)}); "
                             f"give one with --set tflops={self.gpu}:<TFLOP/s>")
        return self.tflops[self.gpu]

    def override(self, items: list[str]) -> Assumptions:
        """``KEY=VALUE`` overrides (``tflops=GPU:VALUE`` for one GPU's TFLOP/s); an unknown key is an error."""
        values = asdict(self)
        names = {f.name: f for f in fields(self)}
        for item in items:
            key, sep, raw = item.partition("=")
            if not sep or key not in names:
                raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(names)}")
            if key == "tflops":
                gpu, sep, number = raw.partition(":")
                if not sep:
                    raise ValueError(f"--set {item!r}: expected tflops=GPU:VALUE, e.g. tflops=h100:350")
                values["tflops"] = {**values["tflops"], gpu: float(number)}
            else:
                values[key] = type(values[key])(raw)
        return Assumptions(**values)

    def lines(self) -> list[str]:
        return [f"gpu {self.gpu}: {self.sustained_tflops:g} sustained bf16 TFLOP/s (40% of {PEAK_BF16_TFLOPS:g} "
                "dense peak unless overridden)",
                f"forward FLOPs = 2 x params x tokens (ViT: (input/patch)^2 + 1; CNN: as patch {self.cnn_patch}; "
                f"MLLM: {self.mllm_image_tokens} image + {self.prompt_tokens} prompt tokens, decoding at "
                f"{self.decode_efficiency:g} of the sustained rate)",
                f"training = {self.train_factor:g} x forward (linear_aug {self.frozen_train_factor:g} x, saliency "
                f"{self.saliency_factor:g} x per point); data-loading overhead {self.data_overhead:.0%}; "
                f"start-up {self.startup_s:g} s per job (x GPUs)",
                f"images: the built manifest's rows, else the dataset registry's n_images, else the parent dataset's "
                f"(upper bound), else {self.default_images}; split shares from the config's split.fractions"]


# -- images -------------------------------------------------------------------------------------------------------

def declared_sizes(datasets: dict[str, dict]) -> dict[str, dict]:
    """``{dataset: {images, source}}`` from the dataset registry's ``n_images`` (schema-checked: count, source)."""
    return {name: {"images": int(e["n_images"]["count"]), "source": str(e["n_images"]["source"])}
            for name, e in datasets.items() if isinstance(e, dict) and e.get("n_images")}


def manifest_rows(path: str) -> int | None:
    """Rows of a built manifest (Parquet metadata only), None when there is none."""
    if not os.path.isfile(path):
        return None
    import pyarrow.parquet as pq
    return int(pq.ParquetFile(path).metadata.num_rows)


def dataset_images(name: str, manifest: str, registry: dict, sizes: dict, a: Assumptions) -> tuple[int, str]:
    """(images, source) of one dataset."""
    rows = manifest_rows(manifest)
    if rows is not None:
        return rows, "manifest"
    if name in sizes:
        return sizes[name]["images"], "declared"
    parent = registry.get(name, {}).get("variant_of")
    if parent in sizes:
        return sizes[parent]["images"], f"declared ({parent}, upper bound)"
    return a.default_images, "assumed"


# -- FLOPs --------------------------------------------------------------------------------------------------------

def tokens(entry: dict, a: Assumptions) -> int:
    """Tokens of one forward pass: image patches (+ class token) for a ViT at its input size, the CNN patch for a
    CNN, image + prompt tokens for an entry without an input size (an MLLM)."""
    if "input_size" not in entry:
        return a.mllm_image_tokens + a.prompt_tokens
    found = re.search(r"patch(\d+)", str(entry.get("architecture", "")))
    patch = int(found.group(1)) if found else a.cnn_patch
    return (int(entry["input_size"]) // patch) ** 2 + 1


def forward_flops(entry: dict, a: Assumptions) -> float:
    """One image's forward FLOPs: 2 x parameters x tokens."""
    return 2.0 * float(entry["params_m"]) * 1e6 * tokens(entry, a)


def decode_flops(entry: dict, new_tokens: int, a: Assumptions) -> float:
    """An MLLM's generated tokens, charged at the decode efficiency (as prefill-equivalent FLOPs)."""
    return 2.0 * float(entry["params_m"]) * 1e6 * new_tokens / a.decode_efficiency


# -- measured throughput ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """Training images/s per (encoder, protocol) from the compute benchmark (compute/benchmark.parquet, phases
    finetune / linear_aug) and from the fine-tuning runs (compute/finetune.parquet, which wins: whole runs)."""

    rates: dict[tuple[str, str], tuple[float, str]]

    @classmethod
    def read(cls, benchmark: str, finetune: str) -> Measured:
        import pandas as pd
        rates: dict[tuple[str, str], tuple[float, str]] = {}
        for path, protocol_col, label in ((benchmark, "phase", "compute benchmark"),
                                          (finetune, "protocol", "fine-tuning runs")):
            if not os.path.isfile(path):
                continue
            table = pd.read_parquet(path)
            missing = {"encoder", protocol_col, "images_per_s", "device_name"} - set(table.columns)
            if missing:
                raise ValueError(f"{path}: measured throughput needs columns {sorted(missing)}")
            table = table[table[protocol_col].isin(["finetune", "linear_aug"]) & (table["images_per_s"] > 0)]
            for (enc, proto), g in table.groupby(["encoder", protocol_col]):
                devices = "/".join(sorted(set(g["device_name"].astype(str))))
                rates[(str(enc), str(proto))] = (float(g["images_per_s"].median()),
                                                 f"measured: {label} ({len(g)} rows, {devices})")
        return cls(rates)

    def train_rate(self, encoder: str, protocol: str) -> tuple[float, str] | None:
        return self.rates.get((encoder, protocol))

    def forward_rate(self, encoder: str, a: Assumptions) -> tuple[float, str] | None:
        """Forward images/s from a measured full fine-tuning step (training = train_factor x forward)."""
        hit = self.rates.get((encoder, "finetune"))
        if hit is None:
            return None
        return hit[0] * a.train_factor, f"{hit[1]} x {a.train_factor:g} (forward)"
