"""Compute benchmark on two tiny timm models (CPU): table columns, monotonic sanity, repeat-run agreement, the
FLOP counter and the peak-memory measure. No assertion on absolute times."""
import numpy as np
import pytest
import torch

from retinabench.compute import COMPUTE_COLUMNS, PeakMemory, benchmark_encoder, count_flops
from retinabench.settings import ComputeSettings, ConfigError, FinetuneSettings

pytestmark = pytest.mark.slow  # trains real models / starts process groups: left out of make test-fast


def entry(name, arch, size=64):
    return {"name": name, "source": "timm", "architecture": arch, "init": "random", "input_size": size,
            "normalization": "imagenet", "pooling": "avg", "size_class": "tiny", "domain": "none"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """In-process work (FLOP counting) on one torch thread; the workers get `threads: 1` from SETTINGS."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SMALL, LARGE = entry("small", "test_resnet"), entry("large", "resnet18")  # 0.37 M vs 11.2 M parameters
SETTINGS = ComputeSettings.from_config({"compute": {"threads": 1, "inference": {"warmup": 3},
                                                    "training": {"batch_size": 8, "warmup": 2, "steps": 6,
                                                                 "distinct_batches": 2}}}).plain()


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compute")
    arr = tmp / "images.npy"
    np.save(arr, np.random.default_rng(0).integers(0, 255, (40, 64, 64, 3), dtype=np.uint8))
    kw = dict(test_rows=range(16), train_rows=range(16, 40), train_labels=[0, 1, 2] * 8, n_classes=3,
              settings=SETTINGS, train_settings=FinetuneSettings().plain(), task="t")
    return {"small": benchmark_encoder(SMALL, arr, **kw), "large": benchmark_encoder(LARGE, arr, **kw),
            "small_again": benchmark_encoder(SMALL, arr, **kw)}


def test_table_columns_and_records(tables):
    t = tables["small"]
    assert list(t.columns) == COMPUTE_COLUMNS
    assert list(t["phase"]) == ["inference", "finetune", "linear_aug"]
    assert set(t["device"]) == {"cpu"} and set(t["dtype"]) == {"fp32"} and set(t["threads"]) == {1}
    assert list(t["batch_size"]) == [1, 8, 8] and list(t["n_timed"]) == [16, 6, 6]
    assert set(t["peak_mem_kind"]) <= {"rss_hwm_delta", "rss_maxrss_delta"}
    assert t["torch"].iloc[0] == torch.__version__ and t["timm"].notna().all() and (t["task"] == "t").all()
    assert (t["seconds_p90"] >= t["seconds_median"]).all() and (t["seconds_median"] > 0).all()
    assert (t["peak_mem_mb"] >= t["model_mem_mb"]).all() and (t["model_mem_mb"] > 0).all()
    assert t["gflops"].nunique() == 1 and (t["gmacs"] * 2 == t["gflops"]).all()
    inf, ft, lp = (t.set_index("phase").loc[p] for p in ("inference", "finetune", "linear_aug"))
    head = 96 * 3 + 3  # test_resnet's 96-d embedding -> 3 classes
    assert inf["n_trainable"] == 0 and ft["n_params"] == inf["n_params"] + head == ft["n_trainable"]
    assert lp["n_trainable"] == head and lp["n_params"] == ft["n_params"]


def test_the_larger_model_is_slower_and_uses_more_memory(tables):
    s, l = (tables[k].set_index("phase") for k in ("small", "large"))
    assert l["n_params"].iloc[0] > 10 * s["n_params"].iloc[0] and l["gflops"].iloc[0] > 5 * s["gflops"].iloc[0]
    for phase in ("inference", "finetune", "linear_aug"):
        assert l.loc[phase, "seconds_median"] > s.loc[phase, "seconds_median"], phase
        assert l.loc[phase, "peak_mem_mb"] > s.loc[phase, "peak_mem_mb"], phase
    for t in (s, l):  # training the whole encoder costs more than training its head
        assert t.loc["finetune", "seconds_median"] > t.loc["linear_aug", "seconds_median"]
        assert t.loc["finetune", "peak_mem_mb"] > t.loc["linear_aug", "peak_mem_mb"]
    # Full fine-tuning keeps weights + gradients + two AdamW moments: > 3x the weights of resnet18 resident.
    assert l.loc["finetune", "peak_mem_mb"] > 3 * l.loc["inference", "model_mem_mb"]


def test_a_repeat_run_measures_the_same_work(tables):
    """What a repeat must reproduce exactly: the model, the FLOPs and what was timed. How close its seconds come is
    a property of the machine, not of the code (load on a shared 2-core runner moved a median 5x)."""
    a, b = (tables[k].set_index("phase") for k in ("small", "small_again"))
    for column in ("n_params", "n_trainable", "gflops", "batch_size", "n_timed", "threads"):
        assert (a[column] == b[column]).all(), column
    assert np.isfinite(b["seconds_median"]).all() and (b["seconds_median"] > 0).all()


def test_flop_counter_counts_attention_on_cpu():
    import timm
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=64).eval()
    fused = count_flops(vit, 64)  # scaled_dot_product_attention -> the CPU flash kernel
    for block in vit.blocks:
        block.attn.fused_attn = False  # explicit q @ k^T and attn @ v matmuls
    assert count_flops(vit, 64) == fused
    resnet = timm.create_model("resnet18", num_classes=0).eval()
    assert count_flops(resnet, 224) / 1e9 == pytest.approx(3.63, abs=0.01)  # 1.82 GMACs, the known figure


def test_peak_memory_sees_a_transient_allocation():
    from retinabench.compute.memory import baseline_rss_mb
    mem = PeakMemory(torch.device("cpu"), baseline_rss_mb()).start()
    x = torch.ones(25_000_000)  # 100 MB, freed before the peak is read
    del x
    assert mem.kind == "rss_hwm_delta"
    assert 90 < mem.peak_mb() < 200


def test_settings_defaults_and_errors():
    s = ComputeSettings.from_config({})
    assert s.inference.batch_size == 1 and s.training.batch_size == 64
    assert s.training.steps == 25 and s.training.protocols == ["finetune", "linear_aug"]
    assert ComputeSettings.from_config({"compute": {"training": {"steps": 5}}}).training.batch_size == 64
    with pytest.raises(ConfigError, match="compute.step: unknown key; known keys of compute: enabled, encoders, task"):
        ComputeSettings.from_config({"compute": {"step": 5}})
    with pytest.raises(ConfigError, match="compute.training.step: unknown key; did you mean 'compute.training.steps'"):
        ComputeSettings.from_config({"compute": {"training": {"step": 5}}})
    with pytest.raises(ConfigError, match="compute.training.protocols\\[0\\]: Input should be 'finetune' or"):
        ComputeSettings.from_config({"compute": {"training": {"protocols": ["lora"]}}})


def test_a_failing_worker_raises_with_its_traceback(tmp_path):
    arr = tmp_path / "images.npy"
    np.save(arr, np.zeros((4, 32, 32, 3), np.uint8))
    with pytest.raises(RuntimeError, match="compute benchmark of broken failed"):
        benchmark_encoder(entry("broken", "no_such_architecture"), arr, test_rows=[0], train_rows=[1, 2],
                          train_labels=[0, 1], n_classes=2, settings=SETTINGS, train_settings=FinetuneSettings().plain())
