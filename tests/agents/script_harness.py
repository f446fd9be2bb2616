"""A small agent harness for the tests: standard library only, run by raygen as ``agent.type: command``.

It reads the prompt from ``RAYGEN_PROMPT_FILE``, calls ``$OPENAI_BASE_URL/chat/completions`` with
``OPENAI_API_KEY`` (streaming with ``--stream``), offers ``terminal``, ``write_file`` and ``read_file``,
runs the calls it gets, and loops until an answer without tool calls, which it prints. Modes for the
failure tests: ``--exit N`` exits N after the first call; ``--forever`` ignores answers and keeps calling;
``--dump PATH`` writes its environment to PATH first; ``--compact`` starts a second thread after two calls.
"""

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {"name": n, "description": d, "parameters": {"type": "object", "properties": p}},
    }
    for n, d, p in (
        ("terminal", "Run a shell command.", {"command": {"type": "string"}}),
        ("write_file", "Write a file.", {"path": {"type": "string"}, "content": {"type": "string"}}),
        ("read_file", "Read a file.", {"path": {"type": "string"}}),
    )
]


def call(messages, stream):
    body = {"model": os.environ["RAYGEN_MODEL"], "messages": messages, "tools": TOOLS, "stream": stream}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        if not stream:
            return json.load(response)["choices"][0]["message"]
        message = {"role": "assistant", "content": ""}
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice["delta"]
                message["content"] += delta.get("content") or ""
                for key in ("reasoning_content",):
                    if delta.get(key):
                        message[key] = message.get(key, "") + delta[key]
                for tc in delta.get("tool_calls") or []:
                    message.setdefault("tool_calls", []).append(
                        {k: tc[k] for k in ("id", "type", "function")}
                    )
        return message


def run_tool(name, args):
    if name == "terminal":
        done = subprocess.run(args["command"], shell=True, capture_output=True, text=True, timeout=30)
        return done.stdout + done.stderr
    if name == "write_file":
        with open(args["path"], "w") as f:
            f.write(args["content"])
        return "ok"
    if name == "read_file":
        with open(args["path"]) as f:
            return f.read()
    return "unknown tool " + name


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--exit", type=int)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--dump")
    parser.add_argument("--compact", action="store_true")
    options = parser.parse_args()
    if options.dump:
        with open(options.dump, "w") as f:
            json.dump(dict(os.environ), f)
    with open(os.environ["RAYGEN_PROMPT_FILE"]) as f:
        prompt = f.read()
    messages = [{"role": "system", "content": "You are a test harness."}, {"role": "user", "content": prompt}]
    calls = 0
    while True:
        try:
            message = call(messages, options.stream)
        except urllib.error.HTTPError as exc:
            print("model call refused:", exc.code, exc.read().decode(), file=sys.stderr)
            return 2
        calls += 1
        if options.exit is not None:
            return options.exit
        messages.append(message)
        if not message.get("tool_calls") and not options.forever:
            print(message.get("content"))
            return 0
        for tc in message.get("tool_calls") or []:
            result = run_tool(tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
        if options.compact and calls == 2:  # a new context: a summary as the only history
            messages = [messages[0], {"role": "user", "content": prompt + "\n(summary: tools ran)"}]


if __name__ == "__main__":
    sys.exit(main())
