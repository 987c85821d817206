// Package layout names what the image build and the node must agree on:
// paths in the root filesystem and names of images shipped inside it.
package layout

const (
	// ModuleList is the file, in /lib/modules/<release> of the initramfs
	// and of the root, listing the modules init loads from there: paths
	// relative to that directory, one per line, in load order.
	ModuleList = "cairn.modules"

	// SandboxImage is the pod sandbox (pause) image: built with the node,
	// imported and pinned at boot, never pulled.
	SandboxImage = "cairn.dev/pause:1.0"
	// SandboxArchive is where the root filesystem holds it, as an image
	// archive containerd imports.
	SandboxArchive = "/usr/share/cairn/images/pause.tar"
)
