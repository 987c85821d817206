package kubelet

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/agent/csi"
	"github.com/cairn-os/cairn/agent/kubelet/stats"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/test/csitest"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
)

// The driver's name and topology key, for short.
const (
	csiDriverName  = csitest.Driver
	csiTopologyKey = csitest.TopologyKey
)

// csiEnv is a node running a CSI driver deployed as a DaemonSet (the test
// driver and registrar of test/images), with the upstream
// external-provisioner and external-attacher running against it.
type csiEnv struct {
	*podEnv
	dir     string // the kubelet directory
	dataDir string // the driver's volumes
	plugins *csi.Plugins
	clock   *testClock // of the node's volumes
}

// TestCSIVolumes proves the CSI node plugin on a node of a real control
// plane (with the scheduler, the attach/detach controller) running its
// pods on a real containerd: a CSI driver deployed as a DaemonSet
// registers through plugins_registry and is listed in the CSINode; a PVC
// provisioned by the upstream external-provisioner and attached by the
// upstream external-attacher is staged once and published for each pod;
// what one pod writes, the next reads; the volume is unpublished for a
// pod that goes and unstaged when the last one does; a claim that never
// binds keeps its pod waiting with the reason.
func TestCSIVolumes(t *testing.T) {
	need.Root(t, "mounts volumes")
	e := startCSIEnv(t, nil)

	t.Run("driver registered", e.testRegistered)
	t.Run("PVC provisioned, attached, staged, published", e.testPersistentVolume)
	t.Run("generic ephemeral volume", e.testGenericEphemeral)
	t.Run("inline CSI volume", e.testInline)
	t.Run("fsGroup owns a CSI volume", e.testFSGroup)
	t.Run("claim expanded on the node", e.testExpand)
	t.Run("block volume", e.testBlock)
	t.Run("driver that fails or hangs", e.testDriverFailures)
	t.Run("claim that never binds", e.testUnboundClaim)
}

