# Builds onloadd and the benchmark in a Go image and ships them in a slim
# Debian image. The container runs the daemon (onloadd serve, the default
# command); it needs the host's network and privileges to attach XDP
# programs, and shares its control socket with the host's processes
# through /run/onload:
#   docker run -d --privileged --network host -v /run/onload:/run/onload onload -group 1000
#   docker run --rm --privileged --network host onload capture -iface eth0 -udp 7000
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/onloadd ./cmd/onloadd \
 && CGO_ENABLED=0 go build -trimpath -o /out/onload-bench ./test/bench

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 iputils-ping sockperf util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["onloadd"]
CMD ["serve"]
