package stage2

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/containers"
	"github.com/cairn-os/cairn/internal/atomicfile"
	"github.com/cairn-os/cairn/internal/authenticode"
	"github.com/cairn-os/cairn/internal/bootentry"
)

const (
	// defaultHealthTimeout is how long a boot of a new UKI has to become
	// healthy when the upgrade does not say.
	defaultHealthTimeout = 5 * time.Minute
	// maxUKISize bounds what an upgrade receives, in memory's tmpfs.
	maxUKISize = 1 << 30
	// maxTries bounds the boots a new UKI may get.
	maxTries = 10
	// progressEvery is how often, in bytes received, an upgrade reports.
	progressEvery = 16 << 20
	// espSlack is the room left free on the ESP after a UKI is written.
	espSlack = 1 << 20
)

// esp is the EFI system partition, mounted only while it is read or
// written: the running system never depends on it.
type esp interface {
	// mount mounts it and returns its root and how to unmount it, which
	// flushes what was written.
	mount(writable bool) (root string, unmount func() error, err error)
}

// upgradeRecord is kept in STATE from an upgrade or rollback on, so that
// the boots that follow know what they are: the new UKI on trial, or the
// old one after a rollback, and why.
type upgradeRecord struct {
	From, To      string
	Tries         int
	HealthTimeout time.Duration
	// Failures says, boot by boot, why the new UKI did not become healthy.
	Failures []string `json:",omitempty"`
	// Rollback is set for a rollback asked through the API: why.
	Rollback string `json:",omitempty"`
}

// boots are the node's UKIs on the ESP: upgrades write a new one beside
// the running one, its boot blesses it, a rollback goes back to the other.
type boots struct {
	esp esp
	// recordPath is the upgradeRecord's file in STATE.
	recordPath string
	// spoolDir holds a UKI while it is received and checked (a tmpfs).
	spoolDir string
	// pull copies to w the UKI of an OCI artifact in a registry and
	// returns its size and digest ("sha256:…"); nil where the node has
	// no containerd to pull with.
	pull func(ctx context.Context, ref string, w io.Writer) (size int64, digest string, err error)
	// running is the version this boot runs.
	running string
	// efivars is where the firmware's variables are (efivarsDir); ""
	// reads none.
	efivars string
	// reboot asks for a clean reboot.
	reboot func(why string)
	// note records an event (kind, subject, message); nil records none.
	note func(kind, subject, message string)

	// mu is held by the upgrade or rollback under way: one at a time.
	mu sync.Mutex
	// guard guards what follows; never held across I/O.
	guard sync.Mutex
	// busy is what holds mu and since when, for those refused.
	busy      string
	busySince time.Time
	state     *machine.BootState
	// trial is the record of the upgrade this boot is on trial for; nil
	// when it is not on trial.
	trial *upgradeRecord
}

// event records an upgrade event about the UKI entry.
func (b *boots) event(entry, message string) {
	if b.note != nil {
		b.note("upgrade", entry, message)
	}
}

// Status returns the boot state.
func (b *boots) Status() *machine.BootState {
	b.guard.Lock()
	defer b.guard.Unlock()
	if b.state == nil {
		return &machine.BootState{Error: "the boot entries are not read yet"}
	}
	return proto.CloneOf(b.state)
}

func (b *boots) update(f func(s *machine.BootState)) {
	b.guard.Lock()
	defer b.guard.Unlock()
	if b.state == nil {
		b.state = &machine.BootState{}
	}
	f(b.state)
}

// lock takes mu for what, or says what holds it.
func (b *boots) lock(what string) error {
	if !b.mu.TryLock() {
		b.guard.Lock()
		defer b.guard.Unlock()
		return status.Errorf(codes.FailedPrecondition, "refused: %s since %s is in progress", b.busy, b.busySince.UTC().Format(time.TimeOnly))
	}
	b.guard.Lock()
	b.busy, b.busySince = what, time.Now()
	b.guard.Unlock()
	return nil
}

// entries lists the Cairn UKIs in the ESP mounted at root.
func entries(root string) ([]bootentry.Entry, error) {
	des, err := os.ReadDir(filepath.Join(root, bootentry.Dir))
	if err != nil {
		return nil, err
	}
	var es []bootentry.Entry
	for _, de := range des {
		if e, ok := bootentry.Parse(de.Name()); ok && de.Type().IsRegular() {
			es = append(es, e)
		}
	}
	return es, nil
}

