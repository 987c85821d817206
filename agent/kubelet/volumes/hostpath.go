package volumes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// hostPath checks that the host path of src is of its type, making it
// first for the types that say so, and returns it: the container mounts
// the host's file itself, which is never copied nor removed. The messages
// are the kubelet's, which FailedMount events carry.
func hostPath(src *corev1.HostPathVolumeSource) (string, error) {
	p := src.Path
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", fmt.Errorf("invalid HostPath `%s`: must not contain '..'", p)
	}
	typ := corev1.HostPathUnset
	if src.Type != nil {
		typ = *src.Type
	}
	var want corev1.HostPathType
	switch typ {
	case corev1.HostPathUnset:
		return p, nil
	case corev1.HostPathDirectoryOrCreate:
		if !exists(p) {
			return made(p, ignoreExist(os.MkdirAll(p, 0o755)))
		}
		want = corev1.HostPathDirectory
	case corev1.HostPathFileOrCreate:
		if !exists(p) {
			// Not its parent: that must exist.
			f, err := os.OpenFile(p, os.O_CREATE, 0o644)
			if err == nil {
				err = f.Close()
			}
			return made(p, ignoreExist(err))
		}
		want = corev1.HostPathFile
	case corev1.HostPathDirectory, corev1.HostPathFile, corev1.HostPathSocket, corev1.HostPathCharDev, corev1.HostPathBlockDev:
		want = typ
	default:
		return "", fmt.Errorf("%s is an invalid volume type", typ)
	}
	got, err := fileType(p)
	if err != nil {
		return "", fmt.Errorf("hostPath type check failed, %s is not a %s, unable to determine its type: %w", p, typeNames[want], err)
	}
	if got != want {
		return "", fmt.Errorf("hostPath type check failed: %s is not a %s, it's a %s", p, typeNames[want], got)
	}
	return p, nil
}

// made is p once made, or err.
func made(p string, err error) (string, error) {
	if err != nil {
		return "", err
	}
	return p, nil
}

// exists tells whether p, or what it links to, exists.
func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ignoreExist is err unless it says that the file exists already: made
// meanwhile, or a link to nowhere, which the kubelet lets be.
func ignoreExist(err error) error {
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	return err
}

// typeNames are the kubelet's words for the types, in its messages.
var typeNames = map[corev1.HostPathType]string{
	corev1.HostPathDirectory: "directory",
	corev1.HostPathFile:      "file",
	corev1.HostPathSocket:    "socket file",
	corev1.HostPathCharDev:   "character device",
	corev1.HostPathBlockDev:  "block device",
}

// errUnknownType is the kubelet's error for a file of a type a hostPath
// cannot name, such as a FIFO.
var errUnknownType = errors.New("only recognise file, directory, socket, block device and character device")

// fileType is the type of the file at p, following symbolic links.
func fileType(p string) (corev1.HostPathType, error) {
	info, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("path %q does not exist", p)
	}
	if err != nil {
		return "", err
	}
	m := info.Mode()
	switch {
	case m.IsDir():
		return corev1.HostPathDirectory, nil
	case m.IsRegular():
		return corev1.HostPathFile, nil
	case m&fs.ModeSocket != 0:
		return corev1.HostPathSocket, nil
	case m&fs.ModeCharDevice != 0:
		return corev1.HostPathCharDev, nil
	case m&fs.ModeDevice != 0:
		return corev1.HostPathBlockDev, nil
	}
	return "", errUnknownType
}
