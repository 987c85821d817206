// Package proxy is Cairn's Service dataplane: it watches Services and
// EndpointSlices and keeps one nftables table, inet "cairn", in step with
// them, doing the work kube-proxy would do on a node.
//
// It has three layers, each testable on its own:
//
//   - endpoints.go turns a Service and its EndpointSlices into servicePorts:
//     one per (Service port, IP family), with the endpoints chosen the way
//     kube-proxy chooses them (ready, then serving+terminating; Local
//     traffic policies).
//   - model.go turns servicePorts into the desired table: chains, rules and
//     sets, as plain data with an nft-like text form (see testdata/*.golden).
//   - plan.go diffs two tables into one transaction; nft_linux.go compiles
//     it to netlink messages with github.com/google/nftables and sends it as
//     one batch. No nft binary and no iptables are involved.
//
// The packet path does not grow with the number of Services: the
// prerouting and output hooks look the destination up in verdict maps keyed
// on address . protocol . port (and protocol . port for NodePorts), as
// kube-proxy's nftables mode does; only the matched Service's own chains run.
//
// Use it as:
//
//	p := proxy.New(cfg, client)
//	go p.Run(ctx)          // informers, rate-limited syncs, periodic full resync
//	...
//	p.Cleanup()            // delete the table
package proxy
