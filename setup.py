"""Builds poptorch_sim, its ``poptorch`` alias and the C++ tile kernels in ``csrc/``."""

from __future__ import annotations

import glob
import os

from setuptools import find_packages, setup

# [Note: build time]
# A cold build of the extension is the compiler's work on a few files: the SIMD variants of the
# bitonic network (csrc/sort/bitonic_*.cpp) instantiate its templates for nine dtypes each, and
# took about 60-120 CPU seconds apiece at -O3 on a 2-vCPU Xeon (2026-11-28); parsing torch's
# headers took 8-9 s in each file that includes <ATen/ATen.h> or <torch/library.h>, and 30 s
# for <torch/extension.h>. So:
# - the kernels' headers are torch-free (sort/sort.h, sort/bitonic/*, optim/optimizer_tiles.h,
#   engine/tile_engine.h, common/simd.h: c10's scalar types and TORCH_CHECK at most), and only
#   the files that register ops or take tensors include torch's; module.cpp includes torch's
#   pybind11 casters, not <torch/extension.h>;
# (The test-only 8-lane network, 119 CPU seconds at -O3, took longer still under
# `#pragma GCC optimize("O1")`: its cost is the always-inlined network itself.)
# - ninja gets the longest files first, so that two cores finish together;
# - scripts/setup.sh keeps each built library in a cache keyed by the sources, torch, the
#   compiler and Python, so a fresh clone of a tree built before copies it.
_LONGEST = {f"csrc/sort/bitonic_{name}.cpp" for name in ("avx512", "avx2", "base", "8_lanes")}


def _extensions() -> tuple[list, dict]:
    """The C++ extension, unless POPTORCH_SIM_SKIP_EXT=1 (scripts/setup.sh builds it apart)."""
    # One folder per op family (csrc/optim, csrc/sort, csrc/engine; csrc/common for what they
    # share); each file includes the others by their path under csrc/. See [Note: build time].
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    if not sources or os.environ.get("POPTORCH_SIM_SKIP_EXT") == "1":
        return [], {}
    import torch
    from torch.utils import cpp_extension

    cuda_sources = sorted(glob.glob("csrc/**/*.cu", recursive=True))
    use_cuda = (
        bool(cuda_sources)
        and (torch.cuda.is_available() or os.environ.get("POPTORCH_SIM_BUILD_CUDA") == "1")
        and cpp_extension.CUDA_HOME is not None
    )
    # -g0 overrides the -g in Python's CFLAGS: with debug info, compiling the then-largest source file took
    # 58 instead of 25 CPU seconds, and the library was 31 MB instead of 2 MB.
    cxx = ["-O3", "-g0", "-std=c++20", "-fopenmp", "-ffp-contract=off"]
    kwargs = dict(
        name="poptorch_sim._C",
        sources=sources + (cuda_sources if use_cuda else []),
        # Headers too, so that `setup.py build_ext` notices when only a header changed.
        depends=sorted(
            glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.inc", recursive=True)
        ),
        include_dirs=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")],
        extra_compile_args={"cxx": cxx + (["-DPOPTORCH_SIM_CUDA"] if use_cuda else [])}
        | ({"nvcc": ["-O3", "-DPOPTORCH_SIM_CUDA"]} if use_cuda else {}),
        extra_link_args=["-fopenmp"],
        py_limited_api=False,
    )
    ext_class = cpp_extension.CUDAExtension if use_cuda else cpp_extension.CppExtension
    return [ext_class(**kwargs)], {"build_ext": _longest_first(cpp_extension.BuildExtension)}


def _longest_first(build_ext: type) -> type:
    """``build_ext`` handing the compiler the longest files first (see [Note: build time]).

    distutils sorts an extension's sources by name before it compiles them, and ninja starts
    them in that order; this reorders them between the two.
    """

    class BuildExt(build_ext):
        def build_extension(self, ext) -> None:
            compile_sources = self.compiler.compile

            def compile_longest_first(sources, *args, **kwargs):
                def key(path: str) -> tuple[bool, str]:
                    return (os.path.relpath(path) not in _LONGEST, path)

                return compile_sources(sorted(sources, key=key), *args, **kwargs)

            self.compiler.compile = compile_longest_first
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_sources

    return BuildExt


ext_modules, cmdclass = _extensions()

setup(
    name="poptorch_sim",
    version="3.4.0",
    description="Graphcore PopTorch's API on ordinary CPUs and GPUs",
    packages=find_packages(
        include=["poptorch_sim", "poptorch_sim.*", "poptorch", "poptorch.*", "popart", "popdist"]
    ),
    package_data={"poptorch_sim": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=["torch", "torchvision", "numpy", "tqdm", "pyyaml"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
