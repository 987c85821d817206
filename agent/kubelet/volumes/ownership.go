package volumes

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	corev1 "k8s.io/api/core/v1"
)

// Modes the kubelet adds for a pod's fsGroup: group read (and write,
// unless the volume is read-only) on every file, and the setgid bit on
// directories, whose new files then belong to the group too.
const (
	readOnlyMask  fs.FileMode = 0o440
	readWriteMask fs.FileMode = 0o660
	execMask      fs.FileMode = 0o110
)

// setOwnership gives the files under dir to pod's fsGroup, if it has one,
// as the kubelet does: group fsGroup, the group's read (and write unless
// readOnly) permission, the setgid bit on directories. Links are left as
// they are. With fsGroupChangePolicy OnRootMismatch, a volume whose top
// directory has the group and modes already is not walked.
func setOwnership(dir string, pod *corev1.Pod, readOnly bool) error {
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.FSGroup == nil {
		return nil
	}
	gid := int(*sc.FSGroup)
	mask := readWriteMask
	if readOnly {
		mask = readOnlyMask
	}
	if sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy == corev1.FSGroupChangeOnRootMismatch && owned(dir, gid, mask) {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Lchown(path, -1, gid); err != nil {
			return err
		}
		mode := info.Mode().Perm() | mask
		if d.IsDir() {
			mode |= execMask | fs.ModeSetgid
		}
		return os.Chmod(path, mode|info.Mode()&(fs.ModeSticky|fs.ModeSetuid))
	})
}

// owned says whether dir is fsGroup's already: group gid, the mask's
// permissions, setgid.
func owned(dir string, gid int, mask fs.FileMode) bool {
	info, err := os.Stat(dir)
	if err != nil {
		return false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == gid && info.Mode().Perm()&(mask|execMask) == mask|execMask && info.Mode()&fs.ModeSetgid != 0
}
