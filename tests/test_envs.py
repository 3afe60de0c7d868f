"""envs/*.yaml (the rule groups' conda environments) agree with requirements.lock; every rule names one."""
import importlib.util
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("envs_sync", REPO / "envs" / "sync.py")
sync = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sync)


def env_pins(env: str) -> dict[str, str]:
    data = yaml.safe_load((REPO / "envs" / f"{env}.yaml").read_text())
    pip = next(d["pip"] for d in data["dependencies"] if isinstance(d, dict))
    return dict(line.split("==", 1) for line in pip)


def test_env_files_are_what_the_lock_gives():
    pins = sync.lock_pins()
    for env in sync.ENVS:
        assert (REPO / "envs" / f"{env}.yaml").read_text() == sync.render(env, pins), \
            f"envs/{env}.yaml is out of date with requirements.lock: run python envs/sync.py"


def test_every_env_pin_is_the_lock_pin_and_the_gpu_stack_stays_out_of_core():
    lock = {sync.canonical(k): v for k, v in sync.lock_pins().items()}
    for env in sync.ENVS:
        for name, version in env_pins(env).items():
            if env == "vllm" and f"{name}=={version}" == sync.VLLM:
                continue  # vLLM's own pin: deliberately not in the lock
            assert lock.get(sync.canonical(name)) == version, f"envs/{env}.yaml pins {name}=={version}, lock {lock.get(sync.canonical(name))}"
    core, gpu = env_pins("core"), env_pins("torch")
    assert "torch" not in core and "transformers" not in core and "snakemake" in core
    assert {"torch", "torchvision", "timm", "open_clip_torch", "transformers", "snakemake"} <= set(gpu)
    assert not {"pytest", "ruff", "snakefmt"} & (set(core) | set(gpu))


def test_every_rule_has_a_conda_environment_that_exists():
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    envs = dict(re.findall(r'^(\w+_ENV) = "([^"]+)"', common, re.M))
    assert set(envs) == {"CORE_ENV", "TORCH_ENV", "MLLM_ENV", "VLLM_ENV"}
    for path in envs.values():
        assert (REPO / "workflow" / "rules" / path).resolve().is_file(), path
    missing = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        blocks = re.split(r"^\s*rule\b", smk.read_text(), flags=re.M)[1:]
        for block in blocks:
            name = block.split(":", 1)[0].strip() or block.split("name:", 1)[-1].split()[0]
            body = re.split(r"^\S", block, flags=re.M)[0] if not block.startswith(":") else block
            if "script:" in body and not re.search(r"conda:\s*\n\s*\w+_ENV", body):
                missing.append(f"{smk.name}: {name}")
    assert not missing, f"rules without conda: {missing}"


def test_the_vllm_env_leaves_vllms_stack_to_vllm_and_pins_the_rest_as_the_lock():
    pins = env_pins("vllm")
    assert f"vllm=={pins.pop('vllm')}" == sync.VLLM
    names = {sync.canonical(n) for n in pins}
    assert not names & {"torch", "torchvision", "transformers", "numpy", "pydantic"}  # vLLM resolves these
    assert {"pandas", "pyarrow", "snakemake"} <= names
    interfaces = (REPO / "workflow" / "rules" / "interfaces.smk").read_text()
    assert re.search(r'MLLM_JOB_ENV = VLLM_ENV if .*backend == "vllm" else MLLM_ENV', interfaces)