// split finds the running entry among es and the other, newest first.
func (b *boots) split(es []bootentry.Entry) (running bootentry.Entry, others []bootentry.Entry, ok bool) {
	for _, e := range es {
		if e.Version == b.running && !ok {
			running, ok = e, true
		} else {
			others = append(others, e)
		}
	}
	return running, others, ok
}

func (b *boots) readRecord() (*upgradeRecord, error) {
	data, err := os.ReadFile(b.recordPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r upgradeRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", b.recordPath, err)
	}
	return &r, nil
}

func (b *boots) writeRecord(r *upgradeRecord) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(b.recordPath, append(data, '\n'), 0o600)
}

// check reads the ESP and the record at boot: which UKI booted, whether it
// is on trial, whether the node went back from another.
func (b *boots) check() error {
	root, unmount, err := b.esp.mount(false)
	if err != nil {
		b.update(func(s *machine.BootState) { s.Error = err.Error() })
		return err
	}
	es, err := entries(root)
	err = errors.Join(err, unmount())
	if err != nil {
		err = fmt.Errorf("read the EFI system partition: %w", err)
		b.update(func(s *machine.BootState) { s.Error = err.Error() })
		return err
	}
	rec, err := b.readRecord()
	running, others, found := b.split(es)
	st := &machine.BootState{}
	if found {
		st.Entry, st.Blessed = running.Name(), !running.Counting
	} else {
		st.Error = fmt.Sprintf("no UKI of the running version %s in %s", b.running, bootentry.Dir)
	}
	if len(others) > 0 {
		st.Other = others[0].Name()
	}
	var trial *upgradeRecord
	switch {
	case err != nil:
		st.Error = err.Error()
	case rec == nil:
		if found && running.Counting { // written, but the record was lost
			trial = &upgradeRecord{To: b.running, Tries: running.Left + running.Done, HealthTimeout: defaultHealthTimeout}
		}
	case rec.Rollback != "" && rec.To == b.running:
		st.RolledBackFrom, st.RollbackReason = rec.From, rec.Rollback
	case rec.Rollback == "" && rec.To == b.running && found && running.Counting:
		trial = rec
	case rec.Rollback == "" && rec.From == b.running && hasVersion(others, rec.To):
		st.RolledBackFrom = rec.To
		st.RollbackReason = fmt.Sprintf("its %d boots did not become healthy", rec.Tries)
		if n := len(rec.Failures); n > 0 {
			st.RollbackReason += ": " + rec.Failures[n-1]
		} else {
			st.RollbackReason += ": none reached init"
		}
	}
	if b.efivars != "" {
		on, err := secureBootEnabled(b.efivars)
		if err != nil && st.Error != "" {
			st.Error += "; " + err.Error()
		} else if err != nil {
			st.Error = err.Error()
		}
		st.SecureBoot = on
		slog.Info("Secure Boot", "enforced", on)
	}
	if trial != nil {
		st.Pending = fmt.Sprintf("%s on trial: boot %d of %d, blessed once healthy within %s", running.Name(), running.Done, trial.Tries, trial.HealthTimeout)
	}
	if st.RolledBackFrom != "" {
		slog.Warn("the node went back to the previous UKI", "from", st.RolledBackFrom, "to", b.running, "reason", st.RollbackReason)
		b.event(st.Entry, fmt.Sprintf("booted after a rollback from %s: %s", st.RolledBackFrom, st.RollbackReason))
	}
	if trial != nil {
		b.event(st.Entry, st.Pending)
	}
	b.guard.Lock()
	b.state, b.trial = st, trial
	b.guard.Unlock()
	return nil
}

func hasVersion(es []bootentry.Entry, v string) bool {
	for _, e := range es {
		if e.Version == v {
			return true
		}
	}
	return false
}

