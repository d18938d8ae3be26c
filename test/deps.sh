#!/bin/sh
# Installs the build and test tools `make test`, `make demo`, `make bench`
# and `make generate` need and this machine lacks, from Debian's apt, and
# says what it installs. Go itself is not a Debian package new enough: it
# must already be installed (https://go.dev/dl, Go 1.26 or later).
set -eu

missing=""
need() { # need <command> <debian package>
	command -v "$1" >/dev/null 2>&1 || case " $missing " in
		*" $2 "*) ;;
		*) missing="$missing $2" ;;
	esac
}
need clang clang
need llvm-strip llvm
need bpftool bpftool
need ip iproute2
need ss iproute2
need ping iputils-ping
need sockperf sockperf
need taskset util-linux
need curl curl
need ethtool ethtool
need redis-server redis-server
need redis-benchmark redis-tools
need redis-cli redis-tools
need memcached memcached
need memcslap libmemcached-tools
need iperf3 iperf3
need nginx nginx
need wrk wrk
# A header, not a command: TestShimIOURing's program links liburing.
[ -e /usr/include/liburing.h ] || case " $missing " in *" liburing-dev "*) ;; *) missing="$missing liburing-dev" ;; esac

if ! command -v go >/dev/null 2>&1; then
	echo "deps: Go is not installed (or not on PATH): install Go 1.26 or later from https://go.dev/dl" >&2
	exit 1
fi

[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: missing packages:$missing" >&2
	echo "deps: install them (as root: apt-get install -y$missing) and run again" >&2
	exit 1
fi
echo "deps: installing with apt-get:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
