"""Slurm routing: config/site.yaml (or $RETINABENCH_SITE) -> every rule's Slurm resources, for
snakemake-executor-plugin-slurm (docs/slurm.md). Rules only say what they need: `resources: gpu=N` (N may be a
function of the wildcards) plus mem_mb/runtime. apply_site_resources(), called once after the last rule, sends
jobs with N > 0 to the site's GPU partition with --gpus=<model>:N, --cpus-per-gpu and an optional constraint,
and every other job to its CPU partition; account and QoS go on every job. What a rule declares itself or a user
gives with --set-resources wins; --default-resources values win too, except over a GPU job's partition and GPU
settings. Other executors ignore these resources, so local runs are unchanged.

workflow/rules/resources.smk calls these with its ``workflow`` object."""
from __future__ import annotations

import math
import os
import platform
import sys

import yaml


class SiteError(ValueError):
    """Unreadable or incomplete Slurm site settings (config/site.yaml)."""


GPU_ROUTED = {"slurm_partition", "gpu_model", "cpus_per_gpu", "constraint", "slurm_extra"}
SITE_KEYS = {"arch", "cpu_partition", "gpu_partition", "gpu_model", "cpus_per_gpu", "gpu_constraint", "gpu_extra"}


def load_site(workflow, path=None, flavour=None):
    """The site settings (config/site.yaml unless $RETINABENCH_SITE) merged with the selected flavour."""
    path = path or os.environ.get("RETINABENCH_SITE") or os.path.join(workflow.basedir, "config", "site.yaml")
    try:
        with open(path) as fh:
            site = yaml.safe_load(fh) or {}
    except OSError as err:
        raise SiteError(f"Slurm site settings {path}: {err} (see docs/slurm.md)") from err
    flavours = site.get("flavours") or {}
    name = flavour or os.environ.get("RETINABENCH_SLURM_FLAVOUR") or site.get("flavour")
    if name not in flavours:
        raise SiteError(f"Slurm site settings {path}: flavour {name!r} is not one of {sorted(flavours)}")
    chosen = flavours[name] or {}
    unknown = set(chosen) - SITE_KEYS
    missing = {"cpu_partition", "gpu_partition"} - set(chosen)
    if unknown or missing:
        raise SiteError(
            f"Slurm site settings {path}, flavour {name}: unknown keys {sorted(unknown)}, "
            f"missing keys {sorted(missing)}"
        )
    return {
        "path": str(path),
        "flavour": name,
        "account": site.get("account"),
        "qos": site.get("qos"),
        **{k: chosen.get(k) for k in SITE_KEYS},
    }


def _explicit(workflow, job_rule, key, defaults_count=True):
    """Whether `key` was set for `job_rule` by the rule itself, by --set-resources or (if defaults_count) by
    --default-resources / the profile's default-resources."""
    if key not in job_rule.resources:
        return False
    settings = workflow.resource_settings
    if defaults_count or key in (settings.overwrite_resources or {}).get(job_rule.name, {}):
        return True
    defaults = settings.default_resources
    return not (defaults is not None and key in defaults and job_rule.resources[key] == defaults[key])


def _gpu_count(job_rule):
    """The job's GPU count from the rule's `gpu` resource: an int, or a function of the job (None: no GPU rule)."""
    if "gpu" not in job_rule.resources:
        return None
    resource = job_rule.resources["gpu"]
    if not resource.is_evaluable():
        return int(resource.value or 0) or None

    def count(wildcards, input, threads, attempt):
        return int(resource.evaluate(wildcards, input=input, threads=threads, attempt=attempt).value or 0)

    return count


def slurm_resources_for(job_rule, site):
    """The Slurm resources apply_site_resources() gives `job_rule`: values, or functions of the job for GPU rules."""
    out = {"slurm_account": site["account"], "qos": site["qos"], "slurm_partition": site["cpu_partition"]}
    count = _gpu_count(job_rule)
    if count is None:
        return out

    def per_job(gpu_value, otherwise=None):  # gpu_value(gpus, threads) for jobs with gpus > 0, else `otherwise`
        def value(wildcards, input, threads, attempt):
            n = count(wildcards, input, threads, attempt) if callable(count) else count
            return gpu_value(n, threads) if n > 0 else otherwise

        return value

    out.update(
        slurm_partition=per_job(lambda n, threads: site["gpu_partition"], otherwise=site["cpu_partition"]),
        gpu_model=per_job(lambda n, threads: site["gpu_model"]),
        cpus_per_gpu=per_job(lambda n, threads: max(int(site["cpus_per_gpu"] or 1), math.ceil(threads / n))),
        constraint=per_job(lambda n, threads: site["gpu_constraint"]),
        slurm_extra=per_job(lambda n, threads: site["gpu_extra"]),
    )
    return out


def apply_site_resources(workflow, site, rules=None):
    """Give every rule (or the given ones) its Slurm resources from the site settings; call after the last rule.
    A GPU rule's partition and GPU settings override default-resources; anything else set by the user is kept."""
    for job_rule in rules if rules is not None else workflow.rules:
        gpu_rule = _gpu_count(job_rule) is not None
        for key, value in slurm_resources_for(job_rule, site).items():
            defaults_count = not (gpu_rule and key in GPU_ROUTED)
            if value is not None and not _explicit(workflow, job_rule, key, defaults_count):
                job_rule.resources[key] = value


def warn_on_architecture(site) -> None:
    if site["arch"] and site["arch"] != platform.machine():
        print(f"retinabench: Slurm flavour {site['flavour']!r} runs on {site['arch']} nodes but this Python "
              f"is {platform.machine()}; jobs started from it would not run there (docs/slurm.md, GH200)",
              file=sys.stderr)
