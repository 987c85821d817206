package staticpod

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/machineconfig"
)

// configWith is a valid machine config of node-1 with the static pods of
// the YAML list pods, encoded.
func configWith(t *testing.T, pods string) []byte {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	var list []any
	if err := yaml.Unmarshal([]byte(pods), &list); err != nil {
		t.Fatalf("static pods %q: %v", pods, err)
	}
	for _, p := range list {
		j, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if j, err = yaml.YAMLToJSON(j); err != nil {
			t.Fatal(err)
		}
		b.Config.Machine.StaticPods = append(b.Config.Machine.StaticPods, j)
	}
	data, err := b.Config.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParse(t *testing.T) {
	c, err := Parse(configWith(t, `
- apiVersion: v1
  kind: Pod
  metadata: {name: web}
  spec:
    hostNetwork: true
    containers: [{name: web, image: registry.example/web:1.0}]
    volumes: [{name: scratch, emptyDir: {}}]
`))
	if err != nil {
		t.Fatalf("Parse() = %v, want a valid config", err)
	}
	pod, err := Decode(c.Machine.StaticPods[0])
	if err != nil {
		t.Fatalf("Decode() = %v", err)
	}
	SetDefaults(pod)
	if pod.Namespace != corev1.NamespaceDefault || pod.Spec.Containers[0].Image != "registry.example/web:1.0" || !pod.Spec.HostNetwork {
		t.Errorf("Decode() = %+v, want web in namespace default on the host network", pod)
	}
	if got := Name(pod, c.Machine.Hostname); got != "web-node-1" {
		t.Errorf("Name() = %q, want web-node-1", got)
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name string
		pods string
		want []machineconfig.FieldError
	}{
		{
			name: "type meta, name and containers missing",
			pods: `
- metadata: {namespace: kube-system}
  spec: {}
`,
			want: []machineconfig.FieldError{
				{Path: "machine.staticPods[0].apiVersion", Msg: "required; use v1"},
				{Path: "machine.staticPods[0].kind", Msg: "required; use Pod"},
				{Path: "machine.staticPods[0].metadata.name", Msg: "required"},
				{Path: "machine.staticPods[0].spec.containers", Msg: "required: at least one container"},
			},
		},
		{
			name: "wrong kind, another node, container without image, duplicates",
			pods: `
- apiVersion: v1
  kind: Pod
  metadata: {name: a}
  spec: {containers: [{name: c, image: x}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: a}
  spec:
    nodeName: node-2
    initContainers: [{name: c, image: x}]
    containers: [{name: c}, {image: x}]
`,
			want: []machineconfig.FieldError{
				{Path: "machine.staticPods[1].apiVersion", Msg: `"apps/v1" is not supported; use v1`},
				{Path: "machine.staticPods[1].kind", Msg: `"Deployment" is not supported; use Pod`},
				{Path: "machine.staticPods[1].metadata.name", Msg: `"a" is machine.staticPods[0]'s already`},
				{Path: "machine.staticPods[1].spec.nodeName", Msg: `"node-2" is not this node: leave it empty or set "node-1"`},
				{Path: "machine.staticPods[1].spec.containers[0].name", Msg: `"c" is another container's already`},
				{Path: "machine.staticPods[1].spec.containers[0].image", Msg: "required"},
				{Path: "machine.staticPods[1].spec.containers[1].name", Msg: "required"},
			},
		},
		{
			name: "what needs the API server",
			pods: `
- apiVersion: v1
  kind: Pod
  metadata: {name: app}
  spec:
    serviceAccountName: app
    imagePullSecrets: [{name: regcred}]
    containers:
      - name: app
        image: x
        env: [{name: A, valueFrom: {configMapKeyRef: {name: cm, key: a}}}, {name: B, value: b}]
        envFrom: [{secretRef: {name: s}}]
    volumes:
      - {name: cm, configMap: {name: cm}}
      - {name: s, secret: {secretName: s}}
      - {name: token, projected: {sources: [{serviceAccountToken: {path: token}}]}}
      - {name: data, persistentVolumeClaim: {claimName: data}}
      - {name: cm, emptyDir: {}}
`,
			want: []machineconfig.FieldError{
				{Path: "machine.staticPods[0].spec.serviceAccountName", Msg: "a static pod has no ServiceAccount: it runs without the API server; leave it empty"},
				{Path: "machine.staticPods[0].spec.imagePullSecrets[0]", Msg: "a static pod cannot read Secrets: it runs without the API server; configure the registry in containerd.registries instead"},
				{Path: "machine.staticPods[0].spec.containers[0].env[0].valueFrom", Msg: "a static pod cannot read ConfigMaps or Secrets: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.containers[0].envFrom[0]", Msg: "a static pod cannot read ConfigMaps or Secrets: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.volumes[0]", Msg: "a static pod cannot mount a configMap volume: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.volumes[1]", Msg: "a static pod cannot mount a secret volume: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.volumes[2]", Msg: "a static pod cannot mount a projected service account token: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.volumes[3]", Msg: "a static pod cannot mount a persistentVolumeClaim volume: it runs without the API server"},
				{Path: "machine.staticPods[0].spec.volumes[4].name", Msg: `"cm" is another volume's already`},
			},
		},
		{
			name: "unknown fields and wrong types, with their paths",
			pods: `
- apiVersion: v1
  kind: Pod
  metadata: {name: a}
  spec: {containers: [{name: c, imagee: x}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: b}
  spec: {containers: [{name: c, image: x, ports: [{containerPort: eighty}]}]}
`,
			want: []machineconfig.FieldError{
				{Path: "machine.staticPods[0]", Msg: `unknown field "spec.containers[0].imagee"`},
				{Path: "machine.staticPods[1].spec.containers.ports.containerPort", Msg: "a JSON string; want int32"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(configWith(t, tt.pods))
			var verr *machineconfig.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse() = %v, want a *machineconfig.ValidationError", err)
			}
			if diff := cmp.Diff(tt.want, verr.Errors); diff != "" {
				t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoad proves that Load reports the problems of both kinds, those of
// machineconfig before those of the pods, under the file's name.
func TestLoad(t *testing.T) {
	data := strings.Replace(string(configWith(t, `
- apiVersion: v1
  kind: Pod
  metadata: {name: a}
  spec: {containers: [{name: c}]}
`)), "hostname: node-1", "hostname: Node_1", 1)
	path := filepath.Join(t.TempDir(), "machine.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var verr *machineconfig.ValidationError
	if !errors.As(err, &verr) || !strings.HasPrefix(err.Error(), path+": invalid machine config:") {
		t.Fatalf("Load() = %v, want %s's *machineconfig.ValidationError", err, path)
	}
	var paths []string
	for _, fe := range verr.Errors {
		paths = append(paths, fe.Path)
	}
	want := []string{"machine.hostname", "machine.staticPods[0].metadata.name", "machine.staticPods[0].spec.containers[0].image"}
	if diff := cmp.Diff(want, paths); diff != "" {
		t.Errorf("Load() error paths mismatch (-want +got):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	pod, err := Decode([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: Web}\nspec: {containers: [{name: web, image: x}]}\n"))
	if err != nil {
		t.Fatalf("Decode() = %v", err)
	}
	SetDefaults(pod)
	err = Validate(pod, "node-1")
	var verr *machineconfig.ValidationError
	if !errors.As(err, &verr) || len(verr.Errors) != 1 || verr.Errors[0].Path != "metadata.name" {
		t.Fatalf("Validate(name Web) = %v, want one error on metadata.name", err)
	}
	pod.Name = "web"
	if err := Validate(pod, "node-1"); err != nil {
		t.Errorf("Validate(name web) = %v, want nil", err)
	}
	pod.Spec.Containers[0].Image = ""
	if err := Validate(pod, "node-1"); err == nil || !strings.Contains(err.Error(), "spec.containers[0].image: required") {
		t.Errorf("Validate(no image) = %v, want spec.containers[0].image: required", err)
	}
}

func TestDecodeUnknownField(t *testing.T) {
	_, err := Decode([]byte(`{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "x"}]}, "extra": 1}`))
	if err == nil || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Errorf("Decode(extra field) = %v, want unknown field \"extra\"", err)
	}
}
