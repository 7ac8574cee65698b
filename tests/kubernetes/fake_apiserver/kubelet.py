"""The FAKE node of the FAKE API server: a one-node "scheduler" and "kubelet" that run each pod
as one Docker container with the pod's security settings mapped to Docker's, and report the pod
status a real kubelet would (Pending -> Running/Ready -> Succeeded/Failed, ErrImagePull,
Unschedulable, CrashLoopBackOff, OOMKilled). A test double only."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, Field

from .claims import Claims, docker_volume
from .store import ApiError, Store, now

__all__ = ["Kubelet", "NodeConfig", "quantity"]

LABEL = "io.sandboxes.fake-k8s"
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "m": 1e-3}


def quantity(text: str | int | float) -> float:
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    return float(m.group(1)) * _UNITS.get(m.group(2), 1)


class NodeConfig(BaseModel):
    name: str = "fake-node"
    labels: dict[str, str] = Field(
        default_factory=lambda: {"kubernetes.io/hostname": "fake-node", "kubernetes.io/os": "linux"}
    )
    allocatable_cpu: str = "2"
    allocatable_memory: str = "4Gi"
    crash_backoff: float = 0.2
    """First back-off before restarting a crashed container (a real kubelet: 10 s, doubling)."""


def _container_status(c: dict[str, Any], state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": c["name"],
        "image": c["image"],
        "imageID": "",
        "state": state,
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "started": False,
        **extra,
    }


def _condition(kind: str, ok: bool, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    cond = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None, "lastTransitionTime": now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


class Kubelet:
    def __init__(self, store: Store, docker: Any, node: NodeConfig, labels: dict[str, str]) -> None:
        self.store, self.docker, self.node, self.labels = store, docker, node, labels
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fake-kubelet")
        self.tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.containers: dict[tuple[str, str], str] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.faults: list[tuple[Callable[[dict[str, Any]], bool], str]] = []
        """Injected start failures: the first whose predicate selects a new pod strikes it."""
        self.exec_drops: set[tuple[str, str, asyncio.Event]] = set()
        """(namespace, pod, event) per open exec stream; setting the event drops the stream."""
        self.stopped: set[tuple[str, str]] = set()
        """Pods being deleted whose containers are gone, held only by finalizers."""
        self.claims = Claims(set(), docker)
        """The API server's PersistentVolumeClaims (the server gives it its namespaces)."""

    async def blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    def _patch_status(self, ns: str, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        pod = self.store.get(ns, name)
        change(pod)
        return self.store.update(ns, name, pod)

    def background(self, coroutine: Any) -> None:
        """Run ``coroutine`` on the loop, keeping a reference so it is not collected mid-way."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def start(self, pod: dict[str, Any]) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.tasks[key] = asyncio.get_running_loop().create_task(self._run(*key))

    # -- scheduling ---------------------------------------------------------------------------
    def _unschedulable(self, pod: dict[str, Any]) -> str | None:
        reasons = []
        selector = pod["spec"].get("nodeSelector") or {}
        if any(self.node.labels.get(k) != v for k, v in selector.items()):
            reasons.append("1 node(s) didn't match Pod's node affinity/selector")
        for resource, allocatable in (("cpu", self.node.allocatable_cpu), ("memory", self.node.allocatable_memory)):
            used = sum(self._requests(p, resource) for p in self.store.items(None) if p["spec"].get("nodeName"))
            if used + self._requests(pod, resource) > quantity(allocatable):
                reasons.append(f"1 Insufficient {resource}")
        if not reasons:
            return None
        why = (
            "Preemption is not helpful for scheduling"
            if len(reasons) == 1 and "selector" in reasons[0]
            else ("No preemption victims found for incoming pod")
        )
        return f"0/1 nodes are available: {', '.join(sorted(reasons))}. preemption: 0/1 nodes are available: 1 {why}."

    @staticmethod
    def _requests(pod: dict[str, Any], resource: str) -> float:
        total = 0.0
        for c in pod["spec"]["containers"]:
            res = c.get("resources") or {}
            value = (res.get("requests") or {}).get(resource) or (res.get("limits") or {}).get(resource)
            total += quantity(value) if value else 0.0
        return total

    # -- the pod's life -------------------------------------------------------------------------
    async def _run(self, ns: str, name: str) -> None:
        with contextlib.suppress(ApiError):  # the pod was deleted under us
            await self._live(ns, name)

    async def _live(self, ns: str, name: str) -> None:
        pod = self.store.get(ns, name)
        message = self._unschedulable(pod)
        if message:
            self._patch_status(
                ns,
                name,
                lambda p: p["status"].update(conditions=[_condition("PodScheduled", False, "Unschedulable", message)]),
            )
            return

        def bind(p: dict[str, Any]) -> None:
            p["spec"]["nodeName"] = self.node.name
            p["status"].update(conditions=[_condition("PodScheduled", True)], startTime=now(), hostIP="127.0.0.1")

        pod = self._patch_status(ns, name, bind)
        spec = pod["spec"]["containers"][0]
        self._set_container(ns, name, {"waiting": {"reason": "ContainerCreating"}}, ready=False)
        if not await self._image_present(ns, name, spec):
            return
        container = await self.blocking(self._create, pod)
        self.containers[ns, name] = container.id
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if deadline:
            asyncio.get_running_loop().call_later(
                float(deadline),
                lambda: self.background(
                    self.fail(
                        ns, name, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
                    )
                ),
            )
        backoff = self.node.crash_backoff
        restarts = 0
        fault = self._fault_for(pod)
        while True:
            terminated = await self._start_and_wait(ns, name, container, restarts, fault, spec.get("command"))
            if terminated is None:
                return
            code = terminated["terminated"]["exitCode"]
            policy = pod["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                phase = "Succeeded" if code == 0 else "Failed"
                self._set_container(ns, name, terminated, ready=False, restarts=restarts, phase=phase)
                return
            restarts += 1
            waiting = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:g}s restarting "
                    f"failed container={spec['name']} pod={name}_{ns}({pod['metadata']['uid']})",
                }
            }
            self._set_container(ns, name, waiting, ready=False, restarts=restarts, last=terminated)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _fault_for(self, pod: dict[str, Any]) -> str | None:
        return next((fault for selects, fault in self.faults if selects(pod)), None)

    async def _start_and_wait(
        self, ns: str, name: str, container: Any, restarts: int, fault: str | None, command: list[str] | None
    ) -> dict[str, Any] | None:
        """Start the container and wait for its end: its ``terminated`` state as the kubelet
        reports it; ``None`` when an injected eviction ended the pod instead.

        A start the runtime refuses (no such executable) is ``StartError``, exit code 128, as
        containerd reports it. An injected fault strikes before the container is reported
        running, so the pod never flashes Ready: ``OOMKilled`` is the kernel's kill (SIGKILL,
        exit code 137), ``Evicted`` the node's eviction of the pod."""
        try:
            await self.blocking(self._check_executable, container, command)
            await self.blocking(container.start)
        except Exception as exc:
            message = getattr(exc, "explanation", None) or str(exc)
            return {"terminated": {"exitCode": 128, "reason": "StartError", "message": message}}
        await self.blocking(container.reload)
        started = container.attrs["State"]["StartedAt"]
        if fault == "Evicted":
            self.background(self.fail(ns, name, "Evicted", "The node was low on resource: memory. "))
            return None
        if fault == "OOMKilled":
            with contextlib.suppress(Exception):
                await self.blocking(container.kill)
        else:
            self._set_container(ns, name, {"running": {"startedAt": started}}, ready=True, restarts=restarts)
        await self.blocking(container.wait)
        await self.blocking(container.reload)
        state = container.attrs["State"]
        code = state["ExitCode"]
        oom = state.get("OOMKilled") or fault == "OOMKilled"
        return {
            "terminated": {
                "exitCode": code,
                "reason": "OOMKilled" if oom else ("Completed" if code == 0 else "Error"),
                "startedAt": started,
                "finishedAt": state["FinishedAt"],
                "containerID": f"docker://{container.id}",
            }
        }

    @staticmethod
    def _check_executable(container: Any, command: list[str] | None) -> None:
        """Refuse, as runc does, an absolute command that is not in the image: with the engine's
        init as PID 1 (the pause container's stand-in) the start itself would succeed and the
        init exit a moment later, after the pod was reported running. Commands found on
        ``$PATH`` are not looked up."""
        import docker.errors

        if not command or not command[0].startswith("/"):
            return
        try:
            container.get_archive(command[0])
        except docker.errors.NotFound:
            raise RuntimeError(
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                f'runc create failed: unable to start container process: exec: "{command[0]}": '
                f"stat {command[0]}: no such file or directory: unknown"
            ) from None

    async def _image_present(self, ns: str, name: str, spec: dict[str, Any]) -> bool:
        image = spec["image"]
        try:
            await self.blocking(self.docker.images.get, image)
            return True
        except Exception as exc:
            error = f'Failed to pull image "{image}": rpc error: code = NotFound desc = {exc}'
        if spec.get("imagePullPolicy") == "Never":
            message = f'Container image "{image}" is not present with pull policy of Never'
            self._set_container(ns, name, {"waiting": {"reason": "ErrImageNeverPull", "message": message}})
            return False
        self._set_container(ns, name, {"waiting": {"reason": "ErrImagePull", "message": error}})
        await asyncio.sleep(self.node.crash_backoff)
        message = f'Back-off pulling image "{image}"'
        self._set_container(ns, name, {"waiting": {"reason": "ImagePullBackOff", "message": message}})
        return False

    def _set_container(
        self,
        ns: str,
        name: str,
        state: dict[str, Any],
        *,
        ready: bool = False,
        restarts: int = 0,
        last: dict[str, Any] | None = None,
        phase: str | None = None,
    ) -> None:
        def change(pod: dict[str, Any]) -> None:
            c = pod["spec"]["containers"][0]
            cs = _container_status(c, state, ready=ready, restartCount=restarts, started="running" in state)
            if last:
                cs["lastState"] = last
            if cid := self.containers.get((ns, name)):
                cs["containerID"] = f"docker://{cid}"
            status = pod["status"]
            status["containerStatuses"] = [cs]
            status["phase"] = phase or ("Running" if "running" in state or restarts else "Pending")
            status["conditions"] = [
                _condition("Initialized", True),
                _condition("Ready", ready, None if ready else "ContainersNotReady"),
                _condition("ContainersReady", ready, None if ready else "ContainersNotReady"),
                _condition("PodScheduled", True),
            ]

        self._patch_status(ns, name, change)

    def _create(self, pod: dict[str, Any]) -> Any:
        meta, spec = pod["metadata"], pod["spec"]
        c = spec["containers"][0]
        psc, csc = spec.get("securityContext") or {}, c.get("securityContext") or {}
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup"))
        user = None if uid is None else (f"{uid}:{gid}" if gid is not None else str(uid))
        caps = csc.get("capabilities") or {}
        security_opt = ["no-new-privileges"] if csc.get("allowPrivilegeEscalation") is False else []
        tmpfs, claimed = {}, []
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for mount in c.get("volumeMounts") or []:
            if claim := volumes[mount["name"]].get("persistentVolumeClaim"):
                owner_ids = (uid or 0, psc.get("fsGroup", gid) or 0)
                claimed.append(self._claimed(meta["namespace"], claim, mount, c["image"], owner_ids))
                continue
            empty_dir = volumes[mount["name"]].get("emptyDir") or {}
            size = f",size={int(quantity(empty_dir['sizeLimit']))}" if empty_dir.get("sizeLimit") else ""
            # A real emptyDir is a 0777 directory (group fsGroup). Docker copies the image
            # directory's mode onto a tmpfs over it whatever ``mode`` says, so the fake gives
            # it to the pod's user and fsGroup instead; and, as an emptyDir, not noexec.
            owner = f",uid={uid or 0},gid={psc.get('fsGroup', gid) or 0}"
            tmpfs[mount["mountPath"]] = f"rw,exec,nosuid,nodev{owner},mode=1777{size}"
        limits = (c.get("resources") or {}).get("limits") or {}
        memory = int(quantity(limits["memory"])) if "memory" in limits else None
        return self.docker.containers.create(
            c["image"],
            entrypoint=c.get("command"),
            command=c.get("args"),
            environment={e["name"]: e.get("value", "") for e in c.get("env") or []},
            working_dir=c.get("workingDir"),
            user=user,
            group_add=[str(g) for g in psc.get("supplementalGroups") or []] or None,
            read_only=bool(csc.get("readOnlyRootFilesystem")),
            cap_drop=caps.get("drop"),
            cap_add=caps.get("add"),
            security_opt=security_opt or None,
            tmpfs=tmpfs or None,
            mounts=claimed or None,
            mem_limit=memory,
            memswap_limit=memory,
            nano_cpus=int(quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
            network_mode="none",
            hostname=meta["name"][:63],
            labels={**self.labels, f"{LABEL}.pod": f"{meta['namespace']}.{meta['name']}"},
            init=bool(spec.get("shareProcessNamespace")),  # a PID 1 that reaps, as the pause container
            stdin_open=bool(c.get("stdin")),
            tty=bool(c.get("tty")),
        )

    def _claimed(self, ns: str, claim: dict[str, Any], mount: dict[str, Any], image: str, ids: tuple[int, int]) -> Any:
        """The Docker mount of a claim's storage, made (and given to the pod's user and fsGroup,
        as a real volume's fsGroup does) the first time a pod mounts it."""
        import docker.errors
        from docker.types import Mount

        if not self.claims.bound(ns, claim["claimName"]):
            raise RuntimeError(f'persistentvolumeclaim "{claim["claimName"]}" not found')
        name = docker_volume(ns, claim["claimName"])
        try:
            self.docker.volumes.get(name)
        except docker.errors.NotFound:
            self.docker.volumes.create(name=name, labels={**self.labels, LABEL: "pvc"})
            self.docker.containers.run(
                image, ["chown", f"{ids[0]}:{ids[1]}", "/claim"], user="0:0", remove=True, network_mode="none",
                labels=self.labels, volumes={name: {"bind": "/claim", "mode": "rw"}},
            )  # fmt: skip
        read_only = bool(mount.get("readOnly") or claim.get("readOnly"))
        return Mount(mount["mountPath"], name, type="volume", read_only=read_only)

    # -- endings --------------------------------------------------------------------------------
    async def fail(self, ns: str, name: str, reason: str, message: str) -> None:
        """End a pod as the node does for a deadline or an eviction: Failed with this reason."""
        task = self.tasks.pop((ns, name), None)
        if task:
            task.cancel()
        await self._remove_container(ns, name, kill=True, keep=True)

        def change(pod: dict[str, Any]) -> None:
            pod["status"].update(phase="Failed", reason=reason, message=message)
            for cs in pod["status"].get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": {"exitCode": 137, "reason": "Error"}})
            for cond in pod["status"].get("conditions") or []:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "False"

        with contextlib.suppress(ApiError):
            self._patch_status(ns, name, change)

    async def terminate(self, ns: str, name: str, grace: int) -> None:
        """Stop the pod's container (SIGTERM, SIGKILL after ``grace``) and remove the pod,
        unless finalizers hold it: then it stays, ``deletionTimestamp`` set, until the last
        finalizer is patched away (`release`)."""
        task = self.tasks.pop((ns, name), None)
        if task:
            task.cancel()
        await self._remove_container(ns, name, grace=grace)
        self.stopped.add((ns, name))
        self.release(ns, name)
        with contextlib.suppress(ApiError):  # held by a finalizer: report its containers ended

            def stopped(pod: dict[str, Any]) -> None:
                for cs in pod["status"].get("containerStatuses") or []:
                    if "terminated" not in cs["state"]:
                        state = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now()}}
                        cs.update(ready=False, started=False, state=state)
                for cond in pod["status"].get("conditions") or []:
                    if cond["type"] in ("Ready", "ContainersReady"):
                        cond["status"] = "False"

            self._patch_status(ns, name, stopped)

    def release(self, ns: str, name: str) -> None:
        """Remove a pod being deleted once its containers are gone and no finalizer holds it."""
        try:
            meta = self.store.get(ns, name)["metadata"]
        except ApiError:
            self.stopped.discard((ns, name))
            return
        if (ns, name) in self.stopped and meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.stopped.discard((ns, name))
            self.store.delete(ns, name)

    async def _remove_container(
        self, ns: str, name: str, *, grace: int = 0, kill: bool = False, keep: bool = False
    ) -> None:
        cid = self.containers.get((ns, name)) if keep else self.containers.pop((ns, name), None)
        if not cid:
            return
        with contextlib.suppress(Exception):
            container = await self.blocking(self.docker.containers.get, cid)
            await self.blocking(container.kill if kill else container.stop, **({} if kill else {"timeout": grace}))
            if not keep:
                await self.blocking(container.remove, force=True, v=True)

    async def shutdown(self) -> None:
        for ns, name in list(self.tasks):
            await self.terminate(ns, name, 0)
        for key in list(self.containers):
            await self._remove_container(*key)
        self.pool.shutdown(wait=False)
