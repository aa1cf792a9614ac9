#!/usr/bin/env bash
# Install system packages the project needs when they are missing: Debian's Chromium for the
# browser tests (Playwright's own browser download cannot work offline), etcd-server for the
# etcd strategy (the project runs its own members; the package's service on 2379 is disabled),
# zookeeper for the zookeeper strategy (the jar only: not zookeeperd, whose service takes 2181) and
# HAProxy in front of the burst's pods (the project runs its own; the package's service is disabled).
# Only as root on Debian; elsewhere, say what to install.
set -euo pipefail

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v etcd >/dev/null || need+=(etcd-server)
[ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null || need+=(zookeeper)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Under systemd the package starts etcd on 2379/2380: an idle extra process on a small machine.
    [ -d /run/systemd/system ] && systemctl disable --now etcd haproxy >/dev/null 2>&1 || true
else
    echo "missing: ${need[*]}: install it (Debian: sudo apt-get install ${need[*]})" >&2
    exit 1
fi
