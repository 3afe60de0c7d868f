"""The `locations` param (CorePlan.located): derived in Snakemake's sense (left out of the params rerun trigger),
merged back into a job's params by workflow/scripts/stage.py."""
from snakemake.rules import Rule

from retinabench.plan.core import CorePlan, merge_locations


class WC:
    dataset = "d1"


def test_located_is_a_derived_param_and_evaluates_per_job():
    fn = CorePlan.located(root=lambda wc: f"/data/{wc.dataset}", fixed={"a": "/x"})
    assert Rule._is_deriving_function(fn)  # Snakemake leaves such params out of its params record
    assert fn(WC, []) == {"root": "/data/d1", "fixed": {"a": "/x"}}


def test_merge_locations_merges_mappings_key_by_key():
    params = {"job": {"entry": 1, "settings": {"a": 1}}, "code": "h",
              "locations": {"job": {"roots": {"d1": "/r"}, "settings": {"b": 2}}, "root": "/data/d1"}}
    assert merge_locations(params) == {"job": {"entry": 1, "settings": {"a": 1, "b": 2}, "roots": {"d1": "/r"}},
                                       "code": "h", "root": "/data/d1"}
    assert merge_locations({"code": "h"}) == {"code": "h"}
