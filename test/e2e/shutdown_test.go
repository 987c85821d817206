//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// preStopDir is where the pod of startPreStopPod leaves its mark, a
// hostPath on EPHEMERAL that the node API reads back.
const preStopDir = "/var/log/cairn-e2e"

// preStopPod is a running pod whose preStop hook writes a file on the
// node: the graceful node shutdown's proof.
type preStopPod struct {
	kc  *kube.Cluster
	pod *corev1.Pod
}

// startPreStopPod runs a pod of image (probee) whose preStop hook touches
// preStopDir/<its UID> through a hostPath, before the node is rebooted.
func startPreStopPod(t *testing.T, ctx context.Context, kc *kube.Cluster, image string) *preStopPod {
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	grace := int64(20)
	pod, err := kc.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "prestop"},
		Spec: corev1.PodSpec{
			NodeName: "e2e-node", AutomountServiceAccountToken: new(bool), TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{{Name: "out", MountPath: "/out"}},
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "touch", "/out/prestop"}},
				}},
			}},
			Volumes: []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: preStopDir, Type: &dirOrCreate},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 3*time.Minute, "pod prestop Running", func() error {
		p, err := kc.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	return &preStopPod{kc: kc, pod: pod}
}

// check, after the node rebooted, finds the file the preStop hook wrote
// as the node went down, and the pod ended by the node's shutdown, as the
// kubelet's graceful node shutdown reports it.
func (p *preStopPod) check(t *testing.T, ctx context.Context, c *client.Client) {
	if _, err := readStream(c.Read(ctx, &machine.ReadRequest{Path: preStopDir + "/prestop"})); err != nil {
		t.Errorf("the preStop hook's file after the reboot: %v; want it written as the node shut down", err)
	}
	poll.Until(t, 2*time.Minute, "pod prestop Failed by the node's shutdown", func() error {
		got, err := p.kc.Client.CoreV1().Pods("default").Get(ctx, p.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != corev1.PodFailed || got.Status.Reason != "Terminated" {
			return fmt.Errorf("phase %s, reason %q, message %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
		}
		return nil
	})
	if err := p.kc.Client.CoreV1().Pods("default").Delete(ctx, p.pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}
