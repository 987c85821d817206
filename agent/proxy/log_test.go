package proxy

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLogKeysOnce: the proxier logs with the logger it is given, which
// names the component already, and adds no key of its own twice.
func TestLogKeysOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil)).With("component", "proxy")
	p := New(Config{NodeName: "n", Logger: log}, nil)
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	p.tell("ns/web", svc, []fieldProblem{{reason: reasonUnsupportedField, field: "spec.x", msg: "ignored"}})
	line := strings.TrimSpace(buf.String())
	if line == "" {
		t.Fatal("nothing logged")
	}
	seen := map[string]bool{}
	for _, kv := range strings.Fields(line) {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || strings.HasPrefix(k, `"`) {
			continue // a word of a quoted value
		}
		if seen[k] {
			t.Errorf("key %s twice in %q", k, line)
		}
		seen[k] = true
	}
	if !seen["component"] {
		t.Errorf("no component in %q", line)
	}
}
