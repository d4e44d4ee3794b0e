"""Times the tile kernels against their references (torch, numpy, torchvision) in one run.

Run ``.venv/bin/python benchmarks/kernels.py`` (``--quick`` for a smoke run). Each row times
ours and the reference interleaved, repeat by repeat, so machine noise hits both alike, and
prints medians, the speedup (reference median / ours) and whether the results are identical.
Rows of the accumulation/optimizer kernels come from ``benchmarks/kernels_optim.py`` when
present: its ``rows(quick: bool) -> list[Row]`` is appended to the table. ``--as-avx2`` runs the
table as on a CPU without AVX-512: poptorch_sim, torch and numpy all capped at their AVX2 code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np


def numpy_simd_targets() -> list[str]:
    """numpy's dispatch targets this CPU runs (its SIMD sorts among them), narrowest first."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [target for target in __cpu_dispatch__ if __cpu_features__.get(target)]


def as_avx2_environment() -> dict[str, str]:
    """This environment with poptorch_sim, torch and numpy capped at AVX2, as on an AVX2-only CPU:
    numpy's AVX-512 dispatch targets disabled, torch's ATen kernels at its AVX2 capability."""
    env = dict(os.environ, POPTORCH_SIM_SIMD="avx2", ATEN_CPU_CAPABILITY="avx2")
    wide = [t for t in numpy_simd_targets() if t.startswith("AVX512") or t == "X86_V4"]
    if wide:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(wide)
    return env


def run_as_avx2(args: list[str]) -> None:
    """Runs this script again with ``args`` but ``--as-avx2``, under ``as_avx2_environment()``
    (numpy and torch read their caps on import); does not return."""
    rest = [a for a in args if a != "--as-avx2"]
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, __file__, *rest], as_avx2_environment())


if __name__ == "__main__" and "--as-avx2" in sys.argv[1:]:
    run_as_avx2(sys.argv[1:])  # before importing torch, which the capped run imports anew

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import Row, interleaved  # noqa: E402

from poptorch_sim import kernels  # noqa: E402


def sort_rows(quick: bool) -> list[Row]:
    """sort/argsort of 2^20 float32 against torch.sort and numpy."""
    n = 1 << (16 if quick else 20)
    repeats = 1 if quick else 9
    x = torch.randn(n)
    xn = x.numpy()
    values, indices = kernels.sort(x)
    ref_values, ref_indices = torch.sort(x, stable=True)
    same = torch.equal(values, ref_values) and torch.equal(indices, ref_indices)
    rows = [
        Row(
            "sort",
            f"{n}",
            *interleaved(lambda: kernels.sort(x), lambda: torch.sort(x), repeats),
            "torch.sort",
            same,
        ),
        Row(
            "sort",
            f"{n}",
            *interleaved(lambda: kernels.sort(x), lambda: np.sort(xn), repeats),
            "np.sort (values only)",
            bool(np.array_equal(values.numpy(), np.sort(xn))),
        ),
        Row(
            "argsort",
            f"{n}",
            *interleaved(
                lambda: kernels.argsort(x), lambda: np.argsort(xn, kind="stable"), repeats
            ),
            "np.argsort stable",
            bool(np.array_equal(kernels.argsort(x).numpy(), np.argsort(xn, kind="stable"))),
        ),
    ]
    batch = torch.randn(16 if quick else 256, 4096)
    rows.append(
        Row(
            "sort rows",
            f"{len(batch)}x4096",
            *interleaved(
                lambda: kernels.sort(batch, dim=1), lambda: torch.sort(batch, dim=1), repeats
            ),
            "torch.sort",
            torch.equal(kernels.sort(batch, dim=1).values, torch.sort(batch, dim=1).values),
        )
    )
    return rows


def _sort_rows_row(
    size: str, x: torch.Tensor, ref: Callable[[], object], ref_name: str, repeats: int, same: bool
) -> Row:
    """A "sort rows" line: ``kernels.sort(x, dim=1)`` against ``ref``, timed interleaved."""
    return Row(
        "sort rows",
        size,
        *interleaved(lambda: kernels.sort(x, dim=1), ref, repeats),
        ref_name,
        same,
    )


def _against_torch_sort(
    size: str, x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, repeats: int
) -> Row:
    """The ``torch.sort`` line of rows ``x`` sorted to ``values``, ``indices``: identical means
    what the stable sort gives."""
    ref = torch.sort(x, dim=1, stable=True)
    same = torch.equal(values, ref.values) and torch.equal(indices, ref.indices)
    return _sort_rows_row(size, x, lambda: torch.sort(x, dim=1), "torch.sort", repeats, same)


def _against_np_sort(size: str, x: torch.Tensor, values: torch.Tensor, repeats: int) -> Row:
    """The ``np.sort`` (values only) line of rows ``x`` sorted to ``values``."""
    xn = x.numpy()
    same = bool(np.array_equal(values.numpy(), np.sort(xn, axis=1)))
    return _sort_rows_row(
        size, x, lambda: np.sort(xn, axis=1), "np.sort (values only)", repeats, same
    )


