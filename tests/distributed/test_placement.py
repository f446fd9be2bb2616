"""Placement rules of raygen.distributed.cluster (no Ray started: the node list is given). The same rules
run for real on a multi-node cluster in tests/cluster/test_multinode.py."""

from __future__ import annotations

import logging

import pytest

from raygen.config import RayConfig
from raygen.distributed import cluster
from raygen.errors import ConfigError


def nodes(*resources: dict, dead: tuple[dict, ...] = ()) -> list[dict]:
    alive = [{"Alive": True, "Resources": {"CPU": 4.0, **r}} for r in resources]
    return alive + [{"Alive": False, "Resources": {"CPU": 4.0, **r}} for r in dead]


@pytest.fixture
def cluster_of(monkeypatch):
    def use(node_list: list[dict]) -> None:
        monkeypatch.setattr(cluster.ray, "nodes", lambda: node_list)

    return use


def test_a_cluster_without_sandbox_resources_reserves_nothing(cluster_of):
    cluster_of(nodes({}, {"GPU": 1.0}))
    assert cluster.session_actor_resources(RayConfig(sessions_per_worker=8), "docker") == {}


def test_the_backend_resource_is_reserved_once_per_session_slot(cluster_of):
    cluster_of(nodes({"raygen_sandbox_docker": 64.0}, {"raygen_sandbox_singularity": 64.0}))
    got = cluster.session_actor_resources(RayConfig(workers=2, sessions_per_worker=16), "singularity")
    assert got == {"raygen_sandbox_singularity": 16.0}


def test_a_backend_no_node_offers_stops_the_run_and_says_what_is_offered(cluster_of):
    cluster_of(nodes({"raygen_sandbox_singularity": 64.0}, {}))
    with pytest.raises(ConfigError, match=r"offers raygen_sandbox_docker.*raygen_sandbox_singularity=64"):
        cluster.session_actor_resources(RayConfig(), "docker")


def test_nodes_too_small_for_one_actor_stop_the_run(cluster_of):
    cluster_of(nodes({"raygen_sandbox_docker": 8.0}, {"raygen_sandbox_docker": 8.0}))
    with pytest.raises(ConfigError, match="sessions-per-worker"):
        cluster.session_actor_resources(RayConfig(sessions_per_worker=16), "docker")


def test_dead_nodes_offer_nothing(cluster_of):
    cluster_of(nodes({"raygen_sandbox_local": 4.0}, dead=({"raygen_sandbox_docker": 64.0},)))
    with pytest.raises(ConfigError, match="no node of this Ray cluster offers raygen_sandbox_docker"):
        cluster.session_actor_resources(RayConfig(sessions_per_worker=4), "docker")


def test_off_node_backends_are_placed_anywhere(cluster_of):
    cluster_of(nodes({"raygen_sandbox_docker": 64.0}))
    assert cluster.session_actor_resources(RayConfig(), "modal") == {}


def test_room_for_fewer_actors_than_workers_warns(cluster_of, caplog):
    cluster_of(nodes({"raygen_sandbox_local": 20.0}, {"raygen_sandbox_local": 4.0}, {}))
    with caplog.at_level(logging.WARNING, logger="raygen.distributed.cluster"):
        got = cluster.session_actor_resources(RayConfig(workers=8, sessions_per_worker=4), "local")
    assert got == {"raygen_sandbox_local": 4.0}
    assert "room for 6 of 8" in caplog.text


def test_explicit_resources_are_used_as_given_even_before_nodes_offer_them(cluster_of, caplog):
    cluster_of(nodes({}))
    config = RayConfig(workers=2, resources={"raygen_sandbox_docker": 4, "pool_a": 0.5})
    with caplog.at_level(logging.WARNING, logger="raygen.distributed.cluster"):
        assert cluster.session_actor_resources(config, "docker") == {
            "raygen_sandbox_docker": 4,
            "pool_a": 0.5,
        }
    assert "room for 0 of 2" in caplog.text  # an autoscaler may add the nodes: warn, do not stop
    cluster_of(nodes({"raygen_sandbox_docker": 64.0}))
    assert cluster.session_actor_resources(RayConfig(resources={}), "docker") == {}


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("10.0.0.5:6379", False),
        ("head-node:6379", False),
        ("auto", False),
        ("ray://127.0.0.1:10001", False),
    ],
)
def test_loopback_addresses(address, loopback):
    assert cluster._is_loopback(address) is loopback