// startCSIEnv starts the node of csiEnv, logging to log if not nil.
func startCSIEnv(t testing.TB, log *slog.Logger) *csiEnv {
	pe, cfg := newPodEnvWith(t, "csi-1", kube.Options{Scheduler: true})
	if log != nil {
		cfg.Log = log
	}
	e := &csiEnv{podEnv: pe, dir: cfg.Dir, dataDir: t.TempDir(), clock: &testClock{}}
	cfg.Pods.volumeClock = e.clock.now
	// A node's / is a shared mount, so that a driver's mounts made in its
	// container (Bidirectional) reach the node; this host's is not: the
	// kubelet directory is made a shared mount of its own.
	if err := unix.Mount("cairn-csi-test", e.dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(e.dir, unix.MNT_DETACH) })
	if err := unix.Mount("", e.dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	// Calls time out soon, for the hanging driver's test.
	plugins, err := csi.New(csi.Config{Dir: e.dir, NodeName: e.node, Log: cfg.Log, Metrics: e.metrics, CallTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg.CSI, e.plugins = plugins, plugins
	cfg.join.VolumesInUse = plugins.InUse
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		plugins.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	startWith(t, cfg, node.Component{Name: "csi", Run: func(ctx context.Context, m *node.Member) error {
		plugins.SyncCSINode(ctx, m.Client)
		return nil
	}})
	e.podEnv.testNodeReady(t)
	e.deployDriver(t)
	return e
}

// deployDriver deploys the driver and its registrar as a DaemonSet, as
// the upstream manifests deploy csi-driver-host-path (csitest), with a
// StorageClass, and runs the upstream external-provisioner and
// external-attacher on the host against the driver's socket.
func (e *csiEnv) deployDriver(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	driver, registrar, err := csitest.Images(ctx, e.reg, e.reg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	d := &csitest.Deployment{DriverImage: driver, RegistrarImage: registrar, KubeletDir: e.dir, DataDir: e.dataDir, AttachRequired: true}
	if err := d.Create(ctx, e.c.Client, "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "hostpath"}, Provisioner: csitest.Driver,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate), ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("CAIRN_CSI_BIN")
	if bin == "" {
		bin = "../../_out/csi/bin"
	}
	for _, name := range []string{"csi-provisioner", "csi-attacher"} {
		path, err := filepath.Abs(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		need.Built(t, path, "csi-sidecars", "CAIRN_CSI_BIN")
		e.runSidecar(t, path, "--csi-address="+d.Socket(), "--kubeconfig="+e.c.AdminKubeconfig, "--leader-election=false", "--v=3")
	}
}

// runSidecar runs an upstream CSI sidecar on the host until the test
// ends, its output in the test's log when it fails.
func (e *csiEnv) runSidecar(t testing.TB, path string, args ...string) {
	log, err := os.Create(filepath.Join(t.TempDir(), filepath.Base(path)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(log.Name()); err == nil {
				t.Logf("%s's output:\n%s", filepath.Base(path), lastLines(string(b), 60))
			}
		}
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// testRegistered waits for the driver to be in the CSINode with what its
// NodeGetInfo said, and its topology on the Node's labels.
func (e *csiEnv) testRegistered(t *testing.T) {
	poll.Until(t, 2*time.Minute, "the driver in the CSINode", func() error {
		n, err := e.c.Client.StorageV1().CSINodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(n.Spec.Drivers) != 1 {
			return fmt.Errorf("drivers %+v, want %s", n.Spec.Drivers, csiDriverName)
		}
		d := n.Spec.Drivers[0]
		if d.Name != csiDriverName || d.NodeID != e.node || !slices.Equal(d.TopologyKeys, []string{csiTopologyKey}) ||
			d.Allocatable == nil || d.Allocatable.Count == nil || *d.Allocatable.Count != 100 {
			return fmt.Errorf("driver %+v, want %s on node %s with topology key %s and 100 volumes", d, csiDriverName, e.node, csiTopologyKey)
		}
		if len(n.OwnerReferences) != 1 || n.OwnerReferences[0].Kind != "Node" || n.OwnerReferences[0].Name != e.node {
			return fmt.Errorf("owners %+v, want the Node", n.OwnerReferences)
		}
		return nil
	})
	n, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Labels[csiTopologyKey]; got != e.node {
		t.Errorf("Node label %s = %q, want %q", csiTopologyKey, got, e.node)
	}
	if got := n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"]; got != "true" {
		t.Errorf("Node annotation controller-managed-attach-detach = %q, want true", got)
	}
}

// testPersistentVolume has a pod write a file in a provisioned volume and
// another read it back, and follows the volume through the node: one
// VolumeAttachment, one staging mount for both pods, one publication per
// pod, and every mount gone once the last pod is.
func (e *csiEnv) testPersistentVolume(t *testing.T) {
	ctx := context.Background()
	cs := e.c.Client
	pvc := e.createClaim(t, "data", "hostpath", "1Mi", corev1.PersistentVolumeFilesystem)
	var pvName string
	poll.Until(t, 2*time.Minute, "the PVC bound by the external-provisioner", func() error {
		c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", c.Status.Phase)
		}
		pvName = c.Spec.VolumeName
		return nil
	})
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle
	volumeDir := filepath.Join(e.dataDir, handle)
	staging := filepath.Join(e.dir, "plugins", "kubernetes.io", "csi", csiDriverName)

	writer := e.claimPod(t, "writer", pvc.Name, []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/data/written"}, {Name: "TOUCH_AFTER", Value: "0"}})
	poll.Until(t, 30*time.Second, "the writer's file in the driver's volume", func() error {
		_, err := os.Stat(filepath.Join(volumeDir, "written"))
		return err
	})
	unique := corev1.UniqueVolumeName("kubernetes.io/csi/" + csiDriverName + "^" + handle)
	poll.Until(t, 30*time.Second, "the volume in use and attached in the Node's status", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !slices.Contains(n.Status.VolumesInUse, unique) {
			return fmt.Errorf("volumesInUse %v, want %s", n.Status.VolumesInUse, unique)
		}
		if !slices.ContainsFunc(n.Status.VolumesAttached, func(a corev1.AttachedVolume) bool { return a.Name == unique }) {
			return fmt.Errorf("volumesAttached %v, want %s", n.Status.VolumesAttached, unique)
		}
		return nil
	})
	if got := e.csiMounts(t, staging); len(got) != 1 {
		t.Errorf("staging mounts %v, want one", got)
	}

	reader := e.claimPod(t, "reader", pvc.Name, nil)
	if got := e.csiMounts(t, staging); len(got) != 1 {
		t.Errorf("staging mounts with two pods %v, want still one", got)
	}
	e.deletePod(t, writer)
	poll.Until(t, 30*time.Second, "the writer's publication gone", func() error {
		if got := e.csiMounts(t, filepath.Join(e.dir, "pods", string(writer.UID))); len(got) > 0 {
			return fmt.Errorf("mounts %v", got)
		}
		if _, err := os.Stat(filepath.Join(e.dir, "pods", string(writer.UID))); !os.IsNotExist(err) {
			return fmt.Errorf("the writer's directory is still there (%v)", err)
		}
		return nil
	})
	if got := e.csiMounts(t, staging); len(got) != 1 {
		t.Errorf("staging mounts while the reader runs %v, want one", got)
	}
	// The pod's stats (/stats/summary's) tell the volume's use, as the
	// driver tells it.
	sum, err := stats.New(stats.Config{NodeName: e.node, Runtime: e.rt.RuntimeClient, Images: e.rt.ImageClient, RootDir: e.dir,
		PodLogRoot: t.TempDir(), VolumeStats: e.plugins.VolumeStats}).Summary(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	var vs []statsv1alpha1.VolumeStats
	for _, ps := range sum.Pods {
		if ps.PodRef.UID == string(reader.UID) {
			vs = ps.VolumeStats
		}
	}
	if len(vs) != 1 || vs[0].Name != "data" || vs[0].PVCRef == nil || vs[0].PVCRef.Name != "data" ||
		vs[0].CapacityBytes == nil || *vs[0].CapacityBytes == 0 || vs[0].Inodes == nil {
		t.Errorf("the reader's volume stats %+v, want the claim data's bytes and inodes", vs)
	}
	if n := e.csiCalls(t, "NodeGetVolumeStats", "OK"); n < 1 {
		t.Errorf("csi_operations_seconds counts %v NodeGetVolumeStats calls that ended OK, want 1", n)
	}
	id := strings.TrimPrefix(reader.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if out, code := e.exec(t, id, "check", "/data/written"); code != 0 {
		t.Errorf("the reader does not see the writer's file: %s (exit %d)", out, code)
	}

	e.deletePod(t, reader)
	poll.Until(t, 30*time.Second, "the volume unpublished and unstaged", func() error {
		if got := e.csiMounts(t, e.dir); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		if ents, _ := os.ReadDir(staging); len(ents) > 0 {
			return fmt.Errorf("%s still holds %s", staging, ents[0].Name())
		}
		return nil
	})
	poll.Until(t, 30*time.Second, "the volume no longer in use in the Node's status", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Contains(n.Status.VolumesInUse, unique) {
			return fmt.Errorf("volumesInUse %v", n.Status.VolumesInUse)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(volumeDir, "written")); err != nil {
		t.Errorf("the volume's data after its pods went: %v", err)
	}
	for _, method := range []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"} {
		if n := e.csiCalls(t, method, "OK"); n < 1 {
			t.Errorf("csi_operations_seconds counts %v %s calls that ended OK, want at least 1", n, method)
		}
	}
}

// createClaim creates the claim name in default, of the StorageClass
// class, of size and volume mode.
func (e *csiEnv) createClaim(t testing.TB, name, class, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc, err := e.c.Client.CoreV1().PersistentVolumeClaims("default").Create(context.Background(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			VolumeMode:       ptr.To(mode),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc
}

// waitFailedMount waits for a FailedMount event about pod saying want.
func (e *csiEnv) waitFailedMount(t testing.TB, pod *corev1.Pod, want string) {
	t.Helper()
	poll.Until(t, 60*time.Second, "a FailedMount event: "+want, func() error {
		list, err := e.c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "reason": "FailedMount"}.String(),
		})
		if err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Message == want {
				return nil
			}
		}
		return fmt.Errorf("no event %q among %d", want, len(list.Items))
	})
}

// claimPod runs a pod of the probee image with the claim mounted at
// /data, and waits for it to run.
func (e *csiEnv) claimPod(t testing.TB, name, claim string, env []corev1.EnvVar) *corev1.Pod {
	return e.waitRunning(t, e.dataPod(t, name, corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}, env))
}

// dataPod creates a pod of the probee image with the volume of src
// mounted at /data, changed by edit if given.
func (e *csiEnv) dataPod(t testing.TB, name string, src corev1.VolumeSource, env []corev1.EnvVar, edit ...func(*corev1.Pod)) *corev1.Pod {
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, Env: env,
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: src}},
		},
	}
	for _, f := range edit {
		f(pod)
	}
	return e.createPod(t, pod)
}

