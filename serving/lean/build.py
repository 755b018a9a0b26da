"""Compile and load the lean step's C++ ops (``ops.cpp``, ``attend.cpp``, ``int4.cpp``,
``int8.cpp``) once per machine.

A compiler call per source against torch's headers, then one link (no ninja, no Python
module: the ops register themselves with ``TORCH_LIBRARY`` and are reached as
``torch.ops.specops_lean``). The library is written whole and renamed into place.

``ops.cpp`` is compiled with ``-ffast-math`` (its row reductions vectorise only so; a row's
order is still fixed whatever the rows beside it); ``attend.cpp`` without it (its vector
code is written lane by lane with the order it must run in, and fast-math would let the
compiler reassociate it differently where pairs are computed side by side), contracting
multiply-adds; the integer kernels with neither, because their vector and plain paths must
agree bit for bit. The link never sees ``-ffast-math``:
with it, GCC before 13 links ``crtfastmath.o`` into a shared library, whose constructor
turns on flush-to-zero for the thread that loads it, changing every float op torch runs
there.

The build is keyed by everything that shapes the binary: the sources, torch's version, the
compiler's version and the CPU's instruction set (it is compiled for the CPU it runs on). A
build folder whose library fails to load is deleted and built again, never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch
from filelock import FileLock

from serving.errors import SpecOpsError

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
HEADER = HERE / "lean.h"
NAMESPACE = "specops_lean"
# The instruction set: this CPU's, or $SPECOPS_LEAN_MARCH (x86-64-v3 builds for AVX2 only,
# with ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 to measure an AVX2 machine here).
MARCH = os.environ.get("SPECOPS_LEAN_MARCH", "native")
FLAGS = ["-O3", f"-march={MARCH}", "-fopenmp", "-std=c++17", "-fPIC"]
# Each source with its own extra flags (see the module docstring).
EXACT = ["-ffp-contract=off"]
SOURCES = {
    HERE / "ops.cpp": ["-ffast-math"],
    HERE / "attend.cpp": ["-ffp-contract=fast"],
    HERE / "int4.cpp": EXACT,
    HERE / "int8.cpp": EXACT,
}
_lock = threading.Lock()
_loaded: Path | None = None


class LeanUnavailable(SpecOpsError):
    """The lean decode step cannot run here; the message names what is missing."""


def compiler() -> str:
    """The C++ compiler the build uses (``$CXX`` or ``c++``); :class:`LeanUnavailable` when
    there is none."""
    name = os.environ.get("CXX", "c++")
    found = shutil.which(name)
    if found is None:
        raise LeanUnavailable(
            f"the lean decode step compiles a small C++ op and found no C++ compiler ({name!r} "
            "is not on PATH): install one (apt install g++) or set SPECOPS_LEAN=off to decode "
            "through transformers"
        )
    return found


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


def build_key(cxx: str) -> str:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    parts = [HEADER.read_bytes(), torch.__version__.encode(), version.stdout.encode()]
    for source, extra in SOURCES.items():
        parts += [source.read_bytes(), " ".join(extra).encode()]
    parts += [_cpu_flags().encode(), " ".join(FLAGS).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def build_root() -> Path:
    from serving.models.real import cache_root

    return cache_root() / "lean-ops"


def _commands(cxx: str, folder: Path, output: Path) -> list[list[str]]:
    """One compile per source, then the link (which never sees ``-ffast-math``)."""
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    commands, objects = [], []
    for source, extra in SOURCES.items():
        target = folder / f"{source.stem}.o"
        objects.append(str(target))
        flags = [*FLAGS, *extra, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes]
        commands.append([cxx, "-c", *flags, str(source), "-o", str(target)])
    link = [cxx, "-shared", *FLAGS, *objects, "-o", str(output)]
    for path in cpp_extension.library_paths():
        link += [f"-L{path}", f"-Wl,-rpath,{path}"]
    commands.append([*link, "-lc10", "-ltorch_cpu", "-ltorch"])
    return commands


def _compile(folder: Path, cxx: str) -> Path:
    """Compile the sources into ``folder`` (the library written whole, then renamed into
    place) and load it."""
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{NAMESPACE}.so"
    partial = folder / f"{NAMESPACE}.so.partial"
    log.info("compiling the lean decode step's C++ ops into %s (once per machine)", folder)
    *compiles, link = _commands(cxx, folder, partial)
    # The sources compile side by side (one process each), then the link.
    running = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in compiles
    ]
    results = []
    for process in running:
        _, stderr = process.communicate()
        results.append((process.returncode, stderr))
    results.append(_run(link))
    for code, stderr in results:
        if code != 0:
            raise LeanUnavailable(
                f"the lean decode step's C++ ops did not compile with {cxx} "
                f"({stderr.strip()[-600:]}); set SPECOPS_LEAN=off to decode through "
                "transformers"
            )
    os.replace(partial, library)
    torch.ops.load_library(str(library))
    return library


def _run(command: list[str]) -> tuple[int, str]:
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    return run.returncode, run.stderr


def load_ops() -> Path:
    """Build (first time) and load the ops into ``torch.ops.specops_lean``; return the
    library's path. Raises :class:`LeanUnavailable` naming what is missing."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
            raise LeanUnavailable(
                "the lean decode step is built for x86 CPUs with AVX2 or AVX-512 (torch reports "
                f"{torch.backends.cpu.get_cpu_capability()!r}); set SPECOPS_LEAN=off"
            )
        cxx = compiler()
        key = build_key(cxx)
        folder = build_root() / key
        folder.parent.mkdir(parents=True, exist_ok=True)
        # One process builds while the others wait (xdist workers, replicas starting).
        with FileLock(str(folder.parent / f"{key}.lock")):
            library = folder / f"{NAMESPACE}.so"
            if library.exists():
                try:
                    torch.ops.load_library(str(library))
                except OSError as error:
                    log.warning("rebuilding the lean ops: %s did not load (%s)", library, error)
                    shutil.rmtree(folder, ignore_errors=True)
                    library = _compile(folder, cxx)
            else:
                library = _compile(folder, cxx)
        _loaded = library
        return library


def main() -> int:
    """``python -m serving.lean.build``: build (if needed) and load the ops now, printing
    the library's path, or why the lean step cannot run here (exit 0 either way: the engine
    then decodes through transformers). The test scripts call it once before the suite, so
    that no test waits on the first compile."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if os.environ.get("SPECOPS_LEAN", "").lower() == "off":
        print("lean ops: SPECOPS_LEAN=off, not built")
        return 0
    try:
        print(f"lean ops: {load_ops()}")
    except LeanUnavailable as error:
        print(f"lean ops unavailable: {error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
