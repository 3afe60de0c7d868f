"""A random-init encoder (``init: random``) starts from a distinct initialisation per run seed (fine-tuning and the
learning-rate sweep), the same one for the same seed; without a seed (the frozen protocols' cached features) from
the entry's one documented initialisation."""
import pandas as pd
import pytest
import torch

from retinabench.models.encoder import build_encoder, entry_seed

VIT = {"name": "vit_micro", "source": "timm", "architecture": "test_vit", "init": "random", "input_size": 32,
       "normalization": "imagenet", "pooling": "cls", "size_class": "tiny"}


def weights(encoder) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in encoder.module.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_seeds_give_different_weights_and_one_seed_the_same():
    s0, s0_again, s1 = (weights(build_encoder(VIT, seed=s)) for s in (0, 0, 1))
    assert same(s0, s0_again)
    assert not same(s0, s1)
    # every weight tensor that is drawn at random differs, not just one
    drawn = [k for k in s0 if s0[k].numel() > 1 and s0[k].std() > 0]
    assert drawn and all(not torch.equal(s0[k], s1[k]) for k in drawn)
    torch.manual_seed(123)  # the global RNG state before the build does not matter: the init is seeded
    assert same(weights(build_encoder(VIT, seed=1)), s1)


def test_without_a_seed_the_entrys_one_documented_initialisation():
    none, none_again, s0 = (weights(build_encoder(VIT, seed=s)) for s in (None, None, 0))
    assert same(none, none_again) and not same(none, s0)
    enc = build_encoder(VIT, seed=2)
    assert enc.weights["seed"] == entry_seed(VIT, 2) != entry_seed(VIT) and enc.weights["run_seed"] == 2
    assert build_encoder(VIT).weights["seed"] == entry_seed(VIT)


def test_the_sweep_trains_each_seed_from_its_own_initialisation(monkeypatch):
    """run_sweep_stage builds a random-init encoder once per seed and hands each run its seed's encoder."""
    from retinabench.protocols import sweep
    from retinabench.protocols.finetune import DivergedError, TrainConfig
    given = []

    def fake_run(*args, seed, encoder, **kw):
        given.append((seed, weights(encoder)))
        raise DivergedError("stop here")  # a diverged run is recorded; the test needs only the encoders handed over

    monkeypatch.setattr(sweep, "run_finetune", fake_run)
    with pytest.raises(DivergedError, match="every run diverged"):
        sweep.run_sweep_stage(1, "unused.npy", pd.DataFrame(), pd.DataFrame(), {"name": "t", "classes": ["a", "b"]},
                              VIT, grid=[1e-3, 1e-2], seeds=[0, 1], regimes=["u-u"], cfg=TrainConfig(),
                              log=lambda m: None)
    assert [s for s, _ in given] == [0, 1, 0, 1]
    by_seed = {s: w for s, w in given}
    assert same(by_seed[0], weights(build_encoder(VIT, seed=0))) and not same(by_seed[0], by_seed[1])
