"""Integrity of every stored form, and the cache directory's refusals, as the API harness checks them.

``corrupt`` and ``damage`` (kvstate/targets/api/ops.py, kvstate/targets/api/damage.py) break an entry the
way a disk does: a MAC then fails.  What a MAC does not decide is left unchecked by them: a
header that is *authentic* (written under the directory's key, as a buggy or older writer of the
same key would) but whose fields are not this cache's layout, and the files a directory holds
beside the entries.  Here:

* ``forge(b, k)``: block ``b``'s published entry gets the forgery :data:`FORGERIES` ``[k]``,
  its header MACed again under the directory's key.  Each breaks one field the scan checks
  (the field set, a number's type or range, the unit table against the layout, the chunk
  table, the window section, the file's size, the format, the block's key against the file's
  name, the JSON itself, the prefix's header length), so the next restart must drop the entry
  (the model's "header" kind: the load may fail or not, the restart finds no entry).  Two
  forgeries plant a *copy* under a fresh name instead (another geometry's fingerprint, another
  key's id): someone else's entry, which the scan must leave alone, never counted and never
  deleted (the harness's accounting checks every such file at every call).
* at every restart (:func:`at_restart`, before the new cache opens): one refused open of the
  directory, rotating through :data:`REFUSALS` (its lock held by another holder, its key file
  readable by others, a symlink, the wrong length, not a regular file, another user's; the
  cache directory a file, or under one): the constructor must raise the documented error,
  leave the directory's files as they were, and let its lock go; then the files a crash leaves
  that are kvstate's to delete (a key temporary of a killed opener, an older copy of an entry,
  an entry file cut inside its prefix), which the restarted cache's scan must remove
  (:class:`StoredForms`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.fsrefusals import FS_REFUSALS
from kvstate.targets.api.fsrefusals import LEAKS as FS_LEAKS


def _disk_private(h: Any) -> tuple[Any, Callable[[bytes], bytes], Any]:
    """The cache's disk tier, its header MAC and the entry prefix's layout (the one read of
    private names in this module)."""
    from kvstate.impl import disk as d

    tier = h.view.disk
    return tier, tier.header_mac, d.PREFIX


# ---- forgeries of an authentic header ---------------------------------------------------------
Header = dict[str, Any]


def _set(field: str, value: Any) -> Callable[[Header], Header]:
    def f(hd: Header) -> Header:
        hd[field] = value
        return hd

    return f


def _units(hd: Header) -> Header:
    # two units of one size trade places: the chunk table and the size still agree, only the
    # unit table is not the layout's
    u = hd["units"]
    i = next(i for i in range(len(u) - 1) if u[i][0] == u[i + 1][0] and u[i][2] == u[i + 1][2])
    u[i][1], u[i + 1][1] = u[i + 1][1], u[i][1]
    return hd


def _unit_negative(hd: Header) -> Header:
    hd["units"][0][1] = -1
    return hd


def _chunks_fewer(hd: Header) -> Header:
    hd["chunks"] = hd["chunks"][:-1]
    return hd


def _chunk_range(hd: Header) -> Header:
    hd["chunks"][0][3] += 1
    return hd


def _chunk_bool(hd: Header) -> Header:
    hd["chunks"][0][2] = False  # equal to 0, the chunk's first byte, but not a number
    return hd


def _chunk_mac(hd: Header) -> Header:
    hd["chunks"][-1][4] = hd["chunks"][-1][4][:-2]  # a MAC one byte short
    return hd


def _window(hd: Header) -> Header:
    sw = hd["swa_section"]
    if sw is None:  # a window section of one byte (the file gets that byte)
        end = sum(n for _, _, n in hd["units"])
        hd["swa_section"] = [end, end + 1, "00" * 32]
    else:  # one byte longer than the layout's window (the file too)
        sw[1] += 1
    return hd


def _other_key(hd: Header) -> Header:
    k = hd["key"]
    hd["key"] = k[:-1] + ("0" if k[-1] != "0" else "1")  # well-formed, another block's
    return hd


def _not_list(hd: Header) -> Header:
    hd["units"] = {"0": hd["units"]}
    return hd


def _fingerprint(hd: Header) -> Header:
    hd["fingerprint"] = {"another": "geometry", "was": hd["fingerprint"]}
    return hd


# (name, header edit, or None for a raw edit in :func:`_forged`, and where the forgery goes)
FORGERIES: tuple[tuple[str, Callable[[Header], Header] | None, str], ...] = (
    ("an extra field", _set("extra", 0), "replace"),
    ("a negative version", _set("ver", -1), "replace"),
    ("a generation that is not an int", _set("gen", True), "replace"),
    ("a unit not of the layout", _units, "replace"),
    ("a negative unit layer", _unit_negative, "replace"),
    ("units not a list", _not_list, "replace"),
    ("a chunk missing", _chunks_fewer, "replace"),
    ("a chunk's range", _chunk_range, "replace"),
    ("a chunk MAC's length", _chunk_mac, "replace"),
    ("a chunk bound that is a bool", _chunk_bool, "replace"),
    ("the window section", _window, "replace"),
    ("a nonce that is not text", _set("nonce", 7), "replace"),
    ("another format", _set("format", 4), "replace"),
    ("a key that is not hex", _set("key", "zz"), "replace"),
    ("another block's key", _other_key, "replace"),
    ("a header that is a list", None, "replace"),
    ("a header that is not JSON", None, "replace"),
    ("a byte past the payload", None, "replace"),
    ("a header length past the file", None, "replace"),
    ("a file cut inside its prefix", None, "replace"),
    ("another geometry", _fingerprint, "foreign"),
    ("another key's id", None, "foreign"),
)


def _forged(h: Any, data: bytes, name: str, edit: Callable[[Header], Header] | None) -> bytes:
    tier, mac, prefix = _disk_private(h)
    magic, hlen, _, key_id = prefix.unpack_from(data)
    body = data[prefix.size + hlen :]
    hb = data[prefix.size : prefix.size + hlen]
    if name == "a byte past the payload":
        return data + b"\x00"
    if name == "a header length past the file":
        return prefix.pack(magic, len(data), mac(hb), key_id) + hb + body
    if name == "a file cut inside its prefix":
        return data[: prefix.size - 1]
    if name == "another key's id":
        return prefix.pack(magic, hlen, mac(hb), bytes(b ^ 0x5A for b in key_id)) + hb + body
    if name == "the window section":
        body += b"\x00"  # only the window's length is not the layout's
    if edit is not None:
        hb = json.dumps(edit(json.loads(hb)), sort_keys=True).encode()
    elif name == "a header that is a list":
        hb = b"[]"
    else:
        hb = b'{"format": '
    return prefix.pack(magic, len(hb), mac(hb), key_id) + hb + body


def do_forge(h: Any, o: Any) -> int | None:
    b = o.arg("b")
    name, edit, where = FORGERIES[o.arg("k") % len(FORGERIES)]
    e = h.view.disk_entries.get(h.rids[b])
    if e is None or b in h.corrupt:
        return None
    data = e.path.read_bytes()
    forged = _forged(h, data, name, edit)
    if where == "foreign":  # someone else's entry beside this one, under a fresh name
        path = h.view.disk.new_path(e.key)
        path.write_bytes(forged)
        h.foreign_files[path.name] = forged
    else:  # the entry itself: authentic, not this cache's layout; the scan must drop it
        e.path.write_bytes(forged)
        h.corrupt[b] = "header"
    h.cov.add(f"fault forge {name}")
    return None


# an authentic header not of this layout (kvstate/targets/api/declare.py: the form)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "forge",
        do_forge,
        "corrupt",
        lambda s: {"b": s.block, "k": st.integers(0, len(FORGERIES) - 1)},
        faults=("forge",),
    ),
)


# ---- the directory's refusals at a restart -----------------------------------------------------
def _snapshot(root: str) -> dict[str, tuple[int, bytes]]:
    out = {}
    for ent in os.scandir(root):
        st = ent.stat(follow_symlinks=False)
        data = open(ent.path, "rb").read() if ent.is_file(follow_symlinks=False) else b""
        out[ent.name] = (st.st_mode, data)
    return out


def _descriptors() -> set[str]:
    """This process's open descriptors (a refused open must leave none of its own)."""
    return set(os.listdir("/proc/self/fd"))


