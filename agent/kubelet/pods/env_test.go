package pods

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "alpha", "B": "beta", "EMPTY": "", "X$(A": "odd"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"":                 "",
		"plain":            "plain",
		"$(A)":             "alpha",
		"$(A)-$(B)":        "alpha-beta",
		"x$(A)y":           "xalphay",
		"$(EMPTY)|":        "|",
		"$(UNKNOWN)":       "$(UNKNOWN)",
		"$$(A)":            "$(A)",
		"$$$(A)":           "$alpha",
		"$$":               "$",
		"$$$$":             "$$",
		"$A":               "$A",
		"a$":               "a$",
		"$":                "$",
		"$(A":              "$(A",
		"$(A $$ $(B)":      "$(A $$ $(B)", // the first ( closes at B's ): one unknown name
		"$(A$$":            "$(A$",        // never closed: the rest is text, $$ still an escape
		"$()":              "$()",
		"$(X$(A))":         "odd)", // names end at the first )
		"100$ and $(B)$":   "100$ and beta$",
		"$(A)$(A)$$(A)$(A": "alphaalpha$(A)$(A",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// fakeRefs answers Refs from maps, for the env logic alone.
type fakeRefs struct {
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	node       *corev1.Node
	services   map[string][]*corev1.Service // by namespace
	gets       int
}

func (f *fakeRefs) Services(_ context.Context, ns string) ([]*corev1.Service, error) {
	return f.services[ns], nil
}

func (f *fakeRefs) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	f.gets++
	if cm, ok := f.configMaps[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f *fakeRefs) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	f.gets++
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (f *fakeRefs) Node(context.Context) (*corev1.Node, error) {
	f.gets++
	if f.node == nil {
		return nil, errors.New("no node")
	}
	return f.node, nil
}

func testRefs() *fakeRefs {
	return &fakeRefs{
		configMaps: map[string]*corev1.ConfigMap{
			"shop/settings": {ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{
				"mode": "fast", "level": "3", "dotted.name-1": "x", "1st": "y", "a=b": "z",
			}},
		},
		secrets: map[string]*corev1.Secret{
			"shop/creds": {ObjectMeta: metav1.ObjectMeta{Name: "creds"}, Data: map[string][]byte{"user": []byte("ann"), "pass": []byte("s3cret")}},
		},
		node: &corev1.Node{Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeHostName, Address: "n1"},
				{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
				{Type: corev1.NodeInternalIP, Address: "10.0.0.6"},
				{Type: corev1.NodeInternalIP, Address: "fd00::5"},
			},
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("1900m"), corev1.ResourceMemory: resource.MustParse("3Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
			},
		}},
	}
}

func testPod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "shop", UID: "u-1",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "blue"},
		},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa", Containers: containers},
	}
}

func field(path string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
}

func resourceField(container, res, divisor string) *corev1.EnvVarSource {
	s := &corev1.ResourceFieldSelector{ContainerName: container, Resource: res}
	if divisor != "" {
		s.Divisor = resource.MustParse(divisor)
	}
	return &corev1.EnvVarSource{ResourceFieldRef: s}
}

// envOf builds c's env in pod and returns it as NAME=value lines.
func envOf(t *testing.T, refs Refs, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	t.Helper()
	got, _, err := envAndWarnings(refs, pod, c)
	return got, err
}

// envAndWarnings is envOf with the warnings told, as reason: message.
func envAndWarnings(refs Refs, pod *corev1.Pod, c *corev1.Container) (env, warnings []string, err error) {
	b := &envBuilder{refs: refs, pod: pod, podIPs: []string{"10.88.0.7"},
		warn: func(reason, msg string) { warnings = append(warnings, reason+": "+msg) }}
	kvs, err := b.env(context.Background(), c)
	var out []string
	for _, kv := range kvs {
		out = append(out, kv.Key+"="+string(kv.Value))
	}
	return out, warnings, err
}

