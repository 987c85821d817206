// Package conformance runs the upstream Kubernetes conformance suite,
// e2e.test at the control plane's version, against a Cairn node: the
// control plane of test/kube, a real containerd (test/runtime) and
// cairn-agent on the host (test/agentnode), with the suite's images built
// here and pushed to a loopback registry (test/registry) that the suite is
// pointed at with KUBE_TEST_REPO_LIST. ginkgo runs the specs in parallel
// processes; the result is a JUnit report and one line:
//
//	conformance: 40 passed, 3 failed, 1 skipped in 12m
//
// hack/build-conformance.sh builds e2e.test, ginkgo and agnhost (make
// conformance-suite; kubectl is make cluster's). TestSelection, in make test, runs a few specs;
// TestConformance (build tag conformance, make conformance) runs every
// [sig-node] spec of [NodeConformance] and [Conformance] that a single node
// can run. docs/conformance.md lists what fails and why.
package conformance