def _key(h: Any) -> str:
    from kvstate.impl.disk import KEY_FILE

    return os.path.join(h.dir, KEY_FILE)


Setup = tuple[Any, Callable[[], None]]  # (cache_dir, or the constructor's arguments; undo)


def _refuse_in_use(h: Any) -> Setup:
    fd = os.open(h.dir, os.O_RDONLY | os.O_DIRECTORY)  # another process holds the directory
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return h.dir, lambda: os.close(fd)


def _refuse_mode(h: Any, mode: int = 0o644) -> Setup:
    os.chmod(_key(h), mode)
    return h.dir, lambda: os.chmod(_key(h), 0o600)


def _aside(h: Any, put: Callable[[str, str], None]) -> Setup:
    key, aside = _key(h), os.path.join(os.path.dirname(h.dir), os.path.basename(h.dir) + ".key")
    os.rename(key, aside)
    put(key, aside)

    def back() -> None:
        if os.path.isdir(key) and not os.path.islink(key):
            os.rmdir(key)
        else:
            os.unlink(key)
        os.rename(aside, key)

    return h.dir, back


def _refuse_symlink(h: Any) -> Setup:
    return _aside(h, lambda key, aside: os.symlink(aside, key))


def _refuse_not_file(h: Any) -> Setup:
    return _aside(h, lambda key, aside: os.mkdir(key, 0o700))


