package bpf

// The object is built for little-endian BPF only (amd64, arm64 and every
// other architecture this project runs on). "make generate" reruns this.
//go:generate go tool bpf2go -cc clang -strip llvm-strip -target bpfel -cflags "-O2 -Wall -Werror" -type listener_key -type flow_key -type stack_ctl -type wake_event steer steer.c
