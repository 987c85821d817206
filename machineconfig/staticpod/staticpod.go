// Package staticpod decodes and checks in full the static pods of a
// machine config (machine.staticPods) with the Pod API, which package
// machineconfig leaves out so that init, which loads the config at boot,
// does not link it. Whatever validates a config for a user — cairn config
// validate, cairn image build — parses it with Parse or Load here, which
// run machineconfig's checks and these together; the agent checks each
// manifest it reads with Decode, SetDefaults and Validate.
package staticpod

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/machineconfig"
)

// A static pod can refer to nothing that only the API holds — no
// ConfigMap, Secret, ServiceAccount token or PersistentVolumeClaim — which
// is also what the API server's NodeRestriction refuses in the mirror
// Pods the node publishes of them.

// Load reads and parses the machine config at path; see Parse.
func Load(path string) (*machineconfig.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read machine config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse is machineconfig.Parse with the static pods checked in full: if
// the document decodes but is invalid, Parse returns the config together
// with a *machineconfig.ValidationError that lists machineconfig's
// problems, then those of the static pods.
func Parse(data []byte) (*machineconfig.Config, error) {
	c, err := machineconfig.Parse(data)
	if c == nil {
		return nil, err
	}
	var verr *machineconfig.ValidationError
	if err != nil && !errors.As(err, &verr) {
		return c, err
	}
	pods := podErrors(c)
	switch {
	case len(pods) == 0:
		return c, err
	case verr == nil:
		return c, &machineconfig.ValidationError{Doc: "machine config", Errors: pods}
	default:
		verr.Errors = append(verr.Errors, pods...)
		return c, err
	}
}

// podErrors lists what c.Validate() does not check of c's static pods.
func podErrors(c *machineconfig.Config) []machineconfig.FieldError {
	var ch checker
	for i, raw := range c.Machine.StaticPods {
		if _, err := raw.Meta(); err != nil {
			continue // c.Validate() reported it
		}
		p := fmt.Sprintf("machine.staticPods[%d]", i)
		pod, errs := decode(raw)
		for _, fe := range errs {
			ch.add(join(p, fe.Path), "%s", fe.Msg)
		}
		if pod == nil {
			continue
		}
		SetDefaults(pod)
		ch.spec(p+".spec.", &pod.Spec, c.Machine.Hostname)
	}
	return ch.errs
}

// Decode decodes a static pod's manifest, YAML or JSON, refusing unknown
// and duplicate fields with their paths.
func Decode(data []byte) (*corev1.Pod, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("decode static pod manifest: %w", err)
	}
	pod, errs := decode(j)
	if len(errs) > 0 {
		return nil, &machineconfig.ValidationError{Doc: "static pod manifest", Errors: errs}
	}
	return pod, nil
}

// decode decodes a manifest's JSON, with paths relative to it ("" for the
// whole).
func decode(data []byte) (*corev1.Pod, []machineconfig.FieldError) {
	var pod corev1.Pod
	strict, err := sigsjson.UnmarshalStrict(data, &pod)
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, []machineconfig.FieldError{{Path: te.Field, Msg: fmt.Sprintf("a JSON %s; want %s", te.Value, te.Type)}}
		}
		return nil, []machineconfig.FieldError{{Msg: strings.TrimPrefix(err.Error(), "json: ")}}
	}
	var errs []machineconfig.FieldError
	for _, e := range strict {
		errs = append(errs, machineconfig.FieldError{Msg: strings.TrimPrefix(e.Error(), "json: ")})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return &pod, nil
}

// join makes the path of rel within p.
func join(p, rel string) string {
	if rel == "" {
		return p
	}
	return p + "." + rel
}

// SetDefaults fills in the namespace, "default" if none.
func SetDefaults(pod *corev1.Pod) {
	if pod.Namespace == "" {
		pod.Namespace = corev1.NamespaceDefault
	}
}

// Name is the name the node runs pod under, and its mirror Pod has.
func Name(pod *corev1.Pod, nodeName string) string {
	return machineconfig.StaticPodName(pod.Name, nodeName)
}

