"""Plan of the protocol-sensitivity jobs of workflow/rules/reliability.smk (``reliability.protocol_sensitivity``):
the other value's features where they must be extracted again, the table and its figure.

Where each probe convention's two feature sets come from (:meth:`SensitivityPlan.feature_sources`): the run's own
features (``base``); ``derive`` — ``projected_l2`` of an entry without a joint image-text space is its
``pre_projection`` embedding L2-normalised, computed from the run's features; ``extract`` — rule
protocol_sensitivity_features extracts it (a dual encoder's projected embedding, its pre-projection one, the other
input size); or a reason the two values are the same run (an encoder whose native input size is 224)."""
from __future__ import annotations

from retinabench.registry.input_size import NATIVE, at_input_size, native_input_size
from retinabench.settings.reliability import SENSITIVITY_CONVENTIONS

PROBE_CONVENTIONS = ("logreg.variant", "features.probe_embedding", "input_size")
BASE, DERIVE, EXTRACT = "base", "derive", "extract"


def variant_name(convention: str, value: str) -> str:
    """The ``variant`` wildcard of an extracted feature set: ``probe_embedding-projected_l2``, ``input_size-224``."""
    return f"{convention.rsplit('.', 1)[-1]}-{value}"


class SensitivityPlan:
    def __init__(self, core, prediction_files):
        """``prediction_files()``: {"<source>/<encoder>/<name>": path} of every protocol the run writes besides
        transfer (the same predictions the reliability jobs evaluate)."""
        self.core, self._predictions = core, prediction_files
        self.settings = core.settings.reliability.protocol_sensitivity
        self.on = bool(self.settings.enabled)

    def configured(self) -> dict[str, str]:
        """The run's value of each convention (a value of neither side stays as configured)."""
        c = self.core.config
        size = c["input_size"]
        return {"logreg.variant": c["logreg"]["variant"],
                "features.probe_embedding": c["features"]["probe_embedding"],
                "input_size": NATIVE if size == NATIVE else str(int(size)),
                "mllm.invalid_answers": c["mllm"]["invalid_answers"],
                "reliability.bootstrap.summary": c["reliability"]["bootstrap"]["summary"],
                "reliability.bootstrap.unit": c["reliability"]["bootstrap"]["unit"],
                "reliability.ece_bin_edges": c["reliability"]["ece_bin_edges"]}

    def probe_conventions(self) -> list[str]:
        """The probe conventions compared: those configured, when the run extracts features (a `features`
        protocol runs)."""
        from retinabench.protocols.registry import PROTOCOLS
        if not any(PROTOCOLS.get(p).kind == "features" for p in self.core.config["protocols"]):
            return []
        return [c for c in self.settings.conventions if c in PROBE_CONVENTIONS]

    def feature_sources(self) -> dict[str, dict[str, dict[str, str]]]:
        """{convention: {encoder: {value: base | derive | extract | a reason}}} of the probe conventions."""
        configured = self.configured()
        out: dict[str, dict[str, dict[str, str]]] = {}
        for convention in self.probe_conventions():
            out[convention] = {}
            for encoder in self.core.encoders:
                entry = self.core.reg.encoder(encoder)
                values: dict[str, str] = {}
                for value in SENSITIVITY_CONVENTIONS[convention]:
                    if convention == "logreg.variant" or value == configured[convention]:
                        values[value] = BASE
                    elif convention == "features.probe_embedding":
                        dual = "zeroshot" in (entry.get("interfaces") or [])
                        values[value] = DERIVE if value == "projected_l2" and not dual else EXTRACT
                    elif "input_size" not in entry or native_input_size(entry) == 224:
                        values[value] = (f"{encoder}'s native input size is 224: native and 224 are the same run"
                                         if "input_size" in entry else f"{encoder} declares no input size")
                    else:
                        values[value] = EXTRACT
                out[convention][encoder] = values
        return out

    def extracted(self) -> dict[str, str]:
        """{"<variant>/<encoder>/<dataset>": path} of every feature set rule protocol_sensitivity_features writes."""
        out = {}
        for convention, encoders in self.feature_sources().items():
            for encoder, values in encoders.items():
                for value, source in values.items():
                    if source == EXTRACT:
                        for dataset in self.core.datasets:
                            v = variant_name(convention, value)
                            out[f"{v}/{encoder}/{dataset}"] = self.core.path("sensitivity_features", variant=v,
                                                                             encoder=encoder, dataset=dataset)
        return out

    def variant_value(self, variant: str) -> tuple[str, str]:
        """(convention, value) of a ``variant`` wildcard."""
        for convention in PROBE_CONVENTIONS:
            for value in SENSITIVITY_CONVENTIONS[convention]:
                if variant_name(convention, value) == variant:
                    return convention, value
        raise KeyError(f"protocol sensitivity: no feature variant {variant!r}")

    def variant_constraint(self) -> str:
        from retinabench.plan.core import alternatives
        return alternatives(sorted({k.split("/")[0] for k in self.extracted()}) or ["none"])

    def feature_entry(self, wc) -> dict:
        """The encoder entry of an extracted variant: the run's entry, at the variant's input size."""
        convention, value = self.variant_value(wc.variant)
        entry = self.core.reg.encoder(wc.encoder)
        return at_input_size(entry, value if value == NATIVE else int(value)) if convention == "input_size" else entry

    def feature_settings(self, wc) -> dict:
        """The features settings of an extracted variant: the run's, with the variant's probe embedding."""
        convention, value = self.variant_value(wc.variant)
        settings = self.core.feature_settings(wc)
        return {**settings, "probe_embedding": value} if convention == "features.probe_embedding" else settings

    def feature_inputs(self, wc) -> dict[str, str]:
        return self.core.feature_inputs(wc)

    # -- the table ---------------------------------------------------------------------------------------------
    def predictions(self) -> dict[str, str]:
        return self._predictions()

    def inputs(self) -> dict[str, list[str]]:
        core = self.core
        return {"features": [core.features(e, d) for e in core.encoders for d in core.datasets]
                if self.probe_conventions() else [],
                "extracted": list(self.extracted().values()),
                "splits": [core.task_split(t) for t in core.tasks],
                "manifests": [core.path("manifest", dataset=d) for d in core.datasets],
                "predictions": list(self.predictions().values())}

    def params(self) -> dict:
        """What the job reads besides its inputs and their paths (:meth:`files`): which variants and sources, the
        run's values, the logreg section."""
        core = self.core
        return {"feature_sources": self.feature_sources(), "extracted_keys": sorted(self.extracted()),
                "prediction_keys": sorted(self.predictions()), "configured": self.configured(),
                "logreg": core.config["logreg"], "encoders": list(core.encoders)}

    def files(self) -> dict:
        """The job's input files by key (``extracted``, ``features``, ``predictions``): locations under results,
        merged into its ``sensitivity`` param (CorePlan.located); their content decides a rerun."""
        core = self.core
        return {"extracted": self.extracted(), "predictions": self.predictions(),
                "features": {f"{e}/{d}": core.features(e, d) for e in core.encoders for d in core.datasets}}

    def table(self) -> str:
        return self.core.path("sensitivity_table")

    def figure_dir(self) -> str:
        return self.core.path("sensitivity_figure")

    def targets(self) -> list[str]:
        return [self.table(), self.figure_dir()] if self.on else []
