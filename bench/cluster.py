"""A local Ray cluster of one or more nodes on this machine (``ray.cluster_utils.Cluster``: a head and
more raylets, each with its own resources) that raygen joins with ``ray.address``, as on a real cluster."""

from __future__ import annotations

import os

ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep Ray on loopback (see ENVIRONMENT.md)
    "RAY_USAGE_STATS_ENABLED": "0",
    # Every process joining a cluster must agree on the auth mode; this cluster is loopback-only.
    "RAY_AUTH_MODE": "disabled",
}


class LocalCluster:
    """``nodes`` Ray nodes of ``cpus_per_node`` logical CPUs each; ``address`` and ``env`` for joiners."""

    def __init__(self, nodes: int, cpus_per_node: int = 2):
        os.environ.update(ENV)
        from ray.cluster_utils import Cluster

        self.env = dict(ENV)
        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": cpus_per_node,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
            },
        )
        try:
            for _ in range(nodes - 1):
                self._cluster.add_node(num_cpus=cpus_per_node, node_ip_address="127.0.0.1")
            self._cluster.wait_for_nodes()
        except BaseException:
            self._cluster.shutdown()
            raise
        self.address = self._cluster.address

    def shutdown(self) -> None:
        self._cluster.shutdown()
