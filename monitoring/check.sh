#!/usr/bin/env bash
# Checks the monitoring mixin: the alerting rules (promtool check), their unit tests
# (promtool test) and the dashboard (valid JSON). Installs Debian's `prometheus` package,
# which ships promtool, when promtool is missing.
#
#   monitoring/check.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found; installing Debian's prometheus package" >&2
    as_root() {
        if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
    }
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends prometheus
fi

promtool check rules monitoring/alerts.yml
promtool test rules monitoring/alerts_test.yml
python3 -m json.tool monitoring/dashboard.json >/dev/null
echo "monitoring/dashboard.json: valid JSON"
