"""The one place that knows how kminer compiles CUDA: nvcc, the torch headers, flags and arches.

A unit check here, a label build here and the bundle's batched builds on a GPU box must judge
the same code the same way, and a dataset row is built by its test with
`torch.utils.cpp_extension.load`. So extension builds take cpp_extension's own flags (its
defines, its C++ standard for the installed torch, its arch flags for `TORCH_CUDA_ARCH_LIST`),
and the arch list is decided once: `TORCH_CUDA_ARCH_LIST` when set, else the GPUs this machine
sees (nvidia-smi), else DEFAULT_ARCH_LIST, the H100 the rows are verified on.

This file travels in verification bundles beside run.py: the standard library only at import,
torch imported lazily where cpp_extension has to be asked.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

try:  # in kminer
    from miner import sandbox
except ImportError:  # in a bundle: beside run.py
    import sandbox

DEFAULT_ARCH_LIST = "9.0"  # sm_90 (H100) on a machine without a GPU and without the variable
HERE = Path(__file__).resolve().parent
# what cpp_extension passes nvcc for every CUDA source (COMMON_NVCC_FLAGS, stable since 1.x)
NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    # not cpp_extension's, but asked for by the setup.py of many repositories whose device
    # code passes `[=] __device__ (...)` lambdas to thrust (MinkowskiEngine); it only allows
    "--extended-lambda",
    # CUB's own profiling ranges off (nothing it computes changes): its NVTX3 C++ header
    # collides with the older copy repositories vendor (cudf's, in MinkowskiEngine)
    "-DCCCL_DISABLE_NVTX",
)


@functools.cache
def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home or "/usr/local/cuda") / "bin" / "nvcc"
    return str(candidate) if candidate.is_file() else None


@functools.cache
def cuda_include_dir() -> str | None:
    """The CUDA toolkit's headers (cuda.h, cuda_runtime.h) for host code g++ compiles: beside
    nvcc, under CUDA_HOME, or /usr/local/cuda (nvcc on PATH may be a wrapper elsewhere)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    bases = [Path(nvcc_path()).resolve().parent.parent] if nvcc_path() else []
    for base in [*bases, *(Path(h) for h in homes if h)]:
        if (base / "include" / "cuda_runtime.h").is_file():
            return str(base / "include")
    return None


@functools.cache
def nvcc_version() -> str:
    """The release of nvcc (`13.0.88`), part of every build key and a row's toolchain; '' when
    there is none."""
    nvcc = nvcc_path()
    if nvcc is None:
        return ""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"release [\d.]+, V([\d.]+)", out.stdout)
    return found.group(1) if found else "unknown"


@functools.cache
def torch_version() -> str:
    """From the package metadata: importing torch costs seconds and is not needed for this."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


@functools.cache
def libclang_available() -> bool:
    """Whether libclang loads: the closure prunes same-named helpers only when it does."""
    try:
        import clang.cindex as ci

        ci.Index.create()
    except Exception:
        return False
    return True


def tool_version(tool: str) -> str:
    """What a stage's results depend on outside kminer's code (see versions.code_version)."""
    versions = {
        "nvcc": nvcc_version,
        "torch": torch_version,
        "libclang": lambda: str(libclang_available()),
        "arch": arch_list,
    }
    return versions[tool]()


@functools.cache
def cxx_standard() -> str:
    """cpp_extension's standard for the installed torch: C++20 from torch 2.13, C++17 before."""
    numbers = re.findall(r"\d+", torch_version())[:2]
    major, minor = (int(n) for n in numbers) if len(numbers) == 2 else (0, 0)
    return "c++20" if (major, minor) >= (2, 13) else "c++17"


@functools.cache
def arch_list() -> str:
    """`TORCH_CUDA_ARCH_LIST`, else the compute capabilities of the visible GPUs, else the
    default (a build here has no GPU to ask)."""
    chosen = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if chosen:
        return chosen
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        caps = sorted({c.strip() for c in out.splitlines() if re.fullmatch(r"\d+\.\d+", c.strip())})
        if caps:
            return ";".join(caps)
    return DEFAULT_ARCH_LIST


@functools.cache
def arch_flags() -> tuple[str, ...]:
    """`-gencode` flags for `arch_list()`, as cpp_extension writes them (`8.6+PTX` also embeds
    PTX; names such as `Hopper` are cpp_extension's to expand)."""
    try:
        import torch.utils.cpp_extension as ce

        saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
        try:
            return tuple(ce._get_cuda_arch_flags())
        finally:
            if saved is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = saved
    except Exception:  # no torch, or a torch without this helper: the same rule, by hand
        flags = []
        for arch in re.split(r"[;\s]+", arch_list()):
            num = arch.removesuffix("+PTX").replace(".", "")
            if not num.isdigit():
                continue
            flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
            if arch.endswith("+PTX"):
                flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
        return tuple(flags)