func TestEnvFieldRefs(t *testing.T) {
	c := corev1.Container{Name: "app", Env: []corev1.EnvVar{
		{Name: "NAME", ValueFrom: field("metadata.name")},
		{Name: "NS", ValueFrom: field("metadata.namespace")},
		{Name: "UID", ValueFrom: field("metadata.uid")},
		{Name: "APP", ValueFrom: field("metadata.labels['app']")},
		{Name: "NOLABEL", ValueFrom: field("metadata.labels['none']")},
		{Name: "TEAM", ValueFrom: field("metadata.annotations['team']")},
		{Name: "NODE", ValueFrom: field("spec.nodeName")},
		{Name: "SA", ValueFrom: field("spec.serviceAccountName")},
		{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
		{Name: "HOST_IPS", ValueFrom: field("status.hostIPs")},
		{Name: "POD_IP", ValueFrom: field("status.podIP")},
		{Name: "POD_IPS", ValueFrom: field("status.podIPs")},
	}}
	got, err := envOf(t, testRefs(), testPod(c), &c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"NAME=web", "NS=shop", "UID=u-1", "APP=web", "NOLABEL=", "TEAM=blue", "NODE=n1", "SA=sa",
		"HOST_IP=10.0.0.5", "HOST_IPS=10.0.0.5,fd00::5", "POD_IP=10.88.0.7", "POD_IPS=10.88.0.7"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}

	// On the host network the pod's IPs are the host's.
	pod := testPod(c)
	pod.Spec.HostNetwork = true
	b := &envBuilder{refs: testRefs(), pod: pod}
	kvs, err := b.env(context.Background(), &c)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if kv.Key == "POD_IPS" && string(kv.Value) != "10.0.0.5,fd00::5" {
			t.Errorf("POD_IPS on the host network = %q, want the host's 10.0.0.5,fd00::5", kv.Value)
		}
	}

	bad := corev1.Container{Name: "app", Env: []corev1.EnvVar{{Name: "X", ValueFrom: field("spec.hostname")}}}
	if _, err := envOf(t, testRefs(), testPod(bad), &bad); err == nil {
		t.Error("fieldRef spec.hostname resolved, want an error: it is not a field env may read")
	}
}

func TestEnvResourceFieldRefs(t *testing.T) {
	q := resource.MustParse
	app := corev1.Container{Name: "app", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: q("250m"), corev1.ResourceMemory: q("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: q("1500m"), corev1.ResourceMemory: q("100M")},
	}}
	bare := corev1.Container{Name: "bare"}
	app.Env = []corev1.EnvVar{
		{Name: "CPU_LIMIT", ValueFrom: resourceField("", "limits.cpu", "")},          // 1.5 → 2
		{Name: "CPU_LIMIT_M", ValueFrom: resourceField("", "limits.cpu", "1m")},      // 1500
		{Name: "CPU_REQUEST_M", ValueFrom: resourceField("", "requests.cpu", "1m")},  // 250
		{Name: "CPU_REQUEST", ValueFrom: resourceField("", "requests.cpu", "")},      // 0.25 → 1
		{Name: "MEM_LIMIT", ValueFrom: resourceField("", "limits.memory", "")},       // 100000000
		{Name: "MEM_LIMIT_MI", ValueFrom: resourceField("", "limits.memory", "1Mi")}, // 95.4 → 96
		{Name: "MEM_REQUEST_MI", ValueFrom: resourceField("app", "requests.memory", "1Mi")},
		{Name: "BARE_CPU_LIMIT_M", ValueFrom: resourceField("bare", "limits.cpu", "1m")},                // allocatable 1900m
		{Name: "BARE_MEM_LIMIT_GI", ValueFrom: resourceField("bare", "limits.memory", "1Gi")},           // allocatable 3Gi
		{Name: "BARE_DISK_LIMIT_G", ValueFrom: resourceField("bare", "limits.ephemeral-storage", "1G")}, // 20Gi → 21.47 → 22
		{Name: "BARE_MEM_REQUEST", ValueFrom: resourceField("bare", "requests.memory", "")},             // none: 0
	}
	pod := testPod(app, bare)
	got, err := envOf(t, testRefs(), pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"CPU_LIMIT=2", "CPU_LIMIT_M=1500", "CPU_REQUEST_M=250", "CPU_REQUEST=1", "MEM_LIMIT=100000000",
		"MEM_LIMIT_MI=96", "MEM_REQUEST_MI=64", "BARE_CPU_LIMIT_M=1900", "BARE_MEM_LIMIT_GI=3", "BARE_DISK_LIMIT_G=22", "BARE_MEM_REQUEST=0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}

	other := corev1.Container{Name: "app", Env: []corev1.EnvVar{{Name: "X", ValueFrom: resourceField("ghost", "limits.cpu", "")}}}
	if _, err := envOf(t, testRefs(), testPod(other), &other); err == nil {
		t.Error("resourceFieldRef of a container the pod lacks resolved, want an error")
	}
}

func TestEnvFromAndRefs(t *testing.T) {
	yes := true
	cm := func(name string) *corev1.ConfigMapEnvSource {
		return &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}
	}
	cmKey := func(name, key string, optional bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: &optional,
		}}
	}
	secretKey := func(name, key string, optional bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: &optional,
		}}
	}
	optionalCM := cm("absent")
	optionalCM.Optional = &yes
	for _, tc := range []struct {
		name     string
		c        corev1.Container
		want     []string
		wantWarn []string
		wantErr  string
	}{
		{
			name: "envFrom with prefixes; names with = skipped; env after it replaces in place",
			c: corev1.Container{
				EnvFrom: []corev1.EnvFromSource{
					{ConfigMapRef: cm("settings"), Prefix: "CFG_"},
					{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
					{ConfigMapRef: optionalCM},
				},
				Env: []corev1.EnvVar{
					{Name: "user", Value: "bob"},
					{Name: "URL", Value: "http://$(user):$(pass)@db/$(CFG_mode)?$(nope)"},
				},
			},
			// Sorted keys per source; names starting with a digit or
			// holding - and . are valid, a = is not.
			want:     []string{"CFG_1st=y", "CFG_dotted.name-1=x", "CFG_level=3", "CFG_mode=fast", "pass=s3cret", "user=bob", "URL=http://bob:s3cret@db/fast?$(nope)"},
			wantWarn: []string{"InvalidEnvironmentVariableNames: Keys [CFG_a=b] from the envFrom configMap shop/settings were skipped: they are not valid environment variable names."},
		},
		{
			name: "keys from a ConfigMap and a Secret; optional ones that are missing are left out",
			c: corev1.Container{Env: []corev1.EnvVar{
				{Name: "MODE", ValueFrom: cmKey("settings", "mode", false)},
				{Name: "PASS", ValueFrom: secretKey("creds", "pass", false)},
				{Name: "NOKEY", ValueFrom: cmKey("settings", "none", true)},
				{Name: "NOCM", ValueFrom: cmKey("absent", "x", true)},
				{Name: "NOSECRET", ValueFrom: secretKey("absent", "x", true)},
				{Name: "REF", Value: "$(MODE)/$(NOKEY)"},
			}},
			want: []string{"MODE=fast", "PASS=s3cret", "REF=fast/$(NOKEY)"},
		},
		{
			name:    "missing ConfigMap",
			c:       corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: cmKey("absent", "k", false)}}},
			wantErr: `configmap "absent" not found`,
		},
		{
			name:    "missing ConfigMap key",
			c:       corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: cmKey("settings", "k", false)}}},
			wantErr: "couldn't find key k in ConfigMap shop/settings",
		},
		{
			name:    "missing Secret key",
			c:       corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: secretKey("creds", "token", false)}}},
			wantErr: "couldn't find key token in Secret shop/creds",
		},
		{
			name:    "missing envFrom Secret",
			c:       corev1.Container{EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}}},
			wantErr: `secret "absent" not found`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Name = "app"
			got, warnings, err := envAndWarnings(testRefs(), testPod(tc.c), &tc.c)
			if diff := cmp.Diff(tc.wantWarn, warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("env = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnvReadsEachObjectOnce(t *testing.T) {
	key := func(k string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: k,
		}}
	}
	c := corev1.Container{Name: "app", Env: []corev1.EnvVar{
		{Name: "A", ValueFrom: key("mode")}, {Name: "B", ValueFrom: key("level")},
		{Name: "C", ValueFrom: field("status.hostIP")}, {Name: "D", ValueFrom: resourceField("", "limits.cpu", "")},
	}}
	refs := testRefs()
	if _, err := envOf(t, refs, testPod(c), &c); err != nil {
		t.Fatal(err)
	}
	if refs.gets != 2 {
		t.Errorf("%d reads through Refs, want 2 (the ConfigMap and the Node once each)", refs.gets)
	}
}

