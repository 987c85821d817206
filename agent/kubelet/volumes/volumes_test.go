package volumes

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// TestMain shares one real control plane among the tests that need it.
func TestMain(m *testing.M) { os.Exit(kube.Main(m, kube.Options{})) }

// clock is a test's clock: the real time moved on by what the test says.
type clock struct{ ahead atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.ahead.Load())) }
func (c *clock) advance(d time.Duration) { c.ahead.Add(int64(d)) }

// nodeEnv is a node of a real control plane, by name, with its client and
// a volume manager that uses it.
type nodeEnv struct {
	c     *kube.Cluster
	ns    string
	node  string
	clock *clock
	m     *Manager
}

func newNodeEnv(t *testing.T) *nodeEnv {
	c := kube.Shared(t)
	e := &nodeEnv{c: c, ns: c.Namespace(), node: "volumes-1", clock: &clock{}}
	client, err := kubernetes.NewForConfig(c.UserConfig("system:node:"+e.node, "system:nodes"))
	if err != nil {
		t.Fatal(err)
	}
	e.m = &Manager{Root: t.TempDir(), Client: client, Now: e.clock.now}
	// Every namespace gets its CA ConfigMap from kube-controller-manager.
	poll.Until(t, 30*time.Second, "kube-root-ca.crt published", func() error {
		_, err := c.Client.CoreV1().ConfigMaps(e.ns).Get(context.Background(), "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
	return e
}

// createPod creates pod bound to the node, retrying while the namespace's
// default ServiceAccount is not yet made.
func (e *nodeEnv) createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Namespace = e.ns
	pod.Spec.NodeName = e.node
	if len(pod.Spec.Containers) == 0 {
		pod.Spec.Containers = []corev1.Container{{Name: "c", Image: "example.invalid/never-run"}}
	}
	var got *corev1.Pod
	poll.Until(t, 30*time.Second, "create Pod "+pod.Name, func() (err error) {
		got, err = e.c.Client.CoreV1().Pods(e.ns).Create(context.Background(), pod, metav1.CreateOptions{})
		return err
	})
	return got
}

// setup calls Setup until the Node authorizer knows of pod: it learns of
// pods through a watch of its own, so for a moment after a pod is made
// its node may be refused what the pod refers to.
func (e *nodeEnv) setup(pod *corev1.Pod) (map[string]string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		paths, err := e.m.Setup(context.Background(), pod)
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return paths, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode().Perm()
}

// review checks token with a TokenReview as the admin: it must be the
// pod's service account's, bound to the pod, for audience (the API
// server's if empty).
func (e *nodeEnv) review(t *testing.T, token, audience string, pod *corev1.Pod) {
	t.Helper()
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if audience != "" {
		tr.Spec.Audiences = []string{audience}
	}
	got, err := e.c.Client.AuthenticationV1().TokenReviews().Create(context.Background(), tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status
	wantUser := "system:serviceaccount:" + e.ns + ":default"
	if !st.Authenticated || st.User.Username != wantUser {
		t.Fatalf("TokenReview = authenticated %v as %q (%s), want %s", st.Authenticated, st.User.Username, st.Error, wantUser)
	}
	if name := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(name) != 1 || name[0] != pod.Name {
		t.Errorf("token bound to pod %v, want %s", name, pod.Name)
	}
	if uid := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(uid) != 1 || uid[0] != string(pod.UID) {
		t.Errorf("token bound to pod UID %v, want %s", uid, pod.UID)
	}
}

// apiAccess is the kube-api-access volume the API server added to pod.
func apiAccess(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			return v.Name
		}
	}
	t.Fatalf("pod %s has no kube-api-access volume: %+v", pod.Name, pod.Spec.Volumes)
	return ""
}

func TestSetupRefreshTearDown(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	admin := e.c.Client.CoreV1()
	if _, err := admin.ConfigMaps(e.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data:       map[string]string{"a": "1", "b": "2"},
		BinaryData: map[string][]byte{"bin": {0, 1}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data:       map[string][]byte{"user": []byte("u"), "pass": []byte("p")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m0600, m0640, m0400 := int32(0o600), int32(0o640), int32(0o400)
	optional, exp := true, int64(600)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vols", Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"note": `say "hi"`}},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, DefaultMode: &m0640,
				Items: []corev1.KeyToPath{{Key: "a", Path: "dir/a.txt", Mode: &m0600}, {Key: "bin", Path: "bin"}},
			}}},
			{Name: "cm-all", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, DefaultMode: &m0640,
			}}},
			{Name: "absent-ok", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: &optional,
			}}},
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds", DefaultMode: &m0400}}},
			{Name: "meta", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
				{Path: "app", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}},
				{Path: "uid", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}},
			}}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "mixed", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: &exp, Path: "vault-token"}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"},
					Items: []corev1.KeyToPath{{Key: "b", Path: "b"}}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"},
					Items: []corev1.KeyToPath{{Key: "user", Path: "user"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
				}}},
			}}}},
		}},
	})
	access := apiAccess(t, pod)

	paths, err := e.setup(pod)
	if err != nil {
		t.Fatalf("Setup = %v", err)
	}
	if len(paths) != len(pod.Spec.Volumes) {
		t.Errorf("Setup returned %d paths, want one per volume (%d): %v", len(paths), len(pod.Spec.Volumes), paths)
	}
	api := paths[access]
	if want := filepath.Join(e.m.Root, string(pod.UID), "volumes", "kubernetes.io~projected", access); api != want {
		t.Errorf("kube-api-access at %s, want %s", api, want)
	}
	if got := read(t, filepath.Join(api, "namespace")); got != e.ns {
		t.Errorf("namespace = %q, want %q", got, e.ns)
	}
	if got := read(t, filepath.Join(api, "ca.crt")); got != string(e.c.CAPEM) {
		t.Errorf("ca.crt = %q, want the cluster CA", got)
	}
	token := read(t, filepath.Join(api, "token"))
	e.review(t, token, "", pod)
	if m := mode(t, filepath.Join(api, "token")); m != 0o644 {
		t.Errorf("token mode %v, want 0644 (the volume's defaultMode)", m)
	}
	vault := read(t, filepath.Join(paths["mixed"], "vault-token"))
	e.review(t, vault, "vault", pod)

	for _, f := range []struct {
		path, content string
		mode          fs.FileMode
	}{
		{"cm/dir/a.txt", "1", 0o600},
		{"cm/bin", "\x00\x01", 0o640},
		{"cm-all/a", "1", 0o640},
		{"cm-all/b", "2", 0o640},
		{"secret/user", "u", 0o400},
		{"secret/pass", "p", 0o400},
		{"meta/labels", `app="x"`, 0o644},
		{"meta/annotations", `note="say \"hi\""`, 0o644},
		{"meta/app", "x", 0o644},
		{"meta/uid", string(pod.UID), 0o644},
		{"mixed/b", "2", 0o644},
		{"mixed/user", "u", 0o644},
		{"mixed/name", "vols", 0o644},
	} {
		vol, rest, _ := strings.Cut(f.path, "/")
		p := filepath.Join(paths[vol], rest)
		if got := read(t, p); got != f.content {
			t.Errorf("%s = %q, want %q", f.path, got, f.content)
		}
		if got := mode(t, p); got != f.mode {
			t.Errorf("mode of %s = %v, want %v", f.path, got, f.mode)
		}
	}
	if entries, _ := os.ReadDir(paths["absent-ok"]); len(entries) != 2 {
		t.Errorf("optional absent ConfigMap's volume holds %d entries, want only ..data and its directory", len(entries))
	}
	if info, err := os.Stat(paths["scratch"]); err != nil || !info.IsDir() || info.Mode().Perm() != 0o777 {
		t.Errorf("emptyDir = %v (%v), want a directory of mode 0777", info, err)
	}

	// Within Resync nothing is read again; after it, a changed
	// ConfigMap shows while the tokens, not yet due, stay.
	cm, err := admin.ConfigMaps(e.ns).Get(ctx, "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["b"] = "3"
	if _, err := admin.ConfigMaps(e.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refresh := func(after time.Duration) {
		t.Helper()
		e.clock.advance(after)
		if err := e.m.Refresh(ctx, pod); err != nil {
			t.Fatalf("Refresh = %v", err)
		}
	}
	refresh(30 * time.Second)
	if got := read(t, filepath.Join(paths["cm-all"], "b")); got != "2" {
		t.Errorf("b = %q within Resync, want still 2", got)
	}
	refresh(time.Minute)
	if got := read(t, filepath.Join(paths["cm-all"], "b")); got != "3" {
		t.Errorf("b = %q after Resync, want 3", got)
	}
	if got := read(t, filepath.Join(paths["mixed"], "b")); got != "3" {
		t.Errorf("projected b = %q after Resync, want 3", got)
	}
	if read(t, filepath.Join(api, "token")) != token || read(t, filepath.Join(paths["mixed"], "vault-token")) != vault {
		t.Error("tokens renewed 1.5 min after issue, want them kept")
	}

	// The 10-minute token is renewed at 8 min, the API server's one a
	// day after issue (or at 80 % of its life, if shorter).
	refresh(7 * time.Minute)
	newVault := read(t, filepath.Join(paths["mixed"], "vault-token"))
	if newVault == vault {
		t.Error("10-minute token not renewed 8.5 min after issue")
	}
	e.review(t, newVault, "vault", pod)
	if read(t, filepath.Join(api, "token")) != token {
		t.Error("kube-api-access token renewed 8.5 min after issue, want it kept")
	}
	refresh(24 * time.Hour)
	newToken := read(t, filepath.Join(api, "token"))
	if newToken == token {
		t.Error("kube-api-access token not renewed a day after issue")
	}
	e.review(t, newToken, "", pod)

	// After an agent restart, a new manager writes the pod's volumes
	// anew on its first Refresh.
	again := &Manager{Root: e.m.Root, Client: e.m.Client, Now: e.clock.now}
	if err := again.Refresh(ctx, pod); err != nil {
		t.Fatalf("Refresh by a new manager = %v", err)
	}
	e.review(t, read(t, filepath.Join(api, "token")), "", pod)

	if err := e.m.TearDown(pod.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.m.Root, string(pod.UID))); !os.IsNotExist(err) {
		t.Errorf("pod directory after TearDown: %v, want it gone", err)
	}
}

