#!/usr/bin/env bash
# promtool (Debian's prometheus package, without its recommends: no daemon is started) for
# the alerting rules' checks (tests/configs/test_monitoring.py). Does nothing when promtool
# is there; as root it installs it, otherwise it says how.
set -euo pipefail
if command -v promtool > /dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
  echo "promtool is missing: sudo apt-get install --no-install-recommends prometheus" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends prometheus > /dev/null \
  || { apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends prometheus > /dev/null; }
promtool --version | head -1
