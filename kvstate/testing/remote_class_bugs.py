"""Planted bugs of the remote tier's classes the fuzz closes with ``--remote``: the configuration's
limits and refusals (kvstate/targets/api/remoteargs.py), a node over an explicit ``ChunkStore``,
a write the server refuses (kvstate/targets/api/remotefull.py), and node B adopting node A's
entries (kvstate/targets/api/remote.py).  Each is an exact edit of
``impl/``'s sources; ``tests/cli/test_api_remote.py`` plants each in a staged copy of the
package and runs ``kvstate fuzz --target kvstate-api --remote --profile ci`` on it: every one
must be caught.  (They are not the remote tier's unit tests' bugs, ``remote_bugs.py``: those
tests build each config once, with good values.)

====================================  ==================================================================
name                                  what the planted code does
====================================  ==================================================================
``remote_key_limit_off_by_one``       a 64-byte fleet key, which the docs allow, is refused
``remote_timeout_limit_off_by_one``   a ``timeout`` of 3600 s, which the docs allow, is refused
``remote_store_argument_ignored``     ``RemoteConfig(store=...)`` connects to ``url`` instead
``remote_refused_write_escapes``      a ``SET`` the server refuses (OOM) escapes as the client's error
``remote_every_header_refused``       a node opening on the store refuses every header (length cap 0)
====================================  ==================================================================
"""

from __future__ import annotations

from kvstate.testing.seeded import Edit, Seeded

_REMOTE = "impl/remote.py"

REMOTE_CLASS_BUGS: tuple[Seeded, ...] = (
    Seeded(
        "remote_key_limit_off_by_one",
        "limits",
        "a documented limit refused",
        "a 64-byte fleet key, which the docs allow, is refused",
        (Edit(_REMOTE, "KEY_MIN, KEY_MAX = 16, 64", "KEY_MIN, KEY_MAX = 16, 63"),),
    ),
    Seeded(
        "remote_timeout_limit_off_by_one",
        "limits",
        "a documented limit refused",
        "a timeout of 3600 s, which the docs allow, is refused",
        (Edit(_REMOTE, "not 0 < t <= 3600:", "not 0 < t < 3600:"),),
    ),
    Seeded(
        "remote_store_argument_ignored",
        "configuration",
        "an object store passed in is not used",
        "RemoteConfig(store=...) connects to url instead",
        (
            Edit(
                _REMOTE,
                "        if self.store is not None:\n            return self.store",
                "        if False:\n            return self.store",
            ),
        ),
    ),  # fmt: skip
    Seeded(
        "remote_refused_write_escapes",
        "errors",
        "a store's refusal surfaces as the client library's exception",
        "a SET the server refuses (OOM) escapes as the client's error",
        (
            Edit(
                "impl/remotestore.py",
                "        except self._errors as exc:\n"
                '            raise self._fail("SET", exc) from exc',
                '        except OSError as exc:\n            raise self._fail("SET", exc) from exc',
            ),
        ),
    ),
    Seeded(
        "remote_every_header_refused",
        "integrity",
        "a node that finds nothing in a shared store",
        "a node opening on the store refuses every header (length cap 0)",
        (Edit(_REMOTE, "MAX_HEADER: Final = 1 << 20", "MAX_HEADER: Final = 0 << 20"),),
    ),
)

# the classes of kvstate/targets/api/remotewire.py, remotesteps.py, remoteheaders.py, remotecalls.py
from kvstate.testing.remote_path_bugs import REMOTE_PATH_BUGS  # noqa: E402

REMOTE_CLASS_BUGS = (*REMOTE_CLASS_BUGS, *REMOTE_PATH_BUGS)
