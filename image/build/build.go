// Package build turns a machine config into a bootable Cairn disk image:
// it validates the config, fetches the pinned kernel, builds the root
// squashfs and initramfs (package rootfs), wraps them into a UKI and writes
// the GPT disk (package image), then records every input and output digest
// in manifest.json. Nothing is written when the config is invalid, and the
// output appears only when the build succeeded.
package build

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/image/oci"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/machineconfig/staticpod"
	"github.com/cairn-os/cairn/rootfs"
)

// Host files the build takes as inputs (Debian packages systemd-boot-efi
// and ca-certificates).
const (
	stubPath       = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	bootloaderPath = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	caBundlePath   = "/etc/ssl/certs/ca-certificates.crt"
)

// DefaultSourceDateEpoch stamps every file of an image when
// Options.SourceDateEpoch is 0: a fixed time keeps builds
// reproducible (and is after 1980, which FAT cannot go below).
const DefaultSourceDateEpoch = 1767225600 // 2026-01-01T00:00:00Z

// KernelCmdline is the kernel command line baked into the UKI, before
// machine.kernel.args. quiet keeps the serial console short: a verbose one
// slows boots under emulation. The machine config refuses the others in
// machine.kernel.args.
const KernelCmdline = "console=tty0 console=ttyS0,115200 quiet panic=10"

// kernelCmdline is the UKI's command line: KernelCmdline, then the
// machine's arguments, validated by the machine config.
func kernelCmdline(k machineconfig.Kernel) string {
	return strings.Join(append([]string{KernelCmdline}, k.Args...), " ")
}

// checkModules checks that the kernel package has each of
// machine.kernel.modules (built in counts), which the image then carries
// with their dependencies among its system modules, for init to load.
func checkModules(kernel *rootfs.Kernel, k machineconfig.Kernel) error {
	for i, mod := range k.Modules {
		if _, err := rootfs.ResolveModules(kernel.ModulesDir(), []string{mod}); err != nil {
			return fmt.Errorf("machine.kernel.modules[%d]: %w: the kernel package %s %s has no such module; remove it from the machine config", i, err, rootfs.KernelPackage, rootfs.KernelVersion)
		}
	}
	return nil
}

// hostTool is a program of the build host, from a Debian package, that
// the node runs; its shared libraries come along.
type hostTool struct{ path, pkg string }

// hostTools are e2fsprogs, which init runs to make, check and grow
// EPHEMERAL, and nft, which the portmap CNI plugin runs for hostPorts.
func hostTools() []hostTool {
	return []hostTool{
		{"/sbin/mke2fs", "e2fsprogs"}, {"/sbin/e2fsck", "e2fsprogs"}, {"/sbin/resize2fs", "e2fsprogs"},
		{"/sbin/nft", "nftables"},
	}
}

// bootModules are the modules init stage 1 loads to mount the root
// squashfs.
func bootModules() []string { return []string{"loop", "squashfs", "overlay"} }

// systemModules are the modules init stage 2 loads: the pod network's
// (bridge, veth; br_netfilter so that traffic between pods on the bridge
// passes the Service rules) and the nftables expressions of the Service
// dataplane and of portmap among them. button is the ACPI button driver:
// init powers off on the power button's events. bonding and 8021q make the
// config's network.interfaces[].bond and vlans. tcp_diag and udp_diag
// answer sock_diag, for the sockets the node API lists. vxlan tunnels pod
// traffic to nodes on other networks (agent/podroutes). The disk and
// CD-ROM drivers beyond virtio (AHCI, NVMe, SCSI, USB storage) let the
// installer of the ISO read its medium and write a machine's disk.
func systemModules() []string {
	return []string{"virtio_pci", "virtio_blk", "virtio_net", "virtio_scsi", "ahci", "nvme", "sd_mod", "sr_mod", "xhci_pci", "usb_storage",
		"crc32c_generic", "ext4", "vfat", "nls_cp437", "nls_ascii", "efivarfs", "button",
		"bridge", "veth", "br_netfilter", "nf_conntrack", "nf_conntrack_netlink", "nf_tables",
		"nft_chain_nat", "nft_nat", "nft_masq", "nft_ct", "nft_fib_inet", "nft_numgen", "nft_reject_inet",
		"bonding", "8021q", "tcp_diag", "udp_diag", "vxlan"}
}

