"""One carpool server per Ray node, started and stopped with Ray.

    import ray, carpool.ray
    ray.init()
    carpool.ray.start_servers("/tmp/carpool-state", setup=register, cache_size="64MiB")
    ...  # in a task or trial:  socket, state_dir = carpool.ray.local_server()
    carpool.ray.stop_servers()         # or let Ray stop: the servers go with it

Each node's server runs under a Ray actor pinned to that node (named carpool-server-<node id>,
0 CPUs), which starts `carpool server` as its child. The server is stopped by stop_servers(); by
the actor's exit when the driver's job ends (ray.shutdown(), the driver exiting); and, if Ray
kills the actor outright (`ray stop`, SIGKILL), by the kernel (carpool.Server's parent-death
signal: the actor starts it on its main thread). docs/python.md, "Ray Tune"."""

import os
import pathlib
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._ffi import CarpoolError, NotFoundError
from .loader import server_stats as _server_stats
from .server import Server

ACTOR_PREFIX = "carpool-server-"
NAMESPACE = "carpool"  # Tune's trials may run in another namespace than the driver's
# The driver's handles: Ray destroys an actor, named or not, once no handle to it is left.
_ACTORS: Dict[str, Any] = {}


@ray.remote(num_cpus=0)
class NodeServer:
    """The carpool server of one node, a child of this actor's process."""

    def __init__(self, state_dir: str, setup: Optional[Callable[[str], Any]],
                 flags: Dict[str, Any]) -> None:
        os.makedirs(state_dir, exist_ok=True)
        if setup is not None:  # e.g. register the datasets in this node's catalog
            setup(state_dir)
        self.state_dir = state_dir
        self.server = Server(state_dir, log=os.path.join(state_dir, "server.log"), **flags)
        self.server.start()

    def where(self) -> Tuple[str, str]:
        return self.server.socket, self.state_dir

    def stats(self) -> Dict[str, Any]:
        return _server_stats(socket=self.server.socket)

    def stop(self) -> Optional[int]:
        return self.server.stop()


def _alive_nodes() -> List[str]:
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def start_servers(state_dir: Union[str, "os.PathLike[str]"],
                  setup: Optional[Callable[[str], Any]] = None,
                  **flags: Any) -> Dict[str, Tuple[str, str]]:
    """Starts a server on every live node of the connected Ray cluster, each with `state_dir` (a
    path on that node) and `flags` (as carpool.Server's). `setup(state_dir)` runs on each node
    first. Returns {node id: (socket, state dir)} once every server answers."""
    if not ray.is_initialized():
        raise CarpoolError("carpool.ray.start_servers needs a Ray connection; call ray.init() "
                           "(or ray.init(address=\"auto\") for a `ray start` cluster) first", 6)
    state = str(pathlib.Path(state_dir).resolve())
    actors = {node: NodeServer.options(  # type: ignore[attr-defined]
        name=ACTOR_PREFIX + node, namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(state, setup, flags) for node in _alive_nodes()}
    _ACTORS.update(actors)
    return dict(zip(actors, ray.get([a.where.remote() for a in actors.values()])))


def _actor(node: str) -> Any:
    try:
        return ray.get_actor(ACTOR_PREFIX + node, namespace=NAMESPACE)
    except ValueError as e:
        raise NotFoundError(f"no carpool server on Ray node {node} ({e}); call "
                            "carpool.ray.start_servers(...) in the driver after ray.init(), "
                            "and before the tasks that read through it") from None


def local_server() -> Tuple[str, str]:
    """(socket, state dir) of the server on the node this task or actor runs on."""
    actor = _actor(ray.get_runtime_context().get_node_id())  # held: methods keep a weak ref
    where: Tuple[str, str] = ray.get(actor.where.remote())
    return where


def server_stats() -> Dict[str, Dict[str, Any]]:
    """{node id: that node's server statistics} (carpool.server_stats), for every live node."""
    actors = {node: _actor(node) for node in _alive_nodes()}  # held: methods keep a weak ref
    return {node: ray.get(actor.stats.remote()) for node, actor in actors.items()}


def stop_servers() -> Dict[str, Optional[int]]:
    """Stops every node's server and its actor; returns {node id: the server's exit code}."""
    codes: Dict[str, Optional[int]] = {}
    for node in _alive_nodes():
        try:
            actor = ray.get_actor(ACTOR_PREFIX + node, namespace=NAMESPACE)
        except ValueError:
            continue  # none there: nothing to stop
        codes[node] = ray.get(actor.stop.remote())
        ray.kill(actor)
        _ACTORS.pop(node, None)
    return codes
