package stage2

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/image/oci"
	"github.com/cairn-os/cairn/internal/bootentry"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// espDir is an ESP that is a directory of the test: mounting it is a
// no-op, and it counts its mounts.
type espDir struct {
	root           string
	mu             sync.Mutex
	mounts, writes int
}

func (e *espDir) mount(writable bool) (string, func() error, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mounts++
	if writable {
		e.writes++
	}
	return e.root, func() error { return nil }, nil
}

// files lists EFI/Linux.
func (e *espDir) files(t *testing.T) []string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(e.root, bootentry.Dir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// testBoots is a node's boots over an ESP holding the UKIs named, each
// the UKI of its version, with the upgrade record and spool in the test's
// directory; reboots counts what asked for a reboot.
type testBoots struct {
	*boots
	esp     *espDir
	reboots []string
}

func newTestBoots(t *testing.T, esp *espDir, stateDir, running string) *testBoots {
	tb := &testBoots{esp: esp}
	tb.boots = &boots{esp: esp, recordPath: filepath.Join(stateDir, "upgrade.json"), spoolDir: filepath.Join(stateDir, "spool"),
		running: running, reboot: func(why string) { tb.reboots = append(tb.reboots, why) }}
	return tb
}

// writeUKI writes a UKI of version v with a kernel of kernelSize bytes.
func writeUKI(t *testing.T, path, v string, kernelSize int) {
	t.Helper()
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	if err := os.WriteFile(kernel, bytes.Repeat([]byte{'k'}, kernelSize), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("initrd of "+v), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := image.WriteUKI(path, image.UKI{Stub: "/usr/lib/systemd/boot/efi/linuxx64.efi.stub",
		OSRelease: []byte("ID=cairn\nVERSION_ID=" + v + "\nIMAGE_VERSION=" + v + "\n"), Cmdline: []byte("quiet"),
		Linux: kernel, Initrd: initrd}); err != nil {
		t.Fatal(err)
	}
}

func newESP(t *testing.T, root string, names ...string) *espDir {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, bootentry.Dir), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		e, _ := bootentry.Parse(n)
		writeUKI(t, filepath.Join(root, bootentry.Dir, n), e.Version, 1000)
	}
	return &espDir{root: root}
}

// upgrade sends the UKI at path through init's control socket.
func upgrade(t *testing.T, c machine.InitClient, path string, h *machine.UpgradeHeader) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := c.Upgrade(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	_, err = client.SendUKI(stream, path, h, func(p *machine.UpgradeProgress) { steps = append(steps, p.Step) })
	return steps, err
}

