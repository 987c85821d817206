package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestSourceDateEpoch(t *testing.T) {
	tests := []struct {
		name, env string
		want      int64
		wantErr   string
	}{
		{name: "unset leaves the build's default", env: "", want: 0},
		{name: "seconds", env: "1700000000", want: 1700000000},
		{name: "not a number", env: "2026-01-01", wantErr: `SOURCE_DATE_EPOCH="2026-01-01": want seconds since 1970`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SOURCE_DATE_EPOCH", tt.env)
			got, err := sourceDateEpoch()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("sourceDateEpoch() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("sourceDateEpoch() = %d, %v, want %d", got, err, tt.want)
			}
		})
	}
}

// TestImageBuildBadEpoch wants `image build` to refuse a SOURCE_DATE_EPOCH
// it cannot read, naming it.
func TestImageBuildBadEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "soon")
	dir := t.TempDir()
	cmd := imageCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"build", "-c", filepath.Join(dir, "machine.yaml"), "-o", filepath.Join(dir, "out", "node.raw")})
	cmd.SilenceUsage = true
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), `SOURCE_DATE_EPOCH="soon"`) {
		t.Errorf("image build with SOURCE_DATE_EPOCH=soon: error = %v, want it named\n%s", err, out.String())
	}
}
