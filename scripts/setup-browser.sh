#!/usr/bin/env bash
# Installs the browser the inspector's tests drive: Debian's chromium (playwright-core never
# downloads one). Needs root for apt-get; otherwise prints the command to run.
set -euo pipefail
if [[ -x /usr/bin/chromium ]]; then
  echo "chromium is installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "chromium is missing; install it as root:  sudo apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q chromium
/usr/bin/chromium --version
