"""Anatomy and rendering of the phantom dataset (retinabench.data.phantom): each eye's latent state, its colour
fundus anatomy (disc, cup, vessel tree, lesions) and OCT anatomy (layers, fluid pockets, thickening), and the
rendering of one acquisition of either, as floats in [0, 1] before acquisition effects. Every function draws from
the generator it is given (seeded by the caller on the patient/eye/image identity).
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage
from scipy.special import expit

_SS = 2                    # supersampling factor for PIL drawing (cheap anti-aliasing)


# ----------------------------------------------------------------------------------------------------------
# small drawing helpers
# ----------------------------------------------------------------------------------------------------------
def _smooth_noise(rng, shape_lowres, out_shape, order=3) -> np.ndarray:
    """Low-frequency noise: a coarse Gaussian grid zoomed to out_shape (fast, unlike a large-sigma blur)."""
    g = rng.standard_normal(shape_lowres)
    zoom = (out_shape[0] / shape_lowres[0], out_shape[1] / shape_lowres[1])
    return ndimage.zoom(g, zoom, order=order, mode="reflect", grid_mode=True)[: out_shape[0], : out_shape[1]]


def _lerp(img, colour, alpha, thresh=1e-4):
    """Alpha-blend a colour into an (H, W, 3) albedo image, in place, only inside alpha's bounding box
    (most layers cover a small part of the image, so this is the main speed-up)."""
    rows = np.flatnonzero((alpha > thresh).any(axis=1))
    if rows.size == 0:
        return img
    cols = np.flatnonzero((alpha[rows[0]:rows[-1] + 1] > thresh).any(axis=0))
    sl = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    a = alpha[sl][..., None]
    img[sl] = img[sl] * (1.0 - a) + np.asarray(colour, dtype=np.float64) * a
    return img


def _soft_ellipse(u, v, cu, cv, ru, rv, edge):
    """Soft-edged ellipse mask (1 inside) evaluated on coordinate grids."""
    d = np.sqrt(((u - cu) / ru) ** 2 + ((v - cv) / rv) ** 2)
    return expit((1.0 - d) / edge)


class _Canvas:
    """Supersampled grayscale mask drawn with PIL; coordinates in image-normalised units [-1, 1]."""

    def __init__(self, size: int):
        self.size = size
        self.px = size * _SS
        self.img = Image.new("L", (self.px, self.px), 0)
        self.draw = ImageDraw.Draw(self.img)

    def _p(self, x, y):
        return ((x + 1.0) * 0.5 * self.px, (y + 1.0) * 0.5 * self.px)

    def _r(self, r):
        return r * 0.5 * self.px

    def line(self, x0, y0, x1, y1, w, value=255):
        wp = max(1, int(round(self._r(w))))
        self.draw.line([self._p(x0, y0), self._p(x1, y1)], fill=value, width=wp)
        if wp > 2:  # round joints, otherwise thick polylines show notches
            cx, cy = self._p(x1, y1)
            h = wp / 2.0
            self.draw.ellipse([cx - h, cy - h, cx + h, cy + h], fill=value)

    def disc(self, x, y, r, value=255, rx=None):
        cx, cy = self._p(x, y)
        ry = self._r(r)
        rxp = self._r(rx) if rx is not None else ry
        self.draw.ellipse([cx - rxp, cy - ry, cx + rxp, cy + ry], fill=value)

    def array(self) -> np.ndarray:
        return np.asarray(self.img.reduce(_SS), dtype=np.float64) / 255.0


# ----------------------------------------------------------------------------------------------------------
# eye-level anatomy and latent state
# ----------------------------------------------------------------------------------------------------------
def eye_state(rng, age: int) -> dict:
    # DR: 50/30/20 on average; P(any DR) rises mildly with age (0.35 at 40 -> 0.65 at 85), P(PDR | DR) = 0.4
    p_any = 0.5 + 0.15 * (age - 62.5) / 22.5
    dr = 0 if rng.random() >= p_any else (2 if rng.random() < 0.4 else 1)
    glaucoma = int(rng.random() < 0.35)
    dme = int(rng.random() < 0.40)
    n_cfp = 1 + int(rng.random() < 0.45)
    n_oct = int(rng.choice(3, p=[0.25, 0.5, 0.25]))
    return {"dr": dr, "glaucoma": glaucoma, "dme": dme, "n_cfp": n_cfp, "n_oct": n_oct}


def _walk_vessel(rng, segs, x, y, heading, width, curv, kind, depth, max_steps, fovea):
    """Random-walk one vessel from (x, y), spawning thinner branches; appends segments to segs."""
    step = 0.03
    for _ in range(max_steps):
        heading += curv + rng.normal(0.0, 0.06)
        nx, ny = x + step * math.cos(heading), y + step * math.sin(heading)
        segs.append((x, y, nx, ny, width, kind))
        x, y = nx, ny
        width *= 0.985
        if width < 0.007 or x * x + y * y > 1.0 or math.hypot(x - fovea[0], y - fovea[1]) < 0.09:
            return
        if depth < 3 and rng.random() < 0.07:
            side = 1.0 if rng.random() < 0.5 else -1.0
            _walk_vessel(rng, segs, x, y, heading + side * rng.uniform(0.45, 1.0), width * rng.uniform(0.55, 0.7),
                         rng.normal(0.0, 0.03), kind, depth + 1, int(max_steps * 0.6), fovea)
            width *= 0.9


def cfp_anatomy(rng, eye: str, state: dict) -> dict:
    """Eye anatomy in retinal coordinates (u right, v down, fovea near the origin); OD has the disc on the
    right of the image (nasal side), OS is the mirror image."""
    mirror = 1.0 if eye == "OD" else -1.0
    fovea = (mirror * rng.uniform(-0.06, 0.0), rng.uniform(-0.02, 0.04))
    disc_r = rng.uniform(0.15, 0.175)
    disc = (mirror * rng.uniform(0.40, 0.46), rng.uniform(-0.06, 0.02))
    cdr = rng.uniform(0.65, 0.85) if state["glaucoma"] else rng.uniform(0.25, 0.45)
    # peripapillary atrophy: a pale crescent on the temporal disc margin, common in glaucoma, rarer otherwise
    ppa = rng.uniform(0.25, 0.5) if rng.random() < (0.55 if state["glaucoma"] else 0.08) else 0.0

    # Vessels, generated in the OD frame (temporal = -u) then mirrored: two temporal arcades curving around the
    # macula and two nasal trunks, each an artery + vein pair.
    segs: list = []
    fov_od = (fovea[0] * mirror, fovea[1])
    d_od = (disc[0] * mirror + 0.35 * cdr * disc_r, disc[1])  # vessels emerge on the nasal side of the cup
    for up in (-1.0, 1.0):
        for kind, w, dh in (("vein", rng.uniform(0.028, 0.034), 0.10), ("artery", rng.uniform(0.020, 0.025), -0.10)):
            h0 = up * (math.pi / 2 + rng.uniform(0.05, 0.30)) + up * dh
            _walk_vessel(rng, segs, d_od[0], d_od[1] + up * 0.02, h0, w, up * rng.uniform(0.045, 0.065), kind, 0, 45,
                         fov_od)
            h1 = up * rng.uniform(0.6, 1.0) + up * dh
            _walk_vessel(rng, segs, d_od[0], d_od[1] + up * 0.02, h1, w * 0.8, -up * rng.uniform(0.0, 0.03), kind, 1,
                         25, fov_od)
    segs = [(mirror * a, b, mirror * c, d, w, k) for a, b, c, d, w, k in segs]

    def sample_points(n, spread=0.45):
        pts = []
        while len(pts) < n:
            p = rng.normal(0.0, spread, size=(4 * n + 8, 2)) + np.asarray(fovea)
            ok = (np.hypot(p[:, 0], p[:, 1]) < 0.82) & (np.hypot(p[:, 0] - disc[0], p[:, 1] - disc[1]) > disc_r + 0.05)
            pts.extend(p[ok].tolist())
        return np.asarray(pts[:n])

    red, exud, nv, prh = [], [], [], []
    if state["dr"] >= 1:
        n_red = int(rng.integers(10, 31)) if state["dr"] == 1 else int(rng.integers(25, 51))
        for (x, y) in sample_points(n_red):
            r = rng.uniform(0.012, 0.02) if rng.random() < 0.55 else rng.uniform(0.02, 0.038)  # MA vs blot
            red.append((x, y, r))
        n_clusters = int(rng.integers(1, 3)) if state["dr"] == 1 else int(rng.integers(2, 4))
        n_ex = int(rng.integers(3, 9)) if state["dr"] == 1 else int(rng.integers(8, 22))
        centres = sample_points(n_clusters, 0.3)
        for i in range(n_ex):
            cx, cy = centres[i % n_clusters]
            a = rng.uniform(0, 2 * math.pi)
            rad = rng.uniform(0.0, 0.09)
            exud.append((cx + rad * math.cos(a), cy + rad * math.sin(a), rng.uniform(0.011, 0.024)))
    if state["dr"] == 2:
        # neovascular tufts: tangles of thin tortuous vessels on the disc (NVD) or along the arcades (NVE)
        for t in range(int(rng.integers(1, 4))):
            if t == 0 and rng.random() < 0.5:
                cx, cy = disc[0] + rng.normal(0, 0.04), disc[1] + rng.normal(0, 0.04)
            else:
                s = segs[int(rng.integers(0, min(len(segs), 120)))]
                cx, cy = s[2], s[3]
            for _ in range(int(rng.integers(8, 14))):
                x, y = cx + rng.normal(0, 0.025), cy + rng.normal(0, 0.025)
                h = rng.uniform(0, 2 * math.pi)
                w = rng.uniform(0.009, 0.013)
                for _ in range(int(rng.integers(6, 12))):
                    h += rng.normal(0, 0.9)
                    nx, ny = x + 0.014 * math.cos(h), y + 0.014 * math.sin(h)
                    nv.append((x, y, nx, ny, w))
                    x, y = nx, ny
        # pre-retinal haemorrhages: large dark blobs, a few overlapping ellipses each
        for (x, y) in sample_points(int(rng.integers(1, 4)), 0.35):
            r = rng.uniform(0.05, 0.10)
            for _ in range(3):
                prh.append((x + rng.normal(0, r * 0.3), y + rng.normal(0, r * 0.2), r * rng.uniform(0.6, 1.0),
                            r * rng.uniform(0.8, 1.3)))
    tex = rng.standard_normal((24, 24))
    colour = np.array([0.80, 0.36, 0.17]) * rng.uniform(0.85, 1.1, size=3)
    return {"fovea": fovea, "disc": disc, "disc_r": disc_r, "cdr": cdr, "ppa": ppa, "mirror": mirror,
            "segs": segs, "red": red, "exud": exud, "nv": nv, "prh": prh, "tex": tex, "colour": colour}


# ----------------------------------------------------------------------------------------------------------
# CFP rendering
# ----------------------------------------------------------------------------------------------------------
def render_cfp(rng, anat: dict, size: int) -> np.ndarray:
    """Render one acquisition (float RGB in [0, 1]) of an eye; pose/illumination/noise are per image."""
    theta = rng.normal(0.0, 0.07)
    scale = rng.uniform(0.96, 1.04)
    tx, ty = rng.normal(0.0, 0.025, size=2)
    c, s = math.cos(theta), math.sin(theta)

    def fwd(u: float, v: float) -> tuple[float, float]:  # retina -> image coordinates
        return scale * (c * u - s * v) + tx, scale * (s * u + c * v) + ty

    lin = (np.arange(size) + 0.5) / size * 2.0 - 1.0
    Y, X = np.meshgrid(lin, lin, indexing="ij")
    # image -> retina coordinates for the full-field layers
    xr, yr = (X - tx) / scale, (Y - ty) / scale
    U, V = c * xr + s * yr, -s * xr + c * yr

    # background albedo with choroidal texture (eye-fixed, so sampled in retinal coordinates)
    ti = (U + 1.2) / 2.4 * 23.0
    tj = (V + 1.2) / 2.4 * 23.0
    tex = ndimage.map_coordinates(anat["tex"], [tj, ti], order=3, mode="reflect")
    fine = _smooth_noise(rng, (size // 4, size // 4), (size, size), order=1)
    alb = anat["colour"][None, None, :] * (1.0 + 0.06 * tex + 0.02 * fine)[..., None]

    # macula: darker, browner area with a tiny foveal reflex
    fu, fv = anat["fovea"]
    rf2 = (U - fu) ** 2 + (V - fv) ** 2
    alb *= 1.0 - np.array([0.22, 0.35, 0.35]) * np.exp(-rf2 / 0.18 ** 2)[..., None]
    alb = _lerp(alb, (0.9, 0.6, 0.4), 0.25 * np.exp(-rf2 / 0.012 ** 2))

    # optic disc (orange-yellow rim) and paler cup; cup is vertically slightly elongated as in real discs
    du, dv = anat["disc"]
    r = anat["disc_r"]
    if anat["ppa"] > 0:
        off = -anat["mirror"] * r * 0.35   # shifted temporally so it shows as a crescent outside the rim
        ppa = _soft_ellipse(U, V, du + off, dv, r * 1.05, r * 1.05, 0.05)
        alb = _lerp(alb, (0.85, 0.62, 0.45), 2 * anat["ppa"] * ppa)
    alb = _lerp(alb, (0.98, 0.60, 0.36), _soft_ellipse(U, V, du, dv, r * 0.92, r, 0.05))
    cr = r * anat["cdr"]
    alb = _lerp(alb, (1.0, 0.97, 0.86), 0.97 * _soft_ellipse(U, V, du, dv, cr * 0.9, cr, 0.07))

    # vessels and lesions: drawn with PIL in image coordinates after applying the pose
    veins, arts, nvm, redm, exm, prhm = (_Canvas(size) for _ in range(6))
    for x0, y0, x1, y1, w, kind in anat["segs"]:
        a0, b0 = fwd(x0, y0)
        a1, b1 = fwd(x1, y1)
        (veins if kind == "vein" else arts).line(a0, b0, a1, b1, w * scale)
    for x0, y0, x1, y1, w in anat["nv"]:
        a0, b0 = fwd(x0, y0)
        a1, b1 = fwd(x1, y1)
        nvm.line(a0, b0, a1, b1, w * scale)
    for x, y, rr in anat["red"]:
        redm.disc(*fwd(x, y), rr * scale)
    for x, y, rr in anat["exud"]:
        exm.disc(*fwd(x, y), rr * scale)
    for x, y, rx, ry in anat["prh"]:
        prhm.disc(*fwd(x, y), ry * scale, rx=rx * scale)
    alb = _lerp(alb, (0.55, 0.10, 0.07), 0.8 * arts.array())
    alb = _lerp(alb, (0.38, 0.05, 0.05), 0.85 * veins.array())
    alb = _lerp(alb, (0.62, 0.08, 0.06), 0.9 * nvm.array())
    alb = _lerp(alb, (0.36, 0.03, 0.02), 0.92 * ndimage.gaussian_filter(redm.array(), 0.5))
    alb = _lerp(alb, (1.0, 0.90, 0.45), 0.95 * exm.array())
    alb = _lerp(alb, (0.25, 0.02, 0.02), 0.95 * ndimage.gaussian_filter(prhm.array(), 0.8))

    # illumination: radial falloff plus a random gradient, per-channel gain jitter, sensor noise
    cx, cy = rng.normal(0.0, 0.02, size=2)
    rho2 = (X - cx) ** 2 + (Y - cy) ** 2
    phi = rng.uniform(0, 2 * math.pi)
    illum = (1.0 - 0.42 * rho2 / 0.85 + rng.uniform(0.0, 0.12) * (X * math.cos(phi) + Y * math.sin(phi)))
    img = alb * (illum * rng.uniform(0.85, 1.05))[..., None] * rng.uniform(0.93, 1.07, size=3)
    img = img + rng.normal(0.0, 0.012, size=img.shape)

    # circular field of view on black
    fov = expit((0.92 - np.sqrt(rho2)) / 0.006)
    return np.clip(img, 0.0, 1.0) * fov[..., None]


# ----------------------------------------------------------------------------------------------------------
# OCT rendering
# ----------------------------------------------------------------------------------------------------------
# Reflectivity profile across the neurosensory retina in normalised depth t' (0 = ILM, 1 = RPE top):
# RNFL bright, GCL mid, IPL bright, INL dark, OPL bright, ONL dark and thick, ELM, EZ bright, IZ.
_T_PTS = np.array([0.00, 0.02, 0.10, 0.14, 0.23, 0.27, 0.34, 0.38, 0.44, 0.47, 0.51, 0.55, 0.80, 0.82, 0.835,
                   0.85, 0.87, 0.90, 0.92, 0.95, 0.97, 1.00])
_R_PTS = np.array([0.90, 0.80, 0.72, 0.42, 0.40, 0.62, 0.60, 0.26, 0.24, 0.58, 0.55, 0.14, 0.12, 0.35, 0.40,
                   0.20, 0.85, 0.80, 0.35, 0.55, 0.40, 0.85])
_T_INNER = 0.53  # t' at which the inner retina (ILM..OPL) ends


def oct_anatomy(rng, state: dict) -> dict:
    pockets, thick = [], []
    if state["dme"]:
        # ~30 % of oedematous eyes are mild (a few small cysts, little thickening) so the task is not trivial
        mild = rng.random() < 0.3
        for i in range(int(rng.integers(1, 4 if mild else 5))):
            # the first pocket is the central one (centre-involving DME); others are smaller cysts
            major = i == 0 and not mild
            x = float(np.clip(rng.normal(0.0, 0.06 if i == 0 else 0.18), -0.45, 0.45))
            a = rng.uniform(0.08, 0.14) if major else rng.uniform(0.035, 0.08)
            b = rng.uniform(0.2, 0.3) if major else rng.uniform(0.12, 0.2)
            t = rng.uniform(0.50, 0.68) if rng.random() < 0.7 else rng.uniform(0.36, 0.46)
            pockets.append((x, t, a, b))
            thick.append((x, 2.0 * a + 0.08, rng.uniform(0.45, 0.8) if major else rng.uniform(0.15, 0.4)))
    return {"T0": rng.uniform(0.28, 0.33), "pit_w": rng.uniform(0.15, 0.21), "chor": rng.uniform(0.12, 0.19),
            "pockets": pockets, "thick": thick, "chor_tex": rng.standard_normal((10, 36))}


def render_oct(rng, anat: dict, width: int, height: int) -> np.ndarray:
    """Render one B-scan (float gray in [0, 1]); tilt, depth, curvature, gain and speckle are per image."""
    x = (np.arange(width) + 0.5) / width * 2.0 - 1.0
    y = (np.arange(height) + 0.5) / height
    xf = x - rng.normal(0.0, 0.04)                    # position relative to the fovea
    rpe = rng.uniform(0.60, 0.66) - rng.uniform(0.03, 0.10) * x ** 2 + rng.normal(0.0, 0.04) * x
    T0 = anat["T0"]
    pit = np.exp(-(xf / anat["pit_w"]) ** 2)
    edema = np.zeros_like(x)
    for cx, w, amp in anat["thick"]:  # envelope (max), not sum, so clustered cysts don't make a spike
        edema = np.maximum(edema, amp * T0 * np.exp(-((xf - cx) / w) ** 2))
    t_in = _T_INNER * T0 * (1.0 - 0.85 * pit) + 0.6 * edema     # inner retina thins in the foveal pit
    t_out = (1 - _T_INNER) * T0 * (1.0 + 0.15 * pit) + 0.4 * edema
    ilm = rpe - t_in - t_out

    Yg = y[:, None]
    z = Yg - ilm[None, :]                             # depth below ILM
    tp = np.where(z < t_in, _T_INNER * z / t_in, _T_INNER + (1 - _T_INNER) * (z - t_in) / t_out)
    refl = np.interp(tp, _T_PTS, _R_PTS)

    # intraretinal fluid: hypo-reflective ellipses in (x, t') so they sit inside the thickened layers
    for cx, ct, a, b in anat["pockets"]:
        d = np.sqrt(((xf[None, :] - cx) / a) ** 2 + ((tp - ct) / b) ** 2)
        m = expit((1.0 - d) / 0.08)
        refl = refl * (1 - m) + 0.03 * m

    # RPE, choroid (vascular texture, eye-fixed), sclera; vitreous above the ILM
    d = Yg - rpe[None, :]
    rpe_t = 0.035
    chor_tex = ndimage.zoom(anat["chor_tex"], (height / 10, width / 36), order=3, grid_mode=True, mode="reflect")
    chor_tex = chor_tex[:height, :width]
    chor = np.clip(0.42 + 0.25 * chor_tex, 0.08, 0.9) * np.exp(-np.clip(d - rpe_t, 0, None) / (anat["chor"] * 0.9))
    deep = np.where(d < rpe_t, 0.95 - 2.0 * d, np.maximum(chor, 0.12))
    refl = np.where(d >= 0, deep, refl)
    refl = np.where(z < 0, 0.03, refl)

    # speckle: multiplicative gamma noise, slightly correlated laterally like a real scan
    speckle = rng.gamma(2.5, 1 / 2.5, size=refl.shape)
    img = ndimage.gaussian_filter(refl * speckle, (0.5, 0.9))
    img = img * rng.uniform(0.85, 1.1) + np.abs(rng.normal(0.0, 0.025, size=img.shape))
    return np.clip(img, 0.0, 1.0) ** 0.85
