"""raygen's forwarder: runs inside a session's sandbox, in front of an agent harness.

``python3 forward.py SEAT_DIR``. The seat folder (bound into the sandbox at its host path) holds
``proxy.sock`` (raygen's model proxy), ``prompt.txt`` and ``agent.json`` (the command, the token, the
model). The forwarder listens on a free loopback port and relays each connection to the proxy's socket,
so a sandbox without any network (bubblewrap, ``network_mode=none``) still reaches its model; it sets
``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL`` and the rest, fills the command's placeholders, runs the
command with the shell and exits with its exit code. Standard library only, and Python 3.8 or newer:
it runs on whatever Python the sandbox has.
"""

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import sys

PLACEHOLDER = re.compile(r"\{(prompt|prompt_file|workdir|model|base_url)\}")
PROMPT_ENV_MAX = 100000
"""Longer prompts are only in the file (one environment variable may hold at most 128 KiB)."""


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, ConnectionError):
        pass


def _relay(socket_path):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for w in (writer, up_writer):
            with contextlib.suppress(OSError):
                w.close()

    return handle


def _environment(seat, base, prompt, prompt_file):
    env = dict(os.environ)
    env.update(seat.get("env") or {})
    token = seat["token"]
    env.update(
        {
            "RAYGEN_PROMPT_FILE": prompt_file,
            "RAYGEN_SESSION_ID": seat["session_id"],
            "RAYGEN_MODEL": seat["model"],
            "OPENAI_BASE_URL": base + "/v1",
            "OPENAI_API_BASE": base + "/v1",
            "OPENAI_API_KEY": token,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": token,
            "ANTHROPIC_AUTH_TOKEN": token,
        }
    )
    if len(prompt) <= PROMPT_ENV_MAX:
        env["RAYGEN_PROMPT"] = prompt
    return env


async def main(seat_dir):
    with open(os.path.join(seat_dir, "agent.json"), encoding="utf-8") as f:
        seat = json.load(f)
    prompt_file = os.path.join(seat_dir, "prompt.txt")
    with open(prompt_file, encoding="utf-8") as f:
        prompt = f.read()
    server = await asyncio.start_server(_relay(os.path.join(seat_dir, "proxy.sock")), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    env = _environment(seat, base, prompt, prompt_file)
    values = {
        "prompt": prompt,
        "prompt_file": prompt_file,
        "workdir": os.getcwd(),
        "model": seat["model"],
        "base_url": base + "/v1",
    }
    command = PLACEHOLDER.sub(lambda m: shlex.quote(values[m.group(1)]), seat["command"])
    shell = shutil.which("bash", path=env.get("PATH")) or "/bin/sh"
    process = await asyncio.create_subprocess_exec(shell, "-c", command, env=env)
    code = await process.wait()
    server.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
