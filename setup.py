"""Builds poptorch_sim, its ``poptorch`` alias and the C++ tile kernels in ``csrc/``."""

from __future__ import annotations

import glob
import os

from setuptools import find_packages, setup

# [Note: build time]
# A cold build of the extension is the compiler's work on 21 files. CPU seconds (user + sys) of
# each compiled alone with build.ninja's command (`/usr/bin/time -f %U+%S c++ <cflags> -c FILE
# <post_cflags>`), 2-vCPU Intel Xeon (AVX-512), GCC 12.2, shared (load 6-10), 2026-11-28, at
# 850aa4f -> 268cb8d (the network out of line, lighter torch headers; files whose source did
# not change moved by up to 15%: the machine's noise):
#   sort/bitonic_8_lanes.cpp  104.5 -> 28.2     optim/optimizer.cpp       14.9 -> 12.4
#   sort/bitonic_avx512.cpp    56.7 -> 19.4     engine/worker_memory.cpp  13.6 -> 11.0
#   sort/bitonic_avx2.cpp      47.4 -> 18.9     module.cpp                13.6 -> 12.3
#   sort/bitonic_base.cpp      35.4 -> 13.7     optim/optimizer_tiles.cpp 12.8 -> 11.8
#   sort/sort.cpp              21.9 -> 19.9     engine/output_cache.cpp   10.9 -> 3.3
#   sort/topk.cpp              16.2 -> 15.4     sort/bitonic.cpp           6.6 -> 6.1
#   optim/offload.cpp          15.8 -> 11.2     engine/tile_engine.cpp     1.8 -> 2.3
#   sort/nms.cpp               15.5 -> 12.8     sort/scatter_sort.cpp      1.5 -> 1.5
#   optim/accumulate.cpp       15.2 -> 9.1      common/simd.cpp            1.4 -> 1.7
#   engine/library.cpp         15.1 -> 9.6      sort/radix.cpp             1.4 -> 1.1
#   engine/streams.cpp         15.0 -> 11.6     total                    437.2 -> 243.3
# Parsing headers alone: <ATen/ATen.h> 9.0 s, <torch/library.h> 5.7 s, both 11.2 s,
# <ATen/core/Tensor.h> 2.2 s, torch's pybind11 casters 8.8 s (<torch/extension.h>: about 30 s).
# So:
# - the bitonic network is compiled once per SIMD variant, not once per dtype (see [Note: the
#   network out of line] in sort/bitonic/variants.h): one dtype's instantiation in
#   bitonic_avx512.cpp adds 0.4 (uint8) to 5.0 s (float64) to the file without any (3.6 s),
#   where it added 4.4 to 10.0 s (to 1.4 s);
# - the kernels' headers are torch-free (sort/sort.h, sort/bitonic/*, optim/optimizer_tiles.h,
#   engine/tile_engine.h, common/simd.h: c10's scalar types and TORCH_CHECK at most), and only
#   the files that register ops or take tensors include torch's: <ATen/core/Tensor.h> and the
#   per-operator headers of the functions they call (<ATen/ops/empty.h>), never <ATen/ATen.h>;
#   module.cpp includes torch's pybind11 casters, not <torch/extension.h>;
# - ninja gets the longest files first, so that two cores finish together;
# - scripts/setup.sh keeps each built library in a cache keyed by the sources, torch, the
#   compiler and Python, so a fresh clone of a tree built before copies it.
# What is left, 243 CPU s (about 122 s on two cores), is mostly torch's headers (about 7 s in
# each of the 9 files that register ops with <torch/library.h>, 8.8 s in module.cpp) and
# the test-only 8-lane network (28 s, of which 12-14 s its split vectors' network with no dtype
# instantiated; it took longer still under `#pragma GCC optimize("O1")`).
_LONGEST = {
    f"csrc/sort/{name}.cpp"
    for name in ("bitonic_8_lanes", "bitonic_avx512", "bitonic_avx2", "sort", "topk")
}


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
