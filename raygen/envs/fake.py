"""FakeEnvironment: an in-memory filesystem and a tiny shell, no processes (for fast, Ray-free tests).

The shell subset (anything else fails like bash would, e.g. exit 127 "command not found"):
- sequencing with ``;``, newlines, ``&&`` and ``||``; ``# comments``; redirections ``> f``, ``>> f``, ``>&2``;
- single quotes, double quotes (with ``$`` expansion), backslash escapes;
- ``$VAR``, ``${VAR}`` and ``$((integer arithmetic))`` (+ - * / % **, parentheses, variables);
  an unquoted expansion is one word (no word splitting or globbing);
- commands: echo [-n], printf (%s %d %i %%, widths, \\n \\t \\\\), cat, ls, pwd, cd, mkdir [-p], seq,
  true, false, exit N, sleep S (a real asyncio sleep, so timeouts can be tested).
Pipes and background jobs are not supported (exit 2). There is no host access at all.
"""

from __future__ import annotations

import ast
import asyncio
import errno
import posixpath
import re
import time

from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.envs.configs import FakeEnvConfig
from raygen.errors import SessionFailure
from raygen.formats.text import cap_text

_OPS = ("&&", "||", "|", "&", ">>", ">&2", ">", ";", "\n")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


class _ShellError(Exception):
    """Aborts the command line: status 2 for syntax errors, 1 for expansion errors (as bash does)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message, status)
        self.message, self.status = message, status


class _Exit(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _arith(expr: str, variables: dict[str, str]) -> int:
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return int(variables.get(node.id) or 0)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if type(node.op) in ops:
                return ops[type(node.op)](a, b)
            if isinstance(node.op, ast.Pow) and b >= 0:
                return a**b
            if isinstance(node.op, ast.Div | ast.Mod):
                if b == 0:
                    raise _ShellError("division by 0", 1)
                quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C: truncate toward 0
                return quotient if isinstance(node.op, ast.Div) else a - b * quotient
        raise _ShellError(f"arithmetic syntax error: {expr!r}", 1)

    try:
        return ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError) as exc:
        raise _ShellError(f"arithmetic syntax error: {expr!r}", 1) from exc


def _expand(line: str, i: int, variables: dict[str, str]) -> tuple[str, int]:
    """Expand the ``$`` construct at ``line[i]``: returns its text and the index after it."""
    if line.startswith("$((", i):
        depth = 0
        for end in range(i + 1, len(line)):
            depth += {"(": 1, ")": -1}.get(line[end], 0)
            if depth == 0:
                return str(_arith(line[i + 3 : end - 1], variables)), end + 1
        raise _ShellError("unterminated $((")
    if match := _VAR.match(line, i):
        return variables.get(match[1] or match[2], ""), match.end()
    return "$", i + 1


def _tokenize(line: str, variables: dict[str, str]) -> list[tuple[bool, str]]:
    """Split a command line into ``(is_operator, text)`` tokens, applying quotes and expansions."""
    tokens: list[tuple[bool, str]] = []
    word: list[str] | None = None
    i = 0
    while i < len(line):
        c = line[i]
        op = next((o for o in _OPS if line.startswith(o, i)), None)
        if op or c in " \t" or (c == "#" and word is None):
            if word is not None:
                tokens.append((False, "".join(word)))
                word = None
            if op:
                tokens.append((True, op))
            if c == "#":  # a comment runs to the end of the line
                i = line.find("\n", i) if "\n" in line[i:] else len(line)
            else:
                i += len(op or c)
            continue
        word = [] if word is None else word
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise _ShellError("unterminated quote")
            word.append(line[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                if line[i] == "\\" and line[i + 1 : i + 2] in ('"', "\\", "$"):
                    word.append(line[i + 1])
                    i += 2
                elif line[i] == "$":
                    text, i = _expand(line, i, variables)
                    word.append(text)
                else:
                    word.append(line[i])
                    i += 1
            if i >= len(line):
                raise _ShellError("unterminated quote")
            i += 1
        elif c == "\\":
            word.append(line[i + 1 : i + 2])
            i += 2
        elif c == "$":
            text, i = _expand(line, i, variables)
            word.append(text)
        else:
            word.append(c)
            i += 1
    if word is not None:
        tokens.append((False, "".join(word)))
    return tokens


def _printf(fmt: str, args: list[str]) -> tuple[str, str]:
    """bash's printf for %s/%d/%i/%%: the format repeats while arguments remain. Returns (out, err)."""
    fmt = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[0]), fmt)
    pending, out, err = list(args), [], []

    def directive(m: re.Match[str]) -> str:
        if m[2] == "%":
            return "%"
        value = pending.pop(0) if pending else ""
        if m[2] == "s":
            return f"%{m[1]}s" % value
        try:
            return f"%{m[1]}d" % int(value or 0)
        except ValueError:
            err.append(f"printf: {value}: invalid number\n")
            return f"%{m[1]}d" % 0

    while True:
        before = len(pending)
        out.append(re.sub(r"%([-0]?\d*)([sdi%])", directive, fmt))
        if not pending or len(pending) == before:
            return "".join(out), "".join(err)


