"""The lecturer's view of every student's dask-gateway clusters, through the hub: list them, or stop them.

dask-gateway shows a user only their own clusters, so the lecturer asks the hub (with an admin service's token,
DSGD_HUB_ADMIN_TOKEN in jupyterhub_config.py) for a short-lived token of each student that may reach the gateway
and nothing else, uses it, and revokes it at once.

    JUPYTERHUB_API_URL=http://127.0.0.1:8000/hub/api JUPYTERHUB_API_TOKEN=<admin token> \\
    DASK_GATEWAY__ADDRESS=http://127.0.0.1:8000/services/dask-gateway \\
    python deploy/hub/class_clusters.py [--stop] [--user NAME ...]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

import requests

#: The only scope the student's borrowed token carries, and how long it lives (seconds).
SCOPES = ["access:services!service=dask-gateway"]
TOKEN_LIFETIME_S = 120


@contextmanager
def students_token(hub_api: str, admin_token: str, user: str) -> Iterator[str]:
    """A token of `user` that may reach the gateway only, revoked when the block ends."""
    headers = {"Authorization": f"token {admin_token}"}
    reply = requests.post(f"{hub_api}/users/{user}/tokens", headers=headers, timeout=30,
                          json={"expires_in": TOKEN_LIFETIME_S, "scopes": SCOPES, "note": "lecturer's view"})
    reply.raise_for_status()
    made = reply.json()
    try:
        yield made["token"]
    finally:
        requests.delete(f"{hub_api}/users/{user}/tokens/{made['id']}", headers=headers, timeout=30)


def students(hub_api: str, admin_token: str) -> list[str]:
    """The names of the hub's users."""
    reply = requests.get(f"{hub_api}/users", headers={"Authorization": f"token {admin_token}"}, timeout=30)
    reply.raise_for_status()
    return sorted(u["name"] for u in reply.json())


def class_clusters(hub_api: str, admin_token: str, gateway: str, users: list[str] | None = None,
                   stop: bool = False) -> dict[str, list[str]]:
    """Each student's pending or running clusters (by name), stopped first when stop is true."""
    from dask_gateway import Gateway, JupyterHubAuth

    out = {}
    for user in users or students(hub_api, admin_token):
        with students_token(hub_api, admin_token, user) as token:
            client = Gateway(gateway, auth=JupyterHubAuth(api_token=token))
            try:
                names = [c.name for c in client.list_clusters(status=["pending", "running"])]
                if stop:
                    for name in names:
                        client.stop_cluster(name)
            finally:
                client.close()
                client.close = lambda: None  # dask_gateway's __del__ would close it a second time
        out[user] = names
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop", action="store_true", help="stop every cluster listed")
    parser.add_argument("--user", action="append", help="only this student (repeatable)")
    args = parser.parse_args()
    found = class_clusters(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"],
                           os.environ["DASK_GATEWAY__ADDRESS"], args.user, stop=args.stop)
    for user, names in found.items():
        print(f"{user}: {', '.join(names) if names else 'no cluster'}" + (" (stopped)" if args.stop and names else ""))


if __name__ == "__main__":
    main()
