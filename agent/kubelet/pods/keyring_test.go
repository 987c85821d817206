package pods

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func dockerConfigJSON(name, json string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(json)},
	}
}

func basic(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

// users names the credentials lookup found for image, in order.
func users(k keyring, image string) []string {
	var out []string
	for _, a := range k.lookup(image) {
		out = append(out, a.Username+":"+a.Password)
	}
	return out
}

func TestKeyringLookup(t *testing.T) {
	secrets := []*corev1.Secret{
		dockerConfigJSON("json", `{"auths": {
			"registry.example.com": {"username": "host", "password": "p1"},
			"registry.example.com/team": {"auth": "`+basic("team", "p2")+`"},
			"https://registry.example.com/team/app/": {"username": "app", "password": "p3"},
			"*.example.com": {"username": "glob", "password": "p4"},
			"127.0.0.1:5000": {"username": "local", "password": "p5"},
			"https://index.docker.io/v1/": {"username": "hub", "password": "p6"}
		}}`),
		{
			ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: "shop"},
			Type:       corev1.SecretTypeDockercfg,
			Data:       map[string][]byte{corev1.DockerConfigKey: []byte(`{"other.io": {"auth": "` + basic("old", "p7") + `"}}`)},
		},
		{ObjectMeta: metav1.ObjectMeta{Name: "opaque"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"x": []byte("{")}},
	}
	k, err := parseKeyring(secrets)
	if err != nil {
		t.Fatalf("parseKeyring: %v", err)
	}
	for _, tc := range []struct {
		image string
		want  []string
	}{
		{"registry.example.com/team/app:v1", []string{"app:p3", "team:p2", "host:p1", "glob:p4"}},
		{"registry.example.com/team/other", []string{"team:p2", "host:p1", "glob:p4"}},
		{"registry.example.com/teammate/x", []string{"host:p1", "glob:p4"}}, // a path prefix ends at a /
		{"registry.example.com/app", []string{"host:p1", "glob:p4"}},
		{"mirror.example.com/app", []string{"glob:p4"}},
		{"a.mirror.example.com/app", nil}, // * is one DNS label
		{"example.com/app", nil},
		{"registry.example.com:5000/app", nil}, // ports must match
		{"127.0.0.1:5000/cairn-test/hello:v1", []string{"local:p5"}},
		{"127.0.0.1:5001/cairn-test/hello:v1", nil},
		{"busybox", []string{"hub:p6"}}, // docker.io/library/busybox
		{"docker.io/someone/app@sha256:" + sha256ID, []string{"hub:p6"}},
		{"other.io/x", []string{"old:p7"}},
		{"Not A Reference", nil},
	} {
		if diff := cmp.Diff(tc.want, users(k, tc.image)); diff != "" {
			t.Errorf("lookup(%q) (-want +got):\n%s", tc.image, diff)
		}
	}
}

func TestKeyringBadSecrets(t *testing.T) {
	good := dockerConfigJSON("good", `{"auths": {"r.io": {"username": "u", "password": "p"}}}`)
	for _, bad := range []*corev1.Secret{
		dockerConfigJSON("notjson", `{"auths": `),
		dockerConfigJSON("badauth", `{"auths": {"r.io": {"auth": "!!!"}}}`),
		dockerConfigJSON("nocolon", `{"auths": {"r.io": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("justuser"))+`"}}}`),
	} {
		k, err := parseKeyring([]*corev1.Secret{bad, good})
		if err == nil || !strings.Contains(err.Error(), "pull secret shop/"+bad.Name) {
			t.Errorf("parseKeyring with secret %s: error %v, want one naming it", bad.Name, err)
		}
		if diff := cmp.Diff([]string{"u:p"}, users(k, "r.io/app")); diff != "" {
			t.Errorf("with the bad secret %s, the good one's credentials (-want +got):\n%s", bad.Name, diff)
		}
	}
}
