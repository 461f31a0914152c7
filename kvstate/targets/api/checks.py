"""The API harness's checks beyond refinement, each in its own small module, behind one hook.

:class:`~kvstate.targets.api.state.ApiHarness` explains every call by table actions and checks
bytes, accounting and quiescence itself.  What the table leaves open (which block a policy
picks, how a prefix's identity is judged, what a call half done leaves behind) is checked by
the :class:`CallCheck` objects listed here, which the harness calls around every operation:
``before`` (the call has not run), ``after`` (it ran and was explained by ``steps`` from the
model's ``before`` state to ``end``), ``refused`` (it raised a documented error), ``restart``
(a crash and a new cache).  A check raises ``h.fail(...)`` on a finding.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import CallCheck


def make_checks(h: Any) -> list[CallCheck]:
    """The checks one harness runs (each keeps its own state for the example)."""
    from kvstate.targets.api.actmaint import ActMaintCheck
    from kvstate.targets.api.admform import AdmissionForm
    from kvstate.targets.api.args import MaintCount
    from kvstate.targets.api.corruptmarks import CorruptMarks
    from kvstate.targets.api.defaults import DefaultForms
    from kvstate.targets.api.delivery import Delivery
    from kvstate.targets.api.exhaust import Counts
    from kvstate.targets.api.facade import GuardReads, InspectionReads
    from kvstate.targets.api.geometry import NewModel
    from kvstate.targets.api.graphcounts import GraphCounts
    from kvstate.targets.api.graphs import GraphProtocol
    from kvstate.targets.api.handed import HandRows
    from kvstate.targets.api.handout import Events, GraphRows
    from kvstate.targets.api.jobfaults import UnverifiedTail
    from kvstate.targets.api.lrureads import RecencyReads
    from kvstate.targets.api.memo import WindowPolicy
    from kvstate.targets.api.onereads import OneRead
    from kvstate.targets.api.orders import OrderHook
    from kvstate.targets.api.pinreads import ReleasedPins
    from kvstate.targets.api.prefixreads import PrefixReads
    from kvstate.targets.api.queued import QueuedLoads
    from kvstate.targets.api.readers import AdmissionReaders
    from kvstate.targets.api.readonly import ReadOnlyTokens
    from kvstate.targets.api.ready import Readiness
    from kvstate.targets.api.recoveryhit import RecoveryHit
    from kvstate.targets.api.refusals import RefusalRequired
    from kvstate.targets.api.remote import checks as remote_checks
    from kvstate.targets.api.signatures import PublishedSignatures
    from kvstate.targets.api.single import ActCheck
    from kvstate.targets.api.slotorder import SlotTakes
    from kvstate.targets.api.stats import StatsCheck
    from kvstate.targets.api.stored import StoredForms
    from kvstate.targets.api.storeroom import OutsideStores
    from kvstate.targets.api.unlinks import Orphans
    from kvstate.targets.api.waits import Waits
    from kvstate.targets.api.whyrefused import WhyRefused
    from kvstate.targets.api.window import AppendWindows
    from kvstate.targets.api.writerfails import FinishStores

    return [
        NewModel(),  # first: the others see the derived table's model
        OrderHook(h),
        GraphRows(),
        Events(h),
        WindowPolicy(),
        Readiness(),
        Waits(),
        RecoveryHit(),
        CorruptMarks(),
        OneRead(),
        RefusalRequired(),
        MaintCount(),
        AppendWindows(),
        GraphProtocol(h),
        Delivery(h),
        StoredForms(),
        Counts(),
        PrefixReads(),
        StatsCheck(),
        ActCheck(),
        *remote_checks(h),  # the remote table's outcomes, with a remote tier
        UnverifiedTail(),
        GuardReads(),
        InspectionReads(),
        HandRows(),
        FinishStores(),
        OutsideStores(),
        ReleasedPins(),
        WhyRefused(),
        ReadOnlyTokens(),
        GraphCounts(),
        QueuedLoads(),
        DefaultForms(),
        PublishedSignatures(),
        Orphans(),  # kvstate/targets/api/unlinks.py
        RecencyReads(),  # after OrderHook: it reads the orders that hook walked
        AdmissionReaders(),
        AdmissionForm(),
        SlotTakes(),
        ActMaintCheck(),
    ]
