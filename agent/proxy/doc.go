// Package proxy is Cairn's Service dataplane: it watches Services and
// EndpointSlices and keeps one nftables table, inet "cairn", in step with
// them, doing on the node the work kube-proxy would do. It talks to the
// kernel over netlink (github.com/google/nftables); there is no nft binary
// and no iptables.
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
//   - build.go turns servicePorts into the desired table (model.go: chains,
//     rules, sets and verdict maps as plain data, printed in nft syntax; see
//     testdata/cluster.golden).
//   - plan.go diffs two tables into one transaction; nft_linux.go compiles
//     it to netlink messages and sends them as one batch, which the kernel
//     applies whole or not at all.
//   - proxier.go runs informers and the sync loop, and records a Warning
//     Event on a Service (reason UnsupportedServiceField, source
//     cairn-proxy) for each field the table does not honour:
//     loadBalancerSourceRanges, healthCheckNodePort, trafficDistribution
//     and their annotations; the rest of the Service is programmed.
//     A failed transaction changes nothing in the kernel; it is retried
//     as a full sync, with backoff from MinSyncInterval to 30s.
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
//	(and the same with 6)
//
// Base chains: nat-prerouting and nat-output (dstnat, -100) jump to
// services, which has two vmap lookups per family and nothing else, so the
// packet path does not grow with the number of Services; nat-postrouting
// (srcnat) jumps to masquerading, which masquerades packets marked by
// mark-for-masquerade. filter-prerouting and filter-output (-90, after
// DNAT) send new connections to endpoints-check, which looks up what was
// not DNATed in the no-endpoint maps: a Service with no endpoint rejects
// (TCP reset, ICMP port unreachable) instead of black-holing.
//
// Per Service port and family (names carry family, namespace, name,
// protocol and port name):
//
//	svc4-NS/NAME/PROTO/PORT    Cluster policy: masquerade unless from the cluster CIDR;
//	                           affinity lookups; numgen random over the endpoints
//	local4-NS/NAME/PROTO/PORT  Local policy: the same over this node's endpoints
//	ext4-NS/NAME/PROTO/PORT    NodePort/externalIP/LB traffic: masquerade and go to svc
//	                           (Cluster), or keep the source and go to local (Local),
//	                           with pods and the node itself sent to svc
//	ep4-NS/NAME/PROTO/PORT/IP:PORT   hairpin masquerade; affinity update; DNAT
//	aff4-…/IP:PORT (set)       ClientIP affinity: source addresses with a timeout
//
// A change to one Service or slice changes only that Service's chains and
// its elements of the shared maps, in one transaction. A full sync (at start
// and every ResyncPeriod) reads the kernel's chains, sets and elements,
// rewrites every chain and deletes whatever the model lacks.
package proxy
