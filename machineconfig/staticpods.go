package machineconfig

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Static pods are run by the node alone, with no API server: from the
// node's boot and whether or not one answers. So they can refer to nothing
// that only the API holds — no ConfigMap, Secret, ServiceAccount token or
// PersistentVolumeClaim — which is also what the API server's NodeRestriction
// refuses in the mirror Pods the node publishes of them. The node runs each
// as NAME-HOSTNAME, as the kubelet names its static pods, so that the
// mirror Pods of several nodes do not collide.

// StaticPodName is the name the node runs pod under, and its mirror Pod
// has: the manifest's name, a dash and the node's name.
func StaticPodName(pod *corev1.Pod, nodeName string) string {
	return pod.Name + "-" + nodeName
}

// SetStaticPodDefaults fills in the namespace, "default" if none.
func SetStaticPodDefaults(pod *corev1.Pod) {
	if pod.Namespace == "" {
		pod.Namespace = corev1.NamespaceDefault
	}
}

// ValidateStaticPod reports, as a *ValidationError, what keeps pod from
// running as a static pod of the node nodeName; it expects
// SetStaticPodDefaults to be applied. The agent checks the manifests it
// reads with it.
func ValidateStaticPod(pod *corev1.Pod, nodeName string) error {
	var v validator
	v.staticPod("", pod, nodeName)
	return v.err("static pod")
}

// staticPods checks machine.staticPods: each a valid static pod, their
// names unique (each names its manifest file).
func (v *validator) staticPods(pods []corev1.Pod, nodeName string) {
	names := map[string]string{}
	for i := range pods {
		p := fmt.Sprintf("machine.staticPods[%d]", i)
		pod := &pods[i]
		v.staticPod(p+".", pod, nodeName)
		if pod.Name == "" {
			continue
		}
		if other, dup := names[pod.Name]; dup {
			v.add(p+".metadata.name", "%q is %s's already", pod.Name, other)
			continue
		}
		names[pod.Name] = p
	}
}

// staticPod checks one static pod; p prefixes its field paths.
func (v *validator) staticPod(p string, pod *corev1.Pod, nodeName string) {
	switch pod.APIVersion {
	case "v1":
	case "":
		v.add(p+"apiVersion", "required; use v1")
	default:
		v.add(p+"apiVersion", "%q is not supported; use v1", pod.APIVersion)
	}
	switch pod.Kind {
	case "Pod":
	case "":
		v.add(p+"kind", "required; use Pod")
	default:
		v.add(p+"kind", "%q is not supported; use Pod", pod.Kind)
	}
	switch {
	case pod.Name == "":
		v.add(p+"metadata.name", "required")
	default:
		if errs := validation.IsDNS1123Subdomain(StaticPodName(pod, nodeName)); len(errs) > 0 {
			v.add(p+"metadata.name", "%q, run as %q, is not a valid Pod name: %s", pod.Name, StaticPodName(pod, nodeName), strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Label(pod.Namespace); len(errs) > 0 {
		v.add(p+"metadata.namespace", "%q is not a valid namespace: %s", pod.Namespace, strings.Join(errs, "; "))
	}
	spec := &pod.Spec
	sp := p + "spec."
	if spec.NodeName != "" && spec.NodeName != nodeName {
		v.add(sp+"nodeName", "%q is not this node: leave it empty or set %q", spec.NodeName, nodeName)
	}
	if spec.ServiceAccountName != "" {
		v.add(sp+"serviceAccountName", "a static pod has no ServiceAccount: it runs without the API server; leave it empty")
	}
	for i := range spec.ImagePullSecrets {
		v.add(fmt.Sprintf("%simagePullSecrets[%d]", sp, i), "a static pod cannot read Secrets: it runs without the API server; configure the registry in containerd.registries instead")
	}
	if len(spec.Containers) == 0 {
		v.add(sp+"containers", "required: at least one container")
	}
	containers := map[string]bool{}
	for _, list := range []struct {
		field string
		cs    []corev1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i := range list.cs {
			v.staticContainer(fmt.Sprintf("%s%s[%d]", sp, list.field, i), &list.cs[i], containers)
		}
	}
	volumes := map[string]bool{}
	for i := range spec.Volumes {
		vol := &spec.Volumes[i]
		vp := fmt.Sprintf("%svolumes[%d]", sp, i)
		switch {
		case vol.Name == "":
			v.add(vp+".name", "required")
		case len(validation.IsDNS1123Label(vol.Name)) > 0:
			v.add(vp+".name", "%q is not a valid volume name: %s", vol.Name, strings.Join(validation.IsDNS1123Label(vol.Name), "; "))
		case volumes[vol.Name]:
			v.add(vp+".name", "%q is another volume's already", vol.Name)
		}
		volumes[vol.Name] = true
		if what := apiVolume(vol); what != "" {
			v.add(vp, "a static pod cannot mount %s: it runs without the API server", what)
		}
	}
}

// staticContainer checks one container of a static pod; names holds the
// names of the pod's containers seen so far.
func (v *validator) staticContainer(p string, c *corev1.Container, names map[string]bool) {
	switch {
	case c.Name == "":
		v.add(p+".name", "required")
	case len(validation.IsDNS1123Label(c.Name)) > 0:
		v.add(p+".name", "%q is not a valid container name: %s", c.Name, strings.Join(validation.IsDNS1123Label(c.Name), "; "))
	case names[c.Name]:
		v.add(p+".name", "%q is another container's already", c.Name)
	}
	names[c.Name] = true
	if strings.TrimSpace(c.Image) == "" {
		v.add(p+".image", "required")
	}
	for i := range c.Env {
		ref := c.Env[i].ValueFrom
		if ref != nil && (ref.ConfigMapKeyRef != nil || ref.SecretKeyRef != nil) {
			v.add(fmt.Sprintf("%s.env[%d].valueFrom", p, i), "a static pod cannot read ConfigMaps or Secrets: it runs without the API server")
		}
	}
	for i := range c.EnvFrom {
		v.add(fmt.Sprintf("%s.envFrom[%d]", p, i), "a static pod cannot read ConfigMaps or Secrets: it runs without the API server")
	}
}

// apiVolume names what vol needs from the API server, or "" if nothing.
func apiVolume(vol *corev1.Volume) string {
	switch {
	case vol.ConfigMap != nil:
		return "a configMap volume"
	case vol.Secret != nil:
		return "a secret volume"
	case vol.PersistentVolumeClaim != nil:
		return "a persistentVolumeClaim volume"
	case vol.Ephemeral != nil:
		return "an ephemeral volume (its claim is made in the API)"
	case vol.Projected != nil:
		for _, s := range vol.Projected.Sources {
			switch {
			case s.ConfigMap != nil:
				return "a projected configMap"
			case s.Secret != nil:
				return "a projected secret"
			case s.ServiceAccountToken != nil:
				return "a projected service account token"
			case s.ClusterTrustBundle != nil:
				return "a projected clusterTrustBundle"
			}
		}
	}
	return ""
}
