"""Figures written as image files (matplotlib, Agg backend: no display, no pyplot global state)."""

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

DPI = 100
CELL_INCHES = 0.32  # one token's row or column


def save_attention_heatmap(path: str | pathlib.Path, source_pieces: Sequence[str], output_pieces: Sequence[str],
                           maps: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """Writes a PNG heat map of attention weights to path: one panel per entry of maps, titled by its key,
    side by side on a shared colour scale; x axis the source pieces (S), y axis the output pieces (T), colour
    the weight maps[title][t, s] (each (T, S), a row per output token). Returns the image's (width, height)
    in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not maps:
        raise ValueError("no attention maps to plot")
    shape = (len(output_pieces), len(source_pieces))
    for title, weights in maps.items():
        if np.shape(weights) != shape:
            raise ValueError(f"attention map {title!r} has shape {np.shape(weights)}, expected (T, S) = {shape}")
    vmax = max(float(np.max(weights)) for weights in maps.values()) or 1.0
    width = len(maps) * (CELL_INCHES * shape[1] + 1.2) + 1.5  # + tick labels per panel, the colour bar
    height = CELL_INCHES * shape[0] + 1.6  # + the title and the rotated source labels
    figure = Figure(figsize=(max(width, 4.0), max(height, 3.0)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(maps), squeeze=False)[0]
    for ax, (title, weights) in zip(axes, maps.items(), strict=True):
        image = ax.imshow(np.asarray(weights, np.float32), cmap="viridis", vmin=0.0, vmax=vmax, aspect="equal",
                          interpolation="nearest")
        ax.set_title(title)
        ax.set_xticks(range(shape[1]), list(source_pieces), rotation=90)
        ax.set_yticks(range(shape[0]), list(output_pieces))
        ax.set_xlabel("source")
        ax.tick_params(length=0)
    axes[0].set_ylabel("output")
    figure.colorbar(image, ax=list(axes), label="attention weight", shrink=0.8)
    figure.savefig(path, format="png", dpi=DPI)
    return round(figure.get_figwidth() * DPI), round(figure.get_figheight() * DPI)


def save_confusion_matrix(path: str | pathlib.Path, matrix: np.ndarray, class_names: Sequence[str]) -> tuple[int, int]:
    """Writes a PNG heat map of a confusion matrix to path: rows the true class, columns the predicted
    class, colour the fraction of the true class's examples (rows normalised), each cell annotated with its
    count. matrix: (K, K) counts. Returns the image's (width, height) in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(matrix)
    k = len(class_names)
    if matrix.shape != (k, k):
        raise ValueError(f"confusion matrix has shape {matrix.shape}, expected (K, K) = {(k, k)}")
    fractions = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    side = 0.6 * k + 2.5  # inches: cells, tick labels and the colour bar
    figure = Figure(figsize=(side + 1.0, side), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    image = ax.imshow(fractions, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center", fontsize=7,
                color="white" if fractions[i, j] > 0.5 else "black")
    ax.set_xticks(range(k), list(class_names), rotation=90)
    ax.set_yticks(range(k), list(class_names))
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    accuracy = np.trace(matrix) / max(matrix.sum(), 1)
    ax.set_title(f"confusion matrix (accuracy {accuracy:.1%})")
    ax.tick_params(length=0)
    figure.colorbar(image, ax=ax, label="fraction of the true class", shrink=0.8)
    figure.savefig(path, format="png", dpi=DPI)
    return round(figure.get_figwidth() * DPI), round(figure.get_figheight() * DPI)


def save_loss_curves(path: str | pathlib.Path, curves: Mapping[str, tuple[np.ndarray, ...]], ylabel: str,
                     title: str = "", xlabel: str = "step", log_x: bool = False) -> tuple[int, int]:
    """Writes a PNG of loss curves to path: one colour per entry of curves, each (steps, mean, low, high)
    arrays of equal length drawn as the mean line over a shaded low-high band (e.g. min-max over seeds); the
    x axis named xlabel, logarithmic with log_x. Returns the image's (width, height) in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    legend_lines = len(curves) if len(curves) > 3 else 0  # a long legend goes below the axes, not over the curves
    figure = Figure(figsize=(8.0, 5.0 + 0.2 * legend_lines), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    colours = [f"C{i % 10}" for i in range(len(curves))]
    for colour, (label, (steps, mean, low, high)) in zip(colours, curves.items(), strict=True):
        ax.plot(steps, mean, color=colour, label=label, marker="." if len(steps) < 20 else None)
        ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    if log_x:
        ax.set_xscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title or ylabel)
    ax.grid(alpha=0.3)
    if legend_lines:
        figure.legend(loc="outside lower center", fontsize=8)
    elif curves:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)
    figure.savefig(path, format="png", dpi=DPI)
    return round(figure.get_figwidth() * DPI), round(figure.get_figheight() * DPI)


def save_image_attention(path: str | pathlib.Path, images: np.ndarray, maps: np.ndarray,
                         titles: Sequence[str]) -> tuple[int, int]:
    """Writes a PNG of images over their attention maps to path: a column per image, the image on top
    (titled), below it the image with its map (grid x grid, upsampled to the image) overlaid. images:
    (n, H, W, C) uint8; maps: (n, grid, grid), non-negative. Returns the image's (width, height) in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if len(images) != len(maps) or len(images) != len(titles) or not len(images):
        raise ValueError(f"{len(images)} images, {len(maps)} maps and {len(titles)} titles: need as many, > 0")
    height, width = images.shape[1:3]
    figure = Figure(figsize=(1.6 * len(images) + 0.3, 3.8), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, len(images), squeeze=False)
    for column, (image, weights, title) in enumerate(zip(images, maps, titles, strict=True)):
        top, bottom = axes[0, column], axes[1, column]
        top.imshow(image, interpolation="nearest")
        top.set_title(title, fontsize=8)
        bottom.imshow(image, interpolation="nearest")
        bottom.imshow(np.asarray(weights, np.float32), cmap="inferno", alpha=0.6, interpolation="bilinear",
                      extent=(-0.5, width - 0.5, height - 0.5, -0.5))
        for ax in (top, bottom):
            ax.set_axis_off()
    axes[1, 0].set_title("attention rollout", fontsize=8, loc="left")
    figure.savefig(path, format="png", dpi=DPI)
    return round(figure.get_figwidth() * DPI), round(figure.get_figheight() * DPI)


def save_scaling_laws(path: str | pathlib.Path, series: Mapping[str, tuple[np.ndarray, ...]], xlabel: str,
                      ylabel: str = "final eval loss", title: str = "") -> tuple[int, int]:
    """Writes a PNG of fitted scaling laws to path, log-log: one colour per entry of series, each (x, y, fit_x,
    fit_y): the measured points (x, y) as dots (a seed each) and the fitted curve (fit_x, fit_y) as a line.
    Returns the image's (width, height) in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    legend_lines = len(series) if len(series) > 3 else 0
    figure = Figure(figsize=(8.0, 5.0 + 0.2 * legend_lines), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    for index, (label, (x, y, fit_x, fit_y)) in enumerate(series.items()):
        ax.plot(fit_x, fit_y, color=f"C{index % 10}", label=label)
        ax.plot(x, y, color=f"C{index % 10}", marker="o", linestyle="none", markersize=4, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    if high < 10 * low:  # within a decade (a loss): plain numbers on the y axis, not powers of ten
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or ylabel)
    ax.grid(alpha=0.3, which="both")
    if legend_lines:
        figure.legend(loc="outside lower center", fontsize=8)
    elif series:
        ax.legend(fontsize=8)
    figure.savefig(path, format="png", dpi=DPI)
    return round(figure.get_figwidth() * DPI), round(figure.get_figheight() * DPI)
