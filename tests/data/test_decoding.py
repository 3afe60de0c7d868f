"""The one raw-image decoder (retinabench.data.readers.decode_image): every pixel format converted explicitly, pinned
by generated images of known pixel means; nothing else in src/ opens a raw image."""
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from retinabench.data.readers import ImageReadError, decode_image, scale_to_uint8, to_rgb

SRC = Path(__file__).resolve().parents[2] / "src" / "retinabench"


def halves(low, high, dtype, size=(32, 64)):
    """Top half ``low``, bottom half ``high``: the decoded mean is the mean of the two decoded values."""
    h, w = size
    arr = np.full((h, w), high, dtype=dtype)
    arr[: h // 2] = low
    return arr


def rgb(path) -> np.ndarray:
    decoded = decode_image(path)
    assert decoded.image.mode == "RGB"
    return np.asarray(decoded.image)


def test_16bit_grey_png_is_scaled_by_its_bit_depth_not_clipped(tmp_path):
    Image.fromarray(halves(47 * 257, 48 * 257, np.uint16)).save(tmp_path / "oct16.png")
    assert Image.open(tmp_path / "oct16.png").mode == "I;16"
    out = rgb(tmp_path / "oct16.png")
    assert out.mean() == 47.5 and np.array_equal(out[..., 0], out[..., 2])  # grey replicated to 3 channels
    assert decode_image(tmp_path / "oct16.png").mode == "I;16"  # the stored format, as the decode pass records it
    Image.fromarray(halves(0, 65535, np.uint16)).save(tmp_path / "ends.png")
    assert set(np.unique(rgb(tmp_path / "ends.png"))) == {0, 255}


def test_16bit_big_endian_tiff_and_16bit_pgm(tmp_path):
    big = halves(47 * 257, 48 * 257, ">u2")
    Image.frombytes("I;16B", big.shape[::-1], big.tobytes()).save(tmp_path / "be.tif")
    assert Image.open(tmp_path / "be.tif").mode == "I;16B"
    assert rgb(tmp_path / "be.tif").mean() == 47.5
    Image.fromarray(halves(47 * 257, 48 * 257, np.uint16)).save(tmp_path / "scan.pgm")
    assert Image.open(tmp_path / "scan.pgm").mode == "I"
    assert rgb(tmp_path / "scan.pgm").mean() == 47.5


def test_16bit_colour_keeps_its_high_byte(tmp_path):
    import tifffile
    arr = np.zeros((16, 16, 3), np.uint16)
    arr[..., 0], arr[..., 1], arr[..., 2] = 47 * 257, 65535, 128 * 256
    tifffile.imwrite(tmp_path / "rgb16.tif", arr, photometric="rgb")
    assert rgb(tmp_path / "rgb16.tif").reshape(-1, 3).mean(axis=0).tolist() == [47.0, 255.0, 128.0]


def test_32bit_integer_tiffs_by_their_declared_range(tmp_path):
    import tifffile
    full = 2 ** 32 - 1
    unsigned = halves(round(47 / 255 * full), round(48 / 255 * full), np.uint32)
    tifffile.imwrite(tmp_path / "u32.tif", unsigned)
    assert Image.open(tmp_path / "u32.tif").mode == "I"
    assert rgb(tmp_path / "u32.tif").mean() == 47.5
    signed = (unsigned.astype(np.int64) - 2 ** 31).astype(np.int32)  # Pillow writes mode I as signed 32-bit
    Image.fromarray(signed).save(tmp_path / "s32.tif")
    assert rgb(tmp_path / "s32.tif").mean() == 47.5
    tifffile.imwrite(tmp_path / "s16.tif", halves(-32768, 32767, np.int16))  # signed 16-bit: mode I
    assert rgb(tmp_path / "s16.tif").mean() == 127.5


def test_float_images_follow_the_documented_rule(tmp_path):
    Image.fromarray(halves(47 / 255, 48 / 255, np.float32)).save(tmp_path / "unit.tif")  # [0, 1]: x 255
    assert Image.open(tmp_path / "unit.tif").mode == "F"
    assert rgb(tmp_path / "unit.tif").mean() == 47.5
    Image.fromarray(halves(47.0, 48.0, np.float32)).save(tmp_path / "byte.tif")  # within [0, 255]: as is
    assert rgb(tmp_path / "byte.tif").mean() == 47.5
    Image.fromarray(halves(-10.0, 1000.0, np.float32)).save(tmp_path / "wide.tif")  # otherwise: min-max
    assert rgb(tmp_path / "wide.tif").mean() == 127.5
    np.savez(tmp_path / "unit.npz", fundus=halves(47 / 255, 48 / 255, np.float32))  # NPZ floats: the same rule
    assert rgb(tmp_path / "unit.npz").mean() == 47.5


def test_palette_goes_through_its_palette_and_transparency_to_black(tmp_path):
    pal = Image.fromarray(halves(0, 1, np.uint8), "P")
    pal.putpalette([10, 20, 30, 200, 100, 50])
    pal.save(tmp_path / "p.png")
    out = rgb(tmp_path / "p.png")
    assert out.reshape(-1, 3).mean(axis=0).tolist() == [105.0, 60.0, 40.0]
    pal.save(tmp_path / "pt.png", transparency=0)  # index 0 transparent: black
    out = rgb(tmp_path / "pt.png")
    assert out.reshape(-1, 3).mean(axis=0).tolist() == [100.0, 50.0, 25.0]


def test_alpha_is_composited_onto_black(tmp_path):
    arr = np.zeros((32, 64, 4), np.uint8)
    arr[:16] = (200, 100, 50, 255)
    arr[16:] = (255, 255, 255, 0)  # transparent white: dropping alpha would show it
    Image.fromarray(arr, "RGBA").save(tmp_path / "rgba.png")
    assert rgb(tmp_path / "rgba.png").reshape(-1, 3).mean(axis=0).tolist() == [100.0, 50.0, 25.0]
    Image.fromarray(arr[..., [0, 3]], "LA").save(tmp_path / "la.png")
    assert rgb(tmp_path / "la.png").mean() == 100.0
    half = np.full((8, 8, 4), (200, 100, 50, 128), np.uint8)  # 50 % alpha: each channel x 128/255
    Image.fromarray(half, "RGBA").save(tmp_path / "half.png")
    assert np.abs(rgb(tmp_path / "half.png")[0, 0].astype(int) - [100, 50, 25]).max() <= 1


@pytest.mark.parametrize("suffix,tolerance", [(".tif", 0), (".jpg", 2)])
def test_cmyk_to_rgb(tmp_path, suffix, tolerance):
    c, m, y, k = 10, 20, 30, 40
    Image.new("CMYK", (32, 32), (c, m, y, k)).save(tmp_path / f"cmyk{suffix}")
    assert Image.open(tmp_path / f"cmyk{suffix}").mode == "CMYK"
    expected = [(255 - v) * (255 - k) / 255 for v in (c, m, y)]  # (207, 198, 190)
    got = rgb(tmp_path / f"cmyk{suffix}").reshape(-1, 3).mean(axis=0)
    assert np.abs(got - expected).max() <= tolerance + 0.5


def test_exif_orientation_is_applied(tmp_path):
    arr = np.zeros((20, 40, 3), np.uint8)  # stored 40 wide x 20 high, left half white
    arr[:, :20] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation 6: shown rotated 90 degrees clockwise
    Image.fromarray(arr).save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    decoded = decode_image(tmp_path / "rotated.jpg")
    assert decoded.size == (20, 40)  # shown 20 wide x 40 high
    out = np.asarray(decoded.image).astype(float)
    assert out[:18].mean() > 250 and out[22:].mean() < 5  # the stored left half is the shown top half


def test_dicom_scaled_by_bits_stored_and_monochrome1_inverted_within_it(tmp_path):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid
    arr = np.zeros((32, 32), np.uint16)
    arr[:8] = 4095  # a quarter at the 12-bit maximum: mean 255 / 4
    for photometric, mean in (("MONOCHROME2", 63.75), ("MONOCHROME1", 191.25)):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.77.1.5.4"
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
        ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = 32, 32, 1, photometric
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.PixelData = arr.tobytes()
        ds.save_as(tmp_path / f"{photometric}.dcm", enforce_file_format=True)
        assert rgb(tmp_path / f"{photometric}.dcm").mean() == mean


def test_what_cannot_be_converted_faithfully_is_an_error_naming_it(tmp_path):
    with pytest.raises(ImageReadError, match="mode I declares no value range"):
        to_rgb(Image.new("I", (4, 4)))
    with pytest.raises(ImageReadError, match=r"mode\) LAB is not supported"):
        to_rgb(Image.new("LAB", (4, 4)))
    with pytest.raises(ImageReadError, match="exceed the declared range 0..4095"):
        scale_to_uint8(np.array([0, 5000]), 0, 4095)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ImageReadError, match="bad.png"):
        decode_image(tmp_path / "bad.png")


