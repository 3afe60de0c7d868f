"""Saliency maps of fine-tuned and linear-probe classifiers (OcularBench Figs. A.7-A.9): integrated gradients in
Captum's NoiseTunnel, grayscale, CLAHE, heatmap."""
from retinabench.saliency.attribution import CacheInput, integrated_gradients_nt, normalise
from retinabench.saliency.maps import SALIENCY_COLUMNS, read_maps, run_saliency, select_images, write_maps
from retinabench.saliency.postprocess import clahe, heatmap, postprocess, scale_unit, to_grayscale

__all__ = ["CacheInput", "SALIENCY_COLUMNS", "clahe", "heatmap", "integrated_gradients_nt",
           "normalise", "postprocess", "read_maps", "run_saliency", "scale_unit",
           "select_images", "to_grayscale", "write_maps"]
