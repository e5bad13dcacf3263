"""C++ kernels for the last-token path (one-row and few-row products, RMSNorm), compiled on first use.

A batch-1 SITE step (and a batch-1 decoding step) multiplies a single row by
every weight matrix, forward and, for the step, backward to the row. Those
products only stream the weights, so they run at memory bandwidth at best,
and MKL's one-row products reach a fraction of it. ``csrc/kernels.cpp``
streams the input-major (K, N) matrix in storage order in both directions and
splits its rows between ``torch.get_num_threads()`` threads (measured in
BENCHMARKS.md). Their autograd, and a weightless RMSNorm's, is written in C++:
a Python ``autograd.Function`` costs as much per call as a small product.

The kernel is built once per source, torch build, Python version and CPU with
``torch.utils.cpp_extension`` (needs a C++ compiler and ninja) into
``$SITE_LENS_CACHE/ext`` (safe to delete; ``build_dir``), saying so on stderr (about half a
minute); venvs with the same torch build share that build. Where it cannot be built, or with
``SITE_LENS_KERNELS=0``, ``row_matmul`` and ``rows_matmul`` are ``x @ W``, ``rms_norm`` torch's, and
everything still runs.
No weight gradients are computed by the kernel (the model is frozen); a
weight that requires grad gets its gradient from torch. Under
``create_graph=True`` the backward passes use torch's ops, so higher
derivatives stay correct. ``disabled()`` swaps a module-level switch: not
for use from several threads at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import sysconfig
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from ..progress import note

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "kernels.cpp"
ENV_SWITCH = "SITE_LENS_KERNELS"  # "0" turns the kernels off

STALE_LOCK_S = 600  # without an OS lock: a torch build lock older than this is left over from a killed build

_state: dict = {"tried": False, "ext": None}


def _cpu_key() -> bytes:
    """What -march=native depends on: the machine and its CPU flags."""
    flags = b""
    try:
        for line in Path("/proc/cpuinfo").read_bytes().splitlines():
            if line.startswith((b"flags", b"Features")):
                flags = line
                break
    except OSError:
        pass
    return platform.machine().encode() + flags


def _take_turn(out: Path):
    """Wait for this build folder's OS lock (released when its holder dies, even killed); the open lock file.

    Holding it, a torch build lock (``lock``) present was left by a killed build, and torch would wait on
    it forever: it goes. Where there is no OS lock (not POSIX, or a file system without ``flock``), a
    torch lock older than ``STALE_LOCK_S`` is taken as left over instead, and None returned.
    """
    try:
        import fcntl

        turn = open(out / "build.flock", "a+")  # noqa: SIM115 (closed by load once the build is loaded)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX)
        except OSError:
            turn.close()
            raise
    except (ImportError, OSError):
        lock = out / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        return None
    (out / "lock").unlink(missing_ok=True)
    return turn


def _no_cuda_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No CUDA runtime is found")


def _cpp_extension():
    """``torch.utils.cpp_extension``, imported without the warning a CUDA build of torch logs on a machine
    without a GPU (``No CUDA runtime is found, using CUDA_HOME=...``): these kernels are CPU code."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.addFilter(_no_cuda_notice)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.removeFilter(_no_cuda_notice)
    return cpp_extension


def build_dir() -> Path:
    """The kernels' build folder for this torch build, interpreter and CPU, under ``$SITE_LENS_CACHE/ext``.

    Its name says the torch and Python versions, then a hash of the source, torch's version, git
    revision and C++ ABI, the interpreter's version and extension suffix, and the CPU's flags
    (``-march=native``): venvs with another torch or Python get folders of their own, and venvs with
    the same torch build share one (a finished build is loaded as it is, see ``_built``).
    """
    from ..models import default_cache_dir

    abi = f"{torch.__version__} {torch.version.git_version} {torch._C._GLIBCXX_USE_CXX11_ABI}"
    py = f"{sys.version} {sysconfig.get_config_var('EXT_SUFFIX')}"
    key = hashlib.sha256(SOURCE.read_bytes() + abi.encode() + py.encode() + _cpu_key()).hexdigest()[:16]
    version = "".join(c if c.isalnum() or c in ".+" else "_" for c in torch.__version__)
    return default_cache_dir() / "ext" / f"kernels-torch{version}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


