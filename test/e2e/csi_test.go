//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/test/csitest"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
)

// testCSI deploys the test CSI driver as a DaemonSet on the booted node,
// at the paths upstream manifests use (/var/lib/kubelet), and checks that
// it registers, that a pre-provisioned PersistentVolume of it is staged
// and published for a pod that writes a file and for another that reads
// it back (the driver's mounts reach the pods through the node's shared
// mounts), and that the node unmounts it once the pods are gone.
func testCSI(t *testing.T, kc *kube.Cluster, c *client.Client, reg *registry.Registry, guestRegistry string) {
	const nodeName, ns = "e2e-node", "default"
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	driver, registrar, err := csitest.Images(ctx, reg, guestRegistry)
	if err != nil {
		t.Fatal(err)
	}
	probee := guestRegistry + "/cairn-test/probee:v1" // pushed by TestBoot
	d := &csitest.Deployment{DriverImage: driver, RegistrarImage: registrar, KubeletDir: "/var/lib/kubelet", DataDir: "/var/lib/csi-hostpath"}
	if err := d.Create(ctx, kc.Client, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kc.Client.AppsV1().DaemonSets(ns).Delete(context.Background(), "csi-hostpath", metav1.DeleteOptions{})
	})
	poll.Until(t, 4*time.Minute, "the driver in the node's CSINode", func() error {
		n, err := kc.Client.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, d := range n.Spec.Drivers {
			if d.Name == csitest.Driver && d.NodeID == nodeName {
				return nil
			}
		}
		return fmt.Errorf("drivers %+v", n.Spec.Drivers)
	})

	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-csi"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: ns, Name: "e2e-csi"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: csitest.Driver, VolumeHandle: "e2e-vol",
			}},
		},
	}
	if _, err := kc.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	empty := ""
	if _, err := kc.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-csi"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &empty, VolumeName: pv.Name,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, args []string, env []corev1.EnvVar) *corev1.Pod {
		grace := int64(1)
		p, err := kc.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName: nodeName, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{
					Name: "probee", Image: probee, ImagePullPolicy: corev1.PullIfNotPresent, Args: args, Env: env,
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "e2e-csi"},
				}}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	phase := func(name string, want corev1.PodPhase) {
		poll.Until(t, 4*time.Minute, "pod "+name+" "+string(want), func() error {
			p, err := kc.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != want {
				return fmt.Errorf("phase %s, containers %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil
		})
	}
	pod("csi-writer", nil, []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/data/written"}, {Name: "TOUCH_AFTER", Value: "0"}})
	phase("csi-writer", corev1.PodRunning)
	// The reader ends well only if it sees the writer's file.
	pod("csi-reader", []string{"check", "/data/written"}, nil)
	phase("csi-reader", corev1.PodSucceeded)

	csiMounts := func() []string {
		resp, err := c.Mounts(ctx, &machine.MountsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range resp.Mounts {
			if strings.HasPrefix(m.Target, "/var/lib/kubelet/pods/") || strings.HasPrefix(m.Target, "/var/lib/kubelet/plugins/kubernetes.io/csi/") {
				out = append(out, m.Target)
			}
		}
		return out
	}
	got := csiMounts()
	staged := 0
	for _, m := range got {
		if strings.HasPrefix(m, "/var/lib/kubelet/plugins/kubernetes.io/csi/"+csitest.Driver+"/") {
			staged++
		}
	}
	if staged != 1 {
		t.Errorf("node's mounts of the volume %v, want it staged once", got)
	}
	for _, name := range []string{"csi-writer", "csi-reader"} {
		if err := kc.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 2*time.Minute, "the volume unpublished and unstaged on the node", func() error {
		if got := csiMounts(); len(got) > 0 {
			return fmt.Errorf("mounts left %v", got)
		}
		return nil
	})
}
