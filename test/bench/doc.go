// Package bench holds Cairn's host benchmarks, which print figures for
// `make bench`. They are built only with the bench tag, so that
// `go test ./...` skips them, and must run as root with the binaries of
// `make cluster components`.
//
// BenchmarkPodStartup (`make bench-pods`) starts one control plane
// (test/kube) and one containerd (test/runtime), and on them, one after
// another, starts 50 pods one at a time and then 50 at once with three
// contenders: the raw CRI calls (the floor), cairn-agent's kubelet part
// (cmd/podagent, a process of its own) and the upstream kubelet. It prints
// the pods' startup latencies and the processes' CPU time and memory.
package bench
