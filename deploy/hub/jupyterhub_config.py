# JupyterHub configuration for the course on one machine: `jupyterhub -f deploy/hub/jupyterhub_config.py`.
#
# JupyterHub (with configurable-http-proxy in front) logs students in and starts a Jupyter server for each; the
# dask-gateway server (gateway_config.py, beside this file) runs as a hub service, trusts the hub's tokens, and
# gives every student clusters of their own, reached through the hub's address at /services/dask-gateway. In each
# student's server, dask's configuration points at it, so the course's start_client() asks the gateway for the
# chapter's cluster. docs/hub.md explains each setting and the same set-up on Kubernetes (the daskhub chart).
#
# Settings from the environment (defaults in brackets):
#   DSGD_HUB_IP, DSGD_HUB_PORT   where students reach the hub                              [127.0.0.1, 8000]
#   DSGD_HUB_PUBLIC_URL          the hub's address in the students' browsers (dashboard links)
#                                [http://<DSGD_HUB_IP>:<DSGD_HUB_PORT>]
#   DSGD_HUB_API_PORT            the hub's own API, behind the proxy                       [8081]
#   DSGD_HUB_PROXY_API_PORT      configurable-http-proxy's API                             [8001]
#   DSGD_HUB_CHP                 the configurable-http-proxy command                       [configurable-http-proxy]
#   DSGD_HUB_AUTH                pam (the machine's accounts) or shared (one password)     [pam]
#   DSGD_HUB_PASSWORD            the shared password (DSGD_HUB_AUTH=shared)                [none]
#   DSGD_HUB_STUDENTS            the Unix group whose members may log in (pam)             [students]
#   DSGD_HUB_ADMINS              comma-separated lecturers (hub admins)                    [none]
#   DSGD_HUB_SPAWNER             local (each server as the student's Unix user, needs root)
#                                or simple (every server as the hub's user, homes below DSGD_HUB_HOMES) [local]
#   DSGD_HUB_HOMES               where the simple spawner makes each student's home        [/tmp]
#   DSGD_HUB_ADMIN_TOKEN         a token for the lecturer's scripts (deploy/hub/class_clusters.py)  [none]
#   DSGD_HUB_COURSE              the notebooks copied into each new student's ~/course  [the repository's course/]
#   DSGD_GATEWAY_HTTP_PORT, DSGD_GATEWAY_TCP_PORT  the gateway's proxy, on 127.0.0.1          [8002, 8003]
# and the gateway's limits (DSGD_MAX_*, DSGD_IDLE_TIMEOUT), passed on to it: see gateway_config.py.
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file


def env(name, default):
    """The setting from the environment, else the default."""
    return os.environ.get(name) or default


hub_ip, hub_port = env("DSGD_HUB_IP", "127.0.0.1"), int(env("DSGD_HUB_PORT", "8000"))
gateway_http, gateway_tcp = int(env("DSGD_GATEWAY_HTTP_PORT", "8002")), int(env("DSGD_GATEWAY_TCP_PORT", "8003"))
GATEWAY_PREFIX = "/services/dask-gateway"
# The address students' browsers reach the hub at (behind a load balancer or TLS: its public https address). A
# cluster's dashboard link is absolute, below it: dask-labextension's search, which finds the link, reads a link
# without a host as relative to the student's own server (/user/<name>/), where no dashboard is.
public_url = env("DSGD_HUB_PUBLIC_URL", f"http://{hub_ip}:{hub_port}").rstrip("/")