@functools.cache
def torch_include_dirs() -> tuple[str, ...]:
    """The installed torch's header dirs (the CPU wheel's are enough to compile), then kminer's
    shims for what that wheel lacks (THC, the CUDA build's cmake macros), then CUDA 13's CCCL."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return ()
    base = Path(next(iter(spec.submodule_search_locations))) / "include"
    dirs = [base, base / "torch/csrc/api/include", HERE / "stubs/torch_shim"]
    cccl = Path(nvcc_path() or "/usr/local/cuda/bin/nvcc").resolve().parent.parent / "include/cccl"
    if cccl.is_dir():
        dirs.append(cccl)
    return tuple(str(d) for d in dirs if d.is_dir())


@functools.cache
def cuda_library_dirs() -> tuple[str, ...]:
    """Headers of CUDA libraries this machine's toolkit lacks (a compile-only install without
    cuRAND: a kernel that draws random numbers includes curand_kernel.h) that pip's nvidia-*
    wheels installed beside torch: kminer depends on nvidia-curand, and torch's CUDA builds
    bring the others. Only the missing headers are exposed, linked into a folder of their own,
    so a wheel's copy never shadows a header the toolkit has."""
    toolkit = Path(cuda_include_dir() or "/usr/local/cuda/include")
    try:  # `nvidia`: the namespace package of the nvidia-* wheels (found, never imported)
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return ()
    roots = [Path(p) for p in spec.submodule_search_locations]
    missing = {}
    for root in roots:
        for header in sorted(root.glob("*/include/cu*.h")):
            if not (toolkit / header.name).exists():
                missing.setdefault(header.name, header)
    if not missing:
        return ()
    key = hashlib.sha256(repr(sorted(map(str, missing.values()))).encode()).hexdigest()[:12]
    # beside the wheels (the execution boundary reads them; its /tmp is a private one)
    folder = roots[0].parent / f"kminer-cuda-libs-{key}"
    if not folder.is_dir():
        try:
            staging = Path(tempfile.mkdtemp(prefix="kminer-cuda-libs-", dir=folder.parent))
        except OSError:  # a read-only install: no cuRAND for this machine's compiles
            return ()
        staging.chmod(0o755)  # the execution boundary compiles as a uid of its own
        for name, header in missing.items():
            (staging / name).symlink_to(header)
        try:
            staging.rename(folder)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return (str(folder),)


@functools.cache
def math_shim_dirs() -> tuple[str, ...]:
    """kminer's declarations of cuBLAS, cuSPARSE and cuSOLVER where this machine's toolkit is a
    compile-only install without them: a unit that includes cublas_v2.h compiles here as it
    does on the GPU box, and its check says what is wrong with its own code, not a header."""
    return () if _has_cuda_math_headers() else (str(HERE / "stubs/cuda_libs_shim"),)


def _has_cuda_math_headers() -> bool:
    nvcc = nvcc_path()
    if nvcc is None:
        return False
    include = Path(nvcc).resolve().parent.parent / "include"
    return (include / "cublas_v2.h").is_file()


# header-only libraries a distribution installs in a folder of their own (Debian's
# libeigen3-dev: /usr/include/eigen3/Eigen/Dense), which repositories take as a git submodule
# (lietorch's eigen/) that a snapshot may lack
HEADER_LIBRARIES = ("eigen3",)


def header_library_dirs() -> tuple[str, ...]:
    """The folders of those libraries: a bundle's own copies beside this file (include/<lib>),
    else this machine's /usr/include/<lib>."""
    found = []
    for lib in HEADER_LIBRARIES:
        for base in (HERE / "include", Path("/usr/include")):
            if (base / lib).is_dir():
                found.append(str(base / lib))
                break
    return tuple(found)


def unit_flags(needs_torch: bool) -> list[str]:
    """nvcc flags of a unit's compile check (`-c`): bare and fast, or with the torch headers
    and the defines cpp_extension sets for them."""
    flags = [f"-std={cxx_standard()}", *arch_flags(), "-w"]
    flags += [f"-I{d}" for d in (*header_library_dirs(), *cuda_library_dirs(), *math_shim_dirs())]
    if needs_torch:
        flags += [f"-I{d}" for d in torch_include_dirs()] + list(NVCC_DEFINES)
    else:  # what only allows more: the label's build has them (pytorch3d's calc_gradients
        flags += _PERMISSIVE  # calls the constexpr std::max from a kernel)
    return flags


