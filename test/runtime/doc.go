// Package runtime starts a real containerd for tests on the host: the
// static containerd, containerd-shim-runc-v2, runc and CNI plugins that
// `make components` builds into _out/bin, with the CRI configured as on a
// Cairn node (pinned local pause image, restrict_oom_score_adj, plain-HTTP
// loopback registries) and a bridge network of its own.
//
//	rt := runtime.Start(t)
//	rt.RuntimeClient.RunPodSandbox(ctx, ...)
//
// Root, state, socket, config and the CNI configuration live in the test's
// temporary directory. When the test ends every pod sandbox is stopped and
// removed, containerd and any shim of it are killed, leftover mounts are
// unmounted, and what containerd and the CNI plugins write outside that
// directory is removed: the bridge, the CNI result cache entries, and
// /run/containerd/{s,fifo} if they were made here and are empty.
//
// The binaries are looked up in $CAIRN_BIN (and $CAIRN_BIN/cni), or else in
// _out/bin of the repository. Without them the test is skipped with "run
// make build" or "run make components", unless CAIRN_NO_SKIP is set: then it
// fails (package test/need).
// It must run as root.
package runtime