# The public proxy, the hub behind it, and the proxy's API, all on this machine.
c.JupyterHub.ip, c.JupyterHub.port = hub_ip, hub_port
c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", int(env("DSGD_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('DSGD_HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [env("DSGD_HUB_CHP", "configurable-http-proxy")]

# Who may log in: the machine's accounts in the students' group (PAM), or anyone with the shared password.
if env("DSGD_HUB_AUTH", "pam") == "shared":
    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = os.environ["DSGD_HUB_PASSWORD"]
    c.Authenticator.allow_all = True
else:
    c.JupyterHub.authenticator_class = "pam"
    c.Authenticator.allowed_groups = {env("DSGD_HUB_STUDENTS", "students")}
c.Authenticator.admin_users = {name for name in env("DSGD_HUB_ADMINS", "").split(",") if name}

# Each student's Jupyter server: a local process running this Python, with the course installed. A kernel asked to
# shut down (a closed notebook, a stopped server) closes its client, which shuts its gateway cluster down: it has
# 30 s for that before it is killed (Jupyter's default is 5 s).
server_args = ["--KernelManager.shutdown_wait_time=30"]
if env("DSGD_HUB_SPAWNER", "local") == "simple":
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = os.path.join(env("DSGD_HUB_HOMES", "/tmp"), "{username}")
    if os.geteuid() == 0:  # every server runs as the hub's user; Jupyter refuses root unless told
        server_args.append("--ServerApp.allow_root=True")
c.Spawner.args = server_args
# start_server.py copies the course into the student's home the first time, imports the course's JupyterLab workspace
# (chapter 00 beside the dask panes) as the one /lab opens, then runs `python -m jupyterhub.singleuser`.
c.Spawner.cmd = [sys.executable, str(HERE / "start_server.py")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.env_keep = ["CONDA_DEFAULT_ENV", "CONDA_ROOT", "JUPYTERHUB_SINGLEUSER_APP", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "PATH",
                    "PYTHONPATH", "VIRTUAL_ENV", "DSGD_SMOKE", "DSGD_HUB_COURSE", "XDG_CACHE_HOME"]
# dask's configuration in every student's server: the gateway, reached through the hub, trusting the hub's token.
c.Spawner.environment = {
    "DASK_GATEWAY__ADDRESS": f"http://127.0.0.1:{hub_port}{GATEWAY_PREFIX}",
    "DASK_GATEWAY__PUBLIC_ADDRESS": f"{public_url}{GATEWAY_PREFIX}",
    "DASK_GATEWAY__PROXY_ADDRESS": f"gateway://127.0.0.1:{gateway_tcp}",
    "DASK_GATEWAY__AUTH__TYPE": "jupyterhub",
}

# The gateway as a hub service: the hub starts and stops it, gives it a token, and proxies its HTTP routes.
passed_on = {k: v for k, v in os.environ.items() if k.startswith(("DSGD_MAX_", "DSGD_IDLE_", "DSGD_GATEWAY_"))}
services = [{
    "name": "dask-gateway",
    "url": f"http://127.0.0.1:{gateway_http}",
    "command": [sys.executable, "-m", "dask_gateway_server", "-f", str(HERE / "gateway_config.py")],
    "environment": {
        **passed_on,
        "DSGD_GATEWAY_AUTH": "jupyterhub",
        "DSGD_GATEWAY_HTTP": f"127.0.0.1:{gateway_http}",
        "DSGD_GATEWAY_TCP": f"127.0.0.1:{gateway_tcp}",
        "DSGD_GATEWAY_PREFIX": GATEWAY_PREFIX,
    },
}]
roles = [
    # every student may use the gateway, and so may the token of their own server (what start_client uses)
    {"name": "user", "scopes": ["self", "access:services!service=dask-gateway"]},
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                  "access:services!service=dask-gateway"]},
]
if os.environ.get("DSGD_HUB_ADMIN_TOKEN"):  # the lecturer's scripts: every student, their servers and tokens
    services.append({"name": "course-admin", "api_token": os.environ["DSGD_HUB_ADMIN_TOKEN"]})
    roles.append({"name": "course-admin", "services": ["course-admin"],
                  "scopes": ["admin:users", "admin:servers", "tokens", "access:services!service=dask-gateway"]})
c.JupyterHub.services = services
c.JupyterHub.load_roles = roles
# the token of each student's server (what start_client uses) asks for the gateway's scope explicitly
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", "access:services!service=dask-gateway"]
