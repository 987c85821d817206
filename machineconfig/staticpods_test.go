package machineconfig

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func TestParseStaticPods(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  staticPods:
    - apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        hostNetwork: true
        containers: [{name: web, image: registry.example/web:1.0}]
        volumes: [{name: scratch, emptyDir: {}}]
`)))
	if err != nil {
		t.Fatalf("Parse() = %v, want a valid config", err)
	}
	if len(c.Machine.StaticPods) != 1 {
		t.Fatalf("Parse() has %d static pods, want 1", len(c.Machine.StaticPods))
	}
	pod := c.Machine.StaticPods[0]
	if pod.Namespace != corev1.NamespaceDefault || pod.Spec.Containers[0].Image != "registry.example/web:1.0" || !pod.Spec.HostNetwork {
		t.Errorf("Parse() static pod = %+v, want web in namespace default on the host network", pod)
	}
	if got := StaticPodName(&pod, c.Machine.Hostname); got != "web-node-1" {
		t.Errorf("StaticPodName() = %q, want web-node-1", got)
	}
}

func TestParseStaticPodsInvalid(t *testing.T) {
	tests := []struct {
		name string
		pods string
		want []FieldError
	}{
		{
			name: "type meta, name and containers missing",
			pods: `    - metadata: {namespace: Kube_System}
      spec: {}
`,
			want: []FieldError{
				{"machine.staticPods[0].apiVersion", "required; use v1"},
				{"machine.staticPods[0].kind", "required; use Pod"},
				{"machine.staticPods[0].metadata.name", "required"},
				{"machine.staticPods[0].metadata.namespace", `"Kube_System" is not a valid namespace: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`},
				{"machine.staticPods[0].spec.containers", "required: at least one container"},
			},
		},
		{
			name: "wrong kind, another node, container without image, duplicates",
			pods: `    - apiVersion: v1
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
			want: []FieldError{
				{"machine.staticPods[1].apiVersion", `"apps/v1" is not supported; use v1`},
				{"machine.staticPods[1].kind", `"Deployment" is not supported; use Pod`},
				{"machine.staticPods[1].spec.nodeName", `"node-2" is not this node: leave it empty or set "node-1"`},
				{"machine.staticPods[1].spec.containers[0].name", `"c" is another container's already`},
				{"machine.staticPods[1].spec.containers[0].image", "required"},
				{"machine.staticPods[1].spec.containers[1].name", "required"},
				{"machine.staticPods[1].metadata.name", `"a" is machine.staticPods[0]'s already`},
			},
		},
		{
			name: "what needs the API server",
			pods: `    - apiVersion: v1
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
			want: []FieldError{
				{"machine.staticPods[0].spec.serviceAccountName", "a static pod has no ServiceAccount: it runs without the API server; leave it empty"},
				{"machine.staticPods[0].spec.imagePullSecrets[0]", "a static pod cannot read Secrets: it runs without the API server; configure the registry in containerd.registries instead"},
				{"machine.staticPods[0].spec.containers[0].env[0].valueFrom", "a static pod cannot read ConfigMaps or Secrets: it runs without the API server"},
				{"machine.staticPods[0].spec.containers[0].envFrom[0]", "a static pod cannot read ConfigMaps or Secrets: it runs without the API server"},
				{"machine.staticPods[0].spec.volumes[0]", "a static pod cannot mount a configMap volume: it runs without the API server"},
				{"machine.staticPods[0].spec.volumes[1]", "a static pod cannot mount a secret volume: it runs without the API server"},
				{"machine.staticPods[0].spec.volumes[2]", "a static pod cannot mount a projected service account token: it runs without the API server"},
				{"machine.staticPods[0].spec.volumes[3]", "a static pod cannot mount a persistentVolumeClaim volume: it runs without the API server"},
				{"machine.staticPods[0].spec.volumes[4].name", `"cm" is another volume's already`},
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

func TestValidateStaticPodName(t *testing.T) {
	pod := &corev1.Pod{}
	pod.APIVersion, pod.Kind, pod.Name = "v1", "Pod", "Web"
	pod.Spec.Containers = []corev1.Container{{Name: "web", Image: "x"}}
	SetStaticPodDefaults(pod)
	err := ValidateStaticPod(pod, "node-1")
	var verr *ValidationError
	if !errors.As(err, &verr) || len(verr.Errors) != 1 || verr.Errors[0].Path != "metadata.name" {
		t.Fatalf("ValidateStaticPod(name Web) = %v, want one error on metadata.name", err)
	}
	pod.Name = "web"
	if err := ValidateStaticPod(pod, "node-1"); err != nil {
		t.Errorf("ValidateStaticPod(name web) = %v, want nil", err)
	}
}
