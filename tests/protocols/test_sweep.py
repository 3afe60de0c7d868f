"""Two-stage learning-rate sweep: the choice (lowest validation loss, ties -> smaller lr), both stages on tiny
data, the chosen-LR record and the sensitivity table."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retinabench.protocols.finetune import DivergedError, TrainConfig
from retinabench.protocols.sweep import (RUNS_COLUMNS, SENSITIVITY_COLUMNS, choose_lr, chosen_record, run_sweep_stage,
                                         sensitivity_table)
from retinabench.settings import ConfigError, SweepSettings

sys.path.insert(0, str(Path(__file__).parent))
from test_finetune import TASK, VIT, make_data  # noqa: E402



def runs(losses: dict[float, list[float]], lr_name="lr_classifier", diverged=()):
    rows = [{"lr": lr, "seed": s, "best_val_loss": v, "lr_name": lr_name, "diverged": lr in diverged}
            for lr, vals in losses.items() for s, v in enumerate(vals)]
    return pd.DataFrame(rows)


def test_choose_lr_is_the_argmin_of_the_seed_mean_validation_loss():
    lr, table = choose_lr(runs({1e-4: [0.9, 0.7], 1e-3: [0.5, 0.7], 1e-2: [0.4, 1.0]}))
    assert lr == 1e-3 and table["val_loss"].tolist() == pytest.approx([0.8, 0.6, 0.7])
    assert choose_lr(runs({1e-4: [0.5], 1e-3: [0.5], 1e-2: [0.6]}))[0] == 1e-4  # tie: the smaller lr
    assert choose_lr(runs({1e-3: [np.inf], 1e-2: [0.9]}, diverged={1e-3}))[0] == 1e-2  # diverged = +inf
    with pytest.raises(DivergedError, match="every learning rate"):
        choose_lr(runs({1e-3: [np.inf]}, diverged={1e-3}))


def test_grids_tasks_and_settings():
    s = SweepSettings.from_config({"sweep": {"encoders": {"a": {"lr_encoder": [1e-3, 1e-5]}}}})
    assert s.grid("a") == {"lr_classifier": [1e-4, 1e-3, 1e-2], "lr_encoder": [1e-5, 1e-3]}
    assert s.grid("b")["lr_encoder"] == [1e-7, 1e-6, 1e-5, 1e-4, 1e-3]
    assert s.tasks(["t1", "t2", "t3"]) == ("t1", "t2")
    assert s.model_copy(update={"task": "t3", "sensitivity_task": None}).tasks(["t1", "t3"]) == ("t3", None)
    with pytest.raises(ConfigError, match="sweep.lr: unknown key"):
        SweepSettings.from_config({"sweep": {"lr": [1]}})
    with pytest.raises(ConfigError, match="sweep.encoders.a.lr_encoder\\[0\\]: Input should be greater than 0"):
        SweepSettings.from_config({"sweep": {"encoders": {"a": {"lr_encoder": [0.0]}}}})
    with pytest.raises(ConfigError, match="repeated: \\[0.001\\]"):
        SweepSettings.from_config({"sweep": {"lr_encoder": [1e-3, 1e-3]}})


def test_two_stages_pick_the_argmin_and_chain(tmp_path):
    arr, index, split = make_data(tmp_path)
    cfg = TrainConfig(epochs=3, steps_per_epoch=2, batch_size=8, eval_batch_size=48)
    kw = dict(seeds=[0], regimes=["u-u", "u-b"], cfg=cfg, log=lambda m: None)
    m1, r1 = run_sweep_stage(1, arr, index, split, TASK, VIT, grid=[1e-3, 1e-1], **kw)
    assert list(r1.columns) == RUNS_COLUMNS and r1["protocol"].unique().tolist() == ["linear_aug"]
    assert sorted(m1["lr"].unique()) == [1e-3, 1e-1] and set(m1["split"]) == {"val", "test"}
    lr_c, _ = choose_lr(r1)
    assert lr_c == r1.loc[r1["best_val_loss"].idxmin(), "lr"]
    with pytest.raises(ValueError, match="needs the lr_classifier"):
        run_sweep_stage(2, arr, index, split, TASK, VIT, grid=[1e-4], **kw)
    m2, r2 = run_sweep_stage(2, arr, index, split, TASK, VIT, grid=[1e-5, 1e-3], lr_classifier=lr_c, **kw)
    assert set(r2["lr_classifier"]) == {lr_c} and set(m2["protocol"]) == {"finetune"}
    rec = chosen_record("vit_micro", "t", r1, r2)
    assert rec["lr_classifier"] == lr_c and rec["lr_encoder"] == r2.loc[r2["best_val_loss"].idxmin(), "lr"]
    assert "validation loss" in rec["criterion"] and len(rec["stage2"]) == 2
    other = 1e-1 if lr_c == 1e-3 else 1e-3
    with pytest.raises(ValueError, match="out of date"):
        chosen_record("vit_micro", "t", r1, r2.assign(lr_classifier=other))
    sens = sensitivity_table(pd.concat([m1, m2]), pd.concat([r1, r2]))
    assert list(sens.columns) == SENSITIVITY_COLUMNS
    assert set(sens["stage"]) == {1, 2} and (sens["n_suboptimal"] == 1).all()


def test_sensitivity_table_values():
    metrics = pd.DataFrame([
        {"encoder": "e", "task": "t", "stage": 2, "regime": "u-u", "split": "test", "metric": "accuracy",
         "lr": lr, "seed": s, "value": v}
        for lr, vals in {1e-5: [0.6, 0.8], 1e-4: [0.9, 0.9], 1e-3: [0.5, 0.5]}.items() for s, v in enumerate(vals)])
    r = runs({1e-5: [0.5, 0.5], 1e-4: [0.3, 0.3], 1e-3: [0.7, 0.7], 1e-2: [np.inf, np.inf]}, "lr_encoder",
             diverged={1e-2}).assign(encoder="e", task="t", stage=2)
    row = sensitivity_table(metrics, r).iloc[0]
    assert row["lr_optimal"] == 1e-4 and row["value_optimal"] == pytest.approx(0.9)
    assert row["value_suboptimal_mean"] == pytest.approx(0.6) and row["n_suboptimal"] == 2
    assert row["drop"] == pytest.approx(0.3) and row["n_diverged"] == 1 and row["protocol"] == "finetune"