// TestUpgrade writes a new UKI through the control socket, beside the
// running one and in place of any other, on trial, and reboots; what is
// refused writes nothing.
func TestUpgrade(t *testing.T) {
	dir := t.TempDir()
	esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi", "cairn-0.0.9.efi")
	b := newTestBoots(t, esp, dir, "0.1.0")
	if err := b.check(); err != nil {
		t.Fatal(err)
	}
	if s := b.Status(); s.Entry != "cairn-0.1.0.efi" || !s.Blessed || s.Other != "cairn-0.0.9.efi" || s.Pending != "" {
		t.Errorf("Status at boot = %v, want cairn-0.1.0.efi blessed, the other cairn-0.0.9.efi", s)
	}
	c := controlClient(t, &node{boots: b.boots})
	uki := func(v string, kernelSize int) string {
		p := filepath.Join(t.TempDir(), "node.efi")
		writeUKI(t, p, v, kernelSize)
		return p
	}
	notUKI := filepath.Join(t.TempDir(), "not-a-uki.efi")
	if err := os.WriteFile(notUKI, []byte("MZ but nothing else"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := esp.files(t)

	refused := []struct {
		name, path string
		h          *machine.UpgradeHeader
		code       codes.Code
		want       string
	}{
		{"older", uki("0.0.10", 1000), &machine.UpgradeHeader{}, codes.FailedPrecondition, "older than the running 0.1.0"},
		{"same", uki("0.1.0", 1000), &machine.UpgradeHeader{}, codes.FailedPrecondition, "the same as the running 0.1.0"},
		{"not a UKI", notUKI, &machine.UpgradeHeader{}, codes.InvalidArgument, "not a PE image"},
		{"too many tries", uki("0.2.0", 1000), &machine.UpgradeHeader{Tries: 11}, codes.InvalidArgument, "tries 11"},
		{"short health timeout", uki("0.2.0", 1000), &machine.UpgradeHeader{HealthTimeout: durationpb.New(time.Second)}, codes.InvalidArgument, "at least 10s"},
	}
	for _, r := range refused {
		if _, err := upgrade(t, c, r.path, r.h); status.Code(err) != r.code || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: Upgrade = %v, want %v with %q", r.name, err, r.code, r.want)
		}
	}

	// A digest that does not match: the header is sent by hand.
	ctx := context.Background()
	stream, err := c.Upgrade(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := uki("0.2.0", 1000)
	data, _ := os.ReadFile(good)
	stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Header{Header: &machine.UpgradeHeader{Size: uint64(len(data)), Sha256: strings.Repeat("ab", 32)}}})
	stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Chunk{Chunk: data}})
	stream.CloseSend()
	for err = nil; err == nil; _, err = stream.Recv() {
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("Upgrade with a wrong digest = %v, want InvalidArgument naming the SHA-256", err)
	}

	// Held, then abandoned: the caller's stream ends after verified.
	held := func(proceed bool) ([]string, error) {
		stream, err := c.Upgrade(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Header{Header: &machine.UpgradeHeader{Size: uint64(len(data)), Sha256: sha256Hex(data), Hold: true}}})
		stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Chunk{Chunk: data}})
		var steps []string
		for {
			p, err := stream.Recv()
			if err != nil {
				return steps, err
			}
			if steps = append(steps, p.Step); p.Step == "verified" {
				if proceed {
					stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Proceed{Proceed: true}})
				}
				stream.CloseSend()
			}
		}
	}
	if steps, err := held(false); status.Code(err) != codes.Aborted || !slices.Equal(steps, []string{"received", "verified"}) {
		t.Errorf("Upgrade held and abandoned = steps %v, %v; want received, verified, then Aborted", steps, err)
	}

	// One at a time: an upgrade under way refuses another.
	if err := b.lock("an upgrade to 0.3.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := upgrade(t, c, good, &machine.UpgradeHeader{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "an upgrade to 0.3.0 since") {
		t.Errorf("Upgrade during another = %v, want FailedPrecondition naming the other", err)
	}
	b.mu.Unlock()

	if after := esp.files(t); !slices.Equal(after, before) || esp.writes != 0 || len(b.reboots) != 0 {
		t.Fatalf("refused upgrades left EFI/Linux %v (was %v), %d writable mounts, reboots %v", after, before, esp.writes, b.reboots)
	}
	if _, err := os.Stat(b.recordPath); !os.IsNotExist(err) {
		t.Errorf("a refused upgrade wrote the record: %v", err)
	}
	if spooled, _ := os.ReadDir(b.spoolDir); len(spooled) != 0 {
		t.Errorf("refused upgrades left %d files in the spool", len(spooled))
	}

	steps, err := upgrade(t, c, good, &machine.UpgradeHeader{Tries: 2, HealthTimeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"received", "verified", "written", "rebooting"}; !slices.Equal(steps, want) {
		t.Errorf("upgrade steps %v, want %v", steps, want)
	}
	if got, want := esp.files(t), []string{"cairn-0.1.0.efi", "cairn-0.2.0+2.efi"}; !slices.Equal(got, want) {
		t.Errorf("EFI/Linux after the upgrade = %v, want %v: the running UKI and the new one on trial", got, want)
	}
	if written, _ := os.ReadFile(filepath.Join(esp.root, bootentry.Dir, "cairn-0.2.0+2.efi")); !bytes.Equal(written, data) {
		t.Error("the UKI written differs from the one sent")
	}
	if len(b.reboots) != 1 {
		t.Errorf("reboots %v, want one", b.reboots)
	}
	var rec upgradeRecord
	raw, _ := os.ReadFile(b.recordPath)
	if err := json.Unmarshal(raw, &rec); err != nil || rec.From != "0.1.0" || rec.To != "0.2.0" || rec.Tries != 2 || rec.HealthTimeout != time.Minute {
		t.Errorf("record %s (%v), want 0.1.0 → 0.2.0, 2 tries of 1m", raw, err)
	}
	if s := b.Status(); !strings.Contains(s.Pending, "cairn-0.2.0+2.efi staged") {
		t.Errorf("Status().Pending = %q after the upgrade", s.Pending)
	}

	// Held, then told to proceed: written again, with the default tries.
	if steps, err := held(true); !errors.Is(err, io.EOF) || !slices.Equal(steps, []string{"received", "verified", "written", "rebooting"}) {
		t.Errorf("Upgrade held, then proceeding = steps %v, %v; want received, verified, written, rebooting", steps, err)
	}
	if got, want := esp.files(t), []string{"cairn-0.1.0.efi", "cairn-0.2.0+3.efi"}; !slices.Equal(got, want) || len(b.reboots) != 2 {
		t.Errorf("EFI/Linux after the held upgrade = %v, want %v, and a second reboot (%v)", got, want, b.reboots)
	}
}

