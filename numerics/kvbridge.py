"""The bridge between the tiny model and the kvstate library: store real states, resume from a hit.

:class:`ModelWriter` is a kvstate writer (``kvstate.impl.testdata.Writer``): when the cache
stores a block it asks the writer for the block's bytes, and this writer answers with the tiny
model's *actual* state of that block: compressed entries (CSA/HCA), the indexer key of every CSA
entry, every layer's SWA window rows and the CSA compressor state saved at the block's end
boundary.  :func:`restore_pieces` does the reverse inside ``with cache.use(adm) as run``: it
reads the five states back through the :class:`~kvstate.impl.cache.Run` accessors
(``read_compressed``, ``read_window``, ``read_tail``) into :class:`StatePieces`, and
``HybridModel.resume`` computes only the rest of the prompt.

Storage layout (the adaptation to kvstate's tiers; nothing is rounded, every byte round-trips):

* The model keeps its states in float32 so that a resume is bit-exact; kvstate's compressed entry
  slot is ``geometry.entry_bytes`` wide (FP8 + UE8M0 scales + BF16 RoPE: 152 B in the small
  geometry).  :func:`storage_geometry` is the small geometry with only the byte layout changed:
  ``entry_pad_bytes`` widens each entry slot to ``KEY + VALUE`` bytes and ``indexer_entry_bytes``
  becomes the float32 key size.  Every field the model reads (layers, ratios, window, dims,
  top-k, block sizes) is unchanged; :func:`check_geometries` enforces that.
* A compressed entry slot holds ``[indexer key (indexer_dim float32) | entry (head_dim float32)]``
  (HCA: the key part is zero).  kvstate derives an indexer page from the CSA pages it indexes
  (``IndexerGroup.build``: the first ``indexer_entry_bytes`` of each entry, XOR 0xA5, a stand-in
  for the indexer's key projection, which the library cannot compute).  With the key stored in
  front of the entry that derivation yields the model's key exactly, so a rebuilt indexer (after a
  disk load) is the model's indexer, and the restore reads state (4) from kvstate's indexer tier.
* An SWA row holds ``[window kv row (head_dim float32) | zero padding]``.
* The compressor group keeps, per CSA layer and LCM boundary ``h``, a ring of ``2m`` rows of
  width ``2 * head_dim`` with their positions.  At ``h`` (a multiple of ``m``) the model's live
  CSA tail is the ``m`` rows of positions ``[h - m, h)``, and only their *second* halves (the
  part a row contributes as the previous block of entry ``h / m``) are ever read again; the first
  halves were folded into entry ``h / m - 1``.  The writer stores
  ``[kv[head_dim:] | score[head_dim:]]`` (exactly the group's width) and the restore puts zeros
  in the dead halves, which the model never reads: the resumed logits stay bit-exact.  HCA has no
  live tail at an LCM boundary (``L`` is a multiple of ``m'``), which is why kvstate stores none.
* Versions: the model counts entry writes; kvstate stamps each block's indexer with the content
  version it was built from.  The restore maps them: ``compressed_version`` = entries restored,
  ``indexer_version`` = entries of the leading blocks whose indexer is at their KV version (all of
  them on a validated hit).

:class:`StorageReader` reads the same bytes *without* validation (any length, any block state,
optionally from a load's destination slot): it shows what a cache that served the prefix-hash
hit without kvstate's hit rule would have handed the model.  It is for negative tests only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from kvstate.impl.cache import HeterogeneousKVCache, Request, Run
from kvstate.spec.geometry import Geometry, SwaDiskPolicy
from kvstate.spec.phases import Swa

from .model import HybridModel
from .state import DTYPE, LayerPieces, StateError, StatePieces, export_pieces, ratio_of

#: Geometry fields the model reads; the cache's storage geometry must agree on all of them.
MODEL_FIELDS = (
    "layers",
    "csa_ratio",
    "hca_ratio",
    "n_win",
    "head_dim",
    "fp8_dims",
    "rope_dims",
    "indexer_heads",
    "indexer_dim",
    "top_k",
    "compressed_block_tokens",
    "swa_block_tokens",
    "swa_checkpoint_tokens",
)
_F32 = 4  # bytes per float32
_XOR = 0xA5  # kvstate's indexer derivation (IndexerGroup.build) XORs the key bytes with this


class BridgeError(ValueError):
    """The cache asked for, or returned, bytes that do not fit the model's state."""


