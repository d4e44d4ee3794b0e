"""Hand-drawn-looking digit glyphs rendered with torch, the pixels of the MNIST stand-in.

Each digit 0-9 is a few polylines (strokes) in a unit box. A split of the stand-in is drawn in
two passes, both vectorised:

1. *Writers*: ``variants`` deformed copies of every digit (smooth random warps of the stroke
   points, random pen width) are rendered at twice MNIST's resolution from the distance of each
   pixel to the nearest stroke segment.
2. *Samples*: every image picks a writer of its class and resamples it through its own random
   affine map (rotation, scale, shear, shift) plus a small elastic field, then gets sensor noise.

Train and test splits use different writers, so the test measures generalisation, not recall.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["IMAGE_SIZE", "render_split"]

IMAGE_SIZE = 28
_TEMPLATE_SIZE = 2 * IMAGE_SIZE
_BOX = 0.7  # half-size of the digit's unit box in grid_sample's [-1, 1] coordinates
_CHUNK = 8192


def _upsample_matrix(coarse: int, fine: int) -> torch.Tensor:
    """Linear interpolation weights ``[fine, coarse]`` from a coarse grid to a fine one."""
    pos = torch.linspace(0, coarse - 1, fine)
    return (1 - (pos[:, None] - torch.arange(coarse)[None]).abs()).clamp_min(0)


_SMOOTH_UPSAMPLE = _upsample_matrix(4, IMAGE_SIZE)

Point = tuple[float, float]


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int) -> list[Point]:
    """Points on an elliptic arc; angles in degrees, y grows downwards (0 = right, 90 = bottom)."""
    angles = [math.radians(a0 + (a1 - a0) * i / (n - 1)) for i in range(n)]
    return [(cx + rx * math.cos(a), cy + ry * math.sin(a)) for a in angles]


def _strokes() -> dict[int, list[list[Point]]]:
    """The polylines of each digit in a unit box (x right, y down)."""
    return {
        0: [_arc(0.5, 0.5, 0.32, 0.47, -90, 270, 17)],
        1: [[(0.3, 0.22), (0.53, 0.02), (0.53, 0.98)]],
        2: [_arc(0.5, 0.3, 0.32, 0.27, -170, 30, 9) + [(0.14, 0.97), (0.88, 0.97)]],
        3: [_arc(0.47, 0.27, 0.3, 0.25, -160, 90, 9), _arc(0.47, 0.74, 0.35, 0.25, -90, 160, 9)],
        4: [[(0.64, 0.02), (0.1, 0.66), (0.9, 0.66)], [(0.66, 0.3), (0.66, 0.98)]],
        5: [
            [(0.82, 0.03), (0.27, 0.03), (0.21, 0.45)] + _arc(0.48, 0.68, 0.34, 0.3, -135, 150, 9)
        ],
        6: [[(0.74, 0.02), (0.45, 0.2), (0.24, 0.46)] + _arc(0.5, 0.72, 0.3, 0.25, 180, 540, 13)],
        7: [[(0.1, 0.04), (0.9, 0.04), (0.38, 0.98)]],
        8: [_arc(0.5, 0.26, 0.26, 0.23, 90, 450, 13), _arc(0.5, 0.73, 0.32, 0.26, -90, 270, 13)],
        9: [_arc(0.5, 0.3, 0.3, 0.27, 0, 360, 13), [(0.8, 0.32), (0.72, 0.98)]],
    }


def _glyph_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Padded stroke tables: points ``[10, K, 2]`` and segment endpoints ``[10, S, 2]``.

    Padding points sit far outside the image, and padding segments join two of them, so they
    never draw anything.
    """
    points: list[list[Point]] = []
    segments: list[list[tuple[int, int]]] = []
    for digit in range(10):
        pts: list[Point] = []
        segs: list[tuple[int, int]] = []
        for line in _strokes()[digit]:
            start = len(pts)
            pts.extend(line)
            segs.extend((start + i, start + i + 1) for i in range(len(line) - 1))
        points.append(pts)
        segments.append(segs)
    k_max = max(len(p) for p in points) + 1
    s_max = max(len(s) for s in segments)
    point_table = torch.full((10, k_max, 2), 20.0)
    segment_table = torch.full((10, s_max, 2), k_max - 1, dtype=torch.long)
    for digit in range(10):
        point_table[digit, : len(points[digit])] = torch.tensor(points[digit])
        segment_table[digit, : len(segments[digit])] = torch.tensor(segments[digit])
    return point_table, segment_table