func TestEnvWithoutRefs(t *testing.T) {
	c := corev1.Container{Name: "app", Env: []corev1.EnvVar{{Name: "A", Value: "a"}, {Name: "B", Value: "$(A)b"}, {Name: "N", ValueFrom: field("metadata.name")}}}
	got, err := envOf(t, nil, testPod(c), &c)
	if err != nil {
		t.Fatalf("env without Refs of values and pod fields: %v", err)
	}
	if diff := cmp.Diff([]string{"A=a", "B=ab", "N=web"}, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "user"}}})
	if _, err := envOf(t, nil, testPod(c), &c); err == nil {
		t.Error("a secretKeyRef resolved without Refs, want an error")
	}
}

func TestCommandExpansion(t *testing.T) {
	env := []*criv1.KeyValue{{Key: "GREETING", Value: []byte("hi")}, {Key: "WHO", Value: []byte("you")}}
	c := &corev1.Container{Name: "c", Command: []string{"/bin/echo", "$(GREETING)"}, Args: []string{"$(WHO)", "$$(WHO)", "$(NOPE)"}}
	got := containerConfig(testPod(*c), c, containerParams{image: "img", env: env})
	if diff := cmp.Diff([]string{"/bin/echo", "hi"}, got.Command); diff != "" {
		t.Errorf("command (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"you", "$(WHO)", "$(NOPE)"}, got.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
}

func TestHostIPs(t *testing.T) {
	node := testRefs().node
	if diff := cmp.Diff([]string{"10.0.0.5", "fd00::5"}, HostIPs(node)); diff != "" {
		t.Errorf("HostIPs (-want +got):\n%s", diff)
	}
	if got := HostIPs(&corev1.Node{}); got != nil {
		t.Errorf("HostIPs of a node without addresses = %v, want none", got)
	}
}
