"""`helm test`: create a sandbox through the service's HTTP API, run a command in it, delete it.

Run by the service image's python with its httpx; configured by the environment:
SANDBOXES_URL, SANDBOXES_API_KEY, SANDBOXES_TEMPLATE, SANDBOXES_TEST_TIMEOUT (seconds).
Every step prints what it did; any failure exits non-zero with the service's own answer.
"""

import os
import sys
import time

import httpx

url = os.environ["SANDBOXES_URL"].rstrip("/")
deadline = time.monotonic() + float(os.environ.get("SANDBOXES_TEST_TIMEOUT", "300"))
headers = {"Authorization": "Bearer " + os.environ["SANDBOXES_API_KEY"]}
token = os.urandom(8).hex()


def fail(message: str, response: httpx.Response | None = None) -> None:
    detail = f" ({response.status_code}: {response.text[:2000]})" if response is not None else ""
    print(f"FAIL: {message}{detail}", flush=True)
    sys.exit(1)


def left() -> float:
    return max(1.0, deadline - time.monotonic())


with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(left())) as client:
    ready = client.get("/readyz")
    if ready.status_code != 200:
        fail("the service is not ready", ready)
    print("service ready", flush=True)

    created = client.post(
        "/v1/sandboxes",
        json={"template": os.environ.get("SANDBOXES_TEMPLATE", "default"), "ttl": 600},
        timeout=left(),
    )
    if created.status_code != 201:
        fail("could not create a sandbox", created)
    sandbox = created.json()["id"]
    print(f"created sandbox {sandbox} ({created.json()['backend']})", flush=True)
    try:
        command = f"printf 'hello %s from uid ' {token}; id -u"
        ran = client.post(f"/v1/sandboxes/{sandbox}/execute", json={"command": command, "timeout": 60}, timeout=left())
        if ran.status_code != 200:
            fail("execute failed", ran)
        result = ran.json()
        print(f"execute: exit {result['exit_code']}, output {result['output']!r}", flush=True)
        if result["exit_code"] != 0 or f"hello {token} from uid " not in result["output"]:
            fail(f"the command did not run as expected: {result}")
        if result["output"].strip().endswith("uid 0"):
            fail("the sandbox runs commands as root")
    finally:
        deleted = client.delete(f"/v1/sandboxes/{sandbox}", timeout=left())
        if deleted.status_code != 204:
            fail("could not delete the sandbox", deleted)
        print(f"deleted sandbox {sandbox}", flush=True)
    gone = client.get(f"/v1/sandboxes/{sandbox}")
    if gone.status_code != 404:
        fail("the deleted sandbox is still listed", gone)
print("PASS", flush=True)
