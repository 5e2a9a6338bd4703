"""Placing device actors on the cluster's nodes: one placement-group bundle per device.

A device is one GPU (bundle `{"GPU": 1, "CPU": 1}`, the actor asks for `num_gpus=1`, so Ray
gives its process that one GPU as `cuda:0`; `devices.gpus_per_device` < 1 shares a GPU) or
one CPU slot (`{"CPU": threads_per_device}`).
The bundles form one placement group (`ray.placement`: PACK by default, so the devices fill as
few nodes as hold them). Device indices follow the nodes: the devices of a node get adjacent
indices (nodes in the order of their first bundle), so rollout devices 0..R-1 and training
devices R..N-1 each sit on as few nodes as the allocation allows, and a training group's
collectives stay inside a node where they can.

`device_order` and `check_capacity` are pure; `place_devices` creates the group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynaresize.config.schema import ConfigError


def device_bundle(device_type: str, threads: int, gpus: float = 1.0) -> dict[str, float]:
    """Resources of one device's bundle (`gpus`: its share of a GPU)."""
    if device_type == "cuda":
        return {"GPU": float(gpus), "CPU": 1.0}
    return {"CPU": float(threads)}


def device_order(bundle_nodes: Sequence[str]) -> list[int]:
    """Bundle index of each device index: a node's bundles get adjacent device indices, nodes
    in the order of their first bundle, a node's bundles in bundle order."""
    first: dict[str, int] = {}
    for b, node in enumerate(bundle_nodes):
        first.setdefault(node, b)
    return sorted(range(len(bundle_nodes)), key=lambda b: (first[bundle_nodes[b]], b))


def check_capacity(num_devices: int, bundle: Mapping[str, float], strategy: str,
                   total: Mapping[str, float], num_nodes: int, where: str) -> None:
    """ConfigError if the cluster can never hold `num_devices` bundles (before anything waits
    for resources that do not exist)."""
    for resource, amount in bundle.items():
        have = float(total.get(resource, 0.0))
        if have < amount * num_devices:
            raise ConfigError("allocation", f"{num_devices} devices",
                              f"{where} has {have:g} {resource} in all; {num_devices} devices "
                              f"need {amount * num_devices:g} ({amount:g} each)")
    if strategy == "STRICT_SPREAD" and num_devices > num_nodes:
        raise ConfigError("ray.placement", strategy,
                          f"one device per node needs {num_devices} nodes; {where} has "
                          f"{num_nodes}")


@dataclass(frozen=True)
class Placement:
    """The placement group and where each device index goes."""

    group: Any
    bundle_of: tuple[int, ...]
    """Device index → bundle index in `group`."""
    node_of: tuple[str, ...]
    """Device index → Ray node id of its bundle."""

    def scheduling(self, index: int) -> Any:
        """The scheduling strategy that puts device `index`'s actor into its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            self.group, placement_group_bundle_index=self.bundle_of[index])

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def place_devices(num_devices: int, bundle: Mapping[str, float], strategy: str,
                  timeout_s: float) -> Placement:
    """Reserve one bundle per device; wait until every bundle has a node."""
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    alive = [n for n in ray.nodes() if n.get("Alive", False)]
    check_capacity(num_devices, bundle, strategy, ray.cluster_resources(), len(alive),
                   "the Ray cluster")
    group = placement_group([dict(bundle) for _ in range(num_devices)], strategy=strategy)
    if not group.wait(timeout_s):
        remove_placement_group(group)
        raise RuntimeError(f"could not place {num_devices} devices ({dict(bundle)} each, "
                           f"{strategy}) within {timeout_s:g}s; free now: "
                           f"{ray.available_resources()}")
    table = placement_group_table(group)["bundles_to_node_id"]
    nodes = [table[b] for b in range(num_devices)]
    order = device_order(nodes)
    return Placement(group, tuple(order), tuple(nodes[b] for b in order))
