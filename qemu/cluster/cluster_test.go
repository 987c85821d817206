package cluster

import (
	"strings"
	"testing"
)

// TestValidateName: a name makes a network namespace and a directory that
// destroy removes, so anything like a path is refused.
func TestValidateName(t *testing.T) {
	for _, name := range []string{"cairn", "a", "demo-2", strings.Repeat("x", 32)} {
		if err := ValidateName(name); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"", "../..", "a/b", "Demo", "-a", "a-", "a.b", strings.Repeat("x", 33)} {
		if err := ValidateName(name); err == nil || !strings.Contains(err.Error(), "cluster name") {
			t.Errorf("ValidateName(%q) = %v, want a refusal", name, err)
		}
	}
}