def short_sort_rows(quick: bool) -> list[Row]:
    """Batches of short rows (2^20 float32 in all) against torch.sort and numpy: its stable
    argsort and take (our contract), np.sort (values only) and its default argsort (indices
    only, not stable; on AVX-512 and AVX2 CPUs numpy 2's SIMD key-index sort)."""
    total = 1 << (16 if quick else 20)
    repeats = 1 if quick else 9
    rows = []
    for n in (16, 4096) if quick else (16, 64, 256, 1024, 4096, 32768):
        x = torch.randn(total // n, n)
        xn = x.numpy()
        values, indices = kernels.sort(x, dim=1)
        size = f"{total // n}x{n}"

        def same_contract_numpy(xn: np.ndarray = xn) -> tuple[np.ndarray, np.ndarray]:
            order = np.argsort(xn, axis=1, kind="stable")
            return np.take_along_axis(xn, order, axis=1), order

        np_values, np_indices = same_contract_numpy()
        rows += [
            _against_torch_sort(size, x, values, indices, repeats),
            _sort_rows_row(
                size,
                x,
                same_contract_numpy,
                "np stable argsort+take",
                repeats,
                bool(
                    np.array_equal(values.numpy(), np_values)
                    and np.array_equal(indices.numpy(), np_indices)
                ),
            ),
            _against_np_sort(size, x, values, repeats),
            _sort_rows_row(
                size,
                x,
                lambda xn=xn: np.argsort(xn, axis=1),
                "np.argsort (indices only)",
                repeats,
                bool(
                    np.array_equal(
                        values.numpy(), np.take_along_axis(xn, np.argsort(xn, axis=1), axis=1)
                    )
                ),
            ),
        ]
    return rows + short_sort_rows_other_dtypes(quick)


def short_sort_rows_other_dtypes(quick: bool) -> list[Row]:
    """Short rows of 16-bit and 64-bit keys (2^20 in all) against torch.sort and np.sort."""
    total = 1 << (16 if quick else 20)
    repeats = 1 if quick else 9
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.int16, torch.float64, torch.int64):
        for n in (64,) if quick else (64, 1024, 32768):
            if dtype.is_floating_point:
                x = torch.randn(total // n, n).to(dtype)
            else:
                x = torch.randint(torch.iinfo(dtype).min, torch.iinfo(dtype).max, (total // n, n))
                x = x.to(dtype)
            values, indices = kernels.sort(x, dim=1)
            size = f"{total // n}x{n} {str(dtype).removeprefix('torch.')}"
            rows.append(_against_torch_sort(size, x, values, indices, repeats))
            if dtype != torch.bfloat16:  # numpy has no bfloat16
                rows.append(_against_np_sort(size, x, values, repeats))
    return rows


def topk_rows(quick: bool) -> list[Row]:
    """topk k=1000 of 1M float32 against torch.topk."""
    n = 1 << (16 if quick else 20)
    x = torch.randn(n)
    ours = kernels.topk(x, 1000)
    ref = torch.topk(x, 1000)
    same = torch.equal(ours.values, ref.values) and torch.equal(ours.indices, ref.indices)
    timing = interleaved(
        lambda: kernels.topk(x, 1000), lambda: torch.topk(x, 1000), 1 if quick else 9
    )
    return [Row("topk k=1000", f"{n}", *timing, "torch.topk", same)]


def random_boxes(n: int, clustered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` boxes (x1, y1, x2, y2) in a 1000x1000 image and distinct scores."""
    if clustered:
        centres = torch.rand(n // 40 + 1, 2) * 1000
        xy = centres[torch.randint(0, len(centres), (n,))] + torch.randn(n, 2) * 6
    else:
        xy = torch.rand(n, 2) * 1000
    wh = torch.rand(n, 2) * 60 + 4
    return torch.cat([xy, xy + wh], 1), torch.randperm(n).float() / n


def nms_rows(quick: bool) -> list[Row]:
    """nms on random and clustered boxes against torchvision.ops.nms."""
    import torchvision  # here: the import costs seconds, and most sections do without it

    rows = []
    for n in (1000,) if quick else (1000, 5000, 20000):
        for clustered in (False, True):
            boxes, scores = random_boxes(n, clustered)
            same = torch.equal(
                kernels.nms(boxes, scores, 0.5), torchvision.ops.nms(boxes, scores, 0.5)
            )
            repeats = 1 if quick else (3 if n >= 20000 else 7)
            timing = interleaved(
                lambda b=boxes, s=scores: kernels.nms(b, s, 0.5),
                lambda b=boxes, s=scores: torchvision.ops.nms(b, s, 0.5),
                repeats,
            )
            kind = "clustered" if clustered else "random"
            rows.append(Row("nms", f"{n} {kind}", *timing, "torchvision nms", same))
    return rows


def retinanet_inputs(quick: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-level (scores [anchors*classes], boxes [anchors, 4]) for a 5-level RetinaNet head."""
    side, classes = (128, 20) if quick else (512, 80)
    levels = []
    for stride in (8, 16, 32, 64, 128):
        anchors = ((side + stride - 1) // stride) ** 2 * 9
        count = anchors * classes
        scores = (torch.randperm(count).double() + 0.5).div(count).float()
        boxes, _ = random_boxes(anchors, clustered=True)
        levels.append((scores, boxes))
    return levels


def retinanet_postprocess(levels, topk_fn, batched_nms_fn, classes: int) -> torch.Tensor:
    """torchvision RetinaNet's postprocess_detections: top-1000 per level, then batched NMS."""
    all_boxes, all_scores, all_labels = [], [], []
    for scores, boxes in levels:
        keep = scores > 0.05
        kept_scores = scores[keep]
        kept_idxs = torch.nonzero(keep).squeeze(1)
        num = min(1000, kept_idxs.numel())
        top_scores, top = topk_fn(kept_scores, num)
        idxs = kept_idxs[top]
        all_boxes.append(boxes[torch.div(idxs, classes, rounding_mode="floor")])
        all_scores.append(top_scores)
        all_labels.append(idxs % classes)
    boxes, scores, labels = (torch.cat(t) for t in (all_boxes, all_scores, all_labels))
    keep = batched_nms_fn(boxes, scores, labels, 0.5)[:300]
    return torch.cat([boxes[keep], scores[keep, None], labels[keep, None].float()], 1)


def retinanet_rows(quick: bool) -> list[Row]:
    """RetinaNet post-processing with our topk + batched_nms against torch + torchvision."""
    import torchvision

    classes = 20 if quick else 80
    levels = retinanet_inputs(quick)

    def ours() -> torch.Tensor:
        return retinanet_postprocess(levels, kernels.topk, kernels.batched_nms, classes)

    def ref() -> torch.Tensor:
        return retinanet_postprocess(levels, torch.topk, torchvision.ops.batched_nms, classes)

    same = torch.equal(ours(), ref())
    size = f"5 levels x {sum(s.numel() for s, _ in levels)} scores"
    return [
        Row(
            "retinanet post",
            size,
            *interleaved(ours, ref, 1 if quick else 7),
            "torch.topk + tv batched_nms",
            same,
        )
    ]


def optim_rows(quick: bool) -> list[Row]:
    """Rows from benchmarks/kernels_optim.py (the accumulation/optimizer kernels), if present."""
    try:
        import kernels_optim  # type: ignore[import-not-found]
    except ImportError:
        return []
    return [Row(*row) for row in kernels_optim.rows(quick)]


def print_table(rows: list[Row]) -> None:
    """Prints the table: medians in ms and the speedup (reference / ours)."""
    header = (
        f"{'op':<16}{'size':<30}{'ours ms':>10}{'ref ms':>10}{'speedup':>9}  "
        f"{'identical':<10}reference"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.reference / row.ours if row.ours > 0 else float("inf")
        print(
            f"{row.op:<16}{row.size:<30}{row.ours * 1e3:>10.3f}{row.reference * 1e3:>10.3f}"
            f"{ratio:>8.2f}x  {str(row.identical):<10}{row.reference_name}"
        )


def main(argv: list[str] | None = None) -> list[Row]:
    """Runs every section and prints the table; returns its rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = {
        "sort": sort_rows,
        "short": short_sort_rows,
        "topk": topk_rows,
        "nms": nms_rows,
        "retinanet": retinanet_rows,
        "optim": optim_rows,
    }
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument(
        "--only", choices=sorted(sections), action="append", help="run these sections only"
    )
    parser.add_argument(
        "--as-avx2",
        action="store_true",
        help="run as on a CPU without AVX-512: poptorch_sim, torch and numpy at their AVX2 code",
    )
    args = parser.parse_args(argv)
    if args.as_avx2:  # numpy and torch read their caps on import: run again under them
        run_as_avx2(sys.argv[1:] if argv is None else argv)
    torch.manual_seed(0)
    numpy_targets = numpy_simd_targets()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{kernels.num_tiles()} tiles; torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, numpy {np.__version__} up to "
        f"{numpy_targets[-1] if numpy_targets else 'its baseline'}"
    )
    print(kernels.simd_report())  # CPU model, cores, SIMD level and each family's variant
    print()
    kernels.reset_counters()
    rows = []
    for name, section in sections.items():
        if args.only is None or name in args.only:
            rows += section(args.quick)
    print_table(rows)
    print("\ntile engine counters (all calls above):")
    for name, stats in sorted(kernels.counters().items()):
        print(f"  {name:<20}{stats}")
    return rows


if __name__ == "__main__":
    main()
