// Package proxy is Cairn's nftables dataplane. Its Proxier watches
// Services and EndpointSlices and keeps one nftables table, inet "cairn",
// in step with them, doing on the node the work kube-proxy would do; its
// PolicyEnforcer enforces NetworkPolicy for the node's pods in a table of
// its own, inet "cairn-policy", built by the same model, plan and
// programmer (policy.go, enforcer.go). It talks to the kernel over
// netlink (github.com/google/nftables); there is no nft binary and no
// iptables.
//
// Use it as:
//
//	p := proxy.New(cfg, client)   // cfg: node name, node IPs, cluster CIDRs
//	go p.Run(ctx, svcs, slices)   // shared informers; rate-limited syncs, periodic full resync
//	registry.MustRegister(p)      // Prometheus metrics; or p.Stats()
//	...
//	p.Cleanup()                   // after Run returned: delete the table
//
// # Layers
//
//   - endpoints.go turns a Service and its EndpointSlices into servicePorts,
//     one per (port, IP family), choosing endpoints as kube-proxy does:
//     ready ones, else serving+terminating ones; Local traffic policies use
//     this node's.
//   - build.go turns one Service's servicePorts into its fragment of the
//     table (its chains, and its elements of the shared sets and maps),
//     and builds the fixed part (model.go: chains, rules, sets and
//     verdict maps as plain data, printed in nft syntax; see
//     testdata/cluster.golden).
//   - state.go keeps the fragment of every Service as last written: a
//     change to a Service is the difference between its old and new
//     fragments, whatever the number of Services.
//   - plan.go diffs two tables into one transaction; nft_linux.go compiles
//     it to netlink messages and sends them as one batch, which the kernel
//     applies whole or not at all.
//   - proxier.go runs informers and the sync loop. Each informer event
//     marks its Service; a sync rebuilds the marked Services' fragments
//     and writes their differences. A lone change is written at once; a
//     burst once per MinSyncInterval and again 100ms after it ends, with
//     syncs spaced so that they take at most a fifth of a core. It records a Warning Event on a
//     Service (reason UnsupportedServiceField, source cairn-proxy) for each
//     field the table does not honour: loadBalancerSourceRanges,
//     healthCheckNodePort, trafficDistribution and their annotations; the
//     rest of the Service is programmed. An external IP and port or a
//     NodePort that two Services claim is the first one's; the other gets
//     a ServiceAddressConflict Event. A failed transaction changes nothing
//     in the kernel; it is retried as a full sync, with backoff from
//     MinSyncInterval to 30s.
//     conntrack.go removes stale UDP conntrack entries after endpoints go.
//
// # Table layout
//
// One table of family inet serves IPv4 and IPv6 (dual-stack Services) in
// one transaction; inet NAT needs Linux 5.2. Each family has its own maps:
//
//	service-ips4          ipv4_addr . inet_proto . inet_service : verdict   ClusterIP/externalIP/LB IP -> Service chain
//	service-nodeports4    inet_proto . inet_service : verdict               NodePort -> external chain
//	nodeport-ips4         ipv4_addr                                         the node's NodePort addresses
//	no-endpoint-services4 ipv4_addr . inet_proto . inet_service : verdict   goto reject (no endpoint) or drop (none local)
//	no-endpoint-nodeports4 inet_proto . inet_service : verdict
//	cluster-ips4          ipv4_addr                                         other ports on a ClusterIP are rejected
//	hairpin4              ipv4_addr . ipv4_addr                             E . E for every endpoint E
//	(and the same with 6)
//
// Base chains: nat-prerouting and nat-output (dstnat, -100) jump to
// services, which has two vmap lookups per family and nothing else, so the
// packet path does not grow with the number of Services; nat-postrouting
// (srcnat) jumps to masquerading, which masquerades hairpin packets (an
// endpoint sent to itself: source . destination in hairpin4) and packets
// marked for it. filter-prerouting and filter-output (-90, after DNAT)
// send new connections to endpoints-check, which looks up what was not
// DNATed in the no-endpoint maps: a Service with no endpoint rejects (TCP
// reset, ICMP port unreachable) instead of black-holing.
//
// Per Service port and family, chains named kind, family, a digest of
// their rules, and the service port (svc4-0123abcd-NS/NAME/PROTO/PORT):
//
//	svc4   Cluster policy: mark for masquerade unless from the cluster CIDR;
//	       affinity lookups; a random endpoint
//	local4 Local policy: the same over this node's endpoints
//	ext4   NodePort/externalIP/LB traffic: mark for masquerade and go to
//	       svc (Cluster), or keep the source and go to local (Local), with
//	       pods and the node itself sent to svc
//	ep4    session affinity only, per endpoint (…/IP:PORT): record the
//	       client in the endpoint's affinity set aff4-…/IP:PORT, DNAT
//
// A random endpoint of n is one rule per endpoint, the first taken once in
// n, the next once in n-1 of what is left, and so on (see addServicePort
// for why not a map). No chain has a set of its own but for affinity, so
// the kernel's cost of a transaction grows with what it changes, not with
// the table.
//
// A chain's name carries the digest of its rules, so a chain of that name
// has those rules: a changed chain is a new chain, the elements that
// pointed at the old one re-pointed, the old one deleted, all in the one
// transaction. A full sync (at start, every ResyncPeriod and after a
// failure) reads the kernel's chain names, sets and elements, and the
// rules of the fixed chains, whose comments are their digests; it writes
// only what differs (nothing, for a restart over an unchanged cluster) and
// deletes whatever the model lacks.
package proxy
