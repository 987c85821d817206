package machineconfig

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Install says where the installer of a Cairn ISO writes the node's disk:
// one disk, by path or by a selector. It matters only to the ISO built
// from the config; a node booted from its disk ignores it.
type Install struct {
	// Disk is the whole disk's device path (/dev/vda, /dev/nvme0n1,
	// /dev/disk/by-id/…).
	Disk string `json:"disk,omitempty"`
	// DiskSelector picks the disk by what it is, when its path is not
	// known in advance: the first disk, by name, that matches every field
	// set.
	DiskSelector *DiskSelector `json:"diskSelector,omitempty"`
	// Wipe lets the installer overwrite a disk that holds a partition
	// table or data; without it such a disk is refused and left as it is.
	Wipe bool `json:"wipe,omitempty"`
}

// DiskSelector matches a disk by its size, model and serial number.
type DiskSelector struct {
	// Size is a size with an optional comparison first: ">= 8Gi",
	// "<= 2T", "< 100G", "> 1Ti" or "32Gi" (exactly).
	Size string `json:"size,omitempty"`
	// Model and Serial are shell patterns ('*', '?', '[…]') matched
	// against the disk's model and serial number as the kernel reports
	// them (/sys/block/*/device/model, …/serial).
	Model  string `json:"model,omitempty"`
	Serial string `json:"serial,omitempty"`
}

// sizeRE is a DiskSelector's size: a comparison, then a quantity.
var sizeRE = regexp.MustCompile(`^(>=|<=|>|<|==)?\s*(\S+)$`)

// SizeMatch parses s, a DiskSelector's size, into a test of a disk's size
// in bytes.
func SizeMatch(s string) (func(int64) bool, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return nil, fmt.Errorf("%q is not a size test: use a size such as 32Gi, or one after >=, <=, > or <", s)
	}
	n, err := Quantity(m[2]).Bytes()
	if err != nil {
		return nil, err
	}
	switch m[1] {
	case ">=":
		return func(b int64) bool { return b >= n }, nil
	case "<=":
		return func(b int64) bool { return b <= n }, nil
	case ">":
		return func(b int64) bool { return b > n }, nil
	case "<":
		return func(b int64) bool { return b < n }, nil
	}
	return func(b int64) bool { return b == n }, nil
}

func (v *validator) install(in *Install) {
	const p = "machine.install"
	switch {
	case in.Disk != "" && in.DiskSelector != nil:
		v.add(p, "disk and diskSelector both set: give one")
	case in.Disk != "":
		if !strings.HasPrefix(in.Disk, "/dev/") || path.Clean(in.Disk) != in.Disk {
			v.add(p+".disk", "%q is not a device path: give the whole disk's, such as /dev/vda or /dev/disk/by-id/…", in.Disk)
		}
	case in.DiskSelector != nil:
		s := in.DiskSelector
		if *s == (DiskSelector{}) {
			v.add(p+".diskSelector", "empty: set size, model or serial")
		}
		if s.Size != "" {
			if _, err := SizeMatch(s.Size); err != nil {
				v.add(p+".diskSelector.size", "%v", err)
			}
		}
		for name, pat := range map[string]string{"model": s.Model, "serial": s.Serial} {
			if _, err := path.Match(pat, ""); err != nil {
				v.add(p+".diskSelector."+name, "%q is not a pattern: %v", pat, err)
			}
		}
	case in.Wipe:
		v.add(p+".wipe", "set without a disk: give disk or diskSelector")
	}
}
