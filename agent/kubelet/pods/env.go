package pods

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Refs reads what a pod's containers refer to outside the pod. The kubelet
// answers with the node's client: the Node authorizer lets a node get the
// ConfigMaps and Secrets its pods refer to, and its own Node. An object
// that does not exist is an error for which apierrors.IsNotFound holds.
type Refs interface {
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// Node is the Node the pods run on: its addresses are the pods' host
	// IPs, its allocatable stands in for a container's missing limits.
	Node(ctx context.Context) (*corev1.Node, error)
	// Services are the Services of a namespace, for the service
	// environment variables (servicelinks.go).
	Services(ctx context.Context, namespace string) ([]*corev1.Service, error)
}

// HostIPs are the IPs a pod on node sees as its host's (status.hostIPs):
// the node's first InternalIP address, then the first of the other family.
func HostIPs(node *corev1.Node) []string {
	var out []string
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if !slices.ContainsFunc(out, func(ip string) bool { return is4(ip) == is4(a.Address) }) {
			out = append(out, a.Address)
		}
	}
	return out
}

func is4(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err != nil || a.Is4()
}

// containerEnv is c's environment (see envBuilder.env) in the sandbox sb.
func (w *Worker) containerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, sb sandbox) ([]*criv1.KeyValue, error) {
	b := &envBuilder{
		refs: w.cfg.Refs,
		pod:  pod,
		warn: func(reason, msg string) { w.Event(pod, c.Name, corev1.EventTypeWarning, reason, "%s", msg) },
	}
	if sb.ip != "" {
		b.podIPs = []string{sb.ip}
	}
	return b.env(ctx, c)
}

// envBuilder makes one container's environment, reading each ConfigMap,
// Secret and the Node at most once.
type envBuilder struct {
	refs Refs
	pod  *corev1.Pod
	// podIPs are the sandbox's IPs, primary first; none on the host
	// network.
	podIPs []string
	// warn tells what the kubelet tells as a Warning event.
	warn func(reason, message string)

	configMaps map[string]*corev1.ConfigMap // nil: not found
	secrets    map[string]*corev1.Secret
	node       *corev1.Node

	vars  []*criv1.KeyValue
	index map[string]int
}

// env is c's environment as the kubelet makes it: the service variables,
// then those of envFrom's ConfigMaps and Secrets, each under its prefix,
// then env in
// order, each value with the $(VAR)
// references to the variables before it expanded, or read from what
// valueFrom names. A later variable replaces an earlier one of the same
// name, in its place. A reference that cannot be resolved and is not
// optional is an error, which the kubelet reports as
// CreateContainerConfigError.
func (b *envBuilder) env(ctx context.Context, c *corev1.Container) ([]*criv1.KeyValue, error) {
	b.vars, b.index = nil, map[string]int{}
	if err := b.serviceEnv(ctx); err != nil {
		return nil, err
	}
	for _, from := range c.EnvFrom {
		if err := b.envFrom(ctx, from); err != nil {
			return nil, err
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			b.set(e.Name, expand(e.Value, b.lookup))
			continue
		}
		v, ok, err := b.valueFrom(ctx, c, e.ValueFrom)
		if err != nil {
			return nil, err
		}
		if ok {
			b.set(e.Name, v)
		}
	}
	return b.vars, nil
}

func (b *envBuilder) set(name, value string) {
	if i, ok := b.index[name]; ok {
		b.vars[i].Value = []byte(value)
		return
	}
	b.index[name] = len(b.vars)
	b.vars = append(b.vars, &criv1.KeyValue{Key: name, Value: []byte(value)})
}

func (b *envBuilder) lookup(name string) (string, bool) {
	i, ok := b.index[name]
	if !ok {
		return "", false
	}
	return string(b.vars[i].Value), true
}