// TestUpgradeESPFull: a UKI the ESP has no room for, even without the
// entry it would replace, is refused with nothing removed or written.
func TestUpgradeESPFull(t *testing.T) {
	need.Root(t, "mount a small tmpfs as the ESP")
	dir := t.TempDir()
	root := filepath.Join(dir, "esp")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	esp := newESP(t, root, "cairn-0.1.0.efi", "cairn-0.0.9.efi")
	b := newTestBoots(t, esp, dir, "0.1.0")
	c := controlClient(t, &node{boots: b.boots})
	big := filepath.Join(t.TempDir(), "big.efi")
	writeUKI(t, big, "0.2.0", 2<<20)
	before := esp.files(t)
	if _, err := upgrade(t, c, big, &machine.UpgradeHeader{}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "nothing written") {
		t.Errorf("Upgrade onto a full ESP = %v, want ResourceExhausted, nothing written", err)
	}
	if after := esp.files(t); !slices.Equal(after, before) || len(b.reboots) != 0 {
		t.Errorf("EFI/Linux %v (was %v), reboots %v", after, before, b.reboots)
	}
}

// TestBlessAndRollBack: the boot of a new UKI blesses it once healthy; one
// that is not healthy in time records why and reboots, and the old UKI's
// boot that follows reports the rollback; a rollback asked for marks the
// running UKI spent and reboots into the other.
func TestBlessAndRollBack(t *testing.T) {
	healthy := func() bool { return true }
	never := func() bool { return false }
	record := func(t *testing.T, path string, r upgradeRecord) {
		data, _ := json.Marshal(r)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("healthy", func(t *testing.T) {
		dir := t.TempDir()
		// systemd-boot renamed +2 to +1-1 as it booted it.
		esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi", "cairn-0.2.0+1-1.efi")
		b := newTestBoots(t, esp, dir, "0.2.0")
		record(t, b.recordPath, upgradeRecord{From: "0.1.0", To: "0.2.0", Tries: 2, HealthTimeout: time.Minute})
		if err := b.check(); err != nil {
			t.Fatal(err)
		}
		if s := b.Status(); s.Blessed || !strings.Contains(s.Pending, "on trial: boot 1 of 2") {
			t.Errorf("Status on trial = %v", s)
		}
		c := controlClient(t, &node{boots: b.boots})
		if _, err := upgrade(t, c, filepath.Join(esp.root, bootentry.Dir, "cairn-0.1.0.efi"), &machine.UpgradeHeader{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "on trial") {
			t.Errorf("Upgrade while on trial = %v, want FailedPrecondition", err)
		}
		b.blessIfHealthy(healthy, nil)
		if got, want := esp.files(t), []string{"cairn-0.1.0.efi", "cairn-0.2.0.efi"}; !slices.Equal(got, want) {
			t.Errorf("EFI/Linux after blessing = %v, want %v", got, want)
		}
		if s := b.Status(); !s.Blessed || s.Entry != "cairn-0.2.0.efi" || s.Pending != "" || len(b.reboots) != 0 {
			t.Errorf("Status after blessing = %v, reboots %v", s, b.reboots)
		}

		// Then a rollback: 0.2.0 spent, 0.1.0 boots.
		resp, err := c.Rollback(context.Background(), &machine.RollbackRequest{})
		if err != nil || resp.From != "0.2.0" || resp.To != "0.1.0" {
			t.Fatalf("Rollback = %v, %v", resp, err)
		}
		if got, want := esp.files(t), []string{"cairn-0.1.0.efi", "cairn-0.2.0+0-1.efi"}; !slices.Equal(got, want) || len(b.reboots) != 1 {
			t.Errorf("EFI/Linux after Rollback = %v, want %v; reboots %v", got, want, b.reboots)
		}
		old := newTestBoots(t, esp, dir, "0.1.0")
		if err := old.check(); err != nil {
			t.Fatal(err)
		}
		if s := old.Status(); s.RolledBackFrom != "0.2.0" || !strings.Contains(s.RollbackReason, "cairn node rollback") || !s.Blessed {
			t.Errorf("Status after the rollback's boot = %v", s)
		}
		// Nothing good to go back to now.
		if _, err := controlClient(t, &node{boots: old.boots}).Rollback(context.Background(), &machine.RollbackRequest{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "did not become healthy") {
			t.Errorf("Rollback to a spent UKI = %v, want FailedPrecondition", err)
		}
	})

	t.Run("unhealthy", func(t *testing.T) {
		dir := t.TempDir()
		esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi", "cairn-0.2.0+0-1.efi")
		b := newTestBoots(t, esp, dir, "0.2.0")
		record(t, b.recordPath, upgradeRecord{From: "0.1.0", To: "0.2.0", Tries: 1, HealthTimeout: 50 * time.Millisecond})
		if err := b.check(); err != nil {
			t.Fatal(err)
		}
		b.blessIfHealthy(never, nil)
		if len(b.reboots) != 1 {
			t.Fatalf("reboots %v, want one after the health timeout", b.reboots)
		}
		if got, want := esp.files(t), []string{"cairn-0.1.0.efi", "cairn-0.2.0+0-1.efi"}; !slices.Equal(got, want) {
			t.Errorf("EFI/Linux = %v, want %v: not blessed", got, want)
		}
		// systemd-boot then boots 0.1.0, the only entry with boots left.
		old := newTestBoots(t, esp, dir, "0.1.0")
		if err := old.check(); err != nil {
			t.Fatal(err)
		}
		s := old.Status()
		if s.RolledBackFrom != "0.2.0" || !strings.Contains(s.RollbackReason, "did not become healthy (containerd and cairn-agent Ready) within 50ms") {
			t.Errorf("Status after falling back = %v, want rolled back from 0.2.0 with the reason", s)
		}
	})

	t.Run("only one", func(t *testing.T) {
		dir := t.TempDir()
		esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi")
		b := newTestBoots(t, esp, dir, "0.1.0")
		if _, err := b.Rollback("test"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "only one") {
			t.Errorf("Rollback with one UKI = %v", err)
		}
		if len(b.reboots) != 0 {
			t.Errorf("reboots %v", b.reboots)
		}
	})
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestUpgradeFromRegistry pushes a UKI to a real registry as an OCI
// artifact (cairn image push) and upgrades to it by reference: init pulls
// it with a real containerd, checks it and writes it as it does a UKI sent
// on the stream. A reference that does not pull is refused, nothing
// written.
func TestUpgradeFromRegistry(t *testing.T) {
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi")
	b := newTestBoots(t, esp, dir, "0.1.0")
	b.pull = pullUKI(rt.Socket, filepath.Join(rt.Dir, "certs.d"))
	if err := b.check(); err != nil {
		t.Fatal(err)
	}
	c := controlClient(t, &node{boots: b.boots})
	uki := filepath.Join(t.TempDir(), "node.efi")
	writeUKI(t, uki, "0.2.0", 1<<20)
	ctx := context.Background()
	ref := reg.Addr + "/cairn/node:0.2.0"
	if _, err := oci.PushUKI(ctx, uki, ref, true); err != nil {
		t.Fatal(err)
	}
	upgradeRef := func(h *machine.UpgradeHeader) ([]string, error) {
		stream, err := c.Upgrade(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var steps []string
		_, err = client.SendRef(stream, h, func(p *machine.UpgradeProgress) { steps = append(steps, p.Step) })
		return steps, err
	}

	if _, err := upgradeRef(&machine.UpgradeHeader{ImageRef: reg.Addr + "/cairn/node:none"}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cairn/node:none") {
		t.Errorf("Upgrade from a reference that is not there = %v, want Unavailable naming it", err)
	}
	if _, err := upgradeRef(&machine.UpgradeHeader{ImageRef: ref, Size: 10}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Upgrade by reference with a size = %v, want InvalidArgument", err)
	}
	if got := esp.files(t); !slices.Equal(got, []string{"cairn-0.1.0.efi"}) || len(b.reboots) != 0 {
		t.Fatalf("refused upgrades left EFI/Linux %v, reboots %v", got, b.reboots)
	}

	steps, err := upgradeRef(&machine.UpgradeHeader{ImageRef: ref})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"received", "verified", "written", "rebooting"}; !slices.Equal(steps, want) {
		t.Errorf("upgrade steps %v, want %v", steps, want)
	}
	want, _ := os.ReadFile(uki)
	if got, _ := os.ReadFile(filepath.Join(esp.root, bootentry.Dir, "cairn-0.2.0+3.efi")); !bytes.Equal(got, want) {
		t.Error("the UKI written differs from the one pushed")
	}
}