// waitRunning waits for pod's container to run.
func (e *csiEnv) waitRunning(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return waitPod(t, e.c.Client, "default", pod.Name, 2*time.Minute, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].ContainerID != ""
	})
}

// writeEnv has probee create /data/written as it starts.
var writeEnv = []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/data/written"}, {Name: "TOUCH_AFTER", Value: "0"}}

// testGenericEphemeral runs a pod with a generic ephemeral volume: the
// claim the ephemeral volume controller makes for it is provisioned,
// mounted, written to, unmounted when the pod goes, and deleted with it.
func (e *csiEnv) testGenericEphemeral(t *testing.T) {
	pod := e.waitRunning(t, e.dataPod(t, "scratch", corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("hostpath"),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		}},
	}}, writeEnv))
	ctx := context.Background()
	claim, err := e.c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "scratch-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !metav1.IsControlledBy(claim, pod) {
		t.Errorf("claim %s owned by %+v, want the pod", claim.Name, claim.OwnerReferences)
	}
	pv, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the pod's file in its ephemeral claim's volume", func() error {
		_, err := os.Stat(filepath.Join(e.dataDir, pv.Spec.CSI.VolumeHandle, "written"))
		return err
	})
	e.deletePod(t, pod)
	poll.Until(t, 30*time.Second, "the volume unmounted and the claim deleted with the pod", func() error {
		if got := e.csiMounts(t, e.dir); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		if _, err := e.c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claim.Name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("claim %s still there", claim.Name)
		}
		return nil
	})
}

