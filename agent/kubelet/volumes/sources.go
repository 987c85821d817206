package volumes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// defaultFileMode is the API's default of defaultMode.
const defaultFileMode = 0o644

// files returns the files of a volume that the node writes (projected,
// configMap, secret, downwardAPI) and, if it holds a token, when that is
// due for renewal.
func (m *Manager) files(ctx context.Context, pod *corev1.Pod, v *corev1.Volume, pv *podVolumes, now time.Time) (map[string]file, time.Time, error) {
	files := map[string]file{}
	switch {
	case v.ConfigMap != nil:
		s := v.ConfigMap
		return files, time.Time{}, m.configMap(ctx, pod.Namespace, s.Name, s.Items, s.Optional, modeOr(s.DefaultMode, defaultFileMode), files)
	case v.Secret != nil:
		s := v.Secret
		return files, time.Time{}, m.secret(ctx, pod.Namespace, s.SecretName, s.Items, s.Optional, modeOr(s.DefaultMode, defaultFileMode), files)
	case v.DownwardAPI != nil:
		return files, time.Time{}, m.downward(ctx, pod, v.DownwardAPI.Items, modeOr(v.DownwardAPI.DefaultMode, defaultFileMode), files)
	}
	mode := modeOr(v.Projected.DefaultMode, defaultFileMode)
	var due time.Time
	for i, src := range v.Projected.Sources {
		var err error
		switch {
		case src.ServiceAccountToken != nil:
			var tok *token
			tok, err = m.token(ctx, pod, v.Name, src.ServiceAccountToken, pv, now)
			if err == nil {
				files[src.ServiceAccountToken.Path] = file{data: []byte(tok.value), mode: mode}
				if due.IsZero() || tok.renewAt.Before(due) {
					due = tok.renewAt
				}
			}
		case src.ConfigMap != nil:
			s := src.ConfigMap
			err = m.configMap(ctx, pod.Namespace, s.Name, s.Items, s.Optional, mode, files)
		case src.Secret != nil:
			s := src.Secret
			err = m.secret(ctx, pod.Namespace, s.Name, s.Items, s.Optional, mode, files)
		case src.DownwardAPI != nil:
			err = m.downward(ctx, pod, src.DownwardAPI.Items, mode, files)
		default:
			err = fmt.Errorf("source %d: type %s not supported yet", i, sourceType(src))
		}
		if err != nil {
			return nil, time.Time{}, err
		}
	}
	return files, due, nil
}

// token returns the token for a volume's path, renewed if it is due.
func (m *Manager) token(ctx context.Context, pod *corev1.Pod, volume string, src *corev1.ServiceAccountTokenProjection, pv *podVolumes, now time.Time) (*token, error) {
	key := volume + "/" + src.Path
	if tok := pv.tokens[key]; tok != nil && now.Before(tok.renewAt) {
		return tok, nil
	}
	tok, err := m.requestToken(ctx, pod, src, now)
	if err != nil {
		return nil, err
	}
	pv.tokens[key] = tok
	return tok, nil
}

func (m *Manager) configMap(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, mode fs.FileMode, files map[string]file) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	cm, err := m.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && isTrue(optional) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	maps.Copy(data, cm.BinaryData)
	return project("configmap "+strconv.Quote(name), data, items, isTrue(optional), mode, files)
}

func (m *Manager) secret(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, mode fs.FileMode, files map[string]file) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s, err := m.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && isTrue(optional) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return project("secret "+strconv.Quote(name), s.Data, items, isTrue(optional), mode, files)
}

// project adds data's keys to files: all of them under their own names,
// or those items name under the items' paths and modes.
func project(what string, data map[string][]byte, items []corev1.KeyToPath, optional bool, mode fs.FileMode, files map[string]file) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = file{data: v, mode: mode}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, it.Key)
		}
		files[it.Path] = file{data: v, mode: modeOr(it.Mode, mode)}
	}
	return nil
}

// downward adds the pod's metadata and its containers' resources that
// items ask for to files.
func (m *Manager) downward(ctx context.Context, pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode fs.FileMode, files map[string]file) error {
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = fieldValue(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = pods.ResourceField(pod, nil, it.ResourceFieldRef, func() (*corev1.Node, error) { return m.node(ctx) })
		default:
			err = errors.New("neither fieldRef nor resourceFieldRef")
		}
		if err != nil {
			return fmt.Errorf("downwardAPI path %q: %w", it.Path, err)
		}
		files[it.Path] = file{data: []byte(v), mode: modeOr(it.Mode, mode)}
	}
	return nil
}

// node is the Node, whose allocatable is the limit of a container that
// sets none.
func (m *Manager) node(ctx context.Context) (*corev1.Node, error) {
	if m.Node == nil {
		return nil, errors.New("the node cannot read its Node")
	}
	n, err := m.Node(ctx)
	if err != nil {
		return nil, fmt.Errorf("get the node: %w", err)
	}
	return n, nil
}

// fieldValue is the pod's field at path, as a downwardAPI volume shows
// it: labels and annotations one key="value" a line, sorted.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	if v, ok := pods.MetadataField(pod, path); ok {
		return v, nil
	}
	return "", fmt.Errorf("fieldRef %q not supported", path)
}

func formatMap(m map[string]string) string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, k+"="+strconv.Quote(m[k]))
	}
	return strings.Join(lines, "\n")
}

// modeOr is the file mode m, or def if m is not set.
func modeOr(m *int32, def fs.FileMode) fs.FileMode {
	if m == nil {
		return def
	}
	return fs.FileMode(*m).Perm()
}

func isTrue(b *bool) bool { return b != nil && *b }

// volumeType is the API's name of v's type, such as hostPath.
func volumeType(v *corev1.Volume) string { return setField(v.VolumeSource) }

func sourceType(s corev1.VolumeProjection) string { return setField(s) }

// setField is the JSON name of the first non-nil pointer field of the
// struct v: the member set of a one-of.
func setField(v any) string {
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		if f := rv.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown"
}
