"""Snakemake `script:` entry: turn the rule's job into a plain Job and call the stage registered under the rule's name
(retinabench.pipeline.stages)."""
import contextlib
import importlib.util
import sys
import traceback
from pathlib import Path

sm = snakemake  # noqa: F821 - injected by Snakemake
if importlib.util.find_spec("retinabench") is None:  # a conda environment (--sdm conda): this checkout's package
    sys.path.insert(0, str(Path(sm.scriptdir).parents[1] / "src"))

from retinabench.pipeline import Job, run_stage  # noqa: E402
from retinabench.plan.core import merge_locations  # noqa: E402
# `locations` (retinabench.plan.CorePlan.located): paths kept out of the params rerun trigger, merged back here
job = Job(rule=sm.rule, input=dict(sm.input.items()), output=dict(sm.output.items()),
          params=merge_locations(dict(sm.params.items())), wildcards=dict(sm.wildcards.items()),
          threads=sm.threads)
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
        run_stage(sm.rule, job)
    except BaseException:
        traceback.print_exc(file=log)
        raise
