"""The table's phases as plain ints, for the request path's own bookkeeping.

The metadata columns hold ints, and ``int(CKV.READY)`` (or an ``IntEnum`` member compared with an
int) is a lookup and a call at every use.  Each phase the implementation writes or compares with
is converted here once, from :mod:`kvstate.spec.phases` (the values are the spec's, never written
again), and every module of ``impl/`` imports it from here.  ``Final``: compiled with mypyc, a
final module constant of a module in the same build is a C static; any other module global is a
dict lookup and an unboxing at every use (~150 instructions, several per block).
"""

from __future__ import annotations

from typing import Final

from kvstate.spec.phases import CKV, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail

CKV_FREE: Final = int(CKV.FREE)
CKV_WRITING: Final = int(CKV.WRITING)
CKV_READY: Final = int(CKV.READY)
CKV_OFFLOADING: Final = int(CKV.OFFLOADING)
CKV_HOST: Final = int(CKV.HOST)
CKV_DISK: Final = int(CKV.DISK)
CKV_LOADING: Final = int(CKV.LOADING)
CKV_EVICTING: Final = int(CKV.EVICTING)

TAIL_NONE: Final = int(Tail.NONE)
TAIL_OPEN: Final = int(Tail.OPEN)
TAIL_SEALED: Final = int(Tail.SEALED)

SWA_NULL: Final = int(Swa.NULL)
SWA_VALID: Final = int(Swa.VALID)

IDX_ABSENT: Final = int(Indexer.ABSENT)
IDX_REBUILDING: Final = int(Indexer.REBUILDING)
IDX_PRESENT: Final = int(Indexer.PRESENT)

FMT_PRIMARY: Final = int(Fmt.PRIMARY)

PIPE_NONE: Final = int(Pipe.NONE)
PIPE_CPU: Final = int(Pipe.CPU)
PIPE_DMA: Final = int(Pipe.DMA)

REQ_IDLE: Final = int(Req.IDLE)
REQ_WAITING: Final = int(Req.WAITING)
REQ_MATCHED: Final = int(Req.MATCHED)
REQ_PINNED: Final = int(Req.PINNED)
REQ_VALIDATED: Final = int(Req.VALIDATED)
REQ_USING: Final = int(Req.USING)
REQ_RECOMPUTE: Final = int(Req.RECOMPUTE)

GRAPH_NONE: Final = int(Graph.NONE)
GRAPH_CAPTURED: Final = int(Graph.CAPTURED)
GRAPH_STALE: Final = int(Graph.STALE)
