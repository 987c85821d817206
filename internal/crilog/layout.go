package crilog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// PodDir is the directory of a pod's logs under root.
func PodDir(root, namespace, name, uid string) string {
	return filepath.Join(root, namespace+"_"+name+"_"+uid)
}

// PodUID is the UID of the pod whose log directory is named dir (its base
// name), as PodDir names it; ok is false for a name PodDir does not make.
func PodUID(dir string) (uid string, ok bool) {
	parts := strings.Split(dir, "_")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", false
	}
	return parts[2], true
}

// ContainerLog is the path of a container's log for one attempt, relative
// to its pod's directory: what the CRI's ContainerConfig.LogPath holds.
func ContainerLog(container string, attempt uint32) string {
	return filepath.Join(container, strconv.FormatUint(uint64(attempt), 10)+".log")
}

// ErrNotFound is wrapped by Find's errors for a pod or container without
// logs.
var ErrNotFound = errors.New("no logs")

// Find returns the log of the latest attempt of a container of the pod
// namespace/name under root, or with previous the attempt before it. A pod
// deleted and created again under the same name has a new UID: the most
// recently changed pod directory counts. With container empty, the pod
// must have logs of one container only.
func Find(root, namespace, name, container string, previous bool) (string, error) {
	// Valid names hold no "/", "_" or glob characters: they cannot leave
	// root, and namespace_name_ starts no other pod's directory.
	var bad []string
	bad = append(bad, validation.IsDNS1123Label(namespace)...)
	bad = append(bad, validation.IsDNS1123Subdomain(name)...)
	if container != "" {
		bad = append(bad, validation.IsDNS1123Label(container)...)
	}
	if len(bad) > 0 {
		return "", fmt.Errorf("pod %q/%q container %q: %s", namespace, name, container, strings.Join(bad, "; "))
	}
	dirs, err := filepath.Glob(filepath.Join(root, namespace+"_"+name+"_*"))
	if err != nil {
		return "", err
	}
	pod, newest := "", int64(0)
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil || !st.IsDir() {
			continue
		}
		if t := st.ModTime().UnixNano(); pod == "" || t > newest {
			pod, newest = d, t
		}
	}
	if pod == "" {
		return "", fmt.Errorf("pod %s/%s: %w on this node", namespace, name, ErrNotFound)
	}
	if container == "" {
		ents, err := os.ReadDir(pod)
		if err != nil {
			return "", err
		}
		var names []string
		for _, e := range ents {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		if len(names) != 1 {
			return "", fmt.Errorf("pod %s/%s has logs of containers %v: name one", namespace, name, names)
		}
		container = names[0]
	}
	ents, err := os.ReadDir(filepath.Join(pod, container))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("container %s of pod %s/%s: %w", container, namespace, name, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	latest, prev := -1, -1
	for _, e := range ents {
		n, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".log"))
		if err != nil || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		if n > latest {
			latest, prev = n, latest
		} else if n > prev && n < latest {
			prev = n
		}
	}
	attempt := latest
	if previous {
		attempt = prev
	}
	if attempt < 0 {
		what := "container"
		if previous {
			what = "previous container"
		}
		return "", fmt.Errorf("%s %s of pod %s/%s: %w", what, container, namespace, name, ErrNotFound)
	}
	return filepath.Join(pod, ContainerLog(container, uint32(attempt))), nil
}