// Validate reports, as a *machineconfig.ValidationError, what keeps pod
// from running as a static pod of the node nodeName; it expects
// SetDefaults to be applied.
func Validate(pod *corev1.Pod, nodeName string) error {
	meta := machineconfig.StaticPodMeta{APIVersion: pod.APIVersion, Kind: pod.Kind, Name: pod.Name, Namespace: pod.Namespace}
	ch := checker{errs: meta.Validate(nodeName)}
	ch.spec("spec.", &pod.Spec, nodeName)
	if len(ch.errs) == 0 {
		return nil
	}
	return &machineconfig.ValidationError{Doc: "static pod", Errors: ch.errs}
}

// checker collects field errors.
type checker struct {
	errs []machineconfig.FieldError
}

func (ch *checker) add(path, format string, args ...any) {
	ch.errs = append(ch.errs, machineconfig.FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// spec checks a static pod's spec; sp prefixes its field paths.
func (ch *checker) spec(sp string, spec *corev1.PodSpec, nodeName string) {
	if spec.NodeName != "" && spec.NodeName != nodeName {
		ch.add(sp+"nodeName", "%q is not this node: leave it empty or set %q", spec.NodeName, nodeName)
	}
	if spec.ServiceAccountName != "" {
		ch.add(sp+"serviceAccountName", "a static pod has no ServiceAccount: it runs without the API server; leave it empty")
	}
	for i := range spec.ImagePullSecrets {
		ch.add(fmt.Sprintf("%simagePullSecrets[%d]", sp, i), "a static pod cannot read Secrets: it runs without the API server; configure the registry in containerd.registries instead")
	}
	if len(spec.Containers) == 0 {
		ch.add(sp+"containers", "required: at least one container")
	}
	containers := map[string]bool{}
	for _, list := range []struct {
		field string
		cs    []corev1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i := range list.cs {
			ch.container(fmt.Sprintf("%s%s[%d]", sp, list.field, i), &list.cs[i], containers)
		}
	}
	volumes := map[string]bool{}
	for i := range spec.Volumes {
		vol := &spec.Volumes[i]
		vp := fmt.Sprintf("%svolumes[%d]", sp, i)
		switch {
		case vol.Name == "":
			ch.add(vp+".name", "required")
		case len(validation.IsDNS1123Label(vol.Name)) > 0:
			ch.add(vp+".name", "%q is not a valid volume name: %s", vol.Name, strings.Join(validation.IsDNS1123Label(vol.Name), "; "))
		case volumes[vol.Name]:
			ch.add(vp+".name", "%q is another volume's already", vol.Name)
		}
		volumes[vol.Name] = true
		if what := apiVolume(vol); what != "" {
			ch.add(vp, "a static pod cannot mount %s: it runs without the API server", what)
		}
	}
}

// container checks one container of a static pod; names holds the names
// of the pod's containers seen so far.
func (ch *checker) container(p string, c *corev1.Container, names map[string]bool) {
	switch {
	case c.Name == "":
		ch.add(p+".name", "required")
	case len(validation.IsDNS1123Label(c.Name)) > 0:
		ch.add(p+".name", "%q is not a valid container name: %s", c.Name, strings.Join(validation.IsDNS1123Label(c.Name), "; "))
	case names[c.Name]:
		ch.add(p+".name", "%q is another container's already", c.Name)
	}
	names[c.Name] = true
	if strings.TrimSpace(c.Image) == "" {
		ch.add(p+".image", "required")
	}
	for i := range c.Env {
		ref := c.Env[i].ValueFrom
		if ref != nil && (ref.ConfigMapKeyRef != nil || ref.SecretKeyRef != nil) {
			ch.add(fmt.Sprintf("%s.env[%d].valueFrom", p, i), "a static pod cannot read ConfigMaps or Secrets: it runs without the API server")
		}
	}
	for i := range c.EnvFrom {
		ch.add(fmt.Sprintf("%s.envFrom[%d]", p, i), "a static pod cannot read ConfigMaps or Secrets: it runs without the API server")
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
