# The README's commands. `make demo` and `make test` run as root; each
# installs the Debian packages it needs first (test/deps.sh).

export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
# The C compiler for the LD_PRELOAD shim and cgo (its Go core): clang,
# which make deps installs, or the system's cc.
export CC := $(shell command -v clang 2>/dev/null || echo cc)
SHIM_CFLAGS ?= -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden
# pipefail: a test run's status survives its summary (test/testlog).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

# The commit the benchmark's JSON records ("+dirty" with uncommitted
# changes; empty outside a git checkout).
COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
ifneq ($(COMMIT),)
COMMIT := $(COMMIT)$(shell git diff --quiet HEAD -- 2>/dev/null || echo +dirty)
endif

.PHONY: all build generate docs test bench demo deps clean install-shim uninstall-shim

all: build

deps:
	@test/deps.sh

build:
	$(GO) build -o bin/onloadd ./cmd/onloadd
	$(GO) build -buildmode=c-shared -o bin/libonload-core.so ./shim/core
	rm -f bin/libonload-core.h
	$(CC) $(SHIM_CFLAGS) -o bin/libonload.so shim/*.c -ldl -lpthread
	$(CC) -O2 -Wall -o bin/shim-mixed shim/test/mixed.c -lpthread
	$(CC) -O2 -Wall -o bin/mcping test/bench/mcping/mcping.c -lpthread
	$(CC) -O2 -Wall -o bin/threadsrv test/bench/threadsrv/threadsrv.c -lpthread
	$(GO) build -ldflags "-X main.commit=$(COMMIT)" -o bin/onload-bench ./test/bench
	$(GO) build -o bin/onload-demo ./test/demo

# The shim for programs the dynamic loader runs in its secure mode (a
# set-user-ID program, or one exec'd with its users apart: squid's
# workers): set-user-ID root in a system library directory, where that
# mode takes a preloaded library from (ld.so(8)), and its core beside it.
# onloadd run then preloads it by name. Any user can then preload it into
# any set-user-ID program, as Onload's setuid install allows: there it
# reads no file name from the environment (ONLOAD_CORE, ONLOAD_LOG_FILE)
# and takes stacks only from root's onloadd (README, "Set-user-ID
# programs"). Run as root, after make build.
SHIM_LIBDIR ?= /usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
install-shim:
	test -f bin/libonload.so -a -f bin/libonload-core.so || { echo "make build first" >&2; exit 1; }
	install -o root -g root -m 0755 bin/libonload-core.so $(SHIM_LIBDIR)/libonload-core.so
	install -o root -g root -m 4755 bin/libonload.so $(SHIM_LIBDIR)/libonload.so

uninstall-shim:
	rm -f $(SHIM_LIBDIR)/libonload.so $(SHIM_LIBDIR)/libonload-core.so

# Rebuild the XDP program and its Go bindings with clang (bpf2go). The
# result is committed; on a clean tree this changes nothing.
generate: deps
	cd bpf && $(GO) generate ./...

# docs/config.md, from the option table in sockets/config.go.
docs:
	$(GO) run ./cmd/onloadd config -markdown > docs/config.md

# Everything under the race detector with the big transfers and the
# stress tests cut short, then those at full size without it, one package
# at a time (the wake-up stress tests time every connection to 50ms, and
# another package's tests on the same two CPUs would stall them): 64 MiB
# each way through the engine, 256 MiB each way through net/http and curl,
# a minute of each no-lost-wake-up stress test (12 connections; a
# ping-pong), 256 MiB each way against the kernel through each fault of
# the fault injector,
# the attacks at full size (100,000 spoofed SYNs, a minute of zero window),
# a minute of a hostile writer of a stack image that onloadd polls, the
# takeover of stopped and busy processes, the shim's programs (curl with
# 64 MiB each way, redis-benchmark with 100,000 requests a run), the
# frame-pool pressure test and the handovers to the kernel (256 MiB each
# way, handed over mid-transfer, clean and with 1% loss). Then short runs of the three fuzzers:
# hostile frames, a hostile writer of the shared image, and hostile
# messages to onloadd. Their budgets are counts of inputs, not times: Go
# 1.26's fuzzing coordinator can fail a time-budgeted run with "context
# deadline exceeded" when its workers are starved at the deadline, with
# no failing input (go.dev/issue/75804, fixed in Go 1.27); a count has no
# deadline to race.
#
# test/testlog prints each run as go test would, then every test that was
# skipped and why. With ONLOAD_REQUIRE_ALL=1 (CI sets it) a test that needs
# root, a tool or a kernel feature fails instead of skipping.
test: deps build
	$(GO) vet ./...
	$(GO) build -o bin/testlog ./test/testlog
	$(GO) test -json -race -short -count=1 -timeout 20m ./... | bin/testlog
	$(GO) test -json -p 1 -count=1 -timeout 25m -run 'Bulk|StackTCP|Many|HTTP|NoLostWakeup|Faults|Attack|FramePressure|Hostile|TakeoverStopped|Shim|Handover' ./stack ./test | bin/testlog
	$(GO) test -run '^$$' -fuzz FuzzInput -fuzztime 150000x -timeout 5m ./stack
	$(GO) test -run '^$$' -fuzz FuzzCorruptImage -fuzztime 1000x -timeout 5m ./stack
	$(GO) test -run '^$$' -fuzz FuzzParseRequest -fuzztime 200000x -timeout 5m ./control

# Writes test/bench/results/bench.json and prints the table the README
# quotes.
bench: deps build
	bin/onload-bench

demo: deps build
	bin/onload-demo

clean:
	rm -rf bin
