package machineconfig

import (
	"fmt"
	"regexp"
	"strings"
)

// Kernel configures what `cairn image build` puts into the image's
// kernel: both take effect when the node boots that image.
type Kernel struct {
	// Args are kernel command line arguments appended to the image's own,
	// one argument each (name or name=value; a value with spaces in
	// double quotes, name="a b"). Those Cairn's boot depends on are
	// refused.
	Args []string `json:"args,omitempty"`
	// Modules are modules of the image's Debian kernel package, by name
	// (e.g. dummy, nbd), that the image carries with the modules they
	// depend on and that init loads at boot with its own. A name the
	// kernel package does not have fails the build.
	Modules []string `json:"modules,omitempty"`
}

// ownedKernelArgs are the kernel parameters Cairn's boot depends on, by
// name with '-' as '_' (as the kernel compares them), with why.
var ownedKernelArgs = map[string]string{
	"console":  "the image sets the consoles init's boot log goes to",
	"panic":    "the image reboots the node after a panic, into the last good boot",
	"init":     "the image's init is PID 1",
	"rdinit":   "the image's initramfs runs init stage 1",
	"root":     "init stage 1 mounts the root filesystem from the initramfs",
	"noinitrd": "the root filesystem is in the initramfs",
	"initrd":   "the image's initramfs is the UKI's",
}

// kernelArgRE is one kernel argument: a name, then a value that is one
// word or double-quoted.
var kernelArgRE = regexp.MustCompile(`^[^\s="]+(=([^\s"]*|"[^"\x00-\x1f]*"))?$`)

// kernelArgName returns the parameter name of arg as the kernel compares
// it: before '=', '-' as '_'.
func kernelArgName(arg string) string {
	name, _, _ := strings.Cut(arg, "=")
	return strings.ReplaceAll(name, "-", "_")
}

// MaxKernelArgsLen bounds machine.kernel.args joined by spaces: x86's
// kernel takes a command line of 2048 bytes with its NUL, and cuts the
// rest, which the image's own arguments share.
const MaxKernelArgsLen = 1536

// moduleNameRE is a kernel module's name, without .ko.
var moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidateKernel validates k alone, as machine.kernel: what the build of
// a generic image, which has no config, takes.
func ValidateKernel(k Kernel) error {
	var v validator
	v.kernel(&k)
	return v.err("kernel arguments")
}

func (v *validator) kernel(k *Kernel) {
	for i, arg := range k.Args {
		p := fmt.Sprintf("machine.kernel.args[%d]", i)
		switch who := ownedKernelArgs[kernelArgName(arg)]; {
		case arg == "":
			v.add(p, "empty: give one argument, name or name=value")
		case strings.ContainsAny(arg, "\n\r"):
			v.add(p, "%q holds a line break: the command line is one line", arg)
		case !kernelArgRE.MatchString(arg):
			v.add(p, "%q is not one argument: use name or name=value, each list item one argument, a value with spaces in double quotes", arg)
		case who != "":
			v.add(p, "%q is Cairn's: %s; leave it out", arg, who)
		}
	}
	if n := len(strings.Join(k.Args, " ")); n > MaxKernelArgsLen {
		v.add("machine.kernel.args", "%d bytes in all, more than %d: the kernel's command line is 2048 bytes with the image's own", n, MaxKernelArgsLen)
	}
	seen := map[string]string{}
	for i, mod := range k.Modules {
		p := fmt.Sprintf("machine.kernel.modules[%d]", i)
		name := strings.ReplaceAll(mod, "-", "_")
		switch {
		case !moduleNameRE.MatchString(mod):
			v.add(p, "%q is not a module name: use letters, digits, '_' and '-', without .ko (e.g. dummy)", mod)
		case seen[name] != "":
			v.add(p, "%q is %s already", mod, seen[name])
		default:
			seen[name] = p
		}
	}
}
