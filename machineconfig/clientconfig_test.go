package machineconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const clientDoc = `apiVersion: cairn.dev/v1alpha1
kind: ClientConfig
endpoints: ["127.0.0.1:50000", "node-1.example.com:50000", "[fd00::15]:50000"]
ca: $CA
cert: $CERT
key: $KEY
`

func TestParseClientConfig(t *testing.T) {
	f := testFixture(t)
	got, err := ParseClientConfig([]byte(doc(t, clientDoc)))
	if err != nil {
		t.Fatalf("ParseClientConfig() = %v", err)
	}
	want := &ClientConfig{
		APIVersion: APIVersion,
		Kind:       KindClientConfig,
		Endpoints:  []string{"127.0.0.1:50000", "node-1.example.com:50000", "[fd00::15]:50000"},
		CA:         f.ca,
		Cert:       f.cert,
		Key:        f.key,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseClientConfig() mismatch (-want +got):\n%s", diff)
	}
}

func TestParseClientConfigInvalid(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []FieldError
	}{
		{
			name: "wrong kind",
			doc:  strings.Replace(clientDoc, "kind: ClientConfig", "kind: MachineConfig", 1),
			want: []FieldError{{"kind", `"MachineConfig" is not supported; use ClientConfig`}},
		},
		{
			name: "bad endpoints",
			doc:  strings.Replace(clientDoc, `"node-1.example.com:50000"`, `"node-1", ":50000", "node-1:0", "node-1:http"`, 1),
			want: []FieldError{
				{"endpoints[1]", `"node-1" is not host:port, e.g. 10.0.2.15:50000`},
				{"endpoints[2]", `":50000" is not host:port, e.g. 10.0.2.15:50000`},
				{"endpoints[3]", `"node-1:0" is not host:port, e.g. 10.0.2.15:50000`},
				{"endpoints[4]", `"node-1:http" is not host:port, e.g. 10.0.2.15:50000`},
			},
		},
		{
			name: "nothing but type",
			doc:  "apiVersion: cairn.dev/v1alpha1\nkind: ClientConfig\n",
			want: []FieldError{
				{"endpoints", "required"},
				{"ca", "required"},
				{"cert", "required"},
				{"key", "required"},
			},
		},
		{
			name: "bad PEMs",
			doc:  strings.NewReplacer("ca: $CA", "ca: junk", "cert: $CERT", "cert: junk").Replace(clientDoc),
			want: []FieldError{
				{"ca", "not a PEM certificate"},
				{"cert", "not a PEM certificate"},
			},
		},
		{
			name: "key not matching",
			doc:  strings.Replace(clientDoc, "$KEY", "$OTHERKEY", 1),
			want: []FieldError{{"key", "does not match cert"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseClientConfig([]byte(doc(t, tt.doc)))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("ParseClientConfig() = %v, want a *ValidationError", err)
			}
			if diff := cmp.Diff(tt.want, verr.Errors); diff != "" {
				t.Errorf("ParseClientConfig() errors mismatch (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(err.Error(), "invalid client config:\n") {
				t.Errorf("ParseClientConfig() = %q, want it to start with %q", err, "invalid client config:")
			}
		})
	}
}

func TestParseClientConfigUnknownField(t *testing.T) {
	_, err := ParseClientConfig([]byte(doc(t, clientDoc+"context: prod\n")))
	if want := `unknown field "context"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ParseClientConfig() = %v, want an error containing %q", err, want)
	}
}

func TestClientConfigWriteLoad(t *testing.T) {
	want, err := ParseClientConfig([]byte(doc(t, clientDoc)))
	if err != nil {
		t.Fatalf("ParseClientConfig() = %v", err)
	}
	path := filepath.Join(t.TempDir(), "cairnconfig")
	// An existing, world-readable file must end up private.
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := want.Write(path); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("Write() mode = %v, want %v", got, os.FileMode(0o600))
	}
	got, err := LoadClientConfig(path)
	if err != nil {
		t.Fatalf("LoadClientConfig() = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LoadClientConfig(Write()) mismatch (-want +got):\n%s", diff)
	}
}
