"""Build the native engine: one source, three instruction sets, chosen at run time.

``src/convgrad/kernels/native/engine.cpp`` is compiled three times into the
extension modules ``convgrad.kernels._engine_{avx512,avx2,generic}``: with
AVX-512, with AVX2 + FMA + F16C, and for the compiler's baseline.  Never with
``-march=native``: the package must run on any CPU of its architecture, and
``convgrad.kernels.native`` picks the best build the running CPU supports.
Every extension is optional: without a C++ compiler the package still
installs and falls back to its NumPy/numba kernels.  Everything else about the
package is declared in pyproject.toml.
"""

import copy
import glob
import os
import platform

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# every kernel source of the engine (each its own translation unit, sharing the
# headers), compiled into each build
SOURCES = sorted(glob.glob("src/convgrad/kernels/native/*.cpp"))
DEPENDS = sorted(glob.glob("src/convgrad/kernels/native/*.h"))
# -ffp-contract=fast: a*b + c becomes one FMA where the ISA has it (GCC's
# default outside ISO modes; said explicitly so the build flags decide).
# -pthread: the engine's worker threads (pool.cpp).
COMMON = ["-std=gnu++17", "-O3", "-ffp-contract=fast", "-fno-math-errno", "-fno-plt",
          "-pthread"]

X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386", "x86")

ISA_FLAGS = {"generic": []}
if X86:
    ISA_FLAGS["avx2"] = ["-mavx2", "-mfma", "-mf16c"]
    ISA_FLAGS["avx512"] = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2",
                           "-mfma", "-mf16c", "-mprefer-vector-width=512"]

DEFINES = {"generic": [], "avx2": [("CG_ISA_AVX2", "1")], "avx512": [("CG_ISA_AVX512", "1")]}

# The three builds compile at once, one a core: on 2 cores 318-342 s one after another,
# 200-203 s this way (setup.py build_ext, and pip install -e . in a fresh venv).
JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class build_engines(build_ext):
    """``build_ext --parallel`` with an object directory per extension.  The builds
    compile the same sources with their own flags into objects named after the sources:
    built at once in one directory, they linked each other's objects (the engine then
    refused its avx2 and generic builds, 2026-11-28)."""

    def finalize_options(self):
        if self.parallel is None:       # (pip's editable builds pass no options)
            self.parallel = JOBS or 1
        super().finalize_options()

    def build_extension(self, ext):
        own = copy.copy(self)           # (the builds run in threads: no shared state)
        own.build_temp = os.path.join(self.build_temp, ext.name.rsplit(".", 1)[-1])
        return build_ext.build_extension(own, ext)


setup(cmdclass={"build_ext": build_engines}, ext_modules=[
    Extension(f"convgrad.kernels._engine_{isa}", SOURCES, depends=DEPENDS,
              define_macros=DEFINES[isa], extra_compile_args=COMMON + flags,
              extra_link_args=["-pthread"], language="c++", optional=True)
    for isa, flags in ISA_FLAGS.items()])