// testInline runs a pod with an inline CSI volume, published for the pod
// alone (neither attached nor staged) and removed with it.
func (e *csiEnv) testInline(t *testing.T) {
	pod := e.waitRunning(t, e.dataPod(t, "inline", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: csiDriverName}}, writeEnv))
	// The kubelet's handle of an inline volume.
	dir := filepath.Join(e.dataDir, "ephemeral", fmt.Sprintf("csi-%x", sha256.Sum256([]byte(string(pod.UID)+"data"))))
	poll.Until(t, 30*time.Second, "the pod's file in its inline volume", func() error {
		_, err := os.Stat(filepath.Join(dir, "written"))
		return err
	})
	if got := e.csiMounts(t, filepath.Join(e.dir, "plugins")); len(got) > 0 {
		t.Errorf("staging mounts of an inline volume: %v", got)
	}
	e.deletePod(t, pod)
	poll.Until(t, 30*time.Second, "the inline volume unpublished and removed", func() error {
		if got := e.csiMounts(t, e.dir); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("%s still there (%v)", dir, err)
		}
		return nil
	})
}

// testFSGroup runs a pod with an fsGroup and an inline volume of the
// driver, whose CSIDriver's fsGroupPolicy is File: the group owns the
// volume, with the setgid bit, and the file the pod writes is the group's.
func (e *csiEnv) testFSGroup(t *testing.T) {
	const gid = 2345
	pod := e.dataPod(t, "grouped", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: csiDriverName}}, writeEnv, func(p *corev1.Pod) {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To(int64(gid))}
	})
	pod = e.waitRunning(t, pod)
	dir := filepath.Join(e.dataDir, "ephemeral", fmt.Sprintf("csi-%x", sha256.Sum256([]byte(string(pod.UID)+"data"))))
	poll.Until(t, 30*time.Second, "the pod's file in its volume", func() error {
		_, err := os.Stat(filepath.Join(dir, "written"))
		return err
	})
	for _, path := range []string{dir, filepath.Join(dir, "written")} {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != gid {
			t.Errorf("%s: group %d, want the fsGroup %d", path, st.Gid, gid)
		}
		if path == dir && st.Mode&unix.S_ISGID == 0 {
			t.Errorf("%s: mode %o, want the setgid bit", path, st.Mode)
		}
	}
	e.deletePod(t, pod)
}

