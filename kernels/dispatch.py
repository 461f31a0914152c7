"""The one entry point impl/ calls for KV-cache recovery data paths.

Backend choice is explicit and reported, never silent:

1. an argument ``backend=`` (a ``Backend`` or its name) or the environment variable
   ``KVSTATE_KERNEL_BACKEND`` (``cuda`` / ``simulator`` / ``torch``; ``auto`` or empty means
   "choose") forces one; forcing a backend that cannot run here raises
   ``BackendUnavailableError`` with the reason;
2. otherwise the first that can run: ``CUDA`` (Numba sees a real GPU, not the simulator, and
   torch has CUDA), then ``SIMULATOR`` (only when ``NUMBA_ENABLE_CUDASIM=1`` was set before numba
   was imported, i.e. tests), then ``TORCH`` (the reference, on the tensors' device).

``select_backend()`` returns the choice together with the reason.  Once chosen, a backend's
errors propagate: there is no fallback to another backend after a failure.

Device rules: ``CUDA`` needs every tensor on one CUDA device (it launches on torch's current
stream, so kernels order correctly with torch work); ``SIMULATOR`` needs CPU tensors; ``TORCH``
takes any single device.  A tensor on the wrong device raises ``KernelInputError``; nothing is
copied between devices behind the caller's back.

``check=True`` (the default) validates data-dependent conditions (block-table slots, tail and
window continuity) and raises the errors of ``kernels.errors``; it costs a device sync.  With
``check=False`` nothing syncs (safe inside CUDA-graph capture): kernels still never index out of
bounds - bad slots are skipped and stale rows are zero-filled - but nothing is raised.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import importlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import torch

from . import reference as ref
from ._launch import GPU_LAUNCH, SIMULATOR_LAUNCH, LaunchConfig
from .errors import (
    BackendUnavailableError,
    BlockTableError,
    KernelInputError,
    TailDiscontinuityError,
)
from .layout import EntryLayout

ENV_VAR = "KVSTATE_KERNEL_BACKEND"

__all__ = [
    "ENV_VAR",
    "Backend",
    "BackendChoice",
    "EntryLayout",
    "LaunchConfig",
    "SpliceResult",
    "active_backend",
    "dequantize_entries",
    "gather_blocks",
    "launch_override",
    "quantize_entries",
    "scatter_blocks",
    "select_backend",
    "splice_tail",
]


class Backend(enum.Enum):
    """Where the data paths run."""

    CUDA = "cuda"
    SIMULATOR = "simulator"
    TORCH = "torch"


@dataclass(frozen=True)
class BackendChoice:
    """The backend in use and a human-readable reason for it (for logs and ``kvstate`` reports)."""

    backend: Backend
    reason: str


class SpliceResult(NamedTuple):
    """Outputs of ``splice_tail``: the attention input and the resumable compressor state."""

    kv: torch.Tensor  # [n_c + t, D]: entries, then the kv half of the t tail rows
    state: torch.Tensor  # [S, 2D]: the next entry's window, positions m*n_c - (S-m) + s
    first_bad: torch.Tensor  # int64 [1] on the device: first discontinuous position, -1 if none


# ---- backend selection ----------------------------------------------------------------------
# numba is imported only when a kernel backend (CUDA or the simulator) may run: the torch
# reference, and so the library on a CPU machine, needs neither numba nor the kernel modules.
def _numba() -> ModuleType | None:
    try:
        return importlib.import_module("numba")
    except ImportError:
        return None


def _cuda() -> Any:
    from numba import cuda  # the only supported path: numba-cuda redirects it

    return cuda


@functools.cache
def _kernel(name: str) -> Any:
    """A kernel module (``paged``, ``dequant``, ...), compiled lazily on first launch."""
    return importlib.import_module(f"{__package__}.{name}")


def simulator_enabled() -> bool:
    """True when numba was (or, imported now, would be) imported with ``NUMBA_ENABLE_CUDASIM=1``."""
    nb = sys.modules.get("numba")
    if nb is None:
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() in ("", "0"):
            return False
        nb = _numba()
        if nb is None:
            return False
    return bool(getattr(nb.config, "ENABLE_CUDASIM", 0))


@functools.cache
def _gpu_probe() -> tuple[bool, str]:
    """(usable, why) for the real-GPU backend; probed once per process."""
    if simulator_enabled():
        return False, "NUMBA_ENABLE_CUDASIM=1: numba's cuda module is the simulator"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} has no CUDA device"
    if _numba() is None:
        return False, "numba is not installed (pip install kvstate[kernels])"
    try:
        numba_ok = bool(_cuda().is_available())
    except Exception as exc:  # a broken driver install reports here, not at launch
        return False, f"numba.cuda.is_available() raised {type(exc).__name__}: {exc}"
    if not numba_ok:
        return False, "torch sees a GPU but numba finds no CUDA driver/device"
    name = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    return True, f"numba and torch see {name} (sm_{cc[0]}{cc[1]})"


def _parse(requested: Backend | str) -> Backend:
    if isinstance(requested, Backend):
        return requested
    try:
        return Backend(str(requested).strip().lower())
    except ValueError:
        names = ", ".join(b.value for b in Backend)
        raise KernelInputError(
            f"unknown kernel backend {requested!r}; known: {names}, auto"
        ) from None


def select_backend(requested: Backend | str | None = None) -> BackendChoice:
    """Resolve the backend: argument, else ``$KVSTATE_KERNEL_BACKEND``, else the first usable of
    CUDA, SIMULATOR, TORCH (an argument ``"auto"`` skips the environment and chooses).  Raises
    ``BackendUnavailableError`` for a forced backend that cannot run here."""
    source = "argument"
    if isinstance(requested, str) and requested.strip().lower() == "auto":
        requested = None
    elif requested is None:
        env = os.environ.get(ENV_VAR, "").strip().lower()
        if env and env != "auto":
            requested, source = env, f"{ENV_VAR}={env}"
    gpu_ok, gpu_why = _gpu_probe()
    if requested is not None:
        backend = _parse(requested)
        if backend is Backend.CUDA and not gpu_ok:
            raise BackendUnavailableError(f"kernel backend CUDA forced by {source}, but {gpu_why}")
        if backend is Backend.SIMULATOR and not simulator_enabled():
            raise BackendUnavailableError(
                f"kernel backend SIMULATOR forced by {source}, but NUMBA_ENABLE_CUDASIM=1 was not "
                "set before numba was imported"
            )
        return BackendChoice(backend, f"forced by {source}")
    if gpu_ok:
        return BackendChoice(Backend.CUDA, f"auto: {gpu_why}")
    if simulator_enabled():
        return BackendChoice(Backend.SIMULATOR, "auto: no GPU; NUMBA_ENABLE_CUDASIM=1 is set")
    return BackendChoice(Backend.TORCH, f"auto: torch reference ({gpu_why})")


def active_backend() -> BackendChoice:
    """The backend a call without ``backend=`` would use now, and why."""
    return select_backend(None)


# ---- launch configuration -------------------------------------------------------------------
_LAUNCH: contextvars.ContextVar[LaunchConfig | None] = contextvars.ContextVar(
    "kvstate_kernel_launch", default=None
)


@contextlib.contextmanager
def launch_override(cfg: LaunchConfig) -> Iterator[LaunchConfig]:
    """Run kernels with another launch configuration (tests use it to exercise multi-thread
    blocks and grid-stride loops under the simulator; benchmarks to tune)."""
    token = _LAUNCH.set(cfg)
    try:
        yield cfg
    finally:
        _LAUNCH.reset(token)


def _cfg(backend: Backend) -> LaunchConfig:
    override = _LAUNCH.get()
    if override is not None:
        return override
    return GPU_LAUNCH if backend is Backend.CUDA else SIMULATOR_LAUNCH


# ---- tensor plumbing ------------------------------------------------------------------------
_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _resolve(backend: Backend | str | None) -> Backend:
    return select_backend(backend).backend


def _check_devices(backend: Backend, **tensors: torch.Tensor | None) -> torch.device:
    present = {k: t for k, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in present.items())
        raise KernelInputError(f"tensors are on different devices: {where}")
    device = devices.pop()
    if backend is Backend.CUDA and device.type != "cuda":
        raise KernelInputError(
            f"backend CUDA needs CUDA tensors, got {device}; move them with .cuda() or pass "
            "backend='torch'"
        )
    if backend is Backend.SIMULATOR and device.type != "cpu":
        raise KernelInputError(f"backend SIMULATOR needs CPU tensors, got {device}")
    return device


def _int_tensor(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dim() != dims or t.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(
            f"{name} must be a {dims}-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}"
        )


def _word_bytes(sizes: list[int], tensors: list[torch.Tensor]) -> int:
    """Widest word (8/4/2/1 bytes) dividing every byte count and every base address."""
    for w in (8, 4, 2, 1):
        if all(s % w == 0 for s in sizes) and all(t.data_ptr() % w == 0 for t in tensors):
            return w
    return 1


def _rows_as_words(
    t: torch.Tensor, rows: int, row_elems: int, word: int, name: str
) -> torch.Tensor:
    """View ``t`` as ``[rows, row_bytes / word]`` integer words without copying (raises if the
    rows are not contiguous inside; a copy would silently drop writes)."""
    try:
        v = t.view(rows, row_elems)
        if v.dtype == torch.bool:
            v = v.view(torch.uint8)
        return v.view(torch.uint8).view(_WORD_DTYPES[word])
    except RuntimeError as exc:
        raise KernelInputError(
            f"{name} {tuple(t.shape)} strides {t.stride()} cannot be viewed as rows of words: {exc}"
        ) from None


class _Arrays:
    """Launch scope: hands torch tensors to numba and provides the stream to launch on.

    GPU: zero-copy CUDA-array-interface views (any strides), created without the interface's
    stream sync (``sync=False``: the launch goes to torch's current stream, so it is ordered
    after the work that produced the inputs, with no host round trip; this also keeps launches
    legal inside CUDA-graph capture), inside the tensors' device context.
    Simulator: numpy views.  The simulator only accepts contiguous buffers (it copies every array
    in and out of its fake device anyway), so a strided tensor is staged through a contiguous
    copy there and, if the kernel writes it, copied back when the scope exits normally."""

    def __init__(self, backend: Backend, device: torch.device) -> None:
        self.backend = backend
        self.device = device
        self.stream: Any = 0
        self._writeback: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._gpu: Any = None

    def __enter__(self) -> _Arrays:
        if self.backend is Backend.CUDA:
            index = (
                self.device.index if self.device.index is not None else torch.cuda.current_device()
            )
            cuda = _cuda()
            self._gpu = cuda.gpus[index]
            self._gpu.__enter__()
            self.stream = cuda.external_stream(torch.cuda.current_stream(self.device).cuda_stream)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._gpu is not None:
            self._gpu.__exit__(exc_type, exc, tb)
        if exc_type is None:
            for target, staged in self._writeback:
                target.copy_(staged)

    def __call__(self, t: torch.Tensor, *, written: bool = False) -> Any:
        t = t.detach()
        if self.backend is Backend.SIMULATOR:
            if t.is_contiguous():
                return t.numpy()
            staged = t.contiguous()
            if written:
                self._writeback.append((t, staged))
            return staged.numpy()
        if t.numel() == 0:  # may have no allocation to point at; give numba its own empty array
            return _cuda().device_array(
                tuple(t.shape), dtype=torch.empty(0, dtype=t.dtype).numpy().dtype
            )
        return _cuda().as_cuda_array(t, sync=False)


# ---- 1. paged gather / scatter --------------------------------------------------------------
def _paged_args(
    tier: torch.Tensor, table: torch.Tensor, buf: torch.Tensor | None, length: int | None, role: str
) -> tuple[int, int, int]:
    """Validate a tier/table/buffer triple; returns (length, unit_elems, block_elems)."""
    if tier.dim() < 2:
        raise KernelInputError(
            f"tier must be [num_blocks, block_units, ...], got {tuple(tier.shape)}"
        )
    _int_tensor("block_table", table, 1)
    block_units = tier.shape[1]
    unit_elems = math.prod(tier.shape[2:])
    capacity = table.shape[0] * block_units
    if length is None:
        length = capacity
    if not 0 <= length <= capacity:
        raise KernelInputError(
            f"length {length} units needs {-(-length // max(block_units, 1))} blocks; the block "
            f"table has {table.shape[0]} x {block_units} units"
        )
    if buf is not None:
        if buf.dtype != tier.dtype:
            raise KernelInputError(f"{role} dtype {buf.dtype} != tier dtype {tier.dtype}")
        if buf.numel() != length * unit_elems:
            raise KernelInputError(
                f"{role} has {buf.numel()} elements, expected length x unit = {length} x {unit_elems}"
            )
        if not buf.is_contiguous():
            raise KernelInputError(f"{role} must be contiguous")
    return length, unit_elems, block_units * unit_elems


def gather_blocks(
    tier: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    length: int | None = None,
    check: bool = True,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Copy tier blocks named by ``block_table`` into one contiguous buffer.

    ``tier`` is ``[num_blocks, block_units, *unit]`` (a 2-D tier has scalar units).  The buffer
    holds ``length`` units (default ``len(block_table) * block_units``); unit ``u`` comes from
    ``tier[block_table[u // block_units], u % block_units]``, so the last block may be ragged and
    table entries past ``length`` are not read.  Slots ``-1`` (null block / CUDA-graph padding)
    are skipped and their part of ``out`` is left untouched; a freshly allocated ``out`` is zeroed,
    so they read as zeros.  ``out`` (any contiguous shape with ``length x unit`` elements) defaults
    to ``[n, block_units, *unit]`` when ``length`` is the whole table, else ``[length, *unit]``.
    ``check`` raises ``BlockTableError`` (first bad table index) for a slot outside
    ``[0, num_blocks)`` that is not -1; without it such slots are skipped.  Returns ``out``.
    """
    b = _resolve(backend)
    length, unit_elems, block_elems = _paged_args(tier, block_table, out, length, "out")
    if out is None:
        n = block_table.shape[0]
        shape = (n, *tier.shape[1:]) if length == n * tier.shape[1] else (length, *tier.shape[2:])
        out = torch.zeros(shape, dtype=tier.dtype, device=tier.device)
    device = _check_devices(b, tier=tier, block_table=block_table, out=out)
    if check:
        ref.check_block_table(block_table, tier.shape[0], unique=False)
    if b is Backend.TORCH:
        return ref.gather_blocks_ref(tier, block_table, out, length, check=False)
    _launch_paged(b, device, tier, block_table, out, "out", length, unit_elems, block_elems, check)
    return out


