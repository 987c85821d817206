package crilog

import (
	"path/filepath"
	"testing"
)

func TestPodUID(t *testing.T) {
	for _, tc := range []struct {
		dir, uid string
		ok       bool
	}{
		{filepath.Base(PodDir("/var/log/pods", "default", "web-1", "3f2a")), "3f2a", true},
		{"default_web", "", false},
		{"a_b_c_d", "", false},
		{"_web_3f2a", "", false},
	} {
		uid, ok := PodUID(tc.dir)
		if uid != tc.uid || ok != tc.ok {
			t.Errorf("PodUID(%q) = %q, %v; want %q, %v", tc.dir, uid, ok, tc.uid, tc.ok)
		}
	}
}