// testExpand grows a claim as the upstream external-resizer does (which
// the Go proxy here does not serve): the PersistentVolume's capacity is
// raised and the claim's storage left NodeResizePending. The node grows
// the volume of a running pod at its next refresh of the pod's volumes
// (online), and of a claim that no pod used when it grew as a pod mounts
// it (offline), each through NodeExpandVolume, and records the capacity
// in the claim's status.
func (e *csiEnv) testExpand(t *testing.T) {
	ctx := context.Background()
	cs := e.c.Client
	pvc := e.createClaim(t, "growing", "hostpath", "1Mi", corev1.PersistentVolumeFilesystem)
	pod := e.claimPod(t, "grower", pvc.Name, nil)
	var handle string
	grow := func(size string) {
		t.Helper()
		c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := resource.MustParse(size)
		c.Spec.Resources.Requests[corev1.ResourceStorage] = q
		if c, err = cs.CoreV1().PersistentVolumeClaims("default").Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		handle = pv.Spec.CSI.VolumeHandle
		pv.Spec.Capacity[corev1.ResourceStorage] = q
		if _, err := cs.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: q}
		c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
			corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending,
		}
		c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{
			Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
		}}
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expanded := func(size string) {
		t.Helper()
		want := resource.MustParse(size)
		poll.Until(t, time.Minute, "the claim expanded to "+size+" on the node", func() error {
			b, err := os.ReadFile(filepath.Join(e.dataDir, handle+".capacity"))
			if err != nil {
				return fmt.Errorf("NodeExpandVolume not called: %w", err)
			}
			if string(b) != fmt.Sprint(want.Value()) {
				return fmt.Errorf("NodeExpandVolume asked for %s bytes, want %d", b, want.Value())
			}
			c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := c.Status.Capacity[corev1.ResourceStorage]; got.Cmp(want) != 0 {
				return fmt.Errorf("claim capacity %s, want %s", got.String(), size)
			}
			if s, ok := c.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; ok {
				return fmt.Errorf("claim's storage still %s", s)
			}
			for _, cond := range c.Status.Conditions {
				switch cond.Type {
				case corev1.PersistentVolumeClaimResizing, corev1.PersistentVolumeClaimFileSystemResizePending, corev1.PersistentVolumeClaimNodeResizeError:
					return fmt.Errorf("claim condition %s still there", cond.Type)
				}
			}
			return nil
		})
	}
	grow("2Mi")
	// The pod's volumes are refreshed when their resync is due.
	e.clock.advance(2 * time.Minute)
	expanded("2Mi")

	e.deletePod(t, pod)
	grow("3Mi")
	pod = e.claimPod(t, "grower-again", pvc.Name, nil)
	expanded("3Mi")
	if n := e.csiCalls(t, "NodeExpandVolume", "OK"); n != 2 {
		t.Errorf("csi_operations_seconds counts %d NodeExpandVolume calls that ended OK, want 2", n)
	}
	e.deletePod(t, pod)
}

// testBlock runs a pod with a claim of volumeMode Block in its
// volumeDevices: the provisioned volume (the driver's file on a loop
// device) is staged and published as a device node, the pod's container
// writes at the start of it as /dev/xvda, the host reads that in the
// volume's file, and the device is unpublished, unstaged and detached
// when the pod goes. The same claim in volumeMounts is refused with the
// kubelet's message.
func (e *csiEnv) testBlock(t *testing.T) {
	ctx := context.Background()
	cs := e.c.Client
	pvc := e.createClaim(t, "raw", "hostpath", "2Mi", corev1.PersistentVolumeBlock)
	claim := corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}
	pod := e.dataPod(t, "raw", claim, nil, func(p *corev1.Pod) {
		c := &p.Spec.Containers[0]
		c.VolumeMounts, c.VolumeDevices = nil, []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	})
	pod = e.waitRunning(t, pod)
	c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(e.dataDir, pv.Spec.CSI.VolumeHandle+".img")
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	const text = "written through /dev/xvda"
	if out, code := e.exec(t, id, "write", "/dev/xvda", text); code != 0 {
		t.Fatalf("write to the block device in the container: %s (exit %d)", out, code)
	}
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(text))
	_, err = f.ReadAt(got, 0)
	f.Close()
	if err != nil || string(got) != text {
		t.Errorf("the volume's file starts with %q (%v), want %q", got, err, text)
	}
	device := filepath.Join(e.dir, "pods", string(pod.UID), "volumeDevices", csi.PluginDir, pv.Name, "device")
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Errorf("%s: mode %o (%v), want a block device", device, st.Mode, err)
	}
	e.deletePod(t, pod)
	poll.Until(t, 30*time.Second, "the block volume unpublished, unstaged and detached", func() error {
		if got := e.csiMounts(t, e.dir); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == image {
				return fmt.Errorf("%s still backs %s", image, filepath.Base(filepath.Dir(filepath.Dir(f))))
			}
		}
		return nil
	})

	// A block claim mounted as a file system is refused.
	mounted := e.dataPod(t, "raw-mounted", claim, nil)
	e.waitFailedMount(t, mounted, `MountVolume.SetUp failed for volume "data" : volume data has volumeMode Block, but is specified in volumeMounts`)
	e.deletePod(t, mounted)
}

