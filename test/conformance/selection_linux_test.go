package conformance

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// selection is the few specs that make test runs, one per capability the
// node needs most: logs, exec and port-forward through the API server,
// env vars, the downward API, a probe.
var selection = []string{
	"[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs [Conformance] [NodeConformance]",
	"[sig-node] Pods should support remote command execution over websockets [Conformance] [NodeConformance]",
	"[sig-cli] Kubectl Port forwarding With a server listening on localhost should support forwarding over websockets",
	"[sig-node] Variable Expansion should allow composing env vars into new env vars [Conformance] [NodeConformance]",
	"[sig-node] Downward API should provide pod name, namespace and IP address as env vars [Conformance] [NodeConformance]",
	"[sig-node] Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe [Conformance] [NodeConformance]",
}

// TestSelection runs the specs of selection against a Cairn node, each in a
// process of its own: every one must pass.
func TestSelection(t *testing.T) {
	names := make([]string, len(selection))
	for i, s := range selection {
		names[i] = regexp.QuoteMeta(s)
	}
	res := Run(t, Suite{
		// ginkgo matches the focus against more than the spec's name: no ^.
		Focus:   "(" + strings.Join(names, "|") + ")$",
		Procs:   len(selection),
		Timeout: 10 * time.Minute,
	})
	t.Log(res.Summary())
	for _, name := range res.Failed {
		t.Errorf("failed: %s", name)
	}
	for _, name := range res.Skipped {
		t.Errorf("skipped: %s", name)
	}
	ran := slices.Concat(res.Passed, res.Failed, res.Skipped)
	for _, s := range selection {
		if !slices.ContainsFunc(ran, func(name string) bool { return name == s }) {
			t.Errorf("did not run: %s (renamed upstream?)", s)
		}
	}
}