// Options of one build.
type Options struct {
	// Config is the machine config file; for BuildAll, a directory of
	// them.
	Config string
	// Generic, with no Config, builds an image with no machine config on
	// its STATE: at first boot it takes one from cairn.config.url or a
	// NoCloud volume.
	Generic bool
	// KernelArgs are a generic image's kernel arguments, as a config's
	// machine.kernel.args: cairn.config.url=… and cairn.config.sha256=….
	KernelArgs []string
	// Output is the image to write; for BuildAll, the directory to write
	// the images into.
	Output string
	Format string // an image.Formats name; default raw
	// UKI, when set, writes the UKI alone to Output, with no disk: what
	// `cairn node upgrade` sends to a node.
	UKI    bool
	Assets string // directory holding the node binaries (init-stage1, init, pause) and the components
	// CacheDir holds the kernel package and the boot parts of recent
	// builds; default rootfs.DefaultCacheDir().
	CacheDir string
	// SecureBoot, if set, is the directory of the Secure Boot keys that
	// systemd-boot and the UKI are signed with and that the ESP carries
	// for the firmware to enroll (cairn config gen --secure-boot).
	SecureBoot image.SecureBootKeys
	// NoCache builds the boot parts (UKI and EFI system partition) anew,
	// neither reading nor filling the cache: a cold build.
	NoCache bool
	Size    int64 // disk size in bytes; 0 = image default
	// SourceDateEpoch stamps every file of the image, in seconds since
	// 1970; 0 = DefaultSourceDateEpoch.
	SourceDateEpoch int64
	// Progress gets a line per stage.
	Progress func(string)
}

// withDefaults returns o with its unset fields set to their defaults.
func (o Options) withDefaults() Options {
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.Format == "" {
		o.Format = "raw"
	}
	if o.CacheDir == "" {
		o.CacheDir = rootfs.DefaultCacheDir()
	}
	if o.SourceDateEpoch == 0 {
		o.SourceDateEpoch = DefaultSourceDateEpoch
	}
	return o
}

// asset returns the path of the slash-separated name in o.Assets.
func (o Options) asset(name string) string { return filepath.Join(o.Assets, filepath.FromSlash(name)) }

// An input is a file the build reads and records in the manifest. A file
// of the build host comes from a Debian package, a file of the assets from
// a make target.
type input struct {
	name, path string
	note       string // recorded in the manifest, e.g. the Debian package
	pkg        string // the Debian package providing the file, or
	target     string // the make target building it into the assets
	fix        string // else, what makes it
}

// remedy says what provides the missing input.
func (in input) remedy() string {
	if in.fix != "" {
		return in.fix
	}
	if in.pkg != "" {
		return "install the Debian package " + in.pkg + " (hack/deps.sh)"
	}
	return "`make " + in.target + "` builds it into the assets directory"
}

// hostInputs are the files of the build host and of o.Assets that go into
// the image: all inputs but the machine config and the kernel package.
func hostInputs(o Options) []input {
	asset := func(name, note, target string) input {
		return input{name: name, path: o.asset(name), note: note, target: target}
	}
	deb := func(name, path, pkg string) input {
		return input{name: name, path: path, note: pkg, pkg: pkg}
	}
	ins := []input{
		deb("uki-stub", stubPath, "systemd-boot-efi"),
		deb("bootloader", bootloaderPath, "systemd-boot-efi"),
		asset("init-stage1", "", "build"),
		asset("init", "the node binary: init, cairn-agent, containerd", "build"),
		asset("pause", layout.SandboxImage, "build"),
		deb("ca-bundle", caBundlePath, "ca-certificates"),
	}
	for _, c := range rootfs.Components {
		ins = append(ins, asset(c.Name, "", c.Make))
	}
	for _, t := range hostTools() {
		ins = append(ins, deb(strings.TrimPrefix(t.path, "/"), t.path, t.pkg))
	}
	// The certificates name the keys: the same certificates, the same
	// signatures.
	if o.SecureBoot != "" {
		for _, c := range o.SecureBoot.Certs() {
			ins = append(ins, input{name: "secure-boot-" + filepath.Base(c), path: c, note: "Secure Boot certificate",
				fix: "`cairn config gen --secure-boot` makes the keys"})
		}
	}
	return ins
}