// testDriverFailures runs a pod whose volume the driver fails to publish
// and one whose publication hangs, beside one whose volume is fine: the
// first two wait with FailedMount events (the driver's error, the call's
// timeout), retried, while the third runs.
func (e *csiEnv) testDriverFailures(t *testing.T) {
	inline := func(attrs map[string]string) corev1.VolumeSource {
		return corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: csiDriverName, VolumeAttributes: attrs}}
	}
	fails := e.dataPod(t, "fails", inline(map[string]string{"fail": "true"}), nil)
	hangs := e.dataPod(t, "hangs", inline(map[string]string{"hang": "true"}), nil)
	fine := e.waitRunning(t, e.dataPod(t, "fine", inline(nil), nil))
	want := map[string]string{
		fails.Name: `MountVolume.SetUp failed for volume "data" : NodePublishVolume: rpc error: code = Internal desc = told to fail`,
		hangs.Name: `MountVolume.SetUp failed for volume "data" : NodePublishVolume: rpc error: code = DeadlineExceeded desc = context deadline exceeded`,
	}
	for _, pod := range []*corev1.Pod{fails, hangs} {
		poll.Until(t, 90*time.Second, pod.Name+": FailedMount, retried", func() error {
			list, err := e.c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "reason": "FailedMount"}.String(),
			})
			if err != nil {
				return err
			}
			var got []string
			for _, ev := range list.Items {
				if ev.Message == want[pod.Name] && ev.Count >= 2 {
					return nil
				}
				got = append(got, fmt.Sprintf("%q ×%d", ev.Message, ev.Count))
			}
			return fmt.Errorf("no %q twice among %v", want[pod.Name], got)
		})
		p, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("%s: phase %s, want Pending", pod.Name, p.Status.Phase)
		}
	}
	for _, pod := range []*corev1.Pod{fails, hangs, fine} {
		e.deletePod(t, pod)
	}
	poll.Until(t, 30*time.Second, "no mounts left", func() error {
		if got := e.csiMounts(t, e.dir); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		return nil
	})
}

// csiMounts lists the host's mount points under dir but dir itself.
func (e *csiEnv) csiMounts(t testing.TB, dir string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if m.Mountpoint != dir && m.Mountpoint != e.dir {
			out = append(out, m.Mountpoint)
		}
	}
	return out
}

// csiCalls counts the node's calls to the driver of method that ended
// with code, from its metrics.
func (e *csiEnv) csiCalls(t testing.TB, method, code string) uint64 {
	fams, err := e.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() != "csi_operations_seconds" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method_name"] == method && labels["grpc_status_code"] == code && labels["driver_name"] == csiDriverName {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// testUnboundClaim runs a pod whose claim's StorageClass does not exist:
// it stays Pending, its container waiting, with a FailedMount event that
// says the claim is not bound.
func (e *csiEnv) testUnboundClaim(t *testing.T) {
	ctx := context.Background()
	e.createClaim(t, "never", "no-such-class", "1Mi", corev1.PersistentVolumeFilesystem)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unbound", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "never"},
			}}},
		},
	})
	e.waitFailedMount(t, pod, `MountVolume.SetUp failed for volume "data" : error processing PVC default/never: PVC is not bound`)
	p, err := e.c.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	e.deletePod(t, pod)
}

