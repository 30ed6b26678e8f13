"""Figures: plotly objects first, written as HTML and PNG/SVG."""

from tlcap.viz.export import save_figure
from tlcap.viz.heatmaps import activation_heatmap, activations_for, located_heatmap, neuron_heatmap, neuron_labels

__all__ = ["save_figure", "activation_heatmap", "activations_for", "located_heatmap", "neuron_heatmap", "neuron_labels"]