// blessIfHealthy blesses the running UKI once healthy, when this boot is
// its trial; if it is not healthy in time, it records why and reboots:
// systemd-boot counts the boot, and goes back to the previous UKI once
// the new one's tries are spent.
func (b *boots) blessIfHealthy(healthy func() bool, stop <-chan struct{}) {
	b.guard.Lock()
	trial := b.trial
	b.guard.Unlock()
	if trial == nil {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	timeout := time.After(trial.HealthTimeout)
	for !healthy() {
		select {
		case <-stop:
			return
		case <-timeout:
			why := fmt.Sprintf("%s did not become healthy (containerd and cairn-agent Ready) within %s", b.running, trial.HealthTimeout)
			slog.Error(why + ": rebooting; systemd-boot counts the boot")
			if trial.From != "" { // a record in STATE to add to
				trial.Failures = append(trial.Failures, why)
				if err := b.writeRecord(trial); err != nil {
					slog.Error("the upgrade record not updated", "err", err)
				}
			}
			b.update(func(s *machine.BootState) { s.Pending = why + ": rebooting" })
			b.event(b.running, why+": rebooting")
			b.reboot(why)
			return
		case <-tick.C:
		}
	}
	if err := b.lock("blessing " + b.running); err != nil {
		slog.Error("not blessed", "err", err)
		return
	}
	defer b.mu.Unlock()
	name, err := b.bless()
	if err != nil {
		slog.Error("the running UKI is healthy but could not be blessed: it stays on trial", "err", err)
		b.update(func(s *machine.BootState) { s.Error = "bless: " + err.Error() })
		return
	}
	slog.Info("the running UKI is healthy: blessed", "entry", name)
	b.event(name, "healthy: blessed")
	b.guard.Lock()
	b.trial = nil
	b.state.Entry, b.state.Blessed, b.state.Pending = name, true, ""
	b.guard.Unlock()
}

// bless drops the running entry's boot counter: systemd-boot boots it
// from now on, for good.
func (b *boots) bless() (string, error) {
	root, unmount, err := b.esp.mount(true)
	if err != nil {
		return "", err
	}
	name, err := func() (string, error) {
		es, err := entries(root)
		if err != nil {
			return "", err
		}
		running, _, ok := b.split(es)
		if !ok {
			return "", fmt.Errorf("no UKI of version %s in %s", b.running, bootentry.Dir)
		}
		dir := filepath.Join(root, bootentry.Dir)
		blessed := running.Blessed().Name()
		if err := os.Rename(filepath.Join(dir, running.Name()), filepath.Join(dir, blessed)); err != nil {
			return "", err
		}
		return blessed, atomicfile.SyncDir(dir)
	}()
	return name, errors.Join(err, unmount())
}

// Upgrade receives a UKI, checks it, and writes it beside the running
// one, on trial; then reboots into it unless staged.
func (b *boots) Upgrade(stream grpc.BidiStreamingServer[machine.UpgradeRequest, machine.UpgradeProgress]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if err := checkHeader(h); err != nil {
		return status.Errorf(codes.InvalidArgument, "upgrade refused, nothing written: %v", err)
	}
	b.guard.Lock()
	onTrial := b.trial != nil
	b.guard.Unlock()
	if onTrial {
		return status.Errorf(codes.FailedPrecondition, "upgrade refused: the running UKI %s is on trial until it is healthy; see `cairn node version`", b.running)
	}
	if err := b.lock("an upgrade"); err != nil {
		return err
	}
	defer b.mu.Unlock()
	spool, info, err := b.receive(stream, h)
	if spool != "" {
		defer os.Remove(spool)
	}
	if err != nil {
		return err
	}
	b.guard.Lock()
	b.busy = "an upgrade to " + info.Version
	b.guard.Unlock()
	// Held, the caller (the agent draining the node) says when to write.
	if h.Hold {
		if req, err := stream.Recv(); err != nil || !req.GetProceed() {
			slog.Info("upgrade abandoned before anything was written", "version", info.Version, "err", err)
			return status.Errorf(codes.Aborted, "upgrade to %s abandoned by the caller, nothing written", info.Version)
		}
	}
	tries := int(h.Tries)
	if tries == 0 {
		tries = bootentry.DefaultTries
	}
	timeout := h.HealthTimeout.AsDuration()
	if h.HealthTimeout == nil {
		timeout = defaultHealthTimeout
	}
	entry := bootentry.New(info.Version, tries)
	rec := &upgradeRecord{From: b.running, To: info.Version, Tries: tries, HealthTimeout: timeout}
	if err := b.write(spool, entry, rec); err != nil {
		return err
	}
	msg := fmt.Sprintf("%s written to the EFI system partition beside %s; it has %d boots to become healthy within %s each", entry.Name(), b.running, tries, timeout)
	slog.Info(msg)
	b.event(entry.Name(), "written beside "+b.running)
	if err := stream.Send(&machine.UpgradeProgress{Step: "written", Message: msg, Bytes: h.Size, Version: info.Version}); err != nil {
		return err
	}
	b.update(func(s *machine.BootState) {
		s.Other, s.RolledBackFrom, s.RollbackReason = entry.Name(), "", ""
		s.Pending = entry.Name() + " staged: it boots at the next reboot"
	})
	if h.Stage {
		return stream.Send(&machine.UpgradeProgress{Step: "staged", Message: entry.Name() + " boots at the next reboot", Bytes: h.Size, Version: info.Version})
	}
	if err := stream.Send(&machine.UpgradeProgress{Step: "rebooting", Message: "rebooting into " + info.Version, Bytes: h.Size, Version: info.Version}); err != nil {
		return err
	}
	b.reboot("an upgrade to " + info.Version)
	return nil
}

func checkHeader(h *machine.UpgradeHeader) error {
	switch {
	case h == nil:
		return errors.New("the first message must be the header")
	case h.ImageRef != "" && (h.Size != 0 || h.Sha256 != ""):
		return fmt.Errorf("image ref %s: the registry's manifest gives the size and digest, the header must not", h.ImageRef)
	case h.ImageRef != "":
	case h.Size == 0 || h.Size > maxUKISize:
		return fmt.Errorf("size %d: must be from 1 byte to %d MiB", h.Size, maxUKISize>>20)
	case len(h.Sha256) != 2*sha256.Size:
		return fmt.Errorf("sha256 %q: must be %d hex digits", h.Sha256, 2*sha256.Size)
	case h.Tries > maxTries:
		return fmt.Errorf("tries %d: at most %d", h.Tries, maxTries)
	case h.HealthTimeout != nil && h.HealthTimeout.AsDuration() < 10*time.Second:
		return fmt.Errorf("health timeout %s: at least 10s", h.HealthTimeout.AsDuration())
	}
	if h.ImageRef != "" {
		return nil
	}
	_, err := hex.DecodeString(h.Sha256)
	return err
}

// receive spools the UKI's bytes and checks them: size, digest, a Cairn
// UKI of a version newer than the running one.
func (b *boots) receive(stream grpc.BidiStreamingServer[machine.UpgradeRequest, machine.UpgradeProgress], h *machine.UpgradeHeader) (string, bootentry.Info, error) {
	refuse := func(c codes.Code, format string, args ...any) error {
		return status.Errorf(c, "upgrade refused, nothing written: "+format, args...)
	}
	if err := os.MkdirAll(b.spoolDir, 0o700); err != nil {
		return "", bootentry.Info{}, err
	}
	f, err := os.CreateTemp(b.spoolDir, "upgrade-*.efi")
	if err != nil {
		return "", bootentry.Info{}, err
	}
	defer f.Close()
	sum := sha256.New()
	var n uint64
	if h.ImageRef != "" {
		if b.pull == nil {
			return f.Name(), bootentry.Info{}, refuse(codes.Unimplemented, "this node cannot pull an upgrade from a registry")
		}
		counted := &countingWriter{w: io.MultiWriter(f, sum)}
		size, digest, err := b.pull(stream.Context(), h.ImageRef, counted)
		if err != nil {
			return f.Name(), bootentry.Info{}, refuse(codes.Unavailable, "%v", err)
		}
		algo, hexSum, _ := strings.Cut(digest, ":")
		if algo != "sha256" || size <= 0 || size > maxUKISize {
			return f.Name(), bootentry.Info{}, refuse(codes.InvalidArgument, "%s: a layer of %d bytes, digest %s: want a sha256 digest and at most %d MiB", h.ImageRef, size, digest, maxUKISize>>20)
		}
		h.Size, h.Sha256, n = uint64(size), hexSum, counted.n
		if err := stream.Send(&machine.UpgradeProgress{Step: "received", Message: fmt.Sprintf("pulled %s: %d bytes", h.ImageRef, n), Bytes: n}); err != nil {
			return f.Name(), bootentry.Info{}, err
		}
	}
	for next := uint64(progressEvery); h.ImageRef == ""; {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return f.Name(), bootentry.Info{}, err
		}
		chunk := req.GetChunk()
		if n += uint64(len(chunk)); n > h.Size {
			return f.Name(), bootentry.Info{}, refuse(codes.InvalidArgument, "more than the %d bytes the header announced", h.Size)
		}
		sum.Write(chunk)
		if _, err := f.Write(chunk); err != nil {
			return f.Name(), bootentry.Info{}, refuse(codes.ResourceExhausted, "spool the UKI: %v", err)
		}
		if n >= next || n == h.Size {
			next += progressEvery
			if err := stream.Send(&machine.UpgradeProgress{Step: "received", Message: fmt.Sprintf("received %d of %d bytes", n, h.Size), Bytes: n}); err != nil {
				return f.Name(), bootentry.Info{}, err
			}
		}
		if n == h.Size {
			break
		}
	}
	if n != h.Size {
		return f.Name(), bootentry.Info{}, refuse(codes.InvalidArgument, "received %d bytes, the header announced %d", n, h.Size)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h.Sha256 {
		return f.Name(), bootentry.Info{}, refuse(codes.InvalidArgument, "the UKI's SHA-256 is %s, the header says %s", got, h.Sha256)
	}
	info, err := bootentry.ReadUKI(f)
	if err != nil {
		return f.Name(), info, refuse(codes.InvalidArgument, "%v", err)
	}
	if c := bootentry.Compare(info.Version, b.running); c <= 0 {
		what := "older than"
		if c == 0 {
			what = "the same as"
		}
		return f.Name(), info, refuse(codes.FailedPrecondition, "the UKI's version %s is %s the running %s, and systemd-boot boots the newest: to go back, use `cairn node rollback`", info.Version, what, b.running)
	}
	signer, err := b.checkSignature(f, int64(n))
	if err != nil {
		return f.Name(), info, refuse(codes.PermissionDenied, "the node boots with Secure Boot, and the firmware would not boot this UKI: %v; sign it with the keys the node's image was built with (cairn image build --secure-boot)", err)
	}
	msg := fmt.Sprintf("a Cairn UKI of version %s, %d bytes, SHA-256 as announced%s", info.Version, n, signer)
	return f.Name(), info, stream.Send(&machine.UpgradeProgress{Step: "verified", Message: msg, Bytes: n, Version: info.Version})
}

// write puts the spooled UKI in EFI/Linux as entry, leaving only the
// running UKI beside it, and records the upgrade in STATE. It checks for
// room first; the UKI goes under a name systemd-boot ignores until it is
// whole and synced, then is renamed.
func (b *boots) write(spool string, entry bootentry.Entry, rec *upgradeRecord) error {
	fi, err := os.Stat(spool)
	if err != nil {
		return err
	}
	root, unmount, err := b.esp.mount(true)
	if err != nil {
		return status.Errorf(codes.Unavailable, "upgrade refused, nothing written: mount the EFI system partition: %v", err)
	}
	err = func() error {
		dir := filepath.Join(root, bootentry.Dir)
		es, err := entries(root)
		if err != nil {
			return err
		}
		_, others, ok := b.split(es)
		if !ok {
			return status.Errorf(codes.FailedPrecondition, "upgrade refused, nothing written: no UKI of the running version %s in %s to keep beside the new one", b.running, bootentry.Dir)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return err
		}
		free := int64(st.Bavail) * st.Bsize
		for _, o := range others {
			if ofi, err := os.Stat(filepath.Join(dir, o.Name())); err == nil {
				free += ofi.Size()
			}
		}
		if need := fi.Size() + espSlack; free < need {
			return status.Errorf(codes.ResourceExhausted, "upgrade refused, nothing written: the EFI system partition has %d MiB free beside the running UKI, the new one needs %d MiB", free>>20, need>>20)
		}
		// From here on, a power cut leaves the running UKI, which boots.
		for _, o := range others {
			if err := os.Remove(filepath.Join(dir, o.Name())); err != nil {
				return err
			}
			slog.Info("UKI removed to make room for the upgrade", "entry", o.Name())
		}
		tmp := filepath.Join(dir, ".upgrade.tmp")
		if err := copyFile(spool, tmp); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("write the UKI: %w", err)
		}
		if err := b.writeRecord(rec); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("record the upgrade in STATE: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, entry.Name())); err != nil {
			os.Remove(tmp)
			return err
		}
		return atomicfile.SyncDir(dir)
	}()
	return errors.Join(err, unmount())
}