def test_no_other_module_decodes_a_raw_image():
    """Every raw image goes through readers.decode_image: no Image.open / bare convert("RGB") elsewhere."""
    allowed = {"data/readers.py",
               "pipeline/job.py"}  # job.py opens a written output figure for its pixel size only
    pattern = re.compile(r"Image\.open\(|\.convert\(\s*[\"']RGB[\"']\s*\)|\bopen_image\(")
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if str(p.relative_to(SRC)) not in allowed and pattern.search(p.read_text())]
    assert offenders == [], f"decode raw images with retinabench.data.readers.decode_image: {offenders}"


def test_datasets_check_names_images_under_the_minimum(tmp_path, registries, monkeypatch, capsys):
    from retinabench import cli
    from retinabench.data.check import check_dataset
    from retinabench.testing.raw_fixtures import write_fixture
    root = write_fixture("grape", tmp_path, registries.datasets)
    tiny = sorted(p for p in root.rglob("*.jpg"))[0]
    Image.new("RGB", (1, 1)).save(tiny)
    r = check_dataset("grape", registries.datasets["grape"], tmp_path, decode=10)
    assert r.status == "ok" and r.n_decoded == 4
    assert [d for d in r.details if "too_small" in d] == [
        f"{tiny.relative_to(root)}: too_small (1x1 < 32 px short side); the manifest job will exclude it "
        "(images.min_side)"]
    assert not any("too_small" in d for d in check_dataset("grape", registries.datasets["grape"], tmp_path,
                                                            decode=10, min_side=1).details)
    monkeypatch.chdir(SRC.parents[1])
    # The CLI names the small image; the 4-image fixture is also too small for the run's splits (the sizing check),
    # so the dataset is not ready.
    assert cli.main(["datasets", "--check", "--data-root", str(tmp_path), "--dataset", "grape"]) == 1
    out = capsys.readouterr().out
    assert "too_small (1x1 < 32 px short side)" in out and "too small for the run:" in out