def key_bytes(g: Geometry) -> int:
    return g.indexer_dim * _F32


def value_bytes(g: Geometry) -> int:
    return g.head_dim * _F32


def storage_geometry(g: Geometry, policy: SwaDiskPolicy | None = None) -> Geometry:
    """The cache geometry for model geometry ``g``: same model, entry slots wide enough for the
    float32 ``[key | entry]`` layout (module doc), optionally another SWA disk policy."""
    changes: dict[str, object] = {
        "entry_pad_bytes": key_bytes(g) + value_bytes(g),
        "indexer_entry_bytes": key_bytes(g),
    }
    if policy is not None:
        changes["swa_disk_policy"] = policy
    out = g.with_changes(**changes)
    check_geometries(g, out)
    return out


def check_geometries(model_g: Geometry, cache_g: Geometry) -> None:
    """Raise :class:`BridgeError` unless the cache can hold the model's state exactly."""
    diff = [f for f in MODEL_FIELDS if getattr(model_g, f) != getattr(cache_g, f)]
    if diff:
        raise BridgeError(f"cache and model geometries differ in {diff}")
    if cache_g.entry_bytes < key_bytes(model_g) + value_bytes(model_g):
        raise BridgeError(
            f"entry slots of {cache_g.entry_bytes} B cannot hold a float32 key + entry "
            f"({key_bytes(model_g) + value_bytes(model_g)} B): use storage_geometry()"
        )
    if cache_g.indexer_entry_bytes != key_bytes(model_g):
        raise BridgeError(
            f"indexer entries are {cache_g.indexer_entry_bytes} B, the float32 key is "
            f"{key_bytes(model_g)} B"
        )
    if model_g.n_win < model_g.swa_block_tokens:
        raise BridgeError("the writer needs n_win >= swa_block_tokens")


def _bytes(t: Tensor) -> Tensor:
    """A float32 tensor's bytes, last dim multiplied by 4."""
    return t.contiguous().view(torch.uint8)


def _floats(b: Tensor) -> Tensor:
    return b.contiguous().view(DTYPE)


# ---- the write side ------------------------------------------------------------------------


@dataclass
class Trace:
    """One prompt run through the model: full-prefill logits and the state at every SWA block
    boundary (a chunked prefill split there, which is bit-exact with the full prefill)."""

    tokens: list[int]
    reference: Tensor  # [len(tokens), vocab]: one full prefill, the recompute to compare with
    at: dict[int, StatePieces] = field(default_factory=dict)

    @property
    def final(self) -> StatePieces:
        return self.at[max(self.at)]

    @classmethod
    def run(cls, model: HybridModel, tokens: Sequence[int]) -> Trace:
        toks = [int(t) for t in tokens]
        reference, _ = model.prefill(toks)
        tr = cls(toks, reference)
        step = model.geometry.swa_block_tokens
        state = None
        for lo in range(0, len(toks), step):
            _, state = model.prefill(toks[lo : lo + step], state)
            tr.at[min(lo + step, len(toks))] = export_pieces(state)
        return tr

    def pieces(self, h: int) -> StatePieces:
        if h not in self.at:
            raise BridgeError(f"no state captured at boundary {h}")
        return self.at[h]