def _refuse_length(h: Any) -> Setup:
    def short(key: str, aside: str) -> None:
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, open(aside, "rb").read()[:-1])
        os.close(fd)

    return _aside(h, short)


def _refuse_owner(h: Any) -> Setup:
    st = os.stat(_key(h))
    os.chown(_key(h), st.st_uid + 1, st.st_gid)
    return h.dir, lambda: os.chown(_key(h), st.st_uid, st.st_gid)


def _refuse_is_file(h: Any) -> Setup:
    return _key(h), lambda: None


def _refuse_under_file(h: Any) -> Setup:
    return os.path.join(_key(h), "sub"), lambda: None


def _refuse_nul(h: Any) -> Setup:
    return h.dir + "\x00x", lambda: None


def _refuse_short_key(h: Any) -> Setup:
    return {"cache_dir": h.dir, "disk_key": b"k" * 8}, lambda: None


# (name, the documented error, the world's setup returning (cache_dir, undo)); the owner's
# refusal needs a user that can give a file away (root), else it is skipped
REFUSALS: tuple[tuple[str, str, Callable[[Any], Setup]], ...] = (
    ("the directory locked by another holder", "DirectoryInUse", _refuse_in_use),
    ("the key readable by others", "InvalidArgument", _refuse_mode),
    # one group and one other bit alone, those 0o644 leaves unset (not 0600: docs/library.md)
    ("the key executable by others", "InvalidArgument", lambda h: _refuse_mode(h, 0o601)),
    ("the key writable by its group", "InvalidArgument", lambda h: _refuse_mode(h, 0o620)),
    ("the key a symlink", "InvalidArgument", _refuse_symlink),
    ("the key not a regular file", "InvalidArgument", _refuse_not_file),
    ("the key one byte short", "InvalidArgument", _refuse_length),
    ("the key another user's", "InvalidArgument", _refuse_owner),
    ("the cache directory a file", "InvalidArgument", _refuse_is_file),
    ("the cache directory under a file", "InvalidArgument", _refuse_under_file),
    ("a NUL byte in the cache directory's name", "InvalidArgument", _refuse_nul),
    ("a disk key of 8 bytes", "InvalidArgument", _refuse_short_key),
    *FS_REFUSALS,  # the file system's own (kvstate/targets/api/fsrefusals.py)
)


