package machineconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// Static pods are run by the node alone, with no API server: from the
// node's boot and whether or not one answers. The node runs each as
// NAME-HOSTNAME, as the kubelet names its static pods, so that the mirror
// Pods of several nodes do not collide.
//
// This package keeps each manifest as written and checks only what it can
// without the Pod API (k8s.io/api/core/v1), which would more than double
// what init, which loads this config, links. Package
// machineconfig/staticpod decodes and checks them in full; whatever
// validates a config for a user goes through it.

// StaticPod is one static pod's manifest as written: a JSON object (the
// config's YAML is turned into JSON when parsed), marshalled back
// verbatim.
type StaticPod []byte

// MarshalJSON returns the manifest as it is.
func (p StaticPod) MarshalJSON() ([]byte, error) {
	if p == nil {
		return []byte("null"), nil
	}
	return p, nil
}

// UnmarshalJSON keeps a copy of data.
func (p *StaticPod) UnmarshalJSON(data []byte) error {
	*p = append((*p)[:0], data...)
	return nil
}

// StaticPodMeta is what this package reads of a static pod's manifest.
type StaticPodMeta struct {
	APIVersion string
	Kind       string
	Name       string
	// Namespace is "" for the default one.
	Namespace string
}

// Meta reads the manifest's type, name and namespace.
func (p StaticPod) Meta() (StaticPodMeta, error) {
	var m struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(p, &m); err != nil {
		return StaticPodMeta{}, fmt.Errorf("decode static pod manifest: %w", err)
	}
	return StaticPodMeta{APIVersion: m.APIVersion, Kind: m.Kind, Name: m.Metadata.Name, Namespace: m.Metadata.Namespace}, nil
}

// StaticPodName is the name the node runs a static pod of manifest name
// under, and its mirror Pod has: the name, a dash and the node's name.
func StaticPodName(name, nodeName string) string {
	return name + "-" + nodeName
}

// dnsLabelRE matches an RFC 1123 label in lowercase, a namespace's form.
var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate reports, with paths relative to the manifest (metadata.name),
// what keeps m from being the type, name and namespace of a static pod of
// the node nodeName.
func (m StaticPodMeta) Validate(nodeName string) []FieldError {
	var v validator
	v.staticPodMeta("", m, nodeName)
	return v.errs
}

// staticPods checks machine.staticPods as far as it can without the Pod
// API: each a Pod manifest, their names unique (each names its manifest
// file).
func (v *validator) staticPods(pods []StaticPod, nodeName string) {
	names := map[string]string{}
	for i, pod := range pods {
		p := fmt.Sprintf("machine.staticPods[%d]", i)
		m, err := pod.Meta()
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			v.add(p+"."+te.Field, "a JSON %s; want %s", te.Value, te.Type)
			continue
		case err != nil:
			v.add(p, "not a Pod manifest: want an object with apiVersion, kind, metadata and spec")
			continue
		}
		v.staticPodMeta(p+".", m, nodeName)
		if m.Name == "" {
			continue
		}
		if other, dup := names[m.Name]; dup {
			v.add(p+".metadata.name", "%q is %s's already", m.Name, other)
			continue
		}
		names[m.Name] = p
	}
}

// staticPodMeta checks one static pod's type, name and namespace; p
// prefixes the field paths.
func (v *validator) staticPodMeta(p string, m StaticPodMeta, nodeName string) {
	switch m.APIVersion {
	case "v1":
	case "":
		v.add(p+"apiVersion", "required; use v1")
	default:
		v.add(p+"apiVersion", "%q is not supported; use v1", m.APIVersion)
	}
	switch m.Kind {
	case "Pod":
	case "":
		v.add(p+"kind", "required; use Pod")
	default:
		v.add(p+"kind", "%q is not supported; use Pod", m.Kind)
	}
	// A Pod's name is a DNS subdomain: the hostname's form, up to 253
	// characters.
	switch name := StaticPodName(m.Name, nodeName); {
	case m.Name == "":
		v.add(p+"metadata.name", "required")
	case len(name) > 253 || !hostnameRE.MatchString(name):
		v.add(p+"metadata.name", "%q, run as %q, is not a valid Pod name: use at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit", m.Name, name)
	}
	if m.Namespace != "" && (len(m.Namespace) > 63 || !dnsLabelRE.MatchString(m.Namespace)) {
		v.add(p+"metadata.namespace", "%q is not a valid namespace: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit", m.Namespace)
	}
}