_PERMISSIVE = [f for f in NVCC_DEFINES if not f.startswith("-D")]


@functools.cache
def extension_flags() -> tuple[str, ...]:
    """What `cpp_extension.load` passes nvcc for an extension's .cu (include dirs, defines, ABI,
    arch, C++ standard, -fPIC), quiet, plus the CUDA math library headers on a compile-only
    machine that lacks them."""
    incs = [*torch_include_dirs(), *math_shim_dirs()]
    incs.append(sysconfig.get_paths()["include"])
    incs += [*header_library_dirs(), *cuda_library_dirs()]
    return (
        *[f"-I{d}" for d in incs],
        *NVCC_DEFINES,
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *abi_flags(),
        f"-std={cxx_standard()}",
        *arch_flags(),
        "-Xcompiler",
        "-fPIC",
        "-w",
    )


@functools.cache
def abi_flags() -> tuple[str, ...]:
    """The libstdc++ ABI torch was built with (cpp_extension's own helper where it has one)."""
    try:
        import torch
        import torch.utils.cpp_extension as ce
    except Exception:
        return ()
    if hasattr(ce, "_get_glibcxx_abi_build_flags"):
        return tuple(ce._get_glibcxx_abi_build_flags())
    return (f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",)


def compile_source(
    text: str, name: str, flags: list[str], timeout: float, memory_mb: int = 16 << 10
) -> tuple[int | None, str, float]:
    """nvcc -c on `text` (saved as `name` in a temp dir) inside the execution boundary: mined
    code is code kminer did not write. Returns (exit code, None at the time limit; the log with
    the temp path replaced by `name`; seconds)."""
    with tempfile.TemporaryDirectory(prefix="kminer-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_bytes(text.encode("latin-1", errors="replace"))
        argv = [nvcc_path() or "nvcc", "-c", *flags, str(src), "-o", str(src.with_suffix(".o"))]
        limits = sandbox.Limits(seconds=timeout, memory_mb=memory_mb, processes=64)
        seconds = 0.0
        for _ in range(2):  # a failure that says nothing is no verdict on the code: once more
            done = sandbox.run(argv, limits, cwd=Path(tmp))
            seconds += done.seconds
            log = (done.stdout + done.stderr).replace(str(src), name)
            if done.returncode in (0, None) or log.strip() or done.timed_out:
                break
        if done.timed_out:
            return None, f"nvcc timed out after {timeout:.0f} s", seconds
        if done.over_memory or done.returncode is None:
            return 1, log + f"\nnvcc ended without a verdict ({done.notes})", seconds
        if done.returncode and not log.strip():
            log = f"nvcc exited {done.returncode} without a message, twice"
        return done.returncode, log, seconds


def extension_env() -> dict[str, str]:
    """Environment for a `cpp_extension.load` build and the process that loads it: the same
    arch list as every other build, the header-only libraries on the compilers' search path
    (CPATH: g++ and nvcc), and the system's C++ runtime preloaded where torch imports with it
    (`preloaded_cxx_runtime`)."""
    env = {"TORCH_CUDA_ARCH_LIST": arch_list()}
    if header_library_dirs():
        env["CPATH"] = os.pathsep.join(header_library_dirs())
    runtime = preloaded_cxx_runtime()
    if runtime:
        env["LD_PRELOAD"] = runtime
    return env


@functools.cache
def preloaded_cxx_runtime() -> str:
    """The system's libstdc++ to preload into a process that loads extensions, or "" (not
    Linux, none found, LD_PRELOAD already set, torch does not import with it, or
    KMINER_PRELOAD_CXX_RUNTIME=0). On the H100 box (torch 2.11 wheel, Ubuntu's g++ 13) an
    extension linked with --as-needed took its C++ runtime symbols from torch's own libraries,
    not libstdc++ (its NEEDED list lacked it), and any exception leaving it, a TORCH_CHECK that
    fired, ended the process with SIGSEGV: every input a label or a CPU reference refused was
    a crash of its test, not an invalid case. With libstdc++ loaded first the same call raised
    RuntimeError (measured). Where torch links libstdc++ itself this changes nothing."""
    import ctypes.util
    import sys

    if os.environ.get("KMINER_PRELOAD_CXX_RUNTIME") == "0" or os.environ.get("LD_PRELOAD"):
        return ""
    if not sys.platform.startswith("linux"):
        return ""
    lib = ctypes.util.find_library("stdc++") or ""
    if not lib:
        return ""
    try:  # only the interpreter and torch run here, no repository code
        probe = subprocess.run(
            [sys.executable, "-c", "import torch"],
            env={**os.environ, "LD_PRELOAD": lib},
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return lib if probe.returncode == 0 else ""
