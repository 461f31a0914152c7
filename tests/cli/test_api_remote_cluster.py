"""``kvstate fuzz --target kvstate-api --remote URL`` where the URL names a Redis Cluster node
(kvstate/testing/rediscluster.py: three masters the test starts on 127.0.0.1, no persistence):
the run sees the cluster (``INFO cluster``), builds its caches with ``cluster=True`` and drives
its faults through a cluster-aware client, passes, writes to and reads from every master, and
leaves no key on any master.

Under CI (``CI=true``) a missing ``redis-server`` is a failure, elsewhere a skip with the
reason."""

from __future__ import annotations

import os

import pytest

from kvstate.testing.redisserver import ServerMissing, executable


def test_the_cli_runs_against_a_cluster() -> None:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    try:
        executable()
    except ServerMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI: {exc}")
        pytest.skip(str(exc))
    from kvstate.cli import main
    from kvstate.testing.rediscluster import RedisCluster, is_cluster

    cluster = RedisCluster()
    try:
        assert is_cluster(cluster.url)
        rc = main(["fuzz", "--target", "kvstate-api", "--remote", cluster.url,
                   "--profile", "ci", "--examples", "2", "--no-coverage"])  # fmt: skip
        assert rc == 0
        # every master took the run's writes and served its reads (a client blind to the
        # cluster reaches one master: the others answer it MOVED)
        for i in range(3):
            stats = cluster.node(i).info("commandstats")
            assert stats.get("cmdstat_set", {}).get("calls", 0) > 0, (i, stats)
            reads = [stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("get", "mget")]
            assert sum(reads) > 0, (i, stats)
        # every example's keys deleted at its end, on every master
        assert [cluster.node(i).dbsize() for i in range(3)] == [0, 0, 0]
    finally:
        cluster.close()
