#!/usr/bin/env bash
# Install what multilang-bridge needs on a fresh Debian/Ubuntu machine:
# Ruby (Debian's `ruby` package) for the Ruby components, then this package
# with its dev and spark extras. Node 20, Python 3.11+ and Java 17 are
# expected to be present already.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if ! command -v ruby >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq ruby >/dev/null
fi
command -v node >/dev/null 2>&1 || { echo "setup: node (20+) is required and was not found" >&2; exit 1; }
python3 -m pip install -q --disable-pip-version-check -e ".[dev,spark]"
# An editable install leaves our modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# nothing compiles them later: every process that imports multilang (each host worker, each
# Python component) would compile them from source again. Compile them once here.
python3 -m compileall -q "$PWD/multilang" "$PWD/shellbolt" "$PWD/adapters" "$PWD/examples/python" >/dev/null
echo "setup: ok ($(python3 --version), ruby $(ruby -e 'print RUBY_VERSION'), node $(node --version))"
