"""Ops whose output shape depends on the data (NonMaxSuppression, Unique): computed when the graph is built,
from known values (constants, or a graph input's data), with numpy."""

from __future__ import annotations

import numpy as np

from tensorgraphs.onnx.lowering import OnnxNode, Value, known, lowers, scalar


def _corners(box: np.ndarray, center_point: int) -> tuple[float, float, float, float]:
    """(y_min, x_min, y_max, x_max) of a box given as two corners in any order, or as center and size."""
    if center_point:
        x, y, w, h = box
        return y - h / 2, x - w / 2, y + h / 2, x + w / 2
    y1, x1, y2, x2 = box
    return min(y1, y2), min(x1, x2), max(y1, y2), max(x1, x2)


def _overlaps(a: tuple, b: tuple, threshold: float) -> bool:
    height = min(a[2], b[2]) - max(a[0], b[0])
    width = min(a[3], b[3]) - max(a[1], b[1])
    if height <= 0 or width <= 0:
        return False
    inter = height * width
    area_a, area_b = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
    union = area_a + area_b - inter
    return area_a > 0 and area_b > 0 and union > 0 and inter / union > threshold


@lowers("NonMaxSuppression")
def non_max_suppression(node: OnnxNode, boxes: Value, scores: Value, most: Value | None = None,
                        iou: Value | None = None, least_score: Value | None = None) -> np.ndarray:
    """Per batch and class, greedily the highest-scoring box (the lower index first among equal scores) that
    overlaps none chosen before by more than `iou`, up to `most` boxes scoring above `least_score`."""
    boxes, scores = known(boxes), known(scores)
    limit, threshold = max(int(scalar(most, 0)), 0), float(scalar(iou, 0.0))
    center_point = node.attr("center_point_box", 0)
    chosen = []
    for b in range(scores.shape[0]):
        corners = [_corners(box, center_point) for box in boxes[b]]
        for c in range(scores.shape[1]):
            candidates = [i for i in range(scores.shape[2])
                          if least_score is None or scores[b, c, i] > float(scalar(least_score))]
            candidates.sort(key=lambda i: (-scores[b, c, i], i))
            kept: list[int] = []
            for i in candidates:
                if len(kept) == limit:
                    break
                if not any(_overlaps(corners[i], corners[k], threshold) for k in kept):
                    kept.append(i)
            chosen += [(b, c, i) for i in kept]
    return np.asarray(chosen, np.int64).reshape(-1, 3)


@lowers("Unique")
def unique(node: OnnxNode, x: Value) -> tuple[np.ndarray, ...]:
    """Unique values (or slices along `axis`), sorted or in order of first occurrence, with the first index of
    each, the inverse indices and the counts."""
    data = known(x)
    axis = node.attr("axis")
    values, first, inverse, counts = np.unique(data if axis is not None else data.reshape(-1), axis=axis,
                                               return_index=True, return_inverse=True, return_counts=True)
    if not node.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=axis or 0)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    return values, first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)
