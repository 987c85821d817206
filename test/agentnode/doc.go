// Package agentnode runs cairn-agent, the binary built from ./agent, on the
// host as a node of a test/kube cluster, its pods on a test/runtime
// containerd: the whole process, with its management API, its metrics, its
// kubelet server and its Service proxier, as init starts it on a node but
// for the paths its flags point elsewhere. The benchmarks (test/bench) and
// the conformance runner (test/conformance) use it.
//
//	a := agentnode.Start(t, c, rt, agentnode.Options{Name: "node-1", Bin: agentnode.Build(t)})
//
// New prepares the process without starting it, for a caller that runs it
// under its own harness.
package agentnode
