#!/usr/bin/env bash
# Install the agent harnesses the tests run as sessions (tests/agents, docs/agents.md), each from PyPI into
# a venv of its own under WORKDIR (default /tmp/raygen-ci/agents):
#   WORKDIR/hermes/bin/hermes          hermes-agent   (Hermes Agent)
#   WORKDIR/mini-swe-agent/bin/mini    mini-swe-agent
#   WORKDIR/npm/node_modules/.bin/claude   @anthropic-ai/claude-code (npm; skipped without npm)
#   WORKDIR/npm/node_modules/.bin/codex    @openai/codex (npm; skipped without npm)
# The venvs use the system's /usr/bin/python3 (Debian's), not the project's: a bubblewrap sandbox shows
# /usr but not /root or the project's .venv, and the raygen-test/python image (Debian's python3 too) runs
# them bind-mounted at the same path. A venv whose package is already at the pinned version is left as is.
set -euo pipefail

log() { echo "agents-setup: $*" >&2; }
workdir="${1:-/tmp/raygen-ci/agents}"
python=/usr/bin/python3
mkdir -p "$workdir"

install() {  # install NAME PACKAGE VERSION
    local venv="$workdir/$1" package="$2" version="$3"
    local installed=""
    [ -x "$venv/bin/python" ] && installed="$("$venv/bin/python" -m pip show "$package" 2>/dev/null || true)"
    if grep -qx "Version: $version" <<<"$installed"; then
        log "$package $version is in $venv"
        return
    fi
    log "installing $package $version into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$package==$version" 2>&1 | grep -v '^WARNING: Location' >&2 || true
    "$venv/bin/python" -m pip show "$package" >/dev/null
}

install hermes hermes-agent 0.19.0
install mini-swe-agent mini-swe-agent 2.4.6

# Claude Code and Codex from the npm registry: their platform binaries are registry packages of their own
# (@anthropic-ai/claude-code-linux-x64, @openai/codex-linux-x64), so no install script downloads anything.
install_npm() {  # install_npm PACKAGE VERSION BIN
    local package="$1" version="$2" bin="$workdir/npm/node_modules/.bin/$3"
    if ! command -v npm >/dev/null; then
        log "npm not found: $package not installed (its tests skip)"
    elif "$bin" --version 2>/dev/null | grep -q -- "$version"; then
        log "$package $version is in $workdir/npm"
    else
        log "installing $package $version into $workdir/npm"
        npm install -q --no-audit --no-fund --prefix "$workdir/npm" "$package@$version" >&2
    fi
}
install_npm @anthropic-ai/claude-code 2.1.328 claude
install_npm @openai/codex 0.169.0 codex
echo "$workdir"
