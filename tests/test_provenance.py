import json

import pytest

from retinabench.provenance import format_chain, provenance_chain, read_sidecar, sidecar_path, write_sidecar


def make_chain(tmp_path):
    raw = tmp_path / "raw.csv"
    raw.write_text("a,b\n1,2\n")
    mid = tmp_path / "mid.parquet"
    mid.write_bytes(b"mid")
    write_sidecar(mid, rule="manifest", inputs=[raw], wildcards={"dataset": "d"}, config={"k": 1},
                  extra={"raw_files": [{"path": str(raw), "sha256": "ab" * 32, "note": "index file"}]})
    top = tmp_path / "fig.png"
    top.write_bytes(b"png")
    write_sidecar(top, rule="figure", inputs=[mid], seed=3,
                  extra={"weights": {"file": "w.pth", "sha256": "cd" * 32, "source": "packaged"}})
    return raw, mid, top


def test_sidecar_records_what_the_issue_asks(tmp_path):
    _, mid, top = make_chain(tmp_path)
    rec = read_sidecar(top)
    for key in ("rule", "wildcards", "inputs", "config", "code", "packages", "seed", "created", "host", "sha256"):
        assert key in rec
    assert rec["inputs"][0]["path"] == str(mid) and len(rec["inputs"][0]["sha256"]) == 64
    assert rec["seed"] == 3 and "torch" in rec["packages"] and "commit" in rec["code"]
    assert json.loads(sidecar_path(mid).read_text())["wildcards"] == {"dataset": "d"}


def test_chain_walks_to_raw_and_flags_changed_inputs(tmp_path):
    raw, mid, top = make_chain(tmp_path)
    nodes = provenance_chain(top)
    assert [n["path"] for n in nodes] == [str(top), str(mid), str(raw)]
    assert [n["depth"] for n in nodes] == [0, 1, 2]
    assert not any(n["stale"] for n in nodes)
    text = format_chain(top)
    assert "rule figure" in text and "rule manifest[dataset=d]" in text
    assert "raw data:" in text and "weights:" in text and "cd" * 32 in text
    raw.write_text("tampered\n")
    assert "[CHANGED since used]" in format_chain(top)


def test_missing_input_or_sidecar_is_an_error(tmp_path):
    art = tmp_path / "x.parquet"
    art.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_sidecar(art, rule="r", inputs=[tmp_path / "nope"])
    with pytest.raises(FileNotFoundError, match="no provenance sidecar"):
        read_sidecar(art)


def test_a_folder_artifact_records_every_file_and_goes_stale_when_one_changes(tmp_path):
    from retinabench.provenance import folder_digest, folder_files, provenance_chain, read_sidecar, write_sidecar
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text("{}")
    (d / "adapter_model.safetensors").write_bytes(b"weights")
    write_sidecar(d, rule="train")
    rec = read_sidecar(d)
    assert set(rec["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert rec["sha256"] == folder_digest(folder_files(d))
    out = tmp_path / "preds.parquet"
    out.write_bytes(b"x")
    write_sidecar(out, rule="infer", inputs=[d])
    assert [n["stale"] for n in provenance_chain(out)] == [False, False]
    (d / "adapter_model.safetensors").write_bytes(b"other")
    assert [n["stale"] for n in provenance_chain(out)] == [False, True]
