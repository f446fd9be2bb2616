"""The two gRPC services the ``modal`` SDK (pinned 1.6.4) talks to for sandboxes.

``FakeControlPlane`` implements the control-plane RPCs of ``modal_proto.api_grpc.ModalClientBase`` that
``App.lookup``, ``Image.from_registry``, ``Sandbox.create`` (V2), ``terminate``, ``wait``/``poll`` and tags
use; ``FakeCommandRouter`` implements the ``TaskCommandRouterBase`` RPCs behind ``Sandbox.exec``,
``ContainerProcess.wait``/``poll``, stdout/stderr reads and stdin streams (which the SDK's
``filesystem`` API uses). Every other RPC answers UNIMPLEMENTED and is recorded in ``state.unimplemented``,
so a test can prove the SDK called nothing the fake does not model.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpclib import GRPCError, Status
from modal_proto import api_pb2
from modal_proto import task_command_router_pb2 as sr_pb2
from modal_proto.api_grpc import ModalClientBase
from modal_proto.task_command_router_grpc import TaskCommandRouterBase

from fake_modal.sandboxes import ExecStartError, FakeExec, FakeSandbox

IMAGE_BUILDER_VERSION = "2025.06"


def make_jwt(lifetime_s: float = 3600) -> str:
    """An unsigned JWT with an ``exp`` claim: the SDK only reads the expiry."""

    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"exp": int(time.time() + lifetime_s), "jti": secrets.token_hex(8)}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.fake"


@dataclass
class FakeState:
    """Everything the fake knows; tests read it (from the fake's thread, see FakeModal.inspect)."""

    base_dir: Path
    url: str = ""
    missing_images: Callable[[str], bool] = lambda tag: tag.startswith("missing/")
    """Registry tags whose pull fails (the image build ends in FAILURE, as for an unknown image)."""
    create_delay_s: float = 0.0
    """How long SandboxCreateV2 takes before it creates anything (to cancel a client mid-create)."""
    creations_per_s: float | None = 5.0
    """Modal's documented limit of sandbox creations per second per workspace (5 by default): a creation
    beyond it in any one-second window is refused as Modal refuses it, ``RESOURCE_EXHAUSTED`` (the SDK
    raises ``modal.exception.ResourceExhaustedError``). None: no limit."""
    creation_times: list[float] = field(default_factory=list)
    """When each admitted creation arrived (``time.monotonic``)."""
    refused_creations: int = 0
    apps: dict[str, str] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    """image id -> registry tag"""
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    unimplemented: list[str] = field(default_factory=list)

    def sandbox(self, sandbox_id: str) -> FakeSandbox:
        found = self.sandboxes.get(sandbox_id)
        if found is None:
            raise GRPCError(Status.NOT_FOUND, f"sandbox {sandbox_id} not found")
        return found

    def by_task(self, task_id: str) -> FakeSandbox:
        for sandbox in self.sandboxes.values():
            if sandbox.task_id == task_id:
                if not sandbox.running:
                    raise GRPCError(Status.NOT_FOUND, f"task {task_id} has finished")
                return sandbox
        raise GRPCError(Status.NOT_FOUND, f"task {task_id} not found")


def _fill_unimplemented(cls: type) -> type:
    """Give every abstract RPC of a generated base an UNIMPLEMENTED handler that records the call."""

    def fallback(name: str):
        async def handler(self, stream) -> None:
            self.state.unimplemented.append(name)
            raise GRPCError(Status.UNIMPLEMENTED, f"the fake Modal does not implement {name}")

        return handler

    for name in list(getattr(cls, "__abstractmethods__", ())):
        setattr(cls, name, fallback(name))
    cls.__abstractmethods__ = frozenset()
    return cls


def _result(status: int) -> api_pb2.GenericResult:
    return api_pb2.GenericResult(status=status) if status else api_pb2.GenericResult()


@_fill_unimplemented
class FakeControlPlane(ModalClientBase):
    """Control-plane RPCs (the ``api.ModalClient`` service)."""

    def __init__(self, state: FakeState):
        self.state = state

    async def _recv(self, stream, name: str):
        self.state.calls.append(name)
        return await stream.recv_message()

    async def ClientHello(self, stream) -> None:
        await self._recv(stream, "ClientHello")
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def AuthTokenGet(self, stream) -> None:
        await self._recv(stream, "AuthTokenGet")
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=make_jwt()))

    async def AppGetOrCreate(self, stream) -> None:
        request = await self._recv(stream, "AppGetOrCreate")
        app_id = self.state.apps.setdefault(request.app_name, f"ap-{secrets.token_hex(11)}")
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def EnvironmentGetOrCreate(self, stream) -> None:
        await self._recv(stream, "EnvironmentGetOrCreate")
        settings = api_pb2.EnvironmentSettings(image_builder_version=IMAGE_BUILDER_VERSION)
        metadata = api_pb2.EnvironmentMetadata(name="main", settings=settings)
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(environment_id="en-fake", metadata=metadata)
        )

    async def ImageGetOrCreate(self, stream) -> None:
        request = await self._recv(stream, "ImageGetOrCreate")
        commands = list(request.image.dockerfile_commands)
        tag = next((line.split(None, 1)[1] for line in commands if line.upper().startswith("FROM ")), "")
        image_id = "im-" + hashlib.sha256("\n".join(commands).encode()).hexdigest()[:22]
        if not tag or self.state.missing_images(tag):
            result = api_pb2.GenericResult(
                status=api_pb2.GenericResult.GENERIC_STATUS_FAILURE,
                exception=f"failed to pull {tag!r}: manifest unknown",
            )
        else:
            self.state.images[image_id] = tag
            result = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(image_id=image_id, result=result))

    def _admit_creation(self) -> None:
        _admit(self.state)

    async def SandboxCreateV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxCreateV2")
        self._admit_creation()
        await asyncio.sleep(self.state.create_delay_s)
        definition = request.definition
        if request.app_id not in self.state.apps.values():
            raise GRPCError(Status.NOT_FOUND, f"app {request.app_id} not found")
        if definition.image_id not in self.state.images:
            raise GRPCError(Status.NOT_FOUND, f"image {definition.image_id} not found")
        if definition.entrypoint_args:
            raise GRPCError(Status.INVALID_ARGUMENT, "the fake Modal runs no entrypoint commands")
        env: dict[str, str] = {}
        for source in request.secret_sources:
            env.update(source.env.contents)
        resources = definition.resources
        sandbox = FakeSandbox(
            sandbox_id=f"sb-{secrets.token_hex(16)}",
            task_id=f"ta-{secrets.token_hex(12)}V",
            app_id=request.app_id,
            image=self.state.images[definition.image_id],
            root=self.state.base_dir / f"sandbox-{secrets.token_hex(6)}",
            timeout_secs=definition.timeout_secs,
            tags={tag.tag_name: tag.tag_value for tag in request.tags},
            env=env,
            cpu=resources.milli_cpu / 1000 if resources.milli_cpu else None,
            memory_mb=resources.memory_mb or None,
            network_blocked=definition.network_access.network_access_type
            == api_pb2.NetworkAccess.NetworkAccessType.BLOCKED,
            router_jwt=make_jwt(),
        )
        sandbox.start()
        self.state.sandboxes[sandbox.sandbox_id] = sandbox
        access = api_pb2.CommandRouterAccess(url=self.state.url, jwt=sandbox.router_jwt)
        await stream.send_message(
            api_pb2.SandboxCreateV2Response(
                sandbox_id=sandbox.sandbox_id,
                task_id=sandbox.task_id,
                command_router_access=access,
                metadata=api_pb2.SandboxHandleMetadata(app_id=sandbox.app_id),
            )
        )

    async def SandboxGetCommandRouterAccess(self, stream) -> None:
        request = await self._recv(stream, "SandboxGetCommandRouterAccess")
        sandbox = self.state.sandbox(request.sandbox_id)
        if not sandbox.running:
            raise GRPCError(Status.FAILED_PRECONDITION, "sandbox has finished")
        await stream.send_message(
            api_pb2.SandboxGetCommandRouterAccessResponse(url=self.state.url, jwt=sandbox.router_jwt)
        )

    async def SandboxGetTaskIdV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxGetTaskIdV2")
        sandbox = self.state.sandbox(request.sandbox_id)
        if sandbox.running:
            response = api_pb2.SandboxGetTaskIdResponse(task_id=sandbox.task_id)
        else:
            response = api_pb2.SandboxGetTaskIdResponse(task_result=_result(sandbox.status))
        await stream.send_message(response)

    async def SandboxTerminateV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxTerminateV2")
        sandbox = self.state.sandbox(request.sandbox_id)
        existing = _result(sandbox.status)
        await sandbox.terminate()
        await stream.send_message(api_pb2.SandboxTerminateResponse(existing_result=existing))

    async def SandboxWaitV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxWaitV2")
        sandbox = self.state.sandbox(request.sandbox_id)
        if request.timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sandbox.done.wait(), request.timeout)
        await stream.send_message(
            api_pb2.SandboxWaitResponse(
                result=_result(sandbox.status),
                metadata=api_pb2.SandboxHandleMetadata(app_id=sandbox.app_id),
            )
        )

    async def SandboxTagsGetV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxTagsGetV2")
        tags = self.state.sandbox(request.sandbox_id).tags
        protos = [api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in tags.items()]
        await stream.send_message(api_pb2.SandboxTagsGetResponse(tags=protos))

    async def SandboxTagsSetV2(self, stream) -> None:
        request = await self._recv(stream, "SandboxTagsSetV2")
        sandbox = self.state.sandbox(request.sandbox_id)
        sandbox.tags = {tag.tag_name: tag.tag_value for tag in request.tags}
        await stream.send_message(api_pb2.SandboxTagsSetResponse())


