#!/bin/sh
# Installs the browser the dashboard tests drive (tests/web/test_dashboard.py): Debian's chromium at
# /usr/bin/chromium. Playwright's own `playwright install` cannot download here. Idempotent: does nothing when
# chromium is already there. Needs root (or sudo) and the Debian package mirror.
set -eu
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version