class FakeEnvironment(Environment[FakeEnvConfig]):
    """In-memory filesystem (absolute path -> bytes) plus the shell subset above."""

    backend = "fake"
    confined = True  # nothing runs: commands only touch the in-memory filesystem

    def __init__(self, config: FakeEnvConfig | None, spec: EnvSpec):
        super().__init__(spec)
        self.config = config or FakeEnvConfig()
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}
        self.cwd = "/"
        self.variables: dict[str, str] = {}
        self._state = "new"

    async def start(self) -> None:
        self._refuse_if_closed()
        self.cwd = posixpath.normpath(posixpath.join("/", self.spec.cwd or "/"))
        for path in (self.cwd, "/tmp", "/home/raygen"):
            self.mkdirs(path)
        secrets = {value for value in self.spec.secret_values if value}
        self.variables = {k: v for k, v in self.spec.env.items() if v not in secrets}
        self.variables.update(HOME="/home/raygen", TMPDIR="/tmp", PWD=self.cwd)
        self._state = "started"

    async def _teardown(self) -> None:
        self._state = "closed"
        self.files.clear()
        self.dirs = {"/"}

    def _require_open(self) -> None:
        if self._state != "started":
            raise SessionFailure("env_lost", f"the fake environment is {self._state}, not started")

    def resolve(self, path: str, cwd: str | None = None) -> str:
        return posixpath.normpath(posixpath.join(cwd or self.cwd, path))

    def mkdirs(self, path: str) -> None:
        while path not in self.dirs:
            if path in self.files:
                raise FileExistsError(errno.EEXIST, "File exists", path)
            self.dirs.add(path)
            path = posixpath.dirname(path)

    def read(self, path: str) -> bytes:
        if path in self.dirs:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return self.files[path]

    def write(self, path: str, data: bytes) -> None:
        if path in self.dirs:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        self.mkdirs(posixpath.dirname(path))
        self.files[path] = bytes(data)

    async def read_file(self, path: str) -> bytes:
        self._require_open()
        return self.read(self.resolve(path))

    async def write_file(self, path: str, data: bytes) -> None:
        self._require_open()
        self.write(self.resolve(path), data)

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        self._require_open()
        shell, started, timed_out = _Shell(self), time.monotonic(), False
        try:
            code = await asyncio.wait_for(shell.run(command), timeout_s)
        except TimeoutError:
            code, timed_out = 124, True
        stdout, cut_out = cap_text("".join(shell.out), max_output_chars)
        stderr, cut_err = cap_text("".join(shell.err), max_output_chars)
        return ExecResult(code, stdout, stderr, timed_out, cut_out or cut_err, time.monotonic() - started)


