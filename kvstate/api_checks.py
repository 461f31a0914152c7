"""The API harness's checks beyond refinement, each in its own small module, behind one hook.

:class:`~kvstate.api_state.ApiHarness` explains every call by table actions and checks
bytes, accounting and quiescence itself.  What the table leaves open (which block a policy
picks, how a prefix's identity is judged, what a call half done leaves behind) is checked by
the :class:`CallCheck` objects listed here, which the harness calls around every operation:
``before`` (the call has not run), ``after`` (it ran and was explained by ``steps`` from the
model's ``before`` state to ``end``), ``refused`` (it raised a documented error), ``restart``
(a crash and a new cache).  A check raises ``h.fail(...)`` on a finding.
"""

from __future__ import annotations

from typing import Any

from kvstate.api_base import CallCheck


def make_checks(h: Any) -> list[CallCheck]:
    """The checks one harness runs (each keeps its own state for the example)."""
    from kvstate.api_args import MaintCount
    from kvstate.api_delivery import Delivery
    from kvstate.api_exhaust import Counts
    from kvstate.api_graphs import GraphProtocol
    from kvstate.api_handout import Events, GraphRows
    from kvstate.api_memo import WindowPolicy
    from kvstate.api_orders import OrderHook
    from kvstate.api_ready import Readiness
    from kvstate.api_refusals import RefusalRequired
    from kvstate.api_stored import StoredForms
    from kvstate.api_window import AppendWindows

    return [
        OrderHook(h),
        GraphRows(),
        Events(h),
        WindowPolicy(),
        Readiness(),
        RefusalRequired(),
        MaintCount(),
        AppendWindows(),
        GraphProtocol(h),
        Delivery(h),
        StoredForms(),
        Counts(),
    ]