// BenchmarkCSI prints the node's CSI figures on the driver of
// TestCSIVolumes: the stage and publish latency (p50, p99) of 20 pods
// started at once, each with its own provisioned claim, as the node logs
// them (csi.MountedMessage), and how long after each pod's deletion its
// volume is unmounted from the node.
func BenchmarkCSI(b *testing.B) {
	need.Root(b, "mounts volumes")
	mounted := &mountLog{}
	e := startCSIEnv(b, slog.New(mounted))
	poll.Until(b, 2*time.Minute, "the driver registered", func() error {
		n, err := e.c.Client.StorageV1().CSINodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil || len(n.Spec.Drivers) == 0 {
			return fmt.Errorf("no driver in the CSINode (%v)", err)
		}
		return nil
	})
	const n = 20
	ctx := context.Background()
	for b.Loop() {
		mounted.reset()
		var claims, pods []string
		for i := range n {
			name := fmt.Sprintf("bench-%d", i)
			e.createClaim(b, name, "hostpath", "1Mi", corev1.PersistentVolumeFilesystem)
			claims = append(claims, name)
		}
		poll.Until(b, 2*time.Minute, "the claims bound", func() error {
			for _, c := range claims {
				pvc, err := e.c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, c, metav1.GetOptions{})
				if err != nil || pvc.Status.Phase != corev1.ClaimBound {
					return fmt.Errorf("%s not bound (%v)", c, err)
				}
			}
			return nil
		})
		var created []*corev1.Pod
		for _, c := range claims {
			created = append(created, e.dataPod(b, c, corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c},
			}, nil))
			pods = append(pods, c)
		}
		for _, p := range created {
			e.waitRunning(b, p)
		}
		stage, publish := mounted.durations()
		if len(stage) != n || len(publish) != n {
			b.Fatalf("%d stage and %d publish durations logged, want %d each", len(stage), len(publish), n)
		}
		// Each pod deleted at once; its volume's mount watched from then.
		targets := map[string]time.Time{}
		deleted := time.Now()
		for _, p := range created {
			pvc, err := e.c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			targets[filepath.Join(e.dir, "pods", string(p.UID), "volumes", csi.PluginDir, pvc.Spec.VolumeName, "mount")] = time.Time{}
			if err := e.c.Client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		poll.Until(b, 2*time.Minute, "every volume unmounted", func() error {
			left := 0
			for path, at := range targets {
				if !at.IsZero() {
					continue
				}
				if m, err := mountinfo.Mounted(path); err == nil && m {
					left++
					continue
				}
				targets[path] = time.Now()
			}
			if left > 0 {
				return fmt.Errorf("%d still mounted", left)
			}
			return nil
		})
		var unmounted []time.Duration
		for _, at := range targets {
			unmounted = append(unmounted, at.Sub(deleted))
		}
		b.Logf("CSI stage, %d pods:   p50 %v  p99 %v", n, percentile(stage, 50), percentile(stage, 99))
		b.Logf("CSI publish, %d pods: p50 %v  p99 %v", n, percentile(publish, 50), percentile(publish, 99))
		b.Logf("pod deleted → volume unmounted (%d at once): p50 %v  p99 %v", n, percentile(unmounted, 50), percentile(unmounted, 99))
		b.ReportMetric(float64(percentile(stage, 50)+percentile(publish, 50))/1e6, "stage+publish-p50-ms")
		b.ReportMetric(float64(percentile(unmounted, 50))/1e6, "delete-to-unmounted-p50-ms")
		for _, p := range pods {
			poll.Until(b, time.Minute, "pod "+p+" gone", func() error {
				if _, err := e.c.Client.CoreV1().Pods("default").Get(ctx, p, metav1.GetOptions{}); err == nil {
					return errors.New("still there")
				}
				return nil
			})
			e.c.Client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, p, metav1.DeleteOptions{})
		}
	}
}

// percentile is the p-th percentile of ds, nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)].Round(100 * time.Microsecond)
}

// mountLog is a log handler that keeps the stage and publish durations
// of the node's csi.MountedMessage lines and drops the rest.
type mountLog struct {
	mu             sync.Mutex
	stage, publish []time.Duration
}

func (m *mountLog) Enabled(context.Context, slog.Level) bool { return true }
func (m *mountLog) WithAttrs([]slog.Attr) slog.Handler       { return m }
func (m *mountLog) WithGroup(string) slog.Handler            { return m }

func (m *mountLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != csi.MountedMessage {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "stage":
			m.stage = append(m.stage, a.Value.Duration())
		case "publish":
			m.publish = append(m.publish, a.Value.Duration())
		}
		return true
	})
	return nil
}

func (m *mountLog) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stage, m.publish = nil, nil
}

func (m *mountLog) durations() (stage, publish []time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.stage), slices.Clone(m.publish)
}
