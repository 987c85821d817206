// Package layout names what the image build, init and the agent must agree
// on: paths on a node and names of images shipped inside its root
// filesystem. Programs take these as their flags' defaults; tests pass
// their own.
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

// Paths on a node.
const (
	// StateDir is where the STATE partition is mounted.
	StateDir = "/system/state"
	// MachineConfig is the machine config the node boots with.
	MachineConfig = StateDir + "/config.yaml"
	// RunningConfig is the machine config the node runs on: STATE's as it
	// booted, then each one applied live (cairn node apply), which may
	// not be STATE's (a try, a staged config). Init writes it; the agent
	// reads and watches it.
	RunningConfig = "/run/cairn/config.yaml"
	// StaticPodDir holds the manifests of the machine config's static
	// pods, one <name>.yaml each: written whole by init at each boot
	// before the agent starts, read and watched by the agent; root's
	// alone (0700).
	StaticPodDir = StateDir + "/static-pods"
	// FirstBootConfig is the machine config the image came with, kept
	// beside MachineConfig: a reset that wipes STATE boots on it again.
	FirstBootConfig = StateDir + "/first-boot.yaml"
	// UpgradeRecord is init's record of the last upgrade or rollback:
	// what the boots after it are (the new UKI on trial, the old one
	// after a rollback) and why.
	UpgradeRecord = StateDir + "/upgrade.json"
	// ESPMount is where init mounts the EFI system partition while it
	// reads or writes UKIs, and UpgradeSpool where it keeps a UKI it
	// receives until it is checked.
	ESPMount     = "/run/cairn/esp"
	UpgradeSpool = "/run/cairn/upgrade"
	// InitSocket is PID 1's control socket, which the agent calls.
	InitSocket = "/run/cairn/init.sock"
	// ShutdownMarker is written by init when the node shuts down (a
	// power off, a reboot, an upgrade's), before it stops the services:
	// the agent then ends the pods first (graceful node shutdown), where
	// a plain stop of the agent leaves them running.
	ShutdownMarker = "/run/cairn/shutting-down"
	// InitBinary, AgentBinary and ContainerdBinary are the names of the
	// node binary, one file hard-linked: it runs as init (stage 2), the
	// node agent or containerd by the name it is called by.
	InitBinary       = "/sbin/init"
	AgentBinary      = "/usr/bin/cairn-agent"
	ContainerdBinary = "/usr/bin/containerd"
	// KubeletDir is the kubelet part's own state: its client and serving
	// certificates.
	KubeletDir = "/var/lib/cairn/kubelet"
	// KubeletRootDir is where CSI drivers deployed with upstream
	// manifests expect the kubelet: pods/ (the pods' volumes),
	// plugins/ (the drivers' sockets, the volumes staged on the node) and
	// plugins_registry/ (their registration sockets).
	KubeletRootDir = "/var/lib/kubelet"
	// KubeletServingCert is where the kubelet server's certificate from
	// the cluster and its key are stored, relative to KubeletDir.
	KubeletServingCert = "pki/kubelet-server.pem"
	// PodLogRoot holds the pods' container logs.
	PodLogRoot = "/var/log/pods"

	// ContainerdConfig is containerd's config file.
	ContainerdConfig = "/etc/containerd/config.toml"
	// ContainerdSocket is containerd's socket, which also serves its CRI.
	ContainerdSocket = "/run/containerd/containerd.sock"
	// ContainerdRoot and ContainerdState are containerd's persistent and
	// runtime directories.
	ContainerdRoot  = "/var/lib/containerd"
	ContainerdState = "/run/containerd"
	// RegistryHostsDir holds one hosts.toml directory per registry host.
	RegistryHostsDir = "/etc/containerd/certs.d"
	// CNIBinDir holds the CNI plugins; CNIConfDir the pod network.
	CNIBinDir  = "/opt/cni/bin"
	CNIConfDir = "/etc/cni/net.d"
)
