"""The pods of a label selector, asked of the Kubernetes API itself (no kubectl in the image).

Inside a pod, the API server is at ``$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``
and the pod's service account gives a bearer token, the cluster's CA and the
namespace at the standard paths: plain HTTPS with the standard library is enough.
"""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from tensorflow_elastic import net
from tensorflow_elastic.launch.discovery.command import TOOL_TIMEOUT_S, DiscoveryError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
HOST = "KUBERNETES_SERVICE_HOST"
PORT = "KUBERNETES_SERVICE_PORT"


@dataclasses.dataclass(frozen=True)
class InCluster:
    """Where the API server is and what the pod's service account holds."""

    server: str  # https://HOST:PORT
    token: str
    ca_file: str
    namespace: str


def in_cluster(env: Mapping[str, str], account_dir: str = SERVICE_ACCOUNT_DIR
               ) -> InCluster | None:
    """The in-cluster configuration, or None outside a pod (no API host or no token)."""
    token_file = os.path.join(account_dir, "token")
    if not env.get(HOST) or not os.path.isfile(token_file):
        return None
    with open(token_file) as f:
        token = f.read().strip()
    try:
        with open(os.path.join(account_dir, "namespace")) as f:
            namespace = f.read().strip()
    except OSError:
        namespace = "default"
    server = "https://" + net.format_address(env[HOST], int(env.get(PORT) or 443))
    return InCluster(server, token, os.path.join(account_dir, "ca.crt"), namespace)


def list_pods(config: InCluster, selector: str, namespace: str | None = None,
              timeout: float = TOOL_TIMEOUT_S) -> list[dict[str, Any]]:
    """The pods that match ``selector`` (the API's Pod objects); DiscoveryError says why not."""
    path = (f"/api/v1/namespaces/{urllib.parse.quote(namespace or config.namespace, safe='')}"
            f"/pods?{urllib.parse.urlencode({'labelSelector': selector})}")
    request = urllib.request.Request(config.server + path,
                                     headers={"Authorization": f"Bearer {config.token}",
                                              "Accept": "application/json"})
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as e:
        detail = e.read(500).decode(errors="replace")
        raise DiscoveryError(f"the Kubernetes API refused to list pods ({e.code}): "
                             f"{detail}") from None
    except (urllib.error.URLError, OSError, ssl.SSLError) as e:
        raise DiscoveryError(f"the Kubernetes API at {config.server} did not answer: "
                             f"{getattr(e, 'reason', e)}") from None
    except ValueError as e:
        raise DiscoveryError(f"the Kubernetes API answered with no JSON: {e}") from None
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise DiscoveryError("the Kubernetes API answered with no pod list")
    return body["items"]
