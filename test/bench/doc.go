// Package bench holds Cairn's host benchmarks, which print figures for
// `make bench`. They are built only with the bench tag, so that
// `go test ./...` skips them, and must run as root with the binaries of
// `make cluster components`.
//
// BenchmarkPodStartup (`make bench-pods`) starts one control plane
// (test/kube) and one containerd (test/runtime), and on them, one after
// another, starts 50 pods one at a time and then 50 at once with four
// contenders: the raw CRI calls (the floor); cairn-agent itself, the
// binary built from ./agent with its management API, metrics and Service
// proxier, from a machine config that machineconfig.Generate makes, with
// a stub of init's control socket in the benchmark's process (all of it
// test/agentnode, which test/conformance runs too); its kubelet
// part alone (cmd/podagent, a process of its own); and the upstream
// kubelet. It prints the pods' startup latencies,
// the processes' CPU time and memory, each with its PID and command line,
// and cairn-agent's and podagent's ratios to the floor and the kubelet.
//
// BenchmarkStreams (`make bench-streams`) prints the round trip of
// `kubectl exec` and the throughput of `kubectl port-forward` through the
// API server to cairn-agent's kubelet server and to the upstream
// kubelet, on one control plane and containerd, with the ratios.
//
// BenchmarkProxy (`make bench-proxy`) runs upstream kube-proxy in
// nftables mode and Cairn's proxier (cmd/proxyagent: proxy.Run alone on
// the agent's informers) side by side, each in a network namespace of its
// own that reaches the API server through a forwarder on loopback, twice
// each, at 1 000 and 10 000 Services of 5 endpoints. It reads "programmed"
// from the kernel (the ClusterIPs in each proxy's map of Services, or the
// nftables transaction that touches the changed Service) and prints: start
// with an empty table, restart over its own table with a Service deleted
// meanwhile, one endpoint added, 1 000 Services created live (the last
// one's time, and the CPU-seconds), and RSS, with the ratios.
//
// cairn-agent's proxier programs the table inet cairn in the host's
// network namespace: the benchmark refuses to start if the host has one,
// and deletes it after.
package bench
