//go:build conformance

package conformance

import (
	"fmt"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/repo"
)

// Focus and Skip are what make conformance runs: the [sig-node] specs of
// [NodeConformance] and of [Conformance], but those that need a cluster
// to themselves, take long, break the cluster, are known to flake or test
// a feature ([Feature:…], or a feature gate's [FeatureGate:…]).
const (
	Focus = `\[sig-node\].*\[NodeConformance\]|\[sig-node\].*\[Conformance\]`
	Skip  = `\[Serial\]|\[Slow\]|\[Disruptive\]|\[Flaky\]|\[Feature:|\[FeatureGate:`
)

// HostExclusions are the specs of Focus that the host, not the node, cannot
// run, by what they match in the spec's name, each with why: the agent
// runs on the host's kernel here, where a Cairn node runs its own
// (Debian's, with its modules). They are added to Skip, and the run says
// each.
var HostExclusions = map[string]string{
	`PrivilegedPod should enable privileged commands`: "it adds a dummy link (ip link add dummy1 type dummy): the host's kernel has no dummy driver and loads no modules; a Cairn node's kernel loads it",
}

// TestConformance runs the suite of Focus and Skip against a Cairn node,
// with its report in _out/conformance/report, and prints the counts;
// each failed spec fails it.
func TestConformance(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	focus := FocusFromEnv(Focus)
	skip := Skip
	for spec, why := range HostExclusions {
		skip += "|" + regexp.QuoteMeta(spec)
		fmt.Printf("conformance: excluded on this host: %s: %s\n", spec, why)
	}
	res := Run(t, Suite{
		Focus: focus, Skip: skip,
		Procs:     12,
		Timeout:   80 * time.Minute,
		ReportDir: filepath.Join(root, "_out", "conformance", "report"),
	})
	if len(res.Passed)+len(res.Failed)+len(res.Skipped) == 0 {
		t.Errorf("no spec matched the focus %q", focus)
	}
	for _, name := range res.Skipped {
		t.Logf("skipped: %s", name)
	}
	for _, name := range res.Failed {
		t.Errorf("failed: %s", name)
	}
	fmt.Println(res.Summary())
}
