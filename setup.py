"""Builds poptorch_sim, its ``poptorch`` alias and the C++ tile kernels in ``csrc/``."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from setuptools import find_packages, setup

# [Note: build time]
# A cold build of the extension is the compiler's work on 8 units made of 20 files (9 of 21 with
# the 8-lane hook): the three SIMD variants of the bitonic network, optimizer_tiles.cpp,
# library.cpp, module.cpp and two units of thin torch-facing files (see [Note: compile units]).
# Cold builds in a clone (`rm -rf build poptorch_sim/_C*.so; /usr/bin/time python setup.py -q
# build_ext --inplace`, ninja's default 3 jobs), 2-vCPU Intel Xeon (AVX-512) VM, GCC 12.2,
# quiet but for its host, 2026-11-29, 9770165 and 1c8a29c in turn, twice: 104 and 116 -> 68 and
# 76 s wall, 202 and 227 -> 129 and 144 CPU s (the main checkout at 1c8a29c: 56 s, 107 CPU s;
# with the 8-lane hook, POPTORCH_SIM_BUILD_8_LANES=1: 67 s, 131 CPU s); 9770165 and 5ed3f23
# (optimizer_tiles.cpp's masks too) old-new-new-old: 121 and 102 -> 70 and 78 s wall. The
# host's speed moves by a third between hours: 9770165 built in 75 s on 2026-11-28. What
# changed:
# - the 8-lane test hook is built only where the building CPU lacks AVX-512 (see [Note: the
#   8-lane hook]): 24-32 CPU s;
# - the thin torch-facing files compile as two units: 14.1 and 7.4 CPU s, where their members
#   took 24.3 and 20.1 apart;
# - sort_small (sort/bitonic.cpp) calls the variants' network out of line instead of compiling
#   three copies of its own: 5.4 -> 2.4 s. The sorts that end in it take the same time: one row
#   of 2^18 (the radix and scatter sorts) and, as a control, 64 rows of 4096, five dtypes,
#   AVX-512 and AVX2, one thread, fastest of 15 calls, the two builds in the order
#   old-new-new-old three times: geometric mean 0.94x.
#   (Alternating old-new only favours the first: the same build against itself gave 1.17x.)
# - optimizer_tiles.cpp: its options are template parameters where they guard a store and bit
#   masks elsewhere (see [Note: options as masks] there), so GCC neither unswitches nor leaves a
#   loop scalar: 17.6 -> 7.7 CPU s in one hour, and the steps are bit-identical and take 0.77x
#   (geometric mean of 20 cases, 2M float32 parameters, one thread, fastest of 15 steps,
#   old-new-new-old twice; SGD with momentum, RMSprop and LAMB 0.3-0.7x, where unswitching had
#   run out of levels and left the loop scalar, the rest 0.96-1.10x). Templates alone with
#   unswitching off had left the loops scalar, 1.9x.
# Tried and left (old-new order, so the new side is up to 1.2x too slow): rows of kRun through
# the out-of-line column network instead of the registers (sort_run_rows) saved at most 2 s per
# variant, int32 rows of 16 took 1.10x; the short rows' column size P as an argument instead
# of a template parameter saved about 3 s per variant, and rows of 4 took 1.4-1.6x (fastest of
# 41 calls, six alternations).
#
# Before 2026-11-29: 21 files. CPU seconds (user + sys) of
# each compiled alone with build.ninja's command (`/usr/bin/time -f %U+%S c++ <cflags> -c FILE
# <post_cflags>`, two at a time), 2-vCPU Intel Xeon (AVX-512) VM, GCC 12.2, shared (load 5-8),
# 2026-11-28, at 4691d3d -> 7ac659a (every op registered in library.cpp; files whose source did
# not change moved by up to 12%: the machine's noise):
#   sort/bitonic_8_lanes.cpp   27.3 -> 24.2     optim/optimizer.cpp         9.3 -> 3.3
#   sort/bitonic_avx512.cpp    17.8 -> 17.1     engine/library.cpp          8.0 -> 9.2 (library.cpp)
#   sort/bitonic_avx2.cpp      18.5 -> 16.4     optim/accumulate.cpp        7.5 -> 2.6
#   sort/bitonic_base.cpp      13.2 -> 12.7     engine/worker_memory.cpp    7.5 -> 2.4
#   optim/optimizer_tiles.cpp  10.5 -> 10.2     optim/offload.cpp           7.4 -> 2.7
#   module.cpp                 11.0 -> 9.8      sort/bitonic.cpp            5.6 -> 5.2
#   sort/sort.cpp              14.8 -> 8.0      engine/output_cache.cpp     2.2 -> 2.0
#   sort/topk.cpp              10.4 -> 5.1      the other 4 files           4.9 -> 4.5
#   sort/nms.cpp                9.9 -> 4.6
#   engine/streams.cpp          9.6 -> 3.2      total                     195.2 -> 143.0
# The whole cold build (`rm -rf build poptorch_sim/_C*.so; /usr/bin/time python setup.py -q
# build_ext --inplace`, ninja's default 3 jobs), the same machine and day, the two trees in
# turn, twice (load 3-4): 95 and 99 -> 77 and 83 s wall, 185 and 192 -> 150 and 161 CPU s.
# Parsing headers alone: torch's pybind11 casters 8-9 s (<torch/extension.h>: about 30 s),
# <torch/library.h> 5.3-5.9 s, <ATen/core/Tensor.h> 2.3 s, which with <ATen/ops/empty.h> (or
# any operator's header) takes 4.7 s, with <ATen/WrapDimUtils.h> 3.6 s, with <ATen/Parallel.h>
# or <ATen/Dispatch.h> 2.1-2.3 s.
# So:
# - the bitonic network is compiled once per SIMD variant, not once per dtype (see [Note: the
#   network out of line] in sort/bitonic/variants.h): one dtype's instantiation in
#   bitonic_avx512.cpp adds 0.4 (uint8) to 5.0 s (float64) to the file without any (3.6 s),
#   where it added 4.4 to 10.0 s (to 1.4 s);
# - library.cpp is the one file that includes <torch/library.h> and torch's operator headers:
#   it registers every op and makes the kernels' new tensors (common/tensors.h). Each family
#   declares its ops in its ops.h; their files include <ATen/core/Tensor.h> at most (Tensor's
#   methods, c10::maybe_wrap_dim). The kernels' headers are torch-free (sort/sort.h,
#   sort/bitonic/*, optim/optimizer_tiles.h, engine/tile_engine.h, common/simd.h: c10's scalar
#   types and TORCH_CHECK at most); module.cpp includes torch's pybind11 casters, not
#   <torch/extension.h>;
# - ninja gets the longest files first, so that two cores finish together (in _LONGEST's order;
#   until 2026-11-29 a set, so they started by name: module.cpp and optimizer_tiles.cpp first,
#   the 8-lane network third, the build waiting for it alone at the end);
# - scripts/setup.sh keeps each built library in a cache keyed by the sources, torch, the
#   compiler and Python, so a fresh clone of a tree built before copies it.
# What is left is mostly the bitonic network's five files (75 of the 143 s). A lower -O is no
# way out: the 8-lane network (split vectors) took 175 s at -O2 and 76 s at -O1, the other
# variants 10-15 s at -O2 (3-4 s less each; their speed there not measured).
# optimizer_tiles.cpp takes 2.4 s at -O2; at -O3, 8.8 of its 10.6 s optimize the fused
# optimizers' element loops (-ftime-report's "callgraph functions expansion"). Most of that is
# loop unswitching on the optimizers' options: with -fno-unswitch-loops (or `#pragma GCC
# optimize`, the same machine code) the file took 3.9 instead of 20.0 CPU s, with `--param
# max-unswitch-level=1` 3.6 s, level 2 7.2 s (load 12-16, 2026-11-29, a5318b4), but the steps
# were slower: CPU time of one step of 2M float32 parameters on one thread (medians of 3 and 2
# runs, old and new builds alternated), geometric mean of 24 cases (4 optimizers, AVX-512 and
# AVX2) 1.29x (no unswitching) and 1.54x (level 1), SGD without momentum 1.7-5.3x. (Done on
# 2026-11-29 by templates and masks: see above.) Instantiating
# the test-only 8-lane network for 5 of the 9 dtypes would save about 7 s, but each dtype has
# its own lane code there, which only that hook runs on CPUs without AVX-512. A precompiled
# header of torch's headers was 430 MB (benchmarks/RESULTS.md).
#
# [Note: the 8-lane hook]
# csrc/sort/bitonic_8_lanes.cpp, the longest file (24-32 of 143-185 CPU s), is no kernel: it is
# the AVX-512 variant's network compiled for AVX2, so that the tests check that logic on CPUs
# without AVX-512 (torch.ops.poptorch_sim._sort_rows_8_lanes). Where the CPU that builds the
# library has AVX-512, the tests run the AVX-512 variant itself, so the hook is left out
# (-DPOPTORCH_SIM_NO_8_LANES: the op stays, says why it cannot run, and
# _sort_rows_8_lanes_built() is false; its tests skip, saying so). POPTORCH_SIM_BUILD_8_LANES=1
# builds it anyway, =0 never.
# The longest files, longest first: ninja starts them in this order (see _longest_first; a set
# here had them started by name, module.cpp and optimizer_tiles.cpp before the bitonic files).
_LONGEST = [
    "csrc/sort/bitonic_8_lanes.cpp",
    "csrc/sort/bitonic_avx512.cpp",
    "csrc/sort/bitonic_avx2.cpp",
    "build/units/sort_ops.cpp",
    "csrc/sort/bitonic_base.cpp",
    "csrc/optim/optimizer_tiles.cpp",
    "csrc/library.cpp",
    "csrc/module.cpp",
    "build/units/glue.cpp",
]


# [Note: compile units]
# The thin torch-facing files each parsed <ATen/core/Tensor.h> and the standard headers again, so
# they are compiled as a few units, each one generated file that includes its members (a unity
# build, as CMake's UNITY_BUILD makes): csrc/ keeps one file per concern, and a unit's members
# must not define the same name in an anonymous namespace (the compiler says so). CPU seconds of
# each compiled alone with the build's flags, 2-vCPU Intel Xeon (AVX-512), GCC 12.2, 2026-11-29:
# the sort unit 14.1 (its members apart 24.3), the glue unit 7.4 (apart 20.1). library.cpp and
# module.cpp together took 18.9 against 20 apart, so they stay two units (two cores share them).
# radix.cpp's constants share names with scatter_sort.cpp's, so it joins the glue unit.
_UNITS = {
    "sort_ops": [
        "csrc/sort/sort.cpp",
        "csrc/sort/topk.cpp",
        "csrc/sort/nms.cpp",
        "csrc/sort/scatter_sort.cpp",
        "csrc/sort/bitonic.cpp",
    ],
    "glue": [
        "csrc/optim/optimizer.cpp",
        "csrc/optim/offload.cpp",
        "csrc/optim/accumulate.cpp",
        "csrc/engine/streams.cpp",
        "csrc/engine/output_cache.cpp",
        "csrc/engine/worker_memory.cpp",
        "csrc/engine/tile_engine.cpp",
        "csrc/common/simd.cpp",
        "csrc/sort/radix.cpp",
    ],
}


def _compile_units(sources: list[str]) -> list[str]:
    """``sources`` with each unit's members replaced by its file (see [Note: compile units])."""
    members = {member for unit in _UNITS.values() for member in unit}
    unknown = sorted(members - set(sources))
    if unknown:
        raise SystemExit(f"setup.py: _UNITS names files csrc/ does not have: {unknown}")
    os.makedirs(os.path.join("build", "units"), exist_ok=True)
    units = []
    for name, unit in _UNITS.items():
        path = os.path.join("build", "units", f"{name}.cpp")
        text = "// Made by setup.py: see [Note: compile units].\n" + "".join(
            f'#include "{os.path.relpath(member, "csrc")}"\n' for member in unit
        )
        if not os.path.exists(path) or Path(path).read_text() != text:  # unchanged: ninja skips it
            Path(path).write_text(text)
        units.append(path)
    return [source for source in sources if source not in members] + units


_AVX512_FLAGS = {"avx512f", "avx512vl", "avx512bw", "avx512dq"}  # csrc/common/simd.cpp's


def _build_8_lanes() -> bool:
    """Whether to compile the 8-lane test hook: see [Note: the 8-lane hook]."""
    setting = os.environ.get("POPTORCH_SIM_BUILD_8_LANES", "auto")
    if setting in ("0", "1"):
        return setting == "1"
    if setting != "auto":
        raise SystemExit(f"POPTORCH_SIM_BUILD_8_LANES={setting!r}: use 1, 0 or auto (the default)")
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(cpuinfo.read().split())
    except OSError:  # not Linux: build it
        return True
    return not _AVX512_FLAGS <= flags


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
    if not _build_8_lanes():
        sources.remove(os.path.join("csrc", "sort", "bitonic_8_lanes.cpp"))
        cxx.append("-DPOPTORCH_SIM_NO_8_LANES")
    sources = _compile_units(sources)
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
                def key(path: str) -> tuple[int, str]:
                    rel = os.path.relpath(path)
                    return (_LONGEST.index(rel) if rel in _LONGEST else len(_LONGEST), path)

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