class ModelWriter:
    """A kvstate writer whose bytes are the tiny model's real states (see the module doc).

    The cache calls it while it stores a request's blocks; :meth:`writing` names the prompt
    (its :class:`Trace`) being stored.  Every call checks the block's tokens against the trace,
    so bytes of one prompt can never be filed under another prompt's blocks.
    """

    fmt = 0  # Fmt.PRIMARY

    def __init__(self, model: HybridModel, cache_geometry: Geometry) -> None:
        check_geometries(model.geometry, cache_geometry)
        self.model = model
        self.g = model.geometry
        self.cg = cache_geometry
        self._active: Trace | None = None
        self.calls = 0

    def trace(self, tokens: Sequence[int]) -> Trace:
        return Trace.run(self.model, tokens)

    @contextlib.contextmanager
    def writing(self, trace: Trace) -> Iterator[Trace]:
        before, self._active = self._active, trace
        try:
            yield trace
        finally:
            self._active = before

    def _trace(self) -> Trace:
        if self._active is None:
            raise BridgeError("the cache stored a block outside ModelWriter.writing(trace)")
        return self._active

    def _check_tokens(self, tr: Trace, positions: list[int], tokens: Tensor) -> None:
        want = [tr.tokens[p] if 0 <= p < len(tr.tokens) else None for p in positions]
        if want != [int(t) for t in tokens.tolist()]:
            raise BridgeError(f"block tokens at positions {positions[:3]}... are not the trace's")

    def rows(
        self, group: str, layers: Tensor, positions: Tensor, tokens: Tensor, width: int
    ) -> Tensor:
        tr = self._trace()
        g = self.g
        self.calls += 1
        if width != self.cg.entry_bytes:
            raise BridgeError(f"{group} rows of {width} B, expected {self.cg.entry_bytes}")
        pos = positions.tolist()
        out = torch.zeros(len(layers), len(pos), width, dtype=torch.uint8)
        kb, vb = key_bytes(g), value_bytes(g)
        if group in ("csa", "hca"):
            ratio = ratio_of(g, group)  # type: ignore[arg-type]
            self._check_tokens(tr, [ratio * e + ratio - 1 for e in pos], tokens)
            final = tr.final
            for i, li in enumerate(layers.tolist()):
                lp = final.layers[li]
                if lp.kind != group or lp.compressed is None:
                    raise BridgeError(f"layer {li} is {lp.kind}, the cache asked for {group}")
                if max(pos) >= lp.compressed.shape[0]:
                    raise BridgeError(f"entry {max(pos)} of layer {li} was never compressed")
                idx = torch.tensor(pos, dtype=torch.long)
                out[i, :, kb : kb + vb] = _bytes(lp.compressed.index_select(0, idx))
                if lp.indexer_keys is not None:
                    out[i, :, :kb] = _bytes(lp.indexer_keys.index_select(0, idx))
        elif group == "swa":
            self._check_tokens(tr, pos, tokens)
            bt = g.swa_block_tokens
            for k, p in enumerate(pos):  # the window at the end of p's SWA block holds p
                src = tr.pieces(min((p // bt + 1) * bt, len(tr.tokens)))
                for i, li in enumerate(layers.tolist()):
                    lp = src.layers[li]
                    where = (lp.window_pos == p).nonzero().flatten()
                    if where.numel() != 1:
                        raise BridgeError(f"no window row for position {p} in layer {li}")
                    out[i, k, :vb] = _bytes(lp.window_kv[int(where[0])])
        else:
            raise BridgeError(f"the model has no {group!r} rows")
        return out

    def state_rows(self, layers: Tensor, positions: Tensor, tokens: Tensor, width: int) -> Tensor:
        """Compressor rows at the boundary ``positions[-1] + 1``: ``kv[hd:] | score[hd:]``."""
        tr = self._trace()
        g = self.g
        hd = g.head_dim
        self.calls += 1
        if width != 2 * hd:
            raise BridgeError(f"compressor rows of {width} floats, expected {2 * hd}")
        pos = positions.tolist()
        self._check_tokens(tr, pos, tokens)
        h = pos[-1] + 1
        pieces = tr.pieces(h)
        out = torch.zeros(len(layers), len(pos), width, dtype=DTYPE)
        for i, li in enumerate(layers.tolist()):
            lp = pieces.layers[li]
            if lp.kind != "csa" or lp.tail_pos is None:
                raise BridgeError(f"layer {li} is {lp.kind}: no CSA compressor state")
            assert lp.tail_kv is not None and lp.tail_score is not None
            have = lp.tail_pos.tolist()
            if have != pos:
                raise BridgeError(f"layer {li} tail holds {have} at {h}, the cache asked {pos}")
            out[i, :, :hd] = lp.tail_kv[:, hd:]
            out[i, :, hd:] = lp.tail_score[:, hd:]
        return out


def store_prompt(
    cache: HeterogeneousKVCache, writer: ModelWriter, trace: Trace, n_tokens: int | None = None
) -> Request:
    """A first request over ``trace.tokens[:n_tokens]``: no hit needed, stores its full blocks
    (with the model's bytes) when it finishes.  Returns the (finished) request."""
    toks = trace.tokens[: len(trace.tokens) if n_tokens is None else n_tokens]
    req = cache.request(toks)
    adm = cache.admit(req, recover=False)
    with writer.writing(trace), cache.use(adm):
        pass
    return req


# ---- the read side -------------------------------------------------------------------------


class Source(Protocol):
    """Where :func:`pieces_from` reads the five states of a hit of ``h`` tokens."""

    h: int
    entry_bytes: int  # the cache's compressed entry slot

    def compressed(self, group: str, gpos: int) -> Tensor: ...  # uint8 [pages, page_bytes]
    def indexer(self, gpos: int) -> Tensor: ...  # uint8 [pages, page_bytes]
    def window(self, layer: int) -> Tensor: ...  # uint8 [n_win, entry_bytes], [h - n_win, h)
    def tail(self, gpos: int) -> tuple[Tensor, list[int]]: ...  # rows [k, 2hd] and positions
    def loaded_blocks(self) -> int: ...  # leading blocks whose compressed KV is fully landed
    def synced_blocks(self) -> int: ...  # leading blocks whose indexer is at the KV version


def _prefix_view(run: Run, h: int) -> Run:
    """The pinned run read as a hit of ``h <= run.hit_tokens`` tokens (a prefix of its blocks)."""
    if h == run.hit_tokens:
        return run
    L = run.cache.L
    if not 0 <= h <= run.hit_tokens or h % L:
        raise BridgeError(f"boundary {h} is not a block boundary within the hit {run.hit_tokens}")
    return run.prefix(h)


class RunSource:
    """The validated path: everything through the ``Run`` accessors of a ``cache.use`` block."""

    def __init__(self, run: Run, h: int | None = None) -> None:
        self.run = _prefix_view(run, run.hit_tokens if h is None else h)
        self.h = self.run.hit_tokens
        self.m = run.cache.geometry.csa_ratio
        self.entry_bytes = run.cache.geometry.entry_bytes

    def compressed(self, group: str, gpos: int) -> Tensor:
        return self.run.read_compressed(group, gpos).cpu()

    def indexer(self, gpos: int) -> Tensor:
        return self.run.read_compressed("indexer", gpos).cpu()

    def window(self, layer: int) -> Tensor:
        return self.run.read_window(layer)

    def tail(self, gpos: int) -> tuple[Tensor, list[int]]:
        if self.h == 0:
            return torch.zeros(0, 2 * self.run.cache.geometry.head_dim), []
        state = self.run.read_tail(gpos)  # the splice kernel checked the boundary
        return state[: self.m].cpu(), list(range(self.h - self.m, self.h))

    def loaded_blocks(self) -> int:
        return self.run.blocks  # validated: L3.ckv_ready and L3.disk_loaded hold

    def synced_blocks(self) -> int:
        return self.run.blocks  # validated: L3.indexer_synced holds


class StorageReader:
    """The *unvalidated* path: kvstate's storage for ``request``'s first ``h`` tokens, whatever
    the hit rule says (negative tests only).  ``slots`` overrides a record's device slot, e.g.
    with a load job's destination to read a block whose load has not finished."""

    def __init__(
        self,
        cache: HeterogeneousKVCache,
        request: Request,
        h: int,
        slots: dict[int, int] | None = None,
    ) -> None:
        self.cache = cache
        self.view = cache.inspect()  # read-only: what the bridge reads of the cache
        self.h = h
        self.entry_bytes = cache.geometry.entry_bytes
        self.nb = -(-h // cache.L)
        with self.view.lock:
            self.chain_rids = self.view.resolve(request.chain)
        if self.nb > len(self.chain_rids):
            raise BridgeError(f"the request has only {len(self.chain_rids)} blocks")
        self.rids = self.chain_rids[: self.nb]
        self.slots = dict(slots or {})

    def _slot(self, rid: int) -> int:
        if rid in self.slots:
            return self.slots[rid]
        return self.view.meta.slot[rid] if rid >= 0 else -1

    def _pages(self, grp: Any, gpos: int, rids: Sequence[int]) -> Tensor:
        ppl = grp.pages_per_block
        out = torch.zeros(len(rids) * ppl, grp.page_bytes, dtype=torch.uint8)
        for b, rid in enumerate(rids):
            s = self._slot(rid)
            if s >= 0:  # a block with no device slot reads as a never-written (zero) page
                out[b * ppl : (b + 1) * ppl] = grp.device_data[gpos, grp.dev_index(s)].cpu()
        return out

    def compressed(self, group: str, gpos: int) -> Tensor:
        return self._pages(getattr(self.view.tiers, group), gpos, self.rids)

    def indexer(self, gpos: int) -> Tensor:
        return self._pages(self.view.tiers.indexer, gpos, self.rids)

    def window(self, layer: int) -> Tensor:
        """As ``Run.read_window``, through the group's block table (null page when not valid)."""
        core, g = self.view, self.cache.geometry
        swa = core.tiers.swa
        h, bt, n_win = self.h, g.swa_block_tokens, g.n_win
        out = torch.zeros(n_win, g.entry_bytes, dtype=torch.uint8)
        if h == 0:
            return out
        mapped = swa.map(self.chain_rids)
        rows = []
        for j in range(max(0, h - n_win) // bt, (h - 1) // bt + 1):
            b, i = divmod(j, swa.pages_per_block)
            rid = mapped[b] if b < len(mapped) else -1
            pages = core.meta.swa_pages[rid] if rid >= 0 else ()
            ok = rid >= 0 and pages and core.meta.swa[rid] == Swa.VALID
            page = pages[i] if ok else swa.NULL_PAGE
            rows.append(swa.device_data[layer, page].view(bt, g.entry_bytes).cpu())
        flat = torch.cat(rows)
        lo = max(0, h - n_win) - (max(0, h - n_win) // bt) * bt
        got = flat[lo : lo + min(h, n_win)]
        out[n_win - got.shape[0] :] = got
        return out

    def tail(self, gpos: int) -> tuple[Tensor, list[int]]:
        """The rows of positions ``[h - m, h)`` the boundary's compressor page holds (by its
        position labels; no continuity check), through the group's block table."""
        grp = self.view.tiers.compressor
        m, hd = grp.ratio, self.cache.geometry.head_dim
        empty = torch.zeros(0, 2 * hd)
        if self.h == 0:
            return empty, []
        mapped = grp.map(self.chain_rids)
        rid = mapped[self.nb - 1] if self.nb - 1 < len(mapped) else -1
        s = self._slot(rid) if rid >= 0 else -1
        if s < 0:
            return empty, []
        state, pos = grp.decode(grp.device_data[gpos, grp.dev_index(s)])
        held = pos.tolist()
        want = [q for q in range(self.h - m, self.h) if held[q % grp.ring] == q]
        if not want:
            return empty, []
        idx = torch.tensor([q % grp.ring for q in want], dtype=torch.long)
        return state.index_select(0, idx), want

    def _rule_prefix(self, *names: str) -> int:
        """Blocks from the start on which the table's own hit rules ``names`` hold (evaluated on
        the cache's state through the table, not restated here)."""
        hr = self.cache.table.hit_rule
        rules = [hr.rule(n) for n in names]
        L = self.cache.L
        with self.view.lock:
            view = self.view.chain_view(self.rids)
            n = 0
            while n < len(self.rids) and all(hr.rule_holds(r, view, 0, (n + 1) * L) for r in rules):
                n += 1
        return n

    def loaded_blocks(self) -> int:
        return self._rule_prefix("L3.ckv_ready", "L3.disk_loaded")

    def synced_blocks(self) -> int:
        return self._rule_prefix("L3.indexer_synced")


def pieces_from(g: Geometry, src: Source) -> StatePieces:
    """The model's :class:`StatePieces` at ``src.h`` from kvstate's bytes (layout: module doc)."""
    h, L = src.h, g.lcm_tokens
    if h % L:
        raise BridgeError(f"a kvstate hit ends on an LCM boundary ({L}); got {h}")
    hd, kb, vb = g.head_dim, key_bytes(g), value_bytes(g)
    counters = {"csa": 0, "hca": 0}
    loaded_b, synced_b = src.loaded_blocks(), src.synced_blocks()
    out: list[LayerPieces] = []
    for li, kind in enumerate(g.layers):
        win = src.window(li)
        n = min(h, g.n_win)
        fields: dict[str, Any] = {
            "kind": kind,
            "window_kv": _floats(win[g.n_win - n :, :vb]),
            "window_pos": torch.arange(h - n, h, dtype=torch.long),
        }
        if kind != "swa":
            gpos = counters[kind]
            counters[kind] += 1
            ratio = ratio_of(g, kind)
            epb = g.entries_per_block(ratio)
            n_e = h // ratio
            pages = src.compressed(kind, gpos)
            eb = src.entry_bytes
            slots = pages[:, : epb * eb].reshape(-1, eb)[:n_e] if n_e else pages[:0, :eb]
            if slots.shape[0] != n_e:
                raise BridgeError(f"layer {li}: {slots.shape[0]} entries read, expected {n_e}")
            loaded = torch.zeros(n_e, dtype=torch.bool)
            loaded[: loaded_b * L // ratio] = True
            fields |= {
                "compressed": _floats(slots[:, kb : kb + vb]).reshape(n_e, hd),
                "compressed_loaded": loaded,
                "compressed_version": n_e,
            }
            if kind == "csa":
                ipages = src.indexer(gpos)
                keys = ipages[:, : epb * kb].reshape(-1, kb)[:n_e] ^ _XOR
                fields |= {
                    "indexer_keys": _floats(keys).reshape(n_e, g.indexer_dim),
                    "indexer_version": min(n_e, synced_b * L // ratio),
                }
                rows, pos = src.tail(gpos)
                tkv = torch.zeros(len(pos), 2 * hd, dtype=DTYPE)
                tsc = torch.zeros(len(pos), 2 * hd, dtype=DTYPE)
                tkv[:, hd:] = rows[:, :hd]  # the live (previous-block) halves; the dead
                tsc[:, hd:] = rows[:, hd:]  # own-block halves are never read again
                fields |= {
                    "tail_kv": tkv,
                    "tail_score": tsc,
                    "tail_pos": torch.tensor(pos, dtype=torch.long),
                }
            else:  # no HCA state is live at an LCM boundary (L is a multiple of m')
                if h % g.hca_ratio:
                    raise BridgeError(f"boundary {h} is not a multiple of m' = {g.hca_ratio}")
                fields |= {
                    "tail_kv": torch.zeros(0, hd, dtype=DTYPE),
                    "tail_score": torch.zeros(0, hd, dtype=DTYPE),
                    "tail_pos": torch.zeros(0, dtype=torch.long),
                }
        out.append(LayerPieces(**fields))
    return StatePieces(g, h, tuple(out))


def restore_pieces(model: HybridModel, run: Run, h: int | None = None) -> StatePieces:
    """The five states of a kvstate hit, read through ``run`` (inside ``cache.use``), at its hit
    length or at an earlier block boundary ``h`` of it."""
    check_geometries(model.geometry, run.cache.geometry)
    return pieces_from(model.geometry, RunSource(run, h))


def read_unvalidated(
    model: HybridModel,
    cache: HeterogeneousKVCache,
    request: Request,
    h: int,
    slots: dict[int, int] | None = None,
) -> StatePieces:
    """What kvstate's storage holds for ``request``'s first ``h`` tokens, unvalidated."""
    check_geometries(model.geometry, cache.geometry)
    return pieces_from(model.geometry, StorageReader(cache, request, h, slots))


def resume_from(
    model: HybridModel, pieces: StatePieces, trace: Trace, *, check: bool = True
) -> Tensor:
    """Logits of the prompt's tokens after ``pieces.length``, resumed from ``pieces``."""
    if pieces.length >= len(trace.tokens):
        raise StateError("nothing left to compute after the restored state")
    logits, _ = model.resume(pieces, trace.tokens[pieces.length :], check=check)
    return logits
