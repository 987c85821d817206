package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/rootfs"
)

// bootParts are what a Cairn disk boots from, the same for every machine
// config of the same kernel arguments and modules: the UKI, and the EFI
// system partition holding it and systemd-boot.
type bootParts struct {
	UKI, ESP string
	// Outputs are the manifest's entries of the UKI ("uki") and of what
	// it holds ("initramfs", "rootfs.sqsh"), in that order.
	Outputs []image.Artifact
}

// The cache keeps the boot parts of the cachedBoots most recent builds,
// each in a directory named by the digest of all that made them.
const cachedBoots = 6

// Files of a cache entry.
const (
	ukiFile     = "cairn.efi"
	espFile     = "esp.img"
	outputsFile = "outputs.json" // written last: an entry without it is not one
)

// boot returns the boot parts for c's kernel arguments and modules: from
// an earlier build of this builder or from the cache, or built now. Each
// digest is built once, however many images ask for it at once.
func (b *builder) boot(ctx context.Context, c *nodeConfig, stage func(string)) (*bootParts, error) {
	if err := checkModules(b.kernel, c.Machine.Kernel); err != nil {
		return nil, err
	}
	cmdline := kernelCmdline(c.Machine.Kernel)
	modules := slices.Concat(systemModules(), c.Machine.Kernel.Modules)
	// The ESP's seed is the digest of the inputs that go into it; the
	// cache's key adds what builds them, so that a new builder never
	// takes the parts an older one made.
	h := sha256.New()
	for _, a := range b.inputs {
		fmt.Fprintf(h, "%s=%s\n", a.Name, a.SHA256)
	}
	fmt.Fprintf(h, "cmdline=%s\nmodules=%s\nepoch=%d\nversion=%s\n", cmdline, strings.Join(modules, ","), b.o.SourceDateEpoch, version.Version)
	seed := h.Sum(nil)
	key := sha256.Sum256(append(seed, b.program...))
	id := hex.EncodeToString(key[:])

	b.mu.Lock()
	bb := b.boots[id]
	if bb == nil {
		bb = &bootBuild{done: make(chan struct{})}
		b.boots[id] = bb
		b.mu.Unlock()
		bb.parts, bb.err = b.buildBoot(ctx, id, seed, cmdline, modules, stage)
		close(bb.done)
	} else {
		b.mu.Unlock()
	}
	select {
	case <-bb.done:
		return bb.parts, bb.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// buildBoot takes the boot parts of id from the cache, or builds them into
// it; with NoCache, into the builder's scratch directory.
func (b *builder) buildBoot(ctx context.Context, id string, seed []byte, cmdline string, modules []string, stage func(string)) (*bootParts, error) {
	cache := filepath.Join(b.o.CacheDir, "boot")
	entry := filepath.Join(cache, id)
	if !b.o.NoCache {
		parts, err := readBootParts(entry)
		if err == nil {
			stage("boot parts from the cache: " + id[:12])
			now := time.Now()
			os.Chtimes(entry, now, now) // the most recent is kept longest
			return parts, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || fileExists(entry) {
			b.o.Progress(fmt.Sprintf("boot parts in the cache damaged (%v): building them again", err))
			if err := os.RemoveAll(entry); err != nil {
				return nil, fmt.Errorf("boot parts: %w", err)
			}
		}
	}
	dir := cache
	if b.o.NoCache {
		dir = b.scratch
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(dir, ".new-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work) // gone once renamed into place
	if err := b.writeBoot(ctx, work, seed, cmdline, modules, stage); err != nil {
		return nil, err
	}
	if b.o.NoCache {
		entry = filepath.Join(dir, id)
	}
	if err := os.Rename(work, entry); err != nil && !errors.Is(err, fs.ErrExist) { // ENOTEMPTY too
		return nil, fmt.Errorf("boot parts: %w", err)
	}
	// Another build may have put the same parts there first: the same bytes.
	parts, err := readBootParts(entry)
	if err != nil {
		return nil, err
	}
	if !b.o.NoCache {
		pruneBoots(cache, entry)
	}
	return parts, nil
}

// writeBoot builds the UKI and the ESP into dir, with what they hold, and
// then their manifest entries.
func (b *builder) writeBoot(ctx context.Context, dir string, seed []byte, cmdline string, modules []string, stage func(string)) error {
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return err
	}
	stage("build the pod sandbox image")
	sandbox := filepath.Join(work, "pause.tar")
	if err := sandboxImage(b.o.asset("pause"), sandbox, b.o.SourceDateEpoch); err != nil {
		return err
	}

	stage("build root filesystem and initramfs")
	osRelease := []byte(fmt.Sprintf("NAME=\"Cairn\"\nID=cairn\nVERSION_ID=%s\nIMAGE_VERSION=%s\nPRETTY_NAME=\"Cairn %s\"\n",
		version.Version, version.Version, version.Version))
	var tools []string
	for _, t := range hostTools() {
		tools = append(tools, t.path)
	}
	parts, err := rootfs.Build(ctx, rootfs.Spec{
		Kernel:          b.kernel,
		Stage1:          b.o.asset("init-stage1"),
		Node:            b.o.asset("init"),
		Components:      b.o.Assets,
		HostTools:       tools,
		OSRelease:       osRelease,
		CABundle:        caBundlePath,
		SandboxImage:    sandbox,
		BootModules:     bootModules(),
		SystemModules:   modules,
		SourceDateEpoch: b.o.SourceDateEpoch,
	}, work, b.o.Progress)
	if err != nil {
		return err
	}

	stage("write UKI")
	uki := filepath.Join(dir, ukiFile)
	unsigned := uki
	keys := b.o.SecureBoot
	if keys != "" {
		unsigned = filepath.Join(work, "unsigned.efi")
	}
	if err := image.WriteUKI(unsigned, image.UKI{
		Stub:      stubPath,
		OSRelease: osRelease,
		Cmdline:   []byte(cmdline),
		Linux:     b.kernel.Vmlinuz,
		Initrd:    parts.Initramfs,
	}); err != nil {
		return err
	}
	esp := image.ESP{
		Bootloader:      bootloaderPath,
		UKIs:            map[string]string{"cairn-" + version.Version + ".efi": uki},
		SourceDateEpoch: b.o.SourceDateEpoch,
		Seed:            seed,
	}
	if keys != "" {
		stage("sign systemd-boot and the UKI for Secure Boot")
		esp.Bootloader = filepath.Join(work, "BOOTX64.EFI")
		if err := keys.SignPE(bootloaderPath, esp.Bootloader); err != nil {
			return err
		}
		if err := keys.SignPE(unsigned, uki); err != nil {
			return err
		}
		if esp.Enroll, err = keys.WriteEnrollment(ctx, work, b.o.SourceDateEpoch); err != nil {
			return err
		}
	}

	stage("write EFI system partition")
	if err := image.WriteESP(ctx, esp, filepath.Join(dir, espFile)); err != nil {
		return err
	}

	var outputs []image.Artifact
	for _, f := range [][2]string{{"uki", uki}, {"initramfs", parts.Initramfs}, {"rootfs.sqsh", parts.SquashFS}} {
		a, err := image.FileArtifact(f[0], f[1], "")
		if err != nil {
			return err
		}
		outputs = append(outputs, a)
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	data, err := json.Marshal(outputs)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, outputsFile), data, 0o644)
}

// readBootParts reads the cache entry in dir.
func readBootParts(dir string) (*bootParts, error) {
	data, err := os.ReadFile(filepath.Join(dir, outputsFile))
	if err != nil {
		return nil, err
	}
	parts := &bootParts{UKI: filepath.Join(dir, ukiFile), ESP: filepath.Join(dir, espFile)}
	if err := json.Unmarshal(data, &parts.Outputs); err != nil || len(parts.Outputs) != 3 {
		return nil, fmt.Errorf("boot parts in %s: damaged outputs list (%v)", dir, err)
	}
	for _, f := range []string{parts.UKI, parts.ESP} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("boot parts: %w", err)
		}
	}
	return parts, nil
}

// pruneBoots removes the entries of cache but the cachedBoots most
// recently used, and never keep.
func pruneBoots(cache, keep string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type used struct {
		path string
		at   time.Time
	}
	var all []used
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		all = append(all, used{filepath.Join(cache, e.Name()), info.ModTime()})
	}
	slices.SortFunc(all, func(a, b used) int { return b.at.Compare(a.at) })
	for i, u := range all {
		if i >= cachedBoots && u.path != keep {
			os.RemoveAll(u.path)
		}
	}
}

// fileExists says whether there is a file at path.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// copyFile copies src to a new file dst.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}
