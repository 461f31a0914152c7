"""Planted bugs of the remote tier's paths the fuzz reaches through crafted replies, stepwise
loads, damaged headers and the store's own failures (kvstate/targets/api/remotewire.py,
remotesteps.py, remoteheaders.py, remotecalls.py): one representative of each class those
modules close.  They join ``remote_class_bugs.REMOTE_CLASS_BUGS``, so
``tests/cli/test_api_remote.py`` plants each in a staged copy of the package and runs
``kvstate fuzz --target kvstate-api --remote --profile ci`` on it: every one must be caught.

======================================  ================================================================
name                                    what the planted code does
======================================  ================================================================
``remote_split_value_wrong_range``      a value cut mid-body is copied from the wrong range of the buffer
``remote_error_reply_as_missing``       an error reply mid-pipeline passes for a missing value
``remote_reply_line_limit_off_by_one``  a 4095-byte reply line cut before its LF is refused
``remote_negative_length_as_size``      a ``$-2`` length is taken as a size (the parser moves back)
``remote_step_reads_the_previous_chunk`` a step-by-step load's ``load_progress`` reads the chunk before
``remote_header_at_another_name``       a header copied to another entry's name is adopted there
``remote_timeout_ignored``              the store's calls wait on a stalled server past ``timeout``
======================================  ================================================================
"""

from __future__ import annotations

from kvstate.testing.seeded import Edit, Seeded

_STORE = "impl/remotestore.py"
_REMOTE = "impl/remote.py"

REMOTE_PATH_BUGS: tuple[Seeded, ...] = (
    Seeded(
        "remote_split_value_wrong_range",
        "framing",
        "a reply parser that assumes a value arrives whole",
        "a value cut mid-body is copied from the wrong range of the buffer",
        (
            Edit(
                _STORE,
                "n = min(len(dst), self.hi - self.lo)",
                "n = min(len(dst), self.hi + self.lo)",
            ),
        ),
    ),
    Seeded(
        "remote_error_reply_as_missing",
        "errors",
        "a server's error reply read as a miss",
        "an error reply mid-pipeline passes for a missing value",
        (
            Edit(
                _STORE, "error = error or head[1:_LINE_MAX]", "error = error and head[1:_LINE_MAX]"
            ),
        ),
    ),
    Seeded(
        "remote_reply_line_limit_off_by_one",
        "limits",
        "a framing limit one off",
        "a 4095-byte reply line cut before its LF is refused",
        (Edit(_STORE, "if self.hi - self.lo > 1 << 12:", "if self.hi - self.lo >= 1 << 12:"),),
    ),
    Seeded(
        "remote_negative_length_as_size",
        "framing",
        "a malformed length trusted",
        "a $-2 length is taken as a size (the parser moves back)",
        (Edit(_STORE, "                    if n < 0:", "                    if n < -2:"),),
    ),
    Seeded(
        "remote_step_reads_the_previous_chunk",
        "offsets",
        "a step-by-step load's chunk index one off",
        "a step-by-step load's load_progress reads the chunk before",
        (
            Edit(
                _REMOTE,
                "        return torch.from_numpy(self._read(entry, [k])[1][0])",
                "        return torch.from_numpy(self._read(entry, [max(k - 1, 0)])[1][0])",
            ),
        ),
    ),
    Seeded(
        "remote_header_at_another_name",
        "integrity",
        "an authentic header trusted wherever it is found",
        "a header copied to another entry's name is adopted there",
        (Edit(_REMOTE, "            if name != self.header_name(key):", "            if False:"),),
    ),
    Seeded(
        "remote_timeout_ignored",
        "timeouts",
        "a stalled server stalls the cache",
        "the store's calls wait on a stalled server past timeout",
        (Edit(_STORE, '"socket_timeout": timeout,', '"socket_timeout": None,'),),
    ),
)
