"""Stage of workflow/rules/features.smk: one (encoder, dataset) embedding table (retinabench.features)."""
from __future__ import annotations

import time

from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.stages import stage


@stage("features", "protocol_sensitivity_features")
def stage_features(job: Job) -> None:
    import torch
    from retinabench.features.extract import build_probe_encoder, extract_features
    torch.set_num_threads(max(1, job.threads))
    entry, p = job.params["encoder"], job.params["features"]
    t0 = time.perf_counter()
    encoder = build_probe_encoder(entry, p["probe_embedding"])
    info = extract_features(encoder, job.input["array"], job.input["index"], job.output["features"],
                            batch_size=p["batch_size"], device=p["device"], progress=True)
    info["seconds"] = round(time.perf_counter() - t0, 2)
    write_outputs(job, written=[job.output["features"]], config={"encoder": entry, "features": p},
              extra={"weights": encoder.weights | {"encoder": entry["name"]}, "extraction": info})