func TestSetupErrors(t *testing.T) {
	e := newNodeEnv(t)
	for _, tc := range []struct {
		name   string
		volume corev1.Volume
		want   string
	}{
		{"unsupported type", corev1.Volume{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/"}}},
			`MountVolume.SetUp failed for volume "nfs" : type nfs not supported yet`},
		{"hostPath of another type", corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: "/etc/hostname", Type: ptr.To(corev1.HostPathDirectory)}}},
			`MountVolume.SetUp failed for volume "host" : hostPath type check failed: /etc/hostname is not a directory, it's a File`},
		{"missing ConfigMap", corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}}}},
			`MountVolume.SetUp failed for volume "cfg" : configmap "missing": configmaps "missing" not found`},
		{"missing key", corev1.Volume{Name: "ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "nokey", Path: "x"}}}}},
			`MountVolume.SetUp failed for volume "ca" : configmap "kube-root-ca.crt" has no key "nokey"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := e.createPod(t, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(strings.ReplaceAll(tc.name, " ", "-"))},
				Spec:       corev1.PodSpec{Volumes: []corev1.Volume{tc.volume}},
			})
			t.Cleanup(func() { e.m.TearDown(pod.UID) })
			// The other volumes are still made: the token works. Setup
			// is tried again while the Node authorizer does not know
			// the pod or its ConfigMaps yet (a Forbidden in place of the
			// volume's own error).
			token := filepath.Join(e.m.Root, string(pod.UID), "volumes", "kubernetes.io~projected", apiAccess(t, pod), "token")
			var err error
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				_, err = e.m.Setup(context.Background(), pod)
				_, statErr := os.Stat(token)
				if (statErr == nil && !apierrors.IsForbidden(err)) || time.Now().After(deadline) {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Setup = %v, want an error with %q", err, tc.want)
			}
			if _, err := os.Stat(token); err != nil {
				t.Errorf("kube-api-access beside the failing volume: %v", err)
			}
		})
	}
}

// TestNodeOnly: a node gets no token for a pod bound to another node.
func TestNodeOnly(t *testing.T) {
	e := newNodeEnv(t)
	other := &nodeEnv{c: e.c, ns: e.ns, node: "volumes-2"}
	client, err := kubernetes.NewForConfig(e.c.UserConfig("system:node:"+other.node, "system:nodes"))
	if err != nil {
		t.Fatal(err)
	}
	other.m = &Manager{Root: t.TempDir(), Client: client}
	pod := other.createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}})
	// Once its own node may, this one may not.
	if _, err := other.setup(pod); err != nil {
		t.Fatalf("Setup by the pod's node = %v", err)
	}
	_, err = e.m.Setup(context.Background(), pod)
	if !apierrors.IsForbidden(err) {
		t.Errorf("Setup of another node's pod = %v, want forbidden", err)
	}
}