func (b *envBuilder) envFrom(ctx context.Context, from corev1.EnvFromSource) error {
	var data map[string]string
	var what string
	switch {
	case from.ConfigMapRef != nil:
		cm, err := b.configMap(ctx, from.ConfigMapRef.Name)
		if err != nil {
			return err
		}
		if cm == nil {
			if optional(from.ConfigMapRef.Optional) {
				return nil
			}
			return fmt.Errorf("configmap %q not found", from.ConfigMapRef.Name)
		}
		data, what = cm.Data, "configMap "+b.pod.Namespace+"/"+cm.Name
	case from.SecretRef != nil:
		s, err := b.secret(ctx, from.SecretRef.Name)
		if err != nil {
			return err
		}
		if s == nil {
			if optional(from.SecretRef.Optional) {
				return nil
			}
			return fmt.Errorf("secret %q not found", from.SecretRef.Name)
		}
		data = map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		what = "secret " + b.pod.Namespace + "/" + s.Name
	default:
		return nil
	}
	// The API's key rules make every name valid under its (relaxed)
	// rules for names, printable ASCII but '='; what is not would break
	// the environment, so it is skipped and told.
	var invalid []string
	for _, k := range slices.Sorted(maps.Keys(data)) {
		name := from.Prefix + k
		if len(validation.IsRelaxedEnvVarName(name)) > 0 {
			invalid = append(invalid, name)
			continue
		}
		b.set(name, data[k])
	}
	if len(invalid) > 0 && b.warn != nil {
		b.warn("InvalidEnvironmentVariableNames", fmt.Sprintf("Keys [%s] from the envFrom %s were skipped: they are not valid environment variable names.",
			strings.Join(invalid, ", "), what))
	}
	return nil
}

// valueFrom reads one variable's value; ok is false for an optional
// reference to something that does not exist.
func (b *envBuilder) valueFrom(ctx context.Context, c *corev1.Container, src *corev1.EnvVarSource) (value string, ok bool, err error) {
	switch {
	case src.FieldRef != nil:
		v, err := b.podField(ctx, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := b.resourceField(ctx, c, src.ResourceFieldRef)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := b.configMap(ctx, ref.Name)
		if err != nil {
			return "", false, err
		}
		if cm == nil {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q not found", ref.Name)
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, b.pod.Namespace, ref.Name)
		}
		return v, ok, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := b.secret(ctx, ref.Name)
		if err != nil {
			return "", false, err
		}
		if s == nil {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q not found", ref.Name)
		}
		v, ok := s.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, b.pod.Namespace, ref.Name)
		}
		return string(v), ok, nil
	}
	return "", false, fmt.Errorf("env valueFrom with no source")
}

func optional(o *bool) bool { return o != nil && *o }

// configMap returns the pod's ConfigMap of that name, nil if there is none.
func (b *envBuilder) configMap(ctx context.Context, name string) (*corev1.ConfigMap, error) {
	if cm, ok := b.configMaps[name]; ok {
		return cm, nil
	}
	if b.refs == nil {
		return nil, fmt.Errorf("configmap %q: the node has no API access to read it", name)
	}
	cm, err := b.refs.ConfigMap(ctx, b.pod.Namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		cm = nil
	case err != nil:
		return nil, fmt.Errorf("get configmap %s/%s: %w", b.pod.Namespace, name, err)
	}
	if b.configMaps == nil {
		b.configMaps = map[string]*corev1.ConfigMap{}
	}
	b.configMaps[name] = cm
	return cm, nil
}

// secret returns the pod's Secret of that name, nil if there is none.
func (b *envBuilder) secret(ctx context.Context, name string) (*corev1.Secret, error) {
	if s, ok := b.secrets[name]; ok {
		return s, nil
	}
	if b.refs == nil {
		return nil, fmt.Errorf("secret %q: the node has no API access to read it", name)
	}
	s, err := b.refs.Secret(ctx, b.pod.Namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		s = nil
	case err != nil:
		return nil, fmt.Errorf("get secret %s/%s: %w", b.pod.Namespace, name, err)
	}
	if b.secrets == nil {
		b.secrets = map[string]*corev1.Secret{}
	}
	b.secrets[name] = s
	return s, nil
}

func (b *envBuilder) getNode(ctx context.Context) (*corev1.Node, error) {
	if b.node != nil {
		return b.node, nil
	}
	if b.refs == nil {
		return nil, fmt.Errorf("the node has no API access to read its Node")
	}
	n, err := b.refs.Node(ctx)
	if err != nil {
		return nil, fmt.Errorf("get the node: %w", err)
	}
	b.node = n
	return n, nil
}

// podField is the value of a fieldRef: the pod's metadata.name,
// metadata.namespace, metadata.uid, metadata.labels['KEY'],
// metadata.annotations['KEY'] (empty when absent), spec.nodeName,
// spec.serviceAccountName, status.hostIP(s) or status.podIP(s) (lists
// joined with commas; a pod on the host network has the host's IPs).
func (b *envBuilder) podField(ctx context.Context, path string) (string, error) {
	pod := b.pod
	if v, ok := MetadataField(pod, path); ok {
		return v, nil
	}
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		ips, err := b.hostIPs(ctx)
		return joinIPs(ips, path == "status.hostIPs"), err
	case "status.podIP", "status.podIPs":
		if pod.Spec.HostNetwork {
			ips, err := b.hostIPs(ctx)
			return joinIPs(ips, path == "status.podIPs"), err
		}
		return joinIPs(b.podIPs, path == "status.podIPs"), nil
	}
	return "", fmt.Errorf("unsupported fieldRef fieldPath %q", path)
}

