"""A misbehaving MCP stdio server for tests, speaking raw JSON-RPC (no SDK, so it can break the rules).

    python scripted_server.py MODE [MODE ...]

Modes: ``junk`` (prints non-protocol lines on stdout before every answer), ``hang-init`` (never answers
``initialize``), ``crash-init`` (writes to stderr and exits at start), ``no-tools`` (lists none),
``crash-on-call`` (the ``crash`` tool exits the process), ``hang-on-call`` (the ``hang`` tool never
answers, nor does anything after it), ``child`` (starts a detached ``sleep`` child at start, which must
not outlive the session). Tools: ``echo`` (returns its text), ``fail`` (isError), ``crash``, ``hang``,
``image`` (an image content), ``pid`` (its pid and its child's).
"""

import json
import os
import subprocess
import sys
import time

MODES = set(sys.argv[1:])
TOOLS = [
    {"name": name, "description": f"{name} tool", "inputSchema": schema}
    for name, schema in [
        ("echo", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ("fail", {"type": "object", "properties": {}}),
        ("crash", {"type": "object", "properties": {}}),
        ("hang", {"type": "object", "properties": {}}),
        ("image", {"type": "object", "properties": {}}),
        ("pid", {"type": "object", "properties": {}}),
    ]
]
child = None


def send(message):
    if "junk" in MODES:
        sys.stdout.write("this is not JSON-RPC: a server that logs to stdout\n")
        sys.stdout.write('{"not": "a jsonrpc message"}\n')
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def result(request_id, value):
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


def text(value, error=False):
    return {"content": [{"type": "text", "text": value}], "isError": error}


def call(request_id, name, args):
    if name == "echo":
        result(request_id, text(str(args.get("text"))))
    elif name == "fail":
        result(request_id, text("it failed on purpose", error=True))
    elif name == "crash":
        sys.stderr.write("scripted server: crashing now\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "hang":
        while True:
            time.sleep(3600)
    elif name == "image":
        result(request_id, {"content": [{"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]})
    elif name == "pid":
        result(request_id, text(json.dumps({"pid": os.getpid(), "child": child.pid if child else None})))
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"no tool {name}"}})


def main():
    global child
    if "crash-init" in MODES:
        sys.stderr.write("scripted server: cannot start (missing configuration FOO)\n")
        sys.exit(1)
    if "child" in MODES:
        child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            if "hang-init" in MODES:
                continue
            result(
                request_id,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "scripted", "version": "1.0"},
                },
            )
        elif method == "tools/list":
            result(request_id, {"tools": [] if "no-tools" in MODES else TOOLS})
        elif method == "ping":
            result(request_id, {})
        elif method == "tools/call":
            call(request_id, message["params"]["name"], message["params"].get("arguments") or {})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": method}})


main()