// Build writes the image and its manifest.json beside it.
func Build(ctx context.Context, o Options) (*image.Manifest, error) {
	o = o.withDefaults()
	stage := stager(o.Progress)
	stage("validate machine config")
	c, err := configOf(o)
	if err != nil {
		return nil, err
	}
	b, err := newBuilder(ctx, o, stage)
	if err != nil {
		return nil, err
	}
	defer b.close()
	m, err := b.image(ctx, c, o.Output, filepath.Join(filepath.Dir(o.Output), "manifest.json"), stage)
	if err != nil {
		return nil, err
	}
	stage("done: " + o.Output)
	return m, nil
}

// nodeConfig is a machine config file, read and validated; for a generic
// image, no file and an empty config.
type nodeConfig struct {
	path  string
	bytes []byte
	*machineconfig.Config
}

// state is what the STATE partition of c's image holds.
func (c *nodeConfig) state() map[string][]byte {
	if c.path == "" {
		return nil
	}
	return map[string][]byte{filepath.Base(layout.MachineConfig): c.bytes, filepath.Base(layout.FirstBootConfig): c.bytes}
}

// configOf returns the config that o builds an image of: o.Config's, or
// for a generic image none, with o.KernelArgs.
func configOf(o Options) (*nodeConfig, error) {
	switch {
	case o.Generic && o.Config != "":
		return nil, errors.New("a generic image has no machine config: leave out either")
	case !o.Generic && len(o.KernelArgs) > 0:
		return nil, errors.New("kernel arguments of an image of a machine config are its machine.kernel.args")
	case !o.Generic:
		return readConfig(o.Config)
	}
	k := machineconfig.Kernel{Args: o.KernelArgs}
	if err := machineconfig.ValidateKernel(k); err != nil {
		return nil, err
	}
	return &nodeConfig{Config: &machineconfig.Config{Machine: machineconfig.Machine{Kernel: k}}}, nil
}

// readConfig reads and validates the machine config at path.
func readConfig(path string) (*nodeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("machine config: %w (`cairn config gen` writes one)", err)
	}
	cfg, err := staticpod.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &nodeConfig{path: path, bytes: data, Config: cfg}, nil
}

// A builder makes images from the inputs it checked and hashed once,
// sharing the boot parts between the images of configs that have the same
// kernel arguments and modules.
type builder struct {
	o       Options
	format  image.Format
	kernel  *rootfs.Kernel
	inputs  []image.Artifact // the kernel package and hostInputs, in the disk seed's order
	program []byte           // digest of what else makes boot parts: this program and the host tools' libraries
	scratch string           // with NoCache, where the boot parts are built, removed by close

	mu    sync.Mutex
	boots map[string]*bootBuild // by the digest of their inputs
}

// bootBuild is the one build of the boot parts of a digest.
type bootBuild struct {
	done  chan struct{}
	parts *bootParts
	err   error
}

// newBuilder checks that every input is there, fetches the kernel and
// hashes the inputs.
func newBuilder(ctx context.Context, o Options, stage func(string)) (*builder, error) {
	format, err := image.FormatByName(o.Format)
	if err != nil {
		return nil, err
	}
	if o.SecureBoot != "" {
		if err := o.SecureBoot.Check(); err != nil {
			return nil, err
		}
	}
	ins := hostInputs(o)
	for _, in := range ins {
		if _, err := os.Stat(in.path); err != nil {
			return nil, fmt.Errorf("input %s missing: %w: %s", in.name, err, in.remedy())
		}
	}

	stage("fetch kernel " + rootfs.KernelPackage + " " + rootfs.KernelVersion)
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return nil, err
	}
	kernel, err := rootfs.FetchKernel(ctx, o.CacheDir, o.Progress)
	if err != nil {
		return nil, err
	}

	stage("hash the inputs")
	b := &builder{o: o, format: format, kernel: kernel, boots: map[string]*bootBuild{}}
	deb, err := os.Stat(kernel.Deb)
	if err != nil {
		return nil, err
	}
	// FetchKernel hashed the kernel package already.
	b.inputs = []image.Artifact{{Name: "kernel-package", SHA256: kernel.DebSHA256, Size: deb.Size(), Note: rootfs.KernelPackage + "=" + rootfs.KernelVersion}}
	for _, in := range ins {
		a, err := image.FileArtifact(in.name, in.path, in.note)
		if err != nil {
			return nil, err
		}
		b.inputs = append(b.inputs, a)
	}
	if b.program, err = programDigest(); err != nil {
		return nil, err
	}
	if o.NoCache {
		if b.scratch, err = os.MkdirTemp(o.CacheDir, ".build-boot-"); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// programDigest hashes what makes the boot parts besides the inputs: this
// program, whose code lays them out, and the shared libraries that the
// host tools bring into the root filesystem.
func programDigest() ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("this program: %w", err)
	}
	var tools []string
	for _, t := range hostTools() {
		tools = append(tools, t.path)
	}
	files, err := rootfs.HostToolSources(tools)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, f := range append([]string{exe}, files...) {
		a, err := image.FileArtifact(f, f, "")
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(h, "%s=%s\n", f, a.SHA256)
	}
	return h.Sum(nil), nil
}

