package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestQemuClusterNameRefused: destroy removes the cluster's directory, so
// a name that reads as a path is refused before anything is touched.
func TestQemuClusterNameRefused(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	if err := os.WriteFile(keep, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir) // where _out/clusters/../.. points
	for _, verb := range []string{"destroy", "status"} {
		cmd := qemuClusterCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{verb, "--name", "../.."})
		cmd.SilenceUsage = true
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `cluster name "../.."`) {
			t.Errorf("qemu cluster %s --name ../.. = %v, want the name refused", verb, err)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("after the refusals: %v", err)
	}
}
