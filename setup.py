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

import glob
import platform

from setuptools import Extension, setup

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

setup(ext_modules=[
    Extension(f"convgrad.kernels._engine_{isa}", SOURCES, depends=DEPENDS,
              define_macros=DEFINES[isa], extra_compile_args=COMMON + flags,
              extra_link_args=["-pthread"], language="c++", optional=True)
    for isa, flags in ISA_FLAGS.items()])
