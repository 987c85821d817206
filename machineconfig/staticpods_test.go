package machineconfig

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseStaticPods(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  staticPods:
    - apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        hostNetwork: true
        containers: [{name: web, image: registry.example/web:1.0}]
`)))
	if err != nil {
		t.Fatalf("Parse() = %v, want a valid config", err)
	}
	if len(c.Machine.StaticPods) != 1 {
		t.Fatalf("Parse() has %d static pods, want 1", len(c.Machine.StaticPods))
	}
	want := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"image":"registry.example/web:1.0","name":"web"}],"hostNetwork":true}}`
	if got := string(c.Machine.StaticPods[0]); got != want {
		t.Errorf("Parse() static pod = %s, want %s", got, want)
	}
	m, err := c.Machine.StaticPods[0].Meta()
	if err != nil || m != (StaticPodMeta{APIVersion: "v1", Kind: "Pod", Name: "web"}) {
		t.Errorf("Meta() = %+v, %v, want v1 Pod web", m, err)
	}
	// The manifest is marshalled back as it is, so init writes it whole.
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(out)
	if err != nil {
		t.Fatalf("Parse(Marshal()) = %v", err)
	}
	if diff := cmp.Diff(c, again); diff != "" {
		t.Errorf("Parse(Marshal()) mismatch (-want +got):\n%s", diff)
	}
}

// TestParseStaticPodsInvalid covers what machineconfig checks of a static
// pod without the Pod API; machineconfig/staticpod checks the rest.
func TestParseStaticPodsInvalid(t *testing.T) {
	tests := []struct {
		name string
		pods string
		want []FieldError
	}{
		{
			name: "type meta and name missing, namespace invalid",
			pods: `    - metadata: {namespace: Kube_System}
      spec: {}
`,
			want: []FieldError{
				{"machine.staticPods[0].apiVersion", "required; use v1"},
				{"machine.staticPods[0].kind", "required; use Pod"},
				{"machine.staticPods[0].metadata.name", "required"},
				{"machine.staticPods[0].metadata.namespace", `"Kube_System" is not a valid namespace: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit`},
			},
		},
		{
			name: "wrong kind, duplicate name, a name too long",
			pods: `    - apiVersion: v1
      kind: Pod
      metadata: {name: a}
      spec: {containers: [{name: c, image: x}]}
    - apiVersion: apps/v1
      kind: Deployment
      metadata: {name: a}
    - apiVersion: v1
      kind: Pod
      metadata: {name: ` + strings.Repeat("x", 250) + `}
`,
			want: []FieldError{
				{"machine.staticPods[1].apiVersion", `"apps/v1" is not supported; use v1`},
				{"machine.staticPods[1].kind", `"Deployment" is not supported; use Pod`},
				{"machine.staticPods[1].metadata.name", `"a" is machine.staticPods[0]'s already`},
				{"machine.staticPods[2].metadata.name", `"` + strings.Repeat("x", 250) + `", run as "` + strings.Repeat("x", 250) + `-node-1", is not a valid Pod name: use at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit`},
			},
		},
		{
			name: "not a manifest",
			pods: `    - [apiVersion, v1]
    - {apiVersion: v1, kind: Pod, metadata: {name: [a]}}
`,
			want: []FieldError{
				{"machine.staticPods[0]", "not a Pod manifest: want an object with apiVersion, kind, metadata and spec"},
				{"machine.staticPods[1].metadata.name", "a JSON array; want string"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(doc(t, header+machineSection+"  staticPods:\n"+tt.pods)))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse() = %v, want a *ValidationError", err)
			}
			if diff := cmp.Diff(tt.want, verr.Errors); diff != "" {
				t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStaticPodMetaValidate(t *testing.T) {
	m := StaticPodMeta{APIVersion: "v1", Kind: "Pod", Name: "Web"}
	if errs := m.Validate("node-1"); len(errs) != 1 || errs[0].Path != "metadata.name" {
		t.Fatalf("Validate(name Web) = %v, want one error on metadata.name", errs)
	}
	m.Name = "web"
	if errs := m.Validate("node-1"); errs != nil {
		t.Errorf("Validate(name web) = %v, want none", errs)
	}
	if got := StaticPodName("web", "node-1"); got != "web-node-1" {
		t.Errorf("StaticPodName(web, node-1) = %q, want web-node-1", got)
	}
}
