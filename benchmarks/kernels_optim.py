"""Times the accumulation and fused-optimizer kernels against torch in the same run.

Run ``.venv/bin/python benchmarks/kernels_optim.py`` (``--quick`` for a smoke run); also
called by ``benchmarks/kernels.py`` through ``rows(quick)``. Ours and the baseline are timed
alternately, repeat by repeat, and the medians are compared (speedup = baseline / ours).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import Row  # noqa: E402
from timing import interleaved as _interleaved  # noqa: E402

from poptorch_sim.kernels import accumulate_  # noqa: E402
from poptorch_sim.optim.device import FusedOptimizer  # noqa: E402


def _param_set(total: int) -> list[torch.Tensor]:
    """A transformer-like mix: a few large matrices and many small vectors."""
    big = total // 5
    shapes = [big] * 4 + [1024] * ((total - 4 * big) // 1024)
    params = [torch.randn(n, requires_grad=True) for n in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _clone(params: list[torch.Tensor]) -> list[torch.Tensor]:
    out = [p.detach().clone().requires_grad_() for p in params]
    for o, p in zip(out, params):
        o.grad = p.grad.clone()
    return out


def adamw_rows(quick: bool) -> list[Row]:
    """Fused AdamW step against torch.optim.AdamW (foreach, fused), and off-chip state."""
    total = 200_000 if quick else 10_000_000
    repeats = 1 if quick else 11
    chunk = 1 << (16 if quick else 18)
    base = _param_set(total)
    hyper = dict(lr=1e-3, weight_decay=1e-2)
    mine = _clone(base)
    ours = FusedOptimizer("adamw", [dict(params=mine, **hyper)])
    offp = _clone(base)
    off = FusedOptimizer("adamw", [dict(params=offp, **hyper)], off_chip=True,
                         chunk_elements=chunk)  # fmt: skip
    rows = []
    size = f"{total / 1e6:g}M params"
    for flag in ("foreach", "fused"):
        theirs = _clone(base)
        topt = torch.optim.AdamW(theirs, **hyper, **{flag: True})
        ours_s, ref_s = _interleaved(ours.step, topt.step, repeats)
        check = _clone(base)
        FusedOptimizer("adamw", [dict(params=check, **hyper)]).step()
        ref_check = _clone(base)
        torch.optim.AdamW(ref_check, **hyper, **{flag: True}).step()
        close = all(torch.allclose(a, b) for a, b in zip(check, ref_check))
        rows.append(Row("adamw step", size, ours_s, ref_s, f"torch AdamW({flag}=True) allclose",
                        close))  # fmt: skip
    on_s, off_s = _interleaved(ours.step, off.step, repeats)
    runs = []
    for off_chip in (False, True):
        params = _clone(base)
        opt = FusedOptimizer("adamw", [dict(params=params, **hyper)], off_chip=off_chip,
                             chunk_elements=chunk)  # fmt: skip
        opt.step()
        opt.step()
        runs.append(params)
    same = all(torch.equal(a, b) for a, b in zip(*runs))
    rows.append(Row("adamw off-chip", size + f", chunk {chunk >> 10}K", off_s, on_s,
                    "ours on-chip (bit-identical)", same))  # fmt: skip
    return rows


def accumulate_rows(quick: bool) -> list[Row]:
    """accum += grad * scale against memcpy of the same bytes and torch's add_."""
    n = 100_000 if quick else 10_000_000
    repeats = 1 if quick else 21
    acc, grad = torch.randn(n), torch.randn(n)
    dst = torch.empty(n)
    ref_acc = acc.clone()
    accumulate_(acc, grad, 0.25)
    ref_acc.add_(grad, alpha=0.25)
    close = torch.allclose(acc, ref_acc)
    size = f"{n / 1e6:g}M fp32 ({n * 4 / 2**20:.0f} MiB)"
    rows = [
        Row("accumulate_", size,
            *_interleaved(lambda: accumulate_(acc, grad, 0.25), lambda: dst.copy_(grad), repeats),
            "copy_ of the grad (memcpy)", close),
        Row("accumulate_", size,
            *_interleaved(lambda: accumulate_(acc, grad, 0.25),
                          lambda: acc.add_(grad, alpha=0.25), repeats),
            "torch add_(alpha)", close),
    ]  # fmt: skip
    acc16 = torch.zeros(n, dtype=torch.float16)
    rows.append(Row("accumulate_ fp16", f"{n / 1e6:g}M fp16 accum, fp32 grad",
                    *_interleaved(lambda: accumulate_(acc16, grad, 0.25),
                                  lambda: acc16.add_(grad, alpha=0.25), repeats),
                    "torch add_(alpha) fp16 accum", True))  # fmt: skip
    return rows


def rows(quick: bool) -> list[Row]:
    """All rows of this file (medians in seconds); ``quick`` shrinks sizes and repeats."""
    return accumulate_rows(quick) + adamw_rows(quick)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    table = rows(args.quick)
    header = f"{'op':<18}{'size':<32}{'ours ms':>10}{'ref ms':>10}{'speedup':>9}  reference"
    print(header)
    print("-" * len(header))
    for r in table:
        speedup = r.reference / r.ours if r.ours > 0 else float("inf")
        print(
            f"{r.op:<18}{r.size:<32}{r.ours * 1e3:>10.3f}{r.reference * 1e3:>10.3f}"
            f"{speedup:>8.2f}x  {r.reference_name} [{'ok' if r.identical else 'DIFFERS'}]"
        )
    if not args.quick:
        n = 10_000_000
        acc_row = table[0]
        print(
            f"accumulate_ effective bandwidth: {3 * 4 * n / acc_row.ours / 1e9:.1f} GB/s "
            f"(read acc+grad, write acc); memcpy: {2 * 4 * n / acc_row.reference / 1e9:.1f} GB/s"
        )
    return table


if __name__ == "__main__":
    main()