// copyFile copies src to a new dst and syncs it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	return errors.Join(err, out.Close())
}

// Rollback marks the running UKI as failed, so that systemd-boot boots
// the other one from now on, and reboots into it.
func (b *boots) Rollback(reason string) (*machine.RollbackResponse, error) {
	if err := b.lock("a rollback"); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	root, unmount, err := b.esp.mount(true)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "rollback refused: mount the EFI system partition: %v", err)
	}
	var to bootentry.Entry
	err = func() error {
		es, err := entries(root)
		if err != nil {
			return err
		}
		running, others, ok := b.split(es)
		switch {
		case !ok:
			return status.Errorf(codes.FailedPrecondition, "rollback refused: no UKI of the running version %s in %s", b.running, bootentry.Dir)
		case len(others) == 0:
			return status.Error(codes.FailedPrecondition, "rollback refused: the running UKI is the only one: there is nothing to go back to")
		}
		to = others[0]
		switch {
		case to.Bad():
			return status.Errorf(codes.FailedPrecondition, "rollback refused: the other UKI %s did not become healthy in its boots", to.Name())
		case to.Counting && to.Done == 0:
			return status.Errorf(codes.FailedPrecondition, "rollback refused: the other UKI %s never booted (an upgrade staged for the next reboot)", to.Name())
		}
		if err := b.writeRecord(&upgradeRecord{From: b.running, To: to.Version, Rollback: reason}); err != nil {
			return fmt.Errorf("record the rollback in STATE: %w", err)
		}
		// Boots spent: systemd-boot sorts it after every good entry.
		failed := bootentry.Entry{Version: running.Version, Counting: true, Left: 0, Done: max(running.Done, 1)}
		dir := filepath.Join(root, bootentry.Dir)
		if err := os.Rename(filepath.Join(dir, running.Name()), filepath.Join(dir, failed.Name())); err != nil {
			return err
		}
		return atomicfile.SyncDir(dir)
	}()
	if err = errors.Join(err, unmount()); err != nil {
		return nil, err
	}
	slog.Info("rolling back", "from", b.running, "to", to.Version, "reason", reason)
	b.event(to.Name(), fmt.Sprintf("rolling back from %s: %s", b.running, reason))
	b.reboot("a rollback to " + to.Version)
	return &machine.RollbackResponse{From: b.running, To: to.Version}, nil
}

