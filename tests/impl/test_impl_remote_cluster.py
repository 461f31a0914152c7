"""The remote tier on a real Redis Cluster (three masters: tests/impl/redis_server.py's
``redis_cluster``), ``RemoteConfig(cluster=True)``: node A stores, node B recovers through the
cluster with the prefix's own bytes; every key of one entry lies in one hash slot (one hash tag),
and the entries of a prefix spread over the masters (the routing is exercised, not one node);
a chunk deleted, rewritten or cut on the cluster fails its load and truncates the hit (never a
wrong byte); the tier's scan finds the entries of every master."""

from __future__ import annotations

from collections import defaultdict

import pytest
from redis_server import (  # noqa: F401 (the fixtures)
    RedisCluster,
    redis_cluster,
    redis_cluster_empty,
)
from test_impl_remote import BLOCKS, WHATS, L, hit_and_check, names, node, stored

from kvstate.impl.remotestore import MISSING, RedisStore

pytest.importorskip("redis")


def test_cross_node_hit_through_the_cluster(redis_cluster_empty: RedisCluster) -> None:  # noqa: F811
    cluster = redis_cluster_empty
    toks = stored(cluster)
    b = node(cluster)
    try:
        assert b.inspect().disk.store.cluster
        assert b.stats()["blocks"]["disk"] == BLOCKS  # (the scan reached every master)
        assert hit_and_check(b, toks) == BLOCKS * L  # (and every byte is the prefix's own)
        c = node(cluster)  # the entries stay for the fleet's other nodes
        try:
            assert hit_and_check(c, toks) == BLOCKS * L
        finally:
            c.close()
    finally:
        b.close()


def test_an_entry_s_keys_share_one_slot(redis_cluster_empty: RedisCluster) -> None:  # noqa: F811
    """A load pipelines an entry's reads; a cluster serves them only if all its keys lie in
    one slot.  Every key the tier wrote belongs to an entry whose header and chunks share
    one slot, on the master that holds it; the prefix's entries use more than one master."""
    cluster = redis_cluster_empty
    toks = stored(cluster)
    client = cluster.client()
    b = node(cluster)
    try:
        held = [{k.decode() for k in cluster.node(i).keys("*")} for i in range(len(cluster.ports))]
        seen: set[str] = set()
        masters = set()
        for block in range(BLOCKS):
            header, chunks = names(b, toks, block)
            (slot,) = {client.keyslot(n) for n in [header, *chunks]}
            holders = [i for i, keys in enumerate(held) if keys & {header, *chunks}]
            assert len(holders) == 1, (block, slot, holders)
            assert {header, *chunks} <= held[holders[0]]
            masters.add(holders[0])
            seen.update([header, *chunks])
        assert set().union(*held) == seen  # (nothing of the tier's outside the entries above)
        assert len(masters) > 1, "every entry on one master: the routing went unexercised"
    finally:
        b.close()
        client.close()


@pytest.mark.parametrize("what", WHATS)
def test_a_chunk_gone_or_rewritten_on_the_cluster_truncates_the_hit(
    redis_cluster_empty: RedisCluster,  # noqa: F811
    what: str,
) -> None:
    from test_impl_remote import vanished_or_rewritten

    vanished_or_rewritten(redis_cluster_empty, what)


def test_the_cluster_store_reads_into_spans(redis_cluster_empty: RedisCluster) -> None:  # noqa: F811
    """The store's own calls on a cluster, keys of many slots in one call: values placed in
    their spans, a missing or resized value reported and never placed, scans reaching every
    master."""
    cluster = redis_cluster_empty
    s = RedisStore(cluster.url, timeout=5.0, max_connections=4, cluster=True)
    try:
        names_ = [f"t:{i}" for i in range(12)]  # (no hash tag: their slots differ)
        values = [bytes([i]) * (i + 1) for i in range(12)]
        s.put(list(zip(names_, values, strict=True)), None)
        by_slot = defaultdict(list)
        for n in names_:
            by_slot[s.client.keyslot(n)].append(n)
        assert len(by_slot) > 1
        assert sorted(s.scan("t:*")) == sorted(names_)
        assert s.mget(["t:0", "t:gone"]) == [values[0], None]
        spans, lo = [], 0
        for v in values:
            spans.append((lo, lo + len(v)))
            lo += len(v)
        buf = bytearray(b"\xee" * (lo + 4))
        got = s.read_into(
            [*names_, "t:gone", "t:1"], memoryview(buf), [*spans, (lo, lo + 2), (lo, lo + 4)]
        )
        assert got == [*map(len, values), MISSING, 2]
        assert bytes(buf[:lo]) == b"".join(values) and buf[lo:] == b"\xee" * 4
    finally:
        s.close()
