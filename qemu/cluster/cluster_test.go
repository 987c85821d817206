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

// TestNodeURL: an API server on the host's loopback is reached by the
// nodes at QEMU's host address, any other where it is; what is not an
// https URL is refused.
func TestNodeURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://127.0.0.1:6443":      "https://10.0.2.2:6443",
		"https://localhost":           "https://10.0.2.2:443",
		"https://[::1]:8443":          "https://10.0.2.2:8443",
		"https://192.0.2.7:6443":      "https://192.0.2.7:6443",
		"https://api.example.com:443": "https://api.example.com:443",
	} {
		if got, err := nodeURL(in); err != nil || got != want {
			t.Errorf("nodeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"http://127.0.0.1:8080", "127.0.0.1:6443", ""} {
		if got, err := nodeURL(in); err == nil {
			t.Errorf("nodeURL(%q) = %q, want an error", in, got)
		}
	}
}