def scatter_blocks(
    src: torch.Tensor,
    block_table: torch.Tensor,
    tier: torch.Tensor,
    *,
    length: int | None = None,
    check: bool = True,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Copy a contiguous buffer into tier blocks named by ``block_table`` (the inverse of
    ``gather_blocks``, same layout rules).  Slots ``-1`` write nothing and are never used as an
    index; only the first ``length`` units are written, so a ragged last block leaves the rest of
    its tier block untouched.  ``check`` raises ``BlockTableError`` before anything is written
    for a slot out of range or a slot named twice (two writers racing for one block).  Returns
    ``tier`` (written in place; it must be viewable as rows of words without a copy).
    """
    b = _resolve(backend)
    length, unit_elems, block_elems = _paged_args(tier, block_table, src, length, "src")
    device = _check_devices(b, src=src, block_table=block_table, tier=tier)
    if check:
        ref.check_block_table(block_table, tier.shape[0], unique=True)
    if b is Backend.TORCH:
        return ref.scatter_blocks_ref(src, block_table, tier, length, check=False)
    _launch_paged(b, device, tier, block_table, src, "src", length, unit_elems, block_elems, check)
    return tier


def _launch_paged(
    b: Backend,
    device: Any,
    tier: torch.Tensor,
    table: torch.Tensor,
    buf: torch.Tensor,
    role: str,
    length: int,
    unit_elems: int,
    block_elems: int,
    check: bool,
) -> None:
    """One paged copy between ``tier``'s blocks and the contiguous ``buf``: a gather when
    ``role`` is ``"out"`` (``buf`` written), a scatter when it is ``"src"`` (the tier written);
    both move the same words over the same table, so they share the launch and the flag."""
    if table.shape[0] == 0 or length * unit_elems == 0:
        return
    es = tier.element_size()
    word = _word_bytes([block_elems * es, length * unit_elems * es], [tier, buf])
    tier_w = _rows_as_words(tier, tier.shape[0], block_elems, word, "tier")
    buf_w = _rows_as_words(buf, 1, buf.numel(), word, role).view(-1)
    err = torch.full((1,), table.shape[0], dtype=torch.int64, device=device)
    # (source, table, destination): the destination's words are the ones copied back
    src_w, dst_w = (tier_w, buf_w) if role == "out" else (buf_w, tier_w)
    kernel = _kernel("paged")
    with _Arrays(b, device) as a:
        (kernel.launch_gather if role == "out" else kernel.launch_scatter)(
            a(src_w),
            a(table),
            a(dst_w, written=True),
            buf_w.shape[0],
            a(err, written=True),
            _cfg(b),
            a.stream,
        )
    if check:
        _raise_table_flag(err, table)


def _raise_table_flag(err: torch.Tensor, table: torch.Tensor) -> None:
    i = int(err[0])
    if i < table.shape[0]:
        raise BlockTableError(
            f"kernel skipped block table entry {i} (slot {int(table[i])} out of range)", i
        )


# ---- 2. dequantization ----------------------------------------------------------------------
def _layout(layout: EntryLayout | Any) -> EntryLayout:
    return layout if isinstance(layout, EntryLayout) else EntryLayout.from_geometry(layout)


def dequantize_entries(
    entries: torch.Tensor,
    layout: EntryLayout | Any,
    out: torch.Tensor | None = None,
    *,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Decode packed compressed entries, uint8 ``[n, entry_bytes]``, to float32
    ``[n, head_dim]`` (FP8 dims times their UE8M0 scale, then the BF16 RoPE dims).  ``layout``
    is an ``EntryLayout`` or a geometry (``kvstate.spec.geometry``).  Bit-exact across backends
    except NaN payloads.  Returns ``out``."""
    b = _resolve(backend)
    lay = _layout(layout)
    if entries.dim() != 2 or entries.dtype != torch.uint8 or entries.shape[1] != lay.entry_bytes:
        raise KernelInputError(
            f"entries must be uint8 [n, {lay.entry_bytes}], got {entries.dtype} {tuple(entries.shape)}"
        )
    n = entries.shape[0]
    if out is None:
        out = torch.empty(n, lay.head_dim, dtype=torch.float32, device=entries.device)
    elif out.dtype != torch.float32 or tuple(out.shape) != (n, lay.head_dim):
        raise KernelInputError(
            f"out must be float32 [{n}, {lay.head_dim}], got {out.dtype} {tuple(out.shape)}"
        )
    device = _check_devices(b, entries=entries, out=out)
    if b is Backend.TORCH:
        out.copy_(ref.dequantize_entries_ref(entries, lay))
        return out
    if n == 0:
        return out
    with _Arrays(b, device) as a:
        _kernel("dequant").launch_dequant(a(entries), a(out, written=True), lay, _cfg(b), a.stream)
    return out


def quantize_entries(x: torch.Tensor, layout: EntryLayout | Any) -> torch.Tensor:
    """Pack float32 ``[n, head_dim]`` into uint8 entries (torch on the input's device; the
    write path is not a recovery kernel).  See ``reference.quantize_entries``."""
    return ref.quantize_entries(x, _layout(layout))


# ---- 3. tail splice -------------------------------------------------------------------------
_SMALL_RING = 64  # rings up to this many rows take the host path below on CPU tensors


def _splice_tail_cpu(
    entries: torch.Tensor,
    state: torch.Tensor,
    state_pos: torch.Tensor,
    ratio: int,
    num_tokens: int,
    out_kv: torch.Tensor,
    out_state: torch.Tensor,
    check: bool,
) -> SpliceResult:
    """``ref.splice_tail_ref`` on CPU tensors with the ring's bookkeeping in Python ints (the
    ring is a few rows: the reference's twenty tensor ops on it cost more than the copies).
    The same outputs, flag and error (``tests/kernels/test_kernels_splice.py`` compares both
    on every boundary of random rings, stale rows included)."""
    n_c, dim = entries.shape
    ring = state.shape[0]
    first_tail = ratio * n_c
    tail = num_tokens - first_tail
    base = first_tail - (ring - ratio)
    held = state_pos.tolist()
    ok: list[bool] = []
    bad = -1
    for i in range(ring):
        p = base + i
        live = 0 <= p < num_tokens
        good = live and held[p % ring] == p
        ok.append(good)
        if live and not good and bad < 0:
            bad = i
    if bad >= 0 and check:
        q = base + bad
        raise TailDiscontinuityError(
            f"compressor state slot {q % ring} holds position {int(held[q % ring])}, expected "
            f"{q} (entries end at token {first_tail - 1}, boundary {num_tokens})",
            q,
        )
    # row i holds slot (base + i) % ring: the ring rotated by k
    k = base % ring
    out_state[: ring - k].copy_(state[k:])
    if k:
        out_state[ring - k :].copy_(state[:k])
    for i, good in enumerate(ok):
        if not good:
            out_state[i].zero_()
    out_kv[:n_c].copy_(entries)
    if tail:
        out_kv[n_c:].copy_(out_state[ring - ratio : ring - ratio + tail, :dim])
    first_bad = torch.tensor([base + bad if bad >= 0 else -1], dtype=torch.int64)
    return SpliceResult(out_kv, out_state, first_bad)


def splice_tail(
    entries: torch.Tensor,
    state: torch.Tensor,
    state_pos: torch.Tensor,
    *,
    ratio: int,
    num_tokens: int,
    out_kv: torch.Tensor | None = None,
    out_state: torch.Tensor | None = None,
    check: bool = True,
    backend: Backend | str | None = None,
) -> SpliceResult:
    """Join the compressed entries of one layer with its compressor state at boundary
    ``num_tokens`` (exact semantics in ``kernels/splice.py``).

    ``entries`` ``[n_c, D]``: entries ``0..n_c-1`` (must be ``num_tokens // ratio`` of them);
    ``state`` ``[S, 2D]`` (kv | score): a ring, position ``q`` in slot ``q % S``
    (``S = 2 * ratio`` for CSA, ``S = ratio`` for HCA); ``state_pos`` ``[S]``: the position each
    slot holds (-1 if none).  Returns ``SpliceResult(kv [n_c + t, D], state [S, 2D],
    first_bad [1])`` where ``t = num_tokens - ratio * n_c`` tail rows follow the entries,
    ``state`` is the next entry's window in position order, and ``first_bad`` is the device-side
    error flag: the first position whose slot holds another position (that row is zero-filled),
    or -1.  ``TailDiscontinuityError`` (with that position) is raised when the entry count does
    not match the boundary, and, with ``check``, when ``first_bad`` is not -1 (``check=False``
    leaves the flag to the caller and never syncs).
    """
    b = _resolve(backend)
    _int_tensor("state_pos", state_pos, 1)
    if entries.dim() != 2 or state.dim() != 2:
        raise KernelInputError(
            f"entries [n_c, D] and state [S, 2D] must be 2-D, got {tuple(entries.shape)}, {tuple(state.shape)}"
        )
    n_c, dim = entries.shape
    ring = state.shape[0]
    if state.shape[1] != 2 * dim or state.dtype != entries.dtype or state_pos.shape[0] != ring:
        raise KernelInputError(
            f"state must be {entries.dtype} [S, {2 * dim}] with state_pos [S]; got {state.dtype} "
            f"{tuple(state.shape)}, state_pos {tuple(state_pos.shape)}"
        )
    if ratio < 1 or ring < ratio or num_tokens < 0:
        raise KernelInputError(
            f"need ratio >= 1, S >= ratio, num_tokens >= 0; got {ratio}, {ring}, {num_tokens}"
        )
    if n_c != num_tokens // ratio:
        q = ratio * min(n_c, num_tokens // ratio)
        raise TailDiscontinuityError(
            f"{n_c} compressed entries cover tokens [0, {ratio * n_c}) but boundary {num_tokens} "
            f"needs {num_tokens // ratio} entries (ratio {ratio}): the tail cannot start at "
            f"token {ratio * n_c}",
            q,
        )
    tail = num_tokens - ratio * n_c
    fresh = out_kv is None and out_state is None  # nothing of the caller's to alias the inputs
    if out_kv is None:
        out_kv = torch.empty(n_c + tail, dim, dtype=state.dtype, device=state.device)
    if out_state is None:
        out_state = torch.empty(ring, 2 * dim, dtype=state.dtype, device=state.device)
    for name, t, shape in (
        ("out_kv", out_kv, (n_c + tail, dim)),
        ("out_state", out_state, (ring, 2 * dim)),
    ):
        if tuple(t.shape) != shape or t.dtype != state.dtype:
            raise KernelInputError(
                f"{name} must be {state.dtype} {list(shape)}, got {t.dtype} {tuple(t.shape)}"
            )
    device = _check_devices(
        b, entries=entries, state=state, state_pos=state_pos, out_kv=out_kv, out_state=out_state
    )
    if b is Backend.TORCH and fresh and device.type == "cpu" and ring <= _SMALL_RING:
        return _splice_tail_cpu(
            entries, state, state_pos, ratio, num_tokens, out_kv, out_state, check
        )
    if b is Backend.TORCH:
        kv, st, first_bad = ref.splice_tail_ref(
            entries, state, state_pos, ratio, num_tokens, check=check
        )
        out_kv.copy_(kv)
        out_state.copy_(st)
        return SpliceResult(out_kv, out_state, first_bad)
    es = state.element_size()
    word = _word_bytes([dim * es], [entries, state, out_kv, out_state])
    views = [
        _rows_as_words(entries, n_c, dim, word, "entries"),
        _rows_as_words(state, ring, 2 * dim, word, "state"),
        _rows_as_words(out_kv, n_c + tail, dim, word, "out_kv"),
        _rows_as_words(out_state, ring, 2 * dim, word, "out_state"),
    ]
    err = torch.full((1,), num_tokens, dtype=torch.int64, device=device)
    with _Arrays(b, device) as a:
        _kernel("splice").launch_splice(
            a(views[0]),
            a(views[1]),
            a(state_pos),
            ratio,
            num_tokens,
            a(views[2], written=True),
            a(views[3], written=True),
            a(err, written=True),
            _cfg(b),
            a.stream,
        )
    if check:
        q = int(err[0])
        if q < num_tokens:
            raise TailDiscontinuityError(
                f"compressor state slot {q % ring} holds position {int(state_pos[q % ring])}, "
                f"expected {q} (entries end at token {ratio * n_c - 1}, boundary {num_tokens})",
                q,
            )
    return SpliceResult(out_kv, out_state, torch.where(err < num_tokens, err, -1))