_STDIO_FDS = {
    sr_pb2.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT: 1,
    sr_pb2.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR: 2,
}
_BEARER = re.compile(r"^Bearer (\S+)$")


def _admit(state: FakeState) -> None:
    """Refuse a creation past ``creations_per_s`` in the last second, with Modal's error shape."""
    if state.creations_per_s is None:
        return
    now = time.monotonic()
    if sum(1 for t in state.creation_times if now - t < 1.0) >= state.creations_per_s:
        state.refused_creations += 1
        limit = f"{state.creations_per_s:g}/s"
        raise GRPCError(Status.RESOURCE_EXHAUSTED, f"Sandbox creation rate limit ({limit}) exceeded")
    state.creation_times.append(now)


@_fill_unimplemented
class FakeCommandRouter(TaskCommandRouterBase):
    """Worker-side RPCs (the ``TaskCommandRouter`` service), authenticated by the sandbox's router JWT."""

    def __init__(self, state: FakeState):
        self.state = state

    async def _recv(self, stream, name: str):
        self.state.calls.append(name)
        return await stream.recv_message()

    def _sandbox(self, stream, task_id: str) -> FakeSandbox:
        sandbox = self.state.by_task(task_id)
        match = _BEARER.match(stream.metadata.get("authorization", ""))
        if not match or match.group(1) != sandbox.router_jwt:
            raise GRPCError(Status.UNAUTHENTICATED, "bad or missing router JWT")
        return sandbox

    def _exec(self, stream, task_id: str, exec_id: str) -> FakeExec:
        found = self._sandbox(stream, task_id).execs.get(exec_id)
        if found is None:
            raise GRPCError(Status.NOT_FOUND, f"exec {exec_id} not found")
        return found

    async def TaskExecStart(self, stream) -> None:
        request = await self._recv(stream, "TaskExecStart")
        sandbox = self._sandbox(stream, request.task_id)
        if request.exec_id not in sandbox.execs:  # the exec id doubles as an idempotency key
            env = {entry.key: entry.value for entry in request.env}
            for source in request.secret_sources:
                env.update(source.env.contents)
            try:
                await sandbox.start_exec(
                    request.exec_id,
                    list(request.command_args),
                    request.workdir,
                    env,
                    request.timeout_secs,
                )
            except ExecStartError as exc:
                raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
        await stream.send_message(sr_pb2.TaskExecStartResponse())

    async def TaskExecStdioRead(self, stream) -> None:
        request = await self._recv(stream, "TaskExecStdioRead")
        fake_exec = self._exec(stream, request.task_id, request.exec_id)
        fd = _STDIO_FDS.get(request.file_descriptor)
        if fd is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "unknown file descriptor")
        offset = request.offset
        while True:
            async with fake_exec.changed:
                await fake_exec.changed.wait_for(
                    lambda start=offset: len(fake_exec.output[fd]) > start or fake_exec.eof[fd]
                )
                data = bytes(fake_exec.output[fd][offset : offset + 64 * 1024])
                finished = not data and fake_exec.eof[fd]
            if finished:
                return
            await stream.send_message(sr_pb2.TaskExecStdioReadResponse(data=data))
            offset += len(data)

    @staticmethod
    def _exit_status(fake_exec: FakeExec, response_type):
        code = fake_exec.returncode
        if code is None:
            return response_type()
        return response_type(signal=-code) if code < 0 else response_type(code=code)

    async def TaskExecWait(self, stream) -> None:
        request = await self._recv(stream, "TaskExecWait")
        fake_exec = self._exec(stream, request.task_id, request.exec_id)
        await fake_exec.exited.wait()
        await stream.send_message(self._exit_status(fake_exec, sr_pb2.TaskExecWaitResponse))

    async def TaskExecPoll(self, stream) -> None:
        request = await self._recv(stream, "TaskExecPoll")
        fake_exec = self._exec(stream, request.task_id, request.exec_id)
        await stream.send_message(self._exit_status(fake_exec, sr_pb2.TaskExecPollResponse))

    async def _write_stdin(self, fake_exec: FakeExec, offset: int, data: bytes, eof: bool) -> None:
        stdin = fake_exec.process.stdin
        if fake_exec.stdin_closed or stdin is None:
            raise GRPCError(Status.FAILED_PRECONDITION, "stdin is closed")
        data = data[max(0, fake_exec.stdin_written - offset) :]  # resent bytes are skipped
        try:
            if data:
                stdin.write(data)
                await stdin.drain()
                fake_exec.stdin_written += len(data)
            if eof:
                fake_exec.stdin_closed = True
                stdin.close()
        except (BrokenPipeError, ConnectionResetError) as exc:
            # What the worker answers when the process exited before reading all of its input.
            raise GRPCError(Status.FAILED_PRECONDITION, f"stdin write dropped: {exc}") from exc

    async def TaskExecStdinWrite(self, stream) -> None:
        request = await self._recv(stream, "TaskExecStdinWrite")
        fake_exec = self._exec(stream, request.task_id, request.exec_id)
        await self._write_stdin(fake_exec, request.offset, request.data, request.eof)
        await stream.send_message(sr_pb2.TaskExecStdinWriteResponse())

    async def TaskExecStdinWriteStream(self, stream) -> None:
        first = await self._recv(stream, "TaskExecStdinWriteStream")
        if first is None or not first.HasField("start"):
            raise GRPCError(Status.INVALID_ARGUMENT, "the stream must begin with a start message")
        fake_exec = self._exec(stream, first.start.task_id, first.start.exec_id)
        offset = first.start.offset
        async for message in stream:
            if message.HasField("end"):
                await self._write_stdin(fake_exec, offset, b"", eof=True)
                break
            await self._write_stdin(fake_exec, offset, message.data, eof=False)
            offset += len(message.data)
        await stream.send_message(sr_pb2.TaskExecStdinWriteStreamResponse())

    async def TaskExecStdinStatus(self, stream) -> None:
        request = await self._recv(stream, "TaskExecStdinStatus")
        fake_exec = self._exec(stream, request.task_id, request.exec_id)
        await stream.send_message(
            sr_pb2.TaskExecStdinStatusResponse(
                num_bytes_written=fake_exec.stdin_written, closed=fake_exec.stdin_closed
            )
        )
