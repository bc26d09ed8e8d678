# dask-gateway-server configuration for a course on one machine: `dask-gateway-server -f gateway_config.py`.
#
# Every student gets clusters of their own (local processes), within per-student limits. Each setting can be
# changed by an environment variable (defaults in brackets), so that the same file serves the hub
# (jupyterhub_config.py starts the gateway as a hub service) and the course's tests; docs/hub.md explains each
# setting and its Kubernetes equivalent in the daskhub Helm chart.
#
#   DSGD_GATEWAY_AUTH          jupyterhub (the hub's users and tokens) or simple (one shared password)  [jupyterhub]
#   DSGD_GATEWAY_PASSWORD      the password of the simple authenticator                                [none]
#   DSGD_GATEWAY_BACKEND       local (each student's processes run as their Unix user; needs root)
#                              or unsafe (every cluster runs as the gateway's user)                    [local]
#   DSGD_GATEWAY_API           the private API the proxy and the clusters call, host:port              [127.0.0.1:0]
#   DSGD_GATEWAY_HTTP          the proxy's HTTP address (REST API, dashboards), host:port              [127.0.0.1:8000]
#   DSGD_GATEWAY_TCP           the proxy's scheduler (TLS) address, host:port                          [the HTTP one]
#   DSGD_GATEWAY_PREFIX        the path the gateway serves under (behind the hub: /services/dask-gateway) [none]
#   DSGD_MAX_CLUSTERS          clusters a student may hold at once                                     [2]
#   DSGD_MAX_WORKERS           workers per cluster                                                     [4]
#   DSGD_MAX_CORES             cores per cluster                                                       [4]
#   DSGD_MAX_MEMORY            memory per cluster (bytes or '8 G')                                     [8 G]
#   DSGD_MAX_WORKER_MEMORY     the largest worker a student may ask for, GiB                           [4]
#   DSGD_IDLE_TIMEOUT          seconds without a task before a cluster is shut down (a student may ask
#                              for less, never more)                                                   [1800]
#
# A port of 0 lets the gateway choose a free one; it prints the addresses it listens at when it starts.
import os
import sys

from dask_gateway_server.backends.base import PublicException
from dask_gateway_server.backends.local import LocalBackend, UnsafeLocalBackend
from dask_gateway_server.models import ClusterStatus
from dask_gateway_server.options import Float, Integer, Options

c = get_config()  # noqa: F821 - provided by the gateway when it loads this file


def env(name, default):
    """The setting from the environment, else the default."""
    return os.environ.get(name) or default


MAX_CLUSTERS = int(env("DSGD_MAX_CLUSTERS", "2"))


def limited(base):
    """The backend class with a limit on the clusters one student holds at once (pending or running)."""

    class PerStudentLimit(base):
        async def start_cluster(self, user, cluster_options):
            active = await self.list_clusters(
                username=user.name, statuses=[ClusterStatus.PENDING, ClusterStatus.RUNNING]
            )
            if len(active) >= MAX_CLUSTERS:
                names = ", ".join(sorted(cl.name for cl in active))
                raise PublicException(
                    f"{user.name} already has {len(active)} cluster(s) running ({names}); the course allows "
                    f"{MAX_CLUSTERS} per student"
                )
            return await super().start_cluster(user, cluster_options)

    PerStudentLimit.__name__ = f"PerStudentLimit{base.__name__}"
    return PerStudentLimit


# Who may ask: the hub's users (a token the hub issued), or anyone with the shared password (tests, a demo).
if env("DSGD_GATEWAY_AUTH", "jupyterhub") == "simple":
    c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
    c.SimpleAuthenticator.password = os.environ["DSGD_GATEWAY_PASSWORD"]
else:
    # JUPYTERHUB_API_TOKEN, JUPYTERHUB_API_URL and JUPYTERHUB_SERVICE_NAME come from the hub, which starts the
    # gateway as one of its services; only a token with access to this service may create clusters.
    c.DaskGateway.authenticator_class = "dask_gateway_server.auth.JupyterHubAuthenticator"

# Where clusters run: local processes, each cluster in a working directory of its own.
unsafe = env("DSGD_GATEWAY_BACKEND", "local") == "unsafe"
c.DaskGateway.backend_class = limited(UnsafeLocalBackend if unsafe else LocalBackend)
c.DaskGateway.address = env("DSGD_GATEWAY_API", "127.0.0.1:0")
c.Proxy.address = env("DSGD_GATEWAY_HTTP", "127.0.0.1:8000")
c.Proxy.tcp_address = env("DSGD_GATEWAY_TCP", c.Proxy.address)
c.Proxy.prefix = env("DSGD_GATEWAY_PREFIX", "")

# The course's workers import torch and dsgd_teach: run the scheduler and workers with this very Python.
c.ClusterConfig.scheduler_cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
c.ClusterConfig.worker_cmd = [sys.executable, "-m", "distributed.cli.dask_worker"]

# Per-cluster limits (a student's request past them is capped, and the course says so) and the idle time-out.
c.ClusterConfig.cluster_max_workers = int(env("DSGD_MAX_WORKERS", "4"))
c.ClusterConfig.cluster_max_cores = float(env("DSGD_MAX_CORES", "4"))
c.ClusterConfig.cluster_max_memory = env("DSGD_MAX_MEMORY", "8 G")
IDLE_TIMEOUT = float(env("DSGD_IDLE_TIMEOUT", "1800"))
c.ClusterConfig.idle_timeout = IDLE_TIMEOUT
c.ClusterConfig.worker_cores = 1
c.ClusterConfig.worker_memory = "1 G"


def cluster_settings(options):
    """The options a student may set, turned into the cluster's configuration (memory in bytes)."""
    return {"worker_cores": options.worker_cores, "worker_memory": int(options.worker_memory * 2**30),
            "idle_timeout": options.idle_timeout}


# What a student may choose: the course asks for one core and the memory a worker needs; a student may also ask
# for a shorter idle time-out than the course's (dask config gateway.cluster.options: {idle_timeout: 300}).
c.Backend.cluster_options = Options(
    Integer("worker_cores", default=1, min=1, max=2, label="Worker cores"),
    Float("worker_memory", default=1.0, min=0.5, max=float(env("DSGD_MAX_WORKER_MEMORY", "4")),
          label="Worker memory (GiB)"),
    Float("idle_timeout", default=IDLE_TIMEOUT, min=min(10.0, IDLE_TIMEOUT), max=IDLE_TIMEOUT,
          label="Idle time-out (s)"),
    handler=cluster_settings,
)
