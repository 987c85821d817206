package machineconfig

import (
	"encoding/json"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/cairn-os/cairn/internal/layout"
)

// File is a file that init writes at boot. It replaces what is at Path
// only when its content, mode or owner differ, atomically: readers see the
// old file or the new one, never a part.
type File struct {
	// Path is an absolute, clean path under /etc or /var, e.g.
	// /etc/sysctl.d/90-tuning.conf; its directories are made (0755, root)
	// as needed. Files that Cairn writes itself are refused.
	Path string `json:"path"`
	// Content is the file's content, as written.
	Content string `json:"content,omitempty"`
	// Mode is the file's permission bits, in octal: 0644 (the default) or
	// "0644". No setuid, setgid or sticky bit.
	Mode FileMode `json:"mode,omitempty"`
	// Owner is the file's numeric owner, UID:GID; default 0:0.
	Owner string `json:"owner,omitempty"`
}

// DefaultFileMode is a File's Mode unless configured.
const DefaultFileMode FileMode = 0o644

// DefaultFileOwner is a File's Owner unless configured.
const DefaultFileOwner = "0:0"

// FileMode is a file's permission bits. It is written as an octal string
// ("0644") and read from that or from a number, which YAML reads as octal
// when it starts with 0 (0644).
type FileMode uint32

// MarshalJSON writes the mode as an octal string, e.g. "0644".
func (m FileMode) MarshalJSON() ([]byte, error) {
	return json.Marshal(fmt.Sprintf("%04o", uint32(m)))
}

// UnmarshalJSON takes a number or a string of octal digits.
func (m *FileMode) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v := v.(type) {
	case float64:
		if v < 0 || v > math.MaxUint32 || v != math.Trunc(v) {
			return fmt.Errorf("%s is not a file mode: use octal, e.g. 0644", b)
		}
		*m = FileMode(v)
	case string:
		n, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			return fmt.Errorf("%q is not a file mode: use octal digits, e.g. \"0644\"", v)
		}
		*m = FileMode(n)
	default:
		return fmt.Errorf("%s is not a file mode: use octal, e.g. 0644", b)
	}
	return nil
}

// Ownership returns the owner's UID and GID; they are valid once
// SetDefaults filled in the owner and Validate accepted it.
func (f *File) Ownership() (uid, gid int) {
	uid, gid, _ = parseOwner(f.Owner)
	return uid, gid
}

// parseOwner reads UID:GID, each a number below 2^32-1 (which means "no
// change" to chown).
func parseOwner(s string) (uid, gid int, ok bool) {
	us, gs, found := strings.Cut(s, ":")
	if !found {
		return 0, 0, false
	}
	u, err1 := strconv.ParseUint(us, 10, 32)
	g, err2 := strconv.ParseUint(gs, 10, 32)
	if err1 != nil || err2 != nil || u == math.MaxUint32 || g == math.MaxUint32 {
		return 0, 0, false
	}
	return int(u), int(g), true
}

// fileRoots are the directories machine.files may write under.
var fileRoots = []string{"/etc", "/var"}

// ownedPaths are what Cairn writes itself, files or whole directories: a
// machine file there would be overwritten, or would break the node.
var ownedPaths = []struct{ path, owner string }{
	{"/etc/hostname", "init, from machine.hostname"},
	{"/etc/hosts", "init, from machine.hostname"},
	{"/etc/resolv.conf", "init, from network.nameservers"},
	{"/etc/mtab", "init"},
	{"/etc/cairn", "the image"},
	{path.Dir(layout.ContainerdConfig), "init, from containerd"},
	{layout.CNIConfDir, "the agent (the pod network)"},
	{layout.ContainerdRoot, "containerd"},
	{path.Dir(layout.KubeletDir), "the agent"},
	{layout.KubeletRootDir, "the agent (pods' volumes, CSI drivers)"},
	{layout.PodLogRoot, "the agent (pods' logs)"},
}

func (f *File) setDefaults() {
	if f.Mode == 0 {
		f.Mode = DefaultFileMode
	}
	if f.Owner == "" {
		f.Owner = DefaultFileOwner
	}
}

func (v *validator) files(files []File) {
	seen := map[string]string{}
	for i := range files {
		f, p := &files[i], fmt.Sprintf("machine.files[%d]", i)
		switch msg := checkFilePath(f.Path); {
		case f.Path == "":
			v.add(p+".path", "required")
		case msg != "":
			v.add(p+".path", "%q %s", f.Path, msg)
		case seen[f.Path] != "":
			v.add(p+".path", "%q is %s's already", f.Path, seen[f.Path])
		default:
			seen[f.Path] = p
		}
		if f.Mode&^0o777 != 0 {
			v.add(p+".mode", "%04o has bits beyond 0777: setuid, setgid and sticky are not supported", uint32(f.Mode))
		}
		if _, _, ok := parseOwner(f.Owner); !ok {
			v.add(p+".owner", "%q is not UID:GID, two numbers such as 0:0", f.Owner)
		}
	}
}

// checkFilePath says what is wrong with p as a machine file's path, or "".
func checkFilePath(p string) string {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return "is not an absolute, clean path (no '..', '.', '//' or trailing '/')"
	}
	under := func(dir string) bool { return strings.HasPrefix(p, dir+"/") }
	inRoot := false
	for _, r := range fileRoots {
		inRoot = inRoot || under(r)
	}
	if !inRoot {
		return "is not under /etc or /var: the rest of the node is read-only"
	}
	for _, o := range ownedPaths {
		if p == o.path || under(o.path) {
			return "is written by " + o.owner + ": choose another path"
		}
	}
	return ""
}