// espPartition is the ESP of the boot disk, found by its GPT label and
// mounted at dir.
type espPartition struct{ dir string }

func (p espPartition) mount(writable bool) (string, func() error, error) {
	dev, err := findPartition(sysBlock, "EFI", partitionWait)
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return "", nil, err
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if !writable {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(dev, p.dir, "vfat", flags, "umask=0077"); err != nil {
		return "", nil, fmt.Errorf("mount %s on %s: %w", dev, p.dir, err)
	}
	return p.dir, func() error {
		if err := unix.Unmount(p.dir, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", p.dir, err)
		}
		return nil
	}, nil
}

// countingWriter counts what it writes on.
type countingWriter struct {
	w io.Writer
	n uint64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

// pullUKI pulls UKIs with the containerd at socket, through the registry
// hosts of hostsDir.
func pullUKI(socket, hostsDir string) func(ctx context.Context, ref string, w io.Writer) (int64, string, error) {
	return func(ctx context.Context, ref string, w io.Writer) (int64, string, error) {
		desc, err := containers.PullBlob(ctx, socket, hostsDir, ref, bootentry.MediaType, w)
		return desc.Size, desc.Digest.String(), err
	}
}

// checkSignature checks, when the node booted with Secure Boot, that the
// UKI in r of size bytes is signed by a key of the firmware's db, and
// says by which; it checks nothing otherwise.
func (b *boots) checkSignature(r io.ReaderAt, size int64) (string, error) {
	b.guard.Lock()
	on := b.state != nil && b.state.SecureBoot
	b.guard.Unlock()
	if !on {
		return "", nil
	}
	db, err := readSignatureDB(b.efivars)
	if err != nil {
		return "", err
	}
	signer, err := authenticode.Verify(r, size, db)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(", signed by %q of the firmware's db", signer.Subject.CommonName), nil
}
