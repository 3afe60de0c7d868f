"""Seeded synthetic ("phantom") ophthalmic dataset: colour fundus photographs (CFP) and OCT B-scans.

Why: the benchmark pipeline needs a dataset that can be built anywhere, offline, in seconds, with known
ground truth, so that every stage (adapters, splits, feature extraction, probes, statistics, figures) can be
tested end to end, and so that failure modes the benchmark must catch can be planted on purpose.

What it models:

* Patients (age, sex, acquisition site) with one or two eyes. Each eye has a fixed latent state -- diabetic
  retinopathy grade (0 none, 1 non-proliferative, 2 proliferative), glaucoma, diabetic macular oedema (DME) --
  and fixed anatomy (disc position and size, vessel tree, lesion layout). Repeat acquisitions of the same eye
  share that state and anatomy but differ in pose, illumination and noise.
* Labels come from the eye's latent state only. The one dependence on a covariate is that DR is mildly more
  prevalent with age (as in real screening data); site, sex and image quality never influence labels, so any
  probe that "learns" them is learning a shortcut the benchmark should expose.
* Labels are carried by visible structure: optic cup size (glaucoma), red/yellow lesions, neovascular tufts and
  pre-retinal haemorrhages (DR), intraretinal fluid pockets with retinal thickening (DME).
* Acquisition nuisances: ~10-15 % "poor" images (blur, low contrast, darker; more frequent in older patients),
  and per-site device effects (colour cast, blur, vignetting, reduced resolution) for controlled domain shift.

Anatomy and rendering are in retinabench.data.phantom_render; this module validates the arguments, draws the
patients, applies the acquisition effects and writes the files (each atomically: a temporary name, renamed).

Every random draw comes from a generator seeded by ``SeedSequence(seed, spawn_key=...)`` keyed on the
patient/eye/image identity, so outputs are byte-identical for the same arguments and do not depend on the
order in which anything is generated.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy import ndimage

from retinabench.atomic import atomic_path, atomic_write
from retinabench.data.phantom_render import cfp_anatomy, eye_state, oct_anatomy, render_cfp, render_oct

__all__ = ["SITES_DEFAULT", "COLUMNS", "generate_phantom"]

COLUMNS = ["image_id", "file", "modality", "patient_id", "eye", "age", "sex", "quality", "site",
           "dr_grade", "glaucoma", "dme"]

_SITE_DEFAULTS = {"color_cast": (1.0, 1.0, 1.0), "blur": 0.0, "vignetting": 0.0, "resolution": 1.0,
                  "fraction": 1.0}
_SITE_KEYS = {"name", *_SITE_DEFAULTS}

SITES_DEFAULT = ({"name": "A", "color_cast": (1.0, 1.0, 1.0), "blur": 0.0, "vignetting": 0.0,
                  "resolution": 1.0, "fraction": 1.0},)

_OCT_ASPECT = 2.4          # B-scan width : height
_EYES = ("OD", "OS")

# spawn_key namespaces, so that patient/eye/image streams never collide
_NS_PATIENT, _NS_EYE, _NS_IMAGE, _NS_SITES = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------------------
# argument validation
# ----------------------------------------------------------------------------------------------------------
def _validate_sites(sites) -> list[dict]:
    if sites is None:
        sites = SITES_DEFAULT
    if isinstance(sites, dict) or not hasattr(sites, "__iter__"):
        raise ValueError(f"sites must be a list of site dicts, got {type(sites).__name__}")
    sites = list(sites)
    if not sites:
        raise ValueError("sites must contain at least one site")
    out, names = [], set()
    for i, site in enumerate(sites):
        if not isinstance(site, dict):
            raise ValueError(f"sites[{i}] must be a dict, got {type(site).__name__}")
        unknown = sorted(set(site) - _SITE_KEYS)
        if unknown:
            raise ValueError(f"sites[{i}]: unknown key(s) {unknown}; allowed keys are {sorted(_SITE_KEYS)}")
        name = site.get("name")
        if not isinstance(name, str) or not name or "," in name or "\n" in name:
            raise ValueError(f"sites[{i}]: 'name' must be a non-empty string without commas, got {name!r}")
        if name in names:
            raise ValueError(f"sites[{i}]: duplicate site name {name!r}")
        names.add(name)
        if "fraction" not in site and len(sites) > 1:
            raise ValueError(f"sites[{i}] ({name!r}): 'fraction' is required when there is more than one site")
        s = {"name": name, **{k: site.get(k, v) for k, v in _SITE_DEFAULTS.items()}}
        try:
            cast = tuple(float(c) for c in s["color_cast"])
        except (TypeError, ValueError):
            raise ValueError(f"sites[{i}] ({name!r}): color_cast must be 3 numbers, got {s['color_cast']!r}") from None
        if len(cast) != 3 or not all(math.isfinite(c) and c >= 0 for c in cast):
            raise ValueError(f"sites[{i}] ({name!r}): color_cast must be 3 finite numbers >= 0, "
                             f"got {s['color_cast']!r}")
        s["color_cast"] = cast
        for key, lo, hi, lo_open in (("blur", 0.0, math.inf, False), ("vignetting", 0.0, 1.0, False),
                                     ("resolution", 0.0, 1.0, True), ("fraction", 0.0, 1.0, False)):
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(v)) or float(v) > hi or float(v) < lo or (lo_open and float(v) <= lo):
                rng_txt = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
                raise ValueError(f"sites[{i}] ({name!r}): {key}={v!r} is outside {rng_txt}")
            s[key] = float(v)
        out.append(s)
    total = sum(s["fraction"] for s in out)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"site fractions must sum to 1, got {total!r} "
                         "(" + ", ".join(f"{s['name']}={s['fraction']}" for s in out) + ")")
    return out


def _assign_sites(n: int, sites: list[dict], seed: int) -> list[int]:
    """Exact per-site patient counts (largest remainder), then a seeded random permutation of patients."""
    quotas = [s["fraction"] * n for s in sites]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(sites)), key=lambda j: (-(quotas[j] - counts[j]), j))
    for j in order[: n - sum(counts)]:
        counts[j] += 1
    labels = np.repeat(np.arange(len(sites)), counts)
    perm = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_NS_SITES,))).permutation(n)
    assign = np.empty(n, dtype=int)
    assign[perm] = labels
    return assign.tolist()


# ----------------------------------------------------------------------------------------------------------
# acquisition effects
# ----------------------------------------------------------------------------------------------------------
def _blur(img, sigma):
    if sigma <= 0:
        return img
    sig = (sigma, sigma, 0) if img.ndim == 3 else sigma
    return ndimage.gaussian_filter(img, sig, mode="nearest")


def _degrade(rng, img, size):
    """'Poor' quality: defocus blur, lowered contrast, darker exposure."""
    img = _blur(img, rng.uniform(0.008, 0.016) * size)
    mask = img.max(axis=-1) > 0.02 if img.ndim == 3 else np.ones(img.shape, bool)
    mean = img[mask].mean(axis=0)
    img = mean + (img - mean) * rng.uniform(0.5, 0.7)
    img = img * rng.uniform(0.65, 0.85)
    if img.ndim == 3:  # keep the black surround black
        img = img * (ndimage.gaussian_filter(mask.astype(float), 1.0))[..., None]
    return np.clip(img, 0.0, 1.0)


def _site_effect(img, site: dict) -> np.ndarray:
    h, w = img.shape[:2]
    if img.ndim == 3:
        img = img * np.asarray(site["color_cast"])
    else:  # grayscale device: the cast acts through its luminance
        img = img * float(np.dot([0.299, 0.587, 0.114], site["color_cast"]))
    if site["vignetting"] > 0:
        yy = (np.arange(h) + 0.5) / h * 2 - 1
        xx = (np.arange(w) + 0.5) / w * 2 - 1
        r2 = np.clip(yy[:, None] ** 2 + xx[None, :] ** 2, 0, 1)
        v = 1.0 - site["vignetting"] * r2
        img = img * (v[..., None] if img.ndim == 3 else v)
    img = _blur(img, site["blur"])
    return np.clip(img, 0.0, 1.0)


def _to_pil(img, site: dict) -> Image.Image:
    arr = np.round(img * 255.0).astype(np.uint8)
    pil = Image.fromarray(arr, mode="RGB" if arr.ndim == 3 else "L")
    if site["resolution"] < 1.0:  # lower-resolution sensor: downsample, then back to the common size
        w, h = pil.size
        small = (max(1, int(round(w * site["resolution"]))), max(1, int(round(h * site["resolution"]))))
        pil = pil.resize(small, Image.Resampling.BOX).resize((w, h), Image.Resampling.BILINEAR)
    return pil


# ----------------------------------------------------------------------------------------------------------
# public entry point
# ----------------------------------------------------------------------------------------------------------
def generate_phantom(out_dir, n_patients: int = 80, seed: int = 0, image_size: int = 256,
                     sites=None) -> pd.DataFrame:
    """Write a raw dataset folder and return its metadata table (also written to out_dir/metadata.csv).

    Layout: ``cfp/<image_id>.png`` (RGB, image_size x image_size), ``oct/<image_id>.png`` (grayscale,
    image_size wide, image_size / 2.4 high) and ``metadata.csv`` with columns :data:`COLUMNS`.
    ``sites`` is a list of dicts with keys name, color_cast, blur, vignetting, resolution, fraction
    (default :data:`SITES_DEFAULT`: one undistorted site "A"); patients are split between sites by fraction.
    """
    if isinstance(n_patients, bool) or not isinstance(n_patients, (int, np.integer)) or n_patients < 1:
        raise ValueError(f"n_patients must be an integer >= 1, got {n_patients!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 64:
        raise ValueError(f"image_size must be an integer >= 64, got {image_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    n_patients, image_size, seed = int(n_patients), int(image_size), int(seed)
    site_list = _validate_sites(sites)
    site_of = _assign_sites(n_patients, site_list, seed)

    out = Path(out_dir)
    (out / "cfp").mkdir(parents=True, exist_ok=True)
    (out / "oct").mkdir(parents=True, exist_ok=True)
    oct_h = int(round(image_size / _OCT_ASPECT))

    def rng_for(*key):
        return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))

    rows = []
    for p in range(n_patients):
        prng = rng_for(_NS_PATIENT, p)
        pid = f"P{p + 1:04d}"
        age = int(prng.integers(40, 86))
        sex = "F" if prng.random() < 0.5 else "M"
        eyes = list(_EYES) if prng.random() < 0.6 else [_EYES[int(prng.integers(0, 2))]]
        site = site_list[site_of[p]]
        p_poor = 0.03 + 0.20 * (age - 40) / 45.0   # older patients: more cataract/small pupils -> poor images
        for eye in eyes:
            e = _EYES.index(eye)
            erng = rng_for(_NS_EYE, p, e)
            state = eye_state(erng, age)
            # separate streams so that changing one modality's anatomy never reshuffles the other
            cfp_anat = cfp_anatomy(rng_for(_NS_EYE, p, e, 1), eye, state)
            oct_anat = oct_anatomy(rng_for(_NS_EYE, p, e, 2), state)
            for m, modality, n_img in ((0, "cfp", state["n_cfp"]), (1, "oct", state["n_oct"])):
                for k in range(1, n_img + 1):
                    irng = rng_for(_NS_IMAGE, p, e, m, k)
                    poor = irng.random() < p_poor
                    if modality == "cfp":
                        img = render_cfp(irng, cfp_anat, image_size)
                    else:
                        img = render_oct(irng, oct_anat, image_size, oct_h)
                    if poor:
                        img = _degrade(irng, img, image_size)
                    img = _site_effect(img, site)
                    image_id = f"{pid}_{eye}_{modality}_{k}"
                    rel = f"{modality}/{image_id}.png"
                    with atomic_path(out / rel) as tmp:
                        _to_pil(img, site).save(tmp, format="PNG")
                    rows.append({
                        "image_id": image_id, "file": rel, "modality": modality, "patient_id": pid, "eye": eye,
                        "age": age, "sex": sex, "quality": "poor" if poor else "good", "site": site["name"],
                        "dr_grade": state["dr"] if modality == "cfp" else pd.NA,
                        "glaucoma": state["glaucoma"] if modality == "cfp" else pd.NA,
                        "dme": state["dme"] if modality == "oct" else pd.NA,
                    })
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("dr_grade", "glaucoma", "dme"):
        df[col] = df[col].astype("Int64")
    df["age"] = df["age"].astype("int64")
    atomic_write(out / "metadata.csv", lambda tmp: df.to_csv(tmp, index=False, lineterminator="\n"))
    return df
