#!/usr/bin/env bash
# Installs Debian's package chromium for the browser checks of `make test`
# (headless Chromium loads the debug page and the churn report). Best
# effort and idempotent: it never fails the build. Without Chromium the
# browser checks are skipped with a message saying so.
#
# Measured on the CI machine kind (2 cores, Debian 12): apt-get update 3 s,
# install 24 s, 124 MB downloaded (25 packages, --no-install-recommends).
#
# Set SHARDHOST_NO_BROWSER=1 to skip, SHARDHOST_CHROMIUM=/path to use
# another Chromium or Chrome.
set -u

if [ -n "${SHARDHOST_CHROMIUM:-}" ]; then
	echo "browser checks: $SHARDHOST_CHROMIUM (SHARDHOST_CHROMIUM)"
	exit 0
fi
for b in chromium chromium-browser google-chrome google-chrome-stable; do
	if command -v "$b" >/dev/null 2>&1; then
		echo "browser checks: $("$b" --version 2>/dev/null | head -1)"
		exit 0
	fi
done
if [ "${SHARDHOST_NO_BROWSER:-}" = 1 ]; then
	echo "browser checks: skipped (SHARDHOST_NO_BROWSER=1)"
	exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo="sudo -n"
	else
		echo "browser checks: no Chromium, and apt-get needs root: they will be skipped (install Debian's package chromium to run them)"
		exit 0
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "browser checks: no Chromium and no apt-get: they will be skipped (install Chromium, or set SHARDHOST_CHROMIUM)"
	exit 0
fi
log=$(mktemp)
echo "browser checks: installing Debian's chromium (about 30 s, 124 MB) ..."
start=$SECONDS
if $sudo timeout 300 apt-get update -qq >"$log" 2>&1 &&
	DEBIAN_FRONTEND=noninteractive $sudo timeout 600 apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1 &&
	command -v chromium >/dev/null 2>&1; then
	echo "browser checks: $(chromium --version 2>/dev/null | head -1), installed in $((SECONDS - start)) s"
else
	echo "browser checks: could not install chromium (they will be skipped); apt-get said:"
	tail -5 "$log" | sed 's/^/  /'
fi
rm -f "$log"
exit 0