def _deform_points(points: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Smoothly warp unit-box points ``[T, K, 2]`` (a writer's style), return grid coordinates."""
    t = points.shape[0]
    freq = torch.randn(t, 3, 1, 2, generator=gen) * 2.5
    phase = torch.rand(t, 3, 1, 1, generator=gen) * 2 * math.pi
    amp = torch.randn(t, 3, 1, 2, generator=gen) * 0.035
    wave = torch.sin((points[:, None] * freq).sum(-1, keepdim=True) + phase)
    warped = points + (amp * wave).sum(1)
    warped = warped + torch.randn(points.shape, generator=gen) * 0.008
    slant = (torch.rand(t, 1, generator=gen) - 0.5) * 0.4
    x = warped[..., 0] + slant * (warped[..., 1] - 0.5)
    pad = points[..., 0] > 10
    grid = torch.stack([(2 * x - 1) * _BOX, (2 * warped[..., 1] - 1) * _BOX], dim=-1)
    return torch.where(pad[..., None], points, grid)


def _render_strokes(
    points: torch.Tensor, segments: torch.Tensor, width: torch.Tensor
) -> torch.Tensor:
    """Ink ``[T, R, R]`` in [0, 1] of pen strokes ``segments`` over ``points`` in grid coords."""
    r = _TEMPLATE_SIZE
    centres = (torch.arange(r, dtype=torch.float32) + 0.5) / r * 2 - 1
    py = centres.repeat_interleave(r)[None]  # [1, P], row-major pixels
    px = centres.repeat(r)[None]
    idx = segments.reshape(segments.shape[0], -1, 1).expand(-1, -1, 2)
    ends = torch.gather(points, 1, idx).reshape(*segments.shape, 2)  # [T, S, 2, 2]
    nearest = torch.full((points.shape[0], r * r), float("inf"))
    # One segment at a time keeps the working set at [T, P] instead of [T, S, P, 2].
    for s in range(segments.shape[1]):
        ax, ay = ends[:, s, 0, 0:1], ends[:, s, 0, 1:2]
        bx, by = ends[:, s, 1, 0:1] - ax, ends[:, s, 1, 1:2] - ay
        dx, dy = px - ax, py - ay
        along = ((dx * bx + dy * by) / (bx * bx + by * by).clamp_min(1e-9)).clamp_(0, 1)
        dist2 = (dx - along * bx).square_() + (dy - along * by).square_()
        torch.minimum(nearest, dist2, out=nearest)
    ink = ((width[:, None] - nearest.sqrt_()) / (2.0 / r) + 0.5).clamp_(0, 1)
    return ink.reshape(-1, r, r)


def _writers(variants: int, gen: torch.Generator) -> torch.Tensor:
    """Templates ``[10 * variants, 1, R, R]``: row ``d * variants + v`` is writer v's digit d."""
    point_table, segment_table = _glyph_tables()
    digits = torch.arange(10).repeat_interleave(variants)
    points = _deform_points(point_table[digits], gen)
    width = 0.06 + torch.rand(digits.numel(), generator=gen) * 0.07
    return _render_strokes(points, segment_table[digits], width)[:, None]


def _sample_grids(n: int, gen: torch.Generator) -> torch.Tensor:
    """Per-image sampling grids ``[n, 28, 28, 2]``: random affine map plus an elastic field."""
    angle = (torch.rand(n, generator=gen) - 0.5) * math.radians(30)
    scale = 0.9 + torch.rand(n, generator=gen) * 0.25
    shear = (torch.rand(n, generator=gen) - 0.5) * 0.4
    shift = (torch.rand(n, 2, generator=gen) - 0.5) * 0.2
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    theta = torch.stack(
        [
            torch.stack([cos, -sin + shear * cos, shift[:, 0]], dim=-1),
            torch.stack([sin, cos + shear * sin, shift[:, 1]], dim=-1),
        ],
        dim=1,
    )
    size = (n, 1, IMAGE_SIZE, IMAGE_SIZE)
    grid = F.affine_grid(theta, list(size), align_corners=False)
    coarse = torch.randn(n, 2, 4, 4, generator=gen) * 0.035
    elastic = _SMOOTH_UPSAMPLE @ coarse @ _SMOOTH_UPSAMPLE.T  # [n, 2, 28, 28]
    return grid + elastic.permute(0, 2, 3, 1)


def render_split(labels: torch.Tensor, seed: int, variants: int = 64) -> torch.Tensor:
    """Render one image per label, deterministically from ``seed``.

    Args:
        labels: int64 tensor ``[N]`` of digits 0-9.
        seed: seeds every random choice; the same seed and labels give the same bytes.
        variants: distinct writers per digit (default 64).

    Returns:
        uint8 tensor ``[N, 28, 28]``: white ink (up to 255) on black, as in MNIST.

    >>> render_split(torch.tensor([3, 1]), seed=0).shape
    torch.Size([2, 28, 28])
    """
    gen = torch.Generator().manual_seed(seed)
    templates = _writers(variants, gen)
    writer = labels * variants + torch.randint(variants, (labels.numel(),), generator=gen)
    images = []
    for start in range(0, labels.numel(), _CHUNK):
        rows = writer[start : start + _CHUNK]
        grid = _sample_grids(rows.numel(), gen)
        ink = F.grid_sample(templates[rows], grid, align_corners=False, padding_mode="zeros")
        gain = 0.75 + torch.rand(rows.numel(), 1, 1, 1, generator=gen) * 0.25
        noise = torch.randn(ink.shape, generator=gen) * 0.04
        images.append(((ink * gain + noise).clamp(0, 1) * 255).round().to(torch.uint8)[:, 0])
    return (
        torch.cat(images) if images else torch.zeros(0, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8)
    )
