package conformance

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadReport reads a report in the shape ginkgo writes: a spec that
// the focus left out is "skipped" and does not count; one that skipped
// itself says why, and counts; the suite's setup counts only if it fails.
func TestReadReport(t *testing.T) {
	const report = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="2" errors="0" failures="2" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="2" skipped="0" errors="0" failures="2" time="10">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] a passes" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] b fails" classname="Kubernetes e2e suite" status="failed" time="1"><failure type="failed">boom</failure></testcase>
    <testcase name="[It] c times out" classname="Kubernetes e2e suite" status="timedout" time="1"><failure type="timedout">late</failure></testcase>
    <testcase name="[It] d filtered" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] e skips itself" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped - needs two nodes"></skipped></testcase>
  </testsuite>
</testsuites>`
	path := filepath.Join(t.TempDir(), "junit_01.xml")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	var got Result
	if err := readReport(path, &got); err != nil {
		t.Fatal(err)
	}
	want := Result{
		Passed:  []string{"a passes"},
		Failed:  []string{"b fails", "c times out"},
		Skipped: []string{"e skips itself"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readReport (-want +got):\n%s", diff)
	}
}