def _built(out: Path, name: str):
    """The module a finished build in ``out`` holds, imported as it is, or None (none yet, or it does not load).

    Not through torch's ``load``: its build.ninja names the headers of the venv that wrote it, so
    another venv with the same torch build would compile the same source again.
    """
    import importlib.util

    path = out / f"{name}.so"
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as e:  # a build cut short: torch's build below makes it again
        log.info("%s does not load (%s); building it again", path, e)
        return None


def load():
    """The compiled kernel module, or None where it is switched off or cannot be built (logged once)."""
    if _state["tried"]:
        return _state["ext"]
    _state["tried"] = True
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    turn = None
    try:
        out = build_dir()
        key = out.name.rsplit("-", 1)[1]
        out.mkdir(parents=True, exist_ok=True)
        turn = _take_turn(out)
        _state["ext"] = _built(out, f"site_lens_kernels_{key}")
        if _state["ext"] is not None:
            return _state["ext"]
        build = _cpp_extension().load
        src = out / SOURCE.name  # build from a copy, so every checkout sharing the cache writes the same build.ninja
        if not src.exists():  # (the key is the source's hash: an existing copy is this source)
            tmp = out / f"{SOURCE.name}.{os.getpid()}.tmp"
            tmp.write_bytes(SOURCE.read_bytes())
            tmp.replace(src)
        note("compiling site-lens's C++ kernels for this torch (first use, about half a minute)...")
        t0 = time.perf_counter()
        if shutil.which("ninja") is None:  # a pip-installed ninja lives next to the interpreter
            os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        _state["ext"] = build(
            name=f"site_lens_kernels_{key}",
            sources=[str(src)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(out),
            verbose=False,
        )
        note(f"compiled the C++ kernels in {time.perf_counter() - t0:.0f} s (kept in {out})")
    except Exception as e:
        log.warning("C++ kernels unavailable, using torch's matmul: %s", str(e).splitlines()[0] if str(e) else e)
    finally:
        if turn is not None:
            turn.close()  # releases the lock
    return _state["ext"]


def available() -> bool:
    """Whether the compiled kernels run (builds them on first call)."""
    return load() is not None


@contextmanager
def disabled():
    """Inside this block the kernels are off: torch's matmul and RMSNorm (A/B benchmarks, tests)."""
    load()
    saved = _state["ext"]
    _state["ext"] = None
    try:
        yield
    finally:
        _state["ext"] = saved


def row_matmul(x: Float[Tensor, "*rows d_in"], w: Float[Tensor, "d_in d_out"]) -> Float[Tensor, "*rows d_out"]:
    """``x @ w``; one float32 CPU row against a contiguous matrix runs the kernel, anything else torch's matmul."""
    ext = load()
    if (
        ext is not None
        and x.dim() == 2
        and w.dim() == 2
        and x.shape[0] == 1
        and x.shape[1] == w.shape[0]
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and w.is_contiguous()
    ):
        return ext.row_matmul(x.contiguous(), w, torch.get_num_threads())
    return x @ w


MAX_ROWS = 32  # rows_matmul's kernel takes up to this many rows (csrc: kMaxRows); more go to torch's matmul


def rows_matmul(x: Float[Tensor, "*rows d_in"], w: Float[Tensor, "d_in d_out"]) -> Float[Tensor, "*rows d_out"]:
    """``x @ w`` for a few rows (the sequence objective's span): W streamed once for all of them.

    Float32 CPU rows, 1 to ``MAX_ROWS`` of them after flattening the leading dims, against a
    contiguous matrix run the kernel; anything else torch's matmul.
    """
    ext = load()
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    if (
        ext is not None
        and w.dim() == 2
        and 1 <= rows.shape[0] <= MAX_ROWS
        and x.shape[-1] == w.shape[0]
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and w.is_contiguous()
    ):
        y = ext.rows_matmul(rows.contiguous(), w, torch.get_num_threads())
        return y if x.dim() == 2 else y.view(*lead, w.shape[1])
    return x @ w


def rms_norm(x: Float[Tensor, "*rows d"], eps: float) -> Float[Tensor, "*rows d"]:
    """``x / sqrt(mean(x^2) + eps)`` over the last dim (RMSNorm without its weight)."""
    ext = load()
    if ext is not None:
        return ext.rms_norm(x, eps)
    return F.rms_norm(x, (x.shape[-1],), None, eps)
