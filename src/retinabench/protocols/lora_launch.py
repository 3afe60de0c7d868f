"""One LoRA training job (rule ``mllm_lora_train``) as one process or as a torchrun process group.

:func:`train_job` is the whole job from a JSON-able spec (the job's input paths, registry entries and settings):
load the base MLLM strictly, render the source task's training split, train (:func:`retinabench.protocols.lora.
train_lora`) and, on rank 0, write the adapter's provenance sidecar. :func:`processes` decides how many processes:
one per GPU the job holds (``lora.processes: auto`` = the CUDA devices visible, at most the job's ``gpu``
resource) or the configured number. :func:`launch` runs the job in this process or, with more than one, launches
``python -m torch.distributed.run --standalone --nproc_per_node N -m retinabench.protocols.lora_launch SPEC`` —
each process finds its rank in the environment torchrun sets, puts the model on ``cuda:LOCAL_RANK`` (CPU: gloo),
and transformers' Trainer does the rest (DDP, gradient accumulation per process, rank-0 checkpoints). The process
group's output streams into the job's log; a failing rank fails the job with the group's exit status, the
exceptions the ranks raised and the last lines.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def local_device(device: str = "auto") -> str:
    """This process's device: under torchrun ``cuda:LOCAL_RANK`` (or ``cpu`` without CUDA), else ``device``."""
    import torch
    rank = os.environ.get("LOCAL_RANK")
    if rank is None:
        return device
    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{int(rank)}"


def train_job(spec: dict, log=print) -> dict:
    """Train one adapter from ``spec`` (see :func:`retinabench.pipeline.lora.training_spec`); rank 0 returns the
    record and writes the sidecar, other ranks return ``{"rank": n}``."""
    import torch

    from retinabench.data.image_cache import open_image_cache
    from retinabench.prompts import load_prompts
    from retinabench.models.adapters import write_adapter_sidecar
    from retinabench.models.mllm import load_mllm
    from retinabench.protocols.lora import LoraSettings, train_lora, training_examples
    from retinabench.schemas import read_table
    # the job's threads are shared by the processes of its group
    torch.set_num_threads(max(1, int(spec["threads"]) // int(os.environ.get("WORLD_SIZE", "1"))))
    settings = LoraSettings.of(spec["settings"], "lora.train")
    entry, task = spec["entry"], spec["task"]
    images, index = open_image_cache(spec["inputs"]["array"], spec["inputs"]["index"])
    manifest = read_table(spec["inputs"]["manifest"], "manifest")
    split = read_table(spec["inputs"]["split"], "split")
    prompts = load_prompts(spec["inputs"]["prompts"])
    examples, prompt = training_examples(images, list(index["image_id"]), manifest, split, task, prompts, settings)
    log(f"lora {entry['name']}/{task['name']}: {len(examples)} training examples "
        f"({sum(e.answer == 'yes' for e in examples)} yes), prompt set {prompt.set_name!r}")
    mllm = load_mllm(entry, spec.get("weights"), device=local_device(spec["device"]), dtype=spec["dtype"])
    record = train_lora(mllm, examples, prompt, spec["out_dir"], settings, entry=entry, task=task, log=log)
    if "rank" in record:
        return record
    write_adapter_sidecar(record["adapter"], record, rule=spec.get("rule", "mllm_lora_train"),
                          inputs=spec.get("provenance_inputs", []), wildcards=spec.get("wildcards"),
                          config=spec.get("config"))
    return record


def processes(setting: str | int, gpus: int) -> int:
    """How many training processes: ``auto`` = the CUDA devices visible, capped at the job's ``gpus`` (1 on CPU);
    an int as configured (CPU process groups use gloo; tests)."""
    if setting != "auto":
        n = int(setting)
        if n < 1:
            raise ValueError(f"lora.processes must be auto or >= 1, got {setting!r}")
        return n
    import torch
    return max(1, min(int(gpus), torch.cuda.device_count())) if torch.cuda.is_available() else 1


def launch(spec: dict, n_processes: int, log=print) -> dict | None:
    """Run :func:`train_job` in this process (``n_processes`` 1) or as a torchrun group of ``n_processes``
    (the spec handed over in a temporary file); returns rank 0's record in-process, None from a group (its
    outputs are on disk)."""
    if n_processes == 1:
        return train_job(spec, log=log)
    with tempfile.TemporaryDirectory(prefix="retinabench-lora-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec, indent=1, default=str))
        _run_group(spec, n_processes, spec_path, log)
    return None


def _run_group(spec: dict, n_processes: int, spec_path: Path, log) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n_processes}",
           "-m", "retinabench.protocols.lora_launch", str(spec_path)]
    log(f"lora: launching {n_processes} processes: {' '.join(cmd)}")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, int(spec["threads"]) // n_processes))}
    tail: list[str] = []
    errors: list[str] = []  # the ranks' own exceptions (torchrun's summary that follows them names no cause)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            line = line.rstrip("\n")
            log(line)
            tail = (tail + [line])[-15:]
            if _EXCEPTION.match(line) and line not in errors and "ChildFailedError" not in line:
                errors.append(line)
    if proc.returncode != 0:
        raise RuntimeError(f"lora: the torchrun group of {n_processes} processes failed (exit {proc.returncode}); "
                           "the ranks raised:\n" + ("\n".join(errors) or "(no exception line)")
                           + "\nlast lines:\n" + "\n".join(tail))


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m retinabench.protocols.lora_launch SPEC.json (under torchrun)")
    spec = json.loads(Path(argv[0]).read_text())
    rank = os.environ.get("RANK", "0")
    train_job(spec, log=lambda msg: _rank_line(rank, msg))


def _rank_line(rank: str, msg: str) -> None:
    """One write per line: the ranks share one pipe, and print() writes the text and its newline separately when
    stdout is unbuffered (PYTHONUNBUFFERED), so two ranks' lines could interleave mid-line."""
    sys.stdout.write(f"[rank {rank}] {msg}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