class _Shell:
    """Runs one command line against a FakeEnvironment; ``out``/``err`` survive a timeout."""

    def __init__(self, env: FakeEnvironment):
        self.env, self.cwd, self.out, self.err = env, env.cwd, [], []

    async def run(self, line: str) -> int:
        try:
            statements = self._parse(_tokenize(line, self.env.variables))
            status = 0
            for connector, argv, redirect in statements:
                if argv and not ((connector == "&&" and status) or (connector == "||" and not status)):
                    status = await self._run_redirected(argv, redirect)
            return status
        except _Exit as done:
            return done.code
        except _ShellError as exc:
            self.err.append(f"fake: {exc.message}\n")
            return exc.status

    def _parse(self, tokens: list[tuple[bool, str]]) -> list[tuple[str, list[str], tuple[str, str] | None]]:
        statements, connector, argv, redirect = [], ";", [], None
        tokens = iter(tokens)
        for is_op, text in tokens:
            if not is_op:
                argv.append(text)
            elif text in (";", "\n", "&&", "||"):
                statements.append((connector, argv, redirect))
                connector, argv, redirect = text, [], None
            elif text in (">", ">>"):
                target = next(tokens, (True, ""))
                if target[0]:
                    raise _ShellError(f"syntax error near {text!r}")
                redirect = (text, target[1])
            elif text == ">&2":
                redirect = (text, "")
            else:
                raise _ShellError(f"{text!r} (pipes and background jobs) is not supported by the fake shell")
        return [*statements, (connector, argv, redirect)]

    async def _run_redirected(self, argv: list[str], redirect: tuple[str, str] | None) -> int:
        if redirect is None:
            return await self._command(argv)
        outer, self.out = self.out, []
        try:
            status = await self._command(argv)
        finally:
            text, self.out = "".join(self.out), outer
        if redirect[0] == ">&2":
            self.err.append(text)
            return status
        path = self.env.resolve(redirect[1], self.cwd)
        try:
            old = self.env.files.get(path, b"") if redirect[0] == ">>" else b""
            self.env.write(path, old + text.encode())
        except OSError as exc:
            self.err.append(f"fake: {redirect[1]}: {exc.strerror}\n")
            return 1
        return status

    async def _command(self, argv: list[str]) -> int:
        try:
            return await self._builtin(argv[0], argv[1:])
        except ValueError as exc:  # e.g. "sleep abc", "seq x": bash's builtins also exit 1
            self.err.append(f"fake: {argv[0]}: invalid argument ({exc})\n")
            return 1

    async def _builtin(self, name: str, args: list[str]) -> int:
        if name in ("true", "false"):
            return int(name == "false")
        if name == "exit":
            raise _Exit(int(args[0]) if args and args[0].lstrip("-").isdigit() else 0)
        if name == "sleep":
            await asyncio.sleep(float(args[0]) if args else 0)
            return 0
        if name == "echo":
            newline = not (args and args[0] == "-n")
            self.out.append(" ".join(args[0 if newline else 1 :]) + ("\n" if newline else ""))
            return 0
        if name == "printf":
            if not args:
                raise _ShellError("printf: usage: printf format [arguments]")
            text, errors = _printf(args[0], args[1:])
            self.out.append(text)
            self.err.append(errors)
            return int(bool(errors))
        if name == "pwd":
            self.out.append(self.cwd + "\n")
            return 0
        if name == "seq":
            nums = [int(a) for a in args]
            if not 1 <= len(nums) <= 3 or (len(nums) == 3 and nums[1] == 0):
                raise _ShellError("seq: usage: seq [first [increment]] last")
            first, step, last = (1, 1, nums[0]) if len(nums) == 1 else (nums[0], 1, nums[-1])
            step = nums[1] if len(nums) == 3 else step
            self.out.append("".join(f"{n}\n" for n in range(first, last + (1 if step > 0 else -1), step)))
            return 0
        handler = {"cat": self._cat, "ls": self._ls, "cd": self._cd, "mkdir": self._mkdir}.get(name)
        if handler is None:
            self.err.append(f"fake: {name}: command not found\n")
            return 127
        return handler([a for a in args if not a.startswith("-")], "-p" in args)

    def _fail(self, text: str) -> int:
        self.err.append(text + "\n")
        return 1

    def _cat(self, paths: list[str], _flag: bool) -> int:
        status = 0
        for path in paths:
            try:
                self.out.append(self.env.read(self.env.resolve(path, self.cwd)).decode("utf-8", "replace"))
            except OSError as exc:
                status = self._fail(f"cat: {path}: {exc.strerror}")
        return status

    def _ls(self, paths: list[str], _flag: bool) -> int:
        status, entries = 0, self.env.files.keys() | self.env.dirs
        for path in paths or ["."]:
            full = self.env.resolve(path, self.cwd)
            if full in self.env.dirs:
                names = sorted(
                    posixpath.basename(p) for p in entries if p != "/" and posixpath.dirname(p) == full
                )
                self.out.append("".join(f"{name}\n" for name in names))
            elif full in self.env.files:
                self.out.append(path + "\n")
            else:
                self._fail(f"ls: cannot access '{path}': No such file or directory")
                status = 2
        return status

    def _cd(self, paths: list[str], _flag: bool) -> int:
        target = self.env.resolve(paths[0] if paths else self.env.variables["HOME"], self.cwd)
        if target not in self.env.dirs:
            return self._fail(f"cd: {paths[0]}: No such file or directory")
        self.cwd = target
        return 0

    def _mkdir(self, paths: list[str], parents: bool) -> int:
        status = 0
        for path in paths:
            full = self.env.resolve(path, self.cwd)
            if full in self.env.files or (full in self.env.dirs and not parents):
                status = self._fail(f"mkdir: cannot create directory '{path}': File exists")
            elif not parents and posixpath.dirname(full) not in self.env.dirs:
                status = self._fail(f"mkdir: cannot create directory '{path}': No such file or directory")
            else:
                try:
                    self.env.mkdirs(full)
                except OSError:
                    status = self._fail(f"mkdir: cannot create directory '{path}': Not a directory")
        return status