// close removes what the builder made that no image holds.
func (b *builder) close() {
	if b.scratch != "" {
		os.RemoveAll(b.scratch)
	}
}

// image writes the image of c to out and its manifest to manifest.
func (b *builder) image(ctx context.Context, c *nodeConfig, out, manifest string, stage func(string)) (*image.Manifest, error) {
	boot, err := b.boot(ctx, c, stage)
	if err != nil {
		return nil, err
	}
	m := &image.Manifest{Version: version.Version, Inputs: b.inputs}
	if c.path != "" {
		cfgInput, err := image.FileArtifact("machine-config", c.path, "")
		if err != nil {
			return nil, err
		}
		m.Inputs = append([]image.Artifact{cfgInput}, b.inputs...)
	}

	outDir := filepath.Dir(out)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	tmpOut := filepath.Join(work, "out")

	if b.o.UKI {
		if err := copyFile(boot.UKI, tmpOut); err != nil {
			return nil, err
		}
		uki := boot.Outputs[0]
		uki.Name = filepath.Base(out)
		m.Outputs = append([]image.Artifact{uki}, boot.Outputs[1:]...)
		return m, place(m, tmpOut, out, manifest)
	}

	stage("write disk")
	seed := sha256.New()
	for _, a := range m.Inputs {
		seed.Write([]byte(a.Name + "=" + a.SHA256 + "\n"))
	}
	raw := filepath.Join(work, "disk.raw")
	if err := image.WriteRaw(ctx, image.Disk{
		Size:            b.o.Size,
		ESP:             boot.ESP,
		State:           c.state(),
		SourceDateEpoch: b.o.SourceDateEpoch,
		Seed:            seed.Sum(nil),
	}, raw); err != nil {
		return nil, err
	}

	stage("convert to " + b.format.Name())
	if err := b.format.Convert(ctx, raw, tmpOut); err != nil {
		return nil, err
	}
	artifact := func() (image.Artifact, error) { return image.FileArtifact(filepath.Base(out), tmpOut, "") }
	if b.format.Sparse() {
		artifact = func() (image.Artifact, error) { return image.DiskArtifact(ctx, filepath.Base(out), tmpOut) }
	}
	disk, err := artifact()
	if err != nil {
		return nil, err
	}
	m.Outputs = append([]image.Artifact{disk}, boot.Outputs...)
	return m, place(m, tmpOut, out, manifest)
}

// place moves the image tmp to out and writes its manifest m.
func place(m *image.Manifest, tmp, out, manifest string) error {
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	return m.Write(manifest)
}

// sandboxImage writes the pod sandbox image, the pause binary alone, as an
// image archive named layout.SandboxImage.
func sandboxImage(pauseBin, out string, epoch int64) error {
	bin, err := os.ReadFile(pauseBin)
	if err != nil {
		return err
	}
	img, err := oci.BinaryImage(bin, "/pause", time.Unix(epoch, 0).UTC())
	if err != nil {
		return fmt.Errorf("sandbox image: %w", err)
	}
	return oci.WriteArchive(img, layout.SandboxImage, out)
}

// stager returns a func that reports each stage as it starts, with the
// time since the build started, and how long the stage before it took. A
// stage named "done…" ends the build. It may be called from several
// goroutines: a stage lasts until the next one starts.
func stager(progress func(string)) func(string) {
	start := time.Now()
	var mu sync.Mutex
	var open string // the stage running, if any
	var openAt time.Time
	return func(name string) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		at := fmt.Sprintf("[%5.1fs]", now.Sub(start).Seconds())
		if open != "" {
			progress(fmt.Sprintf("%s   %s took %s", at, open, now.Sub(openAt).Round(time.Millisecond)))
		}
		progress(at + " " + name)
		open, openAt = name, now
		if strings.HasPrefix(name, "done") {
			open = ""
		}
	}
}