func (b *envBuilder) hostIPs(ctx context.Context) ([]string, error) {
	node, err := b.getNode(ctx)
	if err != nil {
		return nil, err
	}
	return HostIPs(node), nil
}

// joinIPs is the first IP, or all of them joined by commas.
func joinIPs(ips []string, all bool) string {
	if len(ips) == 0 {
		return ""
	}
	if !all {
		return ips[0]
	}
	return strings.Join(ips, ",")
}

// subscript returns KEY of FIELD['KEY'].
// MetadataField is the value of a fieldRef into the pod's metadata, the
// same for env and downwardAPI volumes: metadata.name, metadata.namespace,
// metadata.uid, metadata.labels['KEY'] or metadata.annotations['KEY']
// (empty when absent); ok is false for any other path.
func MetadataField(pod *corev1.Pod, path string) (value string, ok bool) {
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], true
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], true
	}
	switch path {
	case "metadata.name":
		return pod.Name, true
	case "metadata.namespace":
		return pod.Namespace, true
	case "metadata.uid":
		return string(pod.UID), true
	}
	return "", false
}

func subscript(path, field string) (string, bool) {
	rest, ok := strings.CutPrefix(path, field+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// resourceField is the value of a resourceFieldRef in c's environment,
// as ResourceField.
func (b *envBuilder) resourceField(ctx context.Context, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	return ResourceField(b.pod, c, ref, func() (*corev1.Node, error) { return b.getNode(ctx) })
}

// ResourceField is the value of a resourceFieldRef, in an env var or a
// downwardAPI volume: a request or limit of a container of the pod (c if
// the reference names none) in units of the divisor, rounded up. A
// missing limit of cpu, memory or ephemeral-storage is the node's
// allocatable (node is called only then), as the container may use that
// much; a missing request is 0.
func ResourceField(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector, node func() (*corev1.Node, error)) (string, error) {
	target := c
	if ref.ContainerName != "" && (c == nil || ref.ContainerName != c.Name) {
		target = specContainer(pod, ref.ContainerName)
	}
	if target == nil {
		return "", fmt.Errorf("resourceFieldRef: no container %q in the pod", ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("unsupported resourceFieldRef resource %q", ref.Resource)
	}
	res := corev1.ResourceName(name)
	var q resource.Quantity
	var found bool
	if kind == "limits" {
		q, found = target.Resources.Limits[res]
		if !found && (res == corev1.ResourceCPU || res == corev1.ResourceMemory || res == corev1.ResourceEphemeralStorage) {
			n, err := node()
			if err != nil {
				return "", err
			}
			q = n.Status.Allocatable[res]
		}
	} else {
		q = target.Resources.Requests[res]
	}
	return strconv.FormatInt(inUnits(res, q, ref.Divisor), 10), nil
}

// inUnits is q divided by divisor (1 if zero), rounded up; CPU is counted
// in millicores so that a divisor of 1m works.
func inUnits(res corev1.ResourceName, q, divisor resource.Quantity) int64 {
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	n, d := q.Value(), divisor.Value()
	if res == corev1.ResourceCPU {
		n, d = q.MilliValue(), divisor.MilliValue()
	}
	out := n / d
	if n%d > 0 {
		out++
	}
	return out
}

// expand replaces each $(NAME) in s by lookup(NAME), the API's rules for
// env values, command and args: $$ is a literal $ (so $$(NAME) is the
// text $(NAME)), and a reference to a name lookup does not know, or one
// never closed, stays as written.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 { // never closed: the rest is text
				b.WriteString("$(")
				i++
				continue
			}
			ref := s[i : i+3+end] // $(NAME)
			if v, ok := lookup(ref[2 : len(ref)-1]); ok {
				b.WriteString(v)
			} else {
				b.WriteString(ref)
			}
			i += len(ref) - 1
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// expandAll expands each of ss with env's variables.
func expandAll(ss []string, env []*criv1.KeyValue) []string {
	if len(ss) == 0 {
		return ss
	}
	vars := make(map[string]string, len(env))
	for _, kv := range env {
		vars[kv.Key] = string(kv.Value)
	}
	lookup := func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = expand(s, lookup)
	}
	return out
}
