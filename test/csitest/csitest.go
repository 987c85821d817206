// Package csitest deploys the CSI driver for tests (test/images/hostpathcsi
// with the registrar of test/images/csiregistrar) on a cluster's nodes,
// as the upstream manifests deploy csi-driver-host-path: a DaemonSet of
// the driver and its registrar, privileged, with the kubelet directory
// mounted at its own path with Bidirectional propagation, and the
// driver's CSIDriver object.
package csitest

import (
	"context"
	"fmt"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/test/registry"
)

// The driver's name and the topology key it reports.
const (
	Driver      = "hostpath.csi.cairn.test"
	TopologyKey = "topology.hostpath.csi.cairn.test/node"
)

// Images builds the driver's and the registrar's images and pushes them
// to r, and returns their references as a node pulls them from pullHost
// (r's address, or how a VM reaches it).
func Images(ctx context.Context, r *registry.Registry, pullHost string) (driver, registrar string, err error) {
	var refs []string
	for _, pkg := range []string{"hostpathcsi", "csiregistrar"} {
		if _, err := registry.BuildAndPush(ctx, r, "./test/images/"+pkg, "cairn-test/"+pkg+":v1"); err != nil {
			return "", "", err
		}
		refs = append(refs, pullHost+"/cairn-test/"+pkg+":v1")
	}
	return refs[0], refs[1], nil
}

// Deployment is the driver deployed on the nodes.
type Deployment struct {
	// DriverImage and RegistrarImage are Images'.
	DriverImage, RegistrarImage string
	// KubeletDir is the nodes' kubelet directory, /var/lib/kubelet.
	KubeletDir string
	// DataDir is where the driver keeps its volumes on the node.
	DataDir string
	// AttachRequired makes the CSIDriver ask for attaching (an external
	// attacher must then run) and the driver check it was attached.
	AttachRequired bool
}

// Socket is the driver's socket on the node.
func (d *Deployment) Socket() string {
	return filepath.Join(d.KubeletDir, "plugins", Driver, "csi.sock")
}

// Create creates the CSIDriver and the DaemonSet in namespace ns.
func (d *Deployment) Create(ctx context.Context, cs kubernetes.Interface, ns string) error {
	if _, err := cs.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: Driver},
		// File: the pods' fsGroup owns the files, as for
		// csi-driver-host-path.
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(d.AttachRequired), PodInfoOnMount: ptr.To(true),
			FSGroupPolicy:        ptr.To(storagev1.FileFSGroupPolicy),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CSIDriver: %w", err)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, d.daemonSet(ns), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create DaemonSet: %w", err)
	}
	return nil
}

func (d *Deployment) daemonSet(ns string) *appsv1.DaemonSet {
	pluginDir := filepath.Dir(d.Socket())
	hostPath := func(name, path string, typ corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &typ}}}
	}
	labels := map[string]string{"app": "csi-hostpath"}
	grace := int64(1)
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-hostpath", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  new(bool),
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "hostpath", Image: d.DriverImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Args: []string{"-endpoint", d.Socket(), "-nodeid", "$(NODE)", "-data-dir", d.DataDir,
							fmt.Sprintf("-attach-required=%t", d.AttachRequired)},
						Env:             []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "kubelet-dir", MountPath: d.KubeletDir, MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
							{Name: "data-dir", MountPath: d.DataDir},
						},
					}, {
						Name: "registrar", Image: d.RegistrarImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Args: []string{"-csi-address", "/csi/csi.sock", "-kubelet-registration-path", d.Socket(), "-registration-dir", "/registration"},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "plugin-dir", MountPath: "/csi"},
							{Name: "registration-dir", MountPath: "/registration"},
						},
					}},
					Volumes: []corev1.Volume{
						hostPath("kubelet-dir", d.KubeletDir, corev1.HostPathDirectory),
						hostPath("data-dir", d.DataDir, corev1.HostPathDirectoryOrCreate),
						hostPath("plugin-dir", pluginDir, corev1.HostPathDirectoryOrCreate),
						hostPath("registration-dir", filepath.Join(d.KubeletDir, "plugins_registry"), corev1.HostPathDirectory),
					},
				},
			},
		},
	}
}