def _refused_open(h: Any, n: int) -> None:
    """One refused open of the crashed cache's directory (the ``n``-th refusal, rotating)."""
    from kvstate.impl import errors
    from kvstate.impl.cache import HeterogeneousKVCache

    name, err, setup = REFUSALS[n % len(REFUSALS)]
    if name == "the key another user's" and os.geteuid() != 0:
        return
    if not os.path.exists(_key(h)):
        return
    before = _snapshot(h.dir)
    fds = _descriptors()
    where, undo = setup(h)
    got: BaseException | None = None
    try:
        over = where if isinstance(where, dict) else {"cache_dir": where}
        c = HeterogeneousKVCache(**{**h.open_kwargs(), **over})
        c.close()
    except errors.KVStateError as exc:
        got = exc
    except Exception as exc:  # noqa: BLE001 - an undocumented error is the finding
        got = exc
    finally:
        undo()
    if not isinstance(got, getattr(errors, err)):
        raise h.fail(
            "directory-refusal",
            [name],
            f"opening a cache over {name}: expected {err}, got "
            f"{'no error' if got is None else f'{type(got).__name__}: {got}'}",
        )
    left = sorted(_descriptors() - fds) + FS_LEAKS[:]
    FS_LEAKS.clear()
    if left:
        raise h.fail(
            "directory-refusal",
            [name],
            f"a refused open over {name} left descriptors open: {left}",
        )
    after = _snapshot(h.dir)
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        raise h.fail(
            "directory-refusal",
            [name],
            f"a refused open over {name} changed the directory's files: {changed}",
        )
    fd = os.open(h.dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise h.fail(
            "directory-refusal", [name], f"a refused open over {name} kept the directory's lock"
        ) from None
    finally:
        os.close(fd)
    h.cov.add(f"fault refused open: {name}")


def _plant_ours(h: Any, tag: str) -> list[str]:
    """Files a crash leaves that are kvstate's to delete (the restarted scan must): a key
    temporary of an opener killed before it linked the key, an older copy of an entry (a crash
    before a reap), an entry's file cut inside its prefix (a copy killed early).  The key
    temporary holds part of a key or, every other restart, all of it: a key's length is the
    largest a temporary of ours can be (:func:`_plant_aliens` plants one byte more)."""
    from kvstate.impl.disk import KEY_BYTES, MAGIC

    names = [f".kvstate-key.{tag}.new", f"{'ab' * 16}{tag}.kvb"]
    with open(os.path.join(h.dir, names[0]), "wb") as f:
        f.write(b"\x01" * (KEY_BYTES if int(tag, 16) % 2 else KEY_BYTES - 4))
    with open(os.path.join(h.dir, names[1]), "wb") as f:
        f.write(MAGIC + b"\x00\x01")
    entries = sorted(h.view.disk_entries.values(), key=lambda e: e.path.name)
    if entries:
        e = entries[len(tag) % len(entries)]
        old = h.view.disk.new_path(e.key)
        shutil.copyfile(e.path, old)
        st = os.stat(e.path)
        os.utime(old, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # written a second earlier
        names.append(old.name)
    return names


def _plant_aliens(h: Any, tag: str) -> dict[str, tuple[int, str]]:
    """What is not kvstate's under its names, which the scan must leave alone and never follow:
    a directory and a symlink (to a real entry) under entry names, a FIFO under a temporary's,
    a symlink under a key temporary's, a regular file there one byte longer than a key (no
    opener of ours writes more), and where the harness may give a file away (root), an
    entry-named file with kvstate's magic that another user owns.  name -> (kind, link)."""
    import stat

    from kvstate.impl.disk import KEY_BYTES, MAGIC

    out: dict[str, tuple[int, str]] = {}
    d = f"{'de' * 16}{tag}.kvb"
    os.mkdir(os.path.join(h.dir, d), 0o700)
    out[d] = (stat.S_IFDIR, "")
    entries = sorted(e.path.name for e in h.view.disk_entries.values())
    target = entries[0] if entries else os.path.basename(_key(h))
    for name in (f"{'df' * 16}{tag}.kvb", f".kvstate-key.{tag}link.new"):
        os.symlink(target, os.path.join(h.dir, name))
        out[name] = (stat.S_IFLNK, target)
    long_key = f".kvstate-key.{tag}long.new"
    with open(os.path.join(h.dir, long_key), "wb") as f:
        f.write(b"\x02" * (KEY_BYTES + 1))
    out[long_key] = (stat.S_IFREG, "")
    fifo = f".{'da' * 16}{tag}.kvb.x.tmp"
    os.mkfifo(os.path.join(h.dir, fifo), 0o600)
    out[fifo] = (stat.S_IFIFO, "")
    if os.geteuid() == 0:
        other = f"{'db' * 16}{tag}.kvb"
        path = os.path.join(h.dir, other)
        with open(path, "wb") as f:
            f.write(MAGIC + b"\x00" * 4)
        os.chown(path, 1, 1)
        out[other] = (stat.S_IFREG, "")
    return out


def at_restart(h: Any, n: int) -> None:
    """After the crash, before the new cache opens: one refused open, then the leftovers."""
    _refused_open(h, n)
    h.cov.add("files of ours planted")
    for c in h.checks:
        if isinstance(c, StoredForms):
            c.planted = _plant_ours(h, f"{n:08x}")
            c.aliens = _plant_aliens(h, f"{n:08x}")


class StoredForms(CallCheck):
    """The restarted cache's scan removed what kvstate left behind (:func:`_plant_ours`)."""

    def __init__(self) -> None:
        self.planted: Sequence[str] = ()
        self.aliens: dict[str, tuple[int, str]] = {}

    def restart(self, h: Any) -> None:
        import stat

        aliens, self.aliens = self.aliens, {}
        for name, (kind, link) in aliens.items():
            path = os.path.join(h.dir, name)
            try:
                st = os.lstat(path)
                same = stat.S_IFMT(st.st_mode) == kind and (not link or os.readlink(path) == link)
            except OSError:
                same = False
            if not same:
                raise h.fail(
                    "restart-scan",
                    ["aliens"],
                    f"the restarted cache's scan touched {name}, which is not kvstate's",
                )
            if kind == stat.S_IFDIR:  # (gone again: the accounting lists entries' names)
                os.rmdir(path)
            else:
                os.unlink(path)
        if aliens:
            h.cov.add("check: the scan left what is not kvstate's alone")
        left = [n for n in self.planted if os.path.lexists(os.path.join(h.dir, n))]
        self.planted = ()
        if left:
            raise h.fail(
                "restart-scan",
                ["leftovers"],
                f"the restarted cache's scan left kvstate's own leftovers behind: {left}",
            )
        h.cov.add("check: the scan removed what a crash left")
