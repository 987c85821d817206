package csi

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/internal/atomicfile"
)

// MountedMessage is the message of the line logged for each volume
// mounted for a pod, with the durations of its stage and publish calls.
const MountedMessage = "mounted CSI volume"

// PluginDir is the directory, under a pod's volumes, of its CSI volumes.
const PluginDir = "kubernetes.io~csi"

// volData is what a volume was mounted with, kept in vol_data.json beside
// its mount (the pod's) and its staging directory (the node's), so that
// it can be unmounted whatever happens to the pod or the agent.
type volData struct {
	Driver      string `json:"driverName"`
	Handle      string `json:"volumeHandle"`
	SpecName    string `json:"specVolID"`
	StagingPath string `json:"stagingPath,omitempty"`
	// Volume is the pod's name of the volume, and ClaimNamespace and
	// Claim its claim's, if it has one: its stats are reported by them.
	Volume         string `json:"podVolumeName,omitempty"`
	ClaimNamespace string `json:"claimNamespace,omitempty"`
	Claim          string `json:"claimName,omitempty"`
	// Block says the volume is a block device, published at
	// dir/device, not a file system at dir/mount.
	Block bool `json:"block,omitempty"`
}

const volDataFile = "vol_data.json"

// podsDir holds a directory per pod, by UID: the kubelet's pods/, the
// volumes.Manager's root.
func (p *Plugins) podsDir() string { return filepath.Join(p.cfg.Dir, "pods") }

// root holds the directories of the pod uid's CSI volumes: its file
// systems under volumes/, its block devices under volumeDevices/, as
// the kubelet keeps them.
func (p *Plugins) root(uid types.UID, block bool) string {
	kind := "volumes"
	if block {
		kind = "volumeDevices"
	}
	return filepath.Join(p.podsDir(), string(uid), kind, PluginDir)
}

// dir is where the pod's CSI volume specName is published from: the
// driver mounts it at target(dir, block).
func (p *Plugins) dir(uid types.UID, specName string, block bool) string {
	return filepath.Join(p.root(uid, block), specName)
}

// target is where, in the volume's directory dir, the driver publishes
// it: a file system at mount, a block device at device.
func target(dir string, block bool) string {
	if block {
		return filepath.Join(dir, "device")
	}
	return filepath.Join(dir, "mount")
}

// stagingPath is the directory where the driver stages a volume for the
// whole node.
func (p *Plugins) stagingPath(driver, handle string, block bool) string {
	name := "globalmount"
	if block {
		name = "globaldevice"
	}
	return filepath.Join(p.cfg.Dir, "plugins", "kubernetes.io", "csi", driver,
		fmt.Sprintf("%x", sha256.Sum256([]byte(handle))), name)
}

// volDataFiles lists the vol_data.json of the CSI volumes of every pod on
// the node, file systems and block devices.
func (p *Plugins) volDataFiles() []string {
	var out []string
	for _, kind := range []string{"volumes", "volumeDevices"} {
		files, _ := filepath.Glob(filepath.Join(p.podsDir(), "*", kind, PluginDir, "*", volDataFile))
		out = append(out, files...)
	}
	return out
}

// source is a CSI volume as a pod mounts it.
type source struct {
	driver, handle, specName string
	claim                    string // the claim's name, if any
	readOnly                 bool
	capability               *csipb.VolumeCapability
	attributes               map[string]string
	stageSecret              *corev1.SecretReference
	publishSecret            *corev1.SecretReference
	ephemeral                bool // inline: published, never attached nor staged
	block                    bool // a raw block device, not a file system
	fsType                   string
	readWriteOnce            bool // its access modes have ReadWriteOnce
}

func (s *source) uniqueName() string { return "kubernetes.io/csi/" + s.driver + "^" + s.handle }

// Handles reports whether v is a volume that SetUp mounts: a claim (of a
// CSI PersistentVolume, which only the API tells), a generic ephemeral
// volume or an inline CSI volume.
func Handles(v *corev1.Volume) bool {
	return v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil
}

// SetUp mounts the volume v of pod through its CSI driver — a
// PersistentVolumeClaim bound to a CSI PersistentVolume, the claim of a
// generic ephemeral volume, or an inline CSI volume — and returns the
// path the pod's containers mount, and whether the pod's fsGroup is to
// own its files (the CSIDriver's fsGroupPolicy). For a claim it waits for
// the VolumeAttachment to be attached when the driver needs attaching,
// stages the volume on the node when the driver stages, publishes it for
// the pod, and expands it if the cluster grew it (Expand). client is the
// node's; errors are in the kubelet's words, and a later SetUp tries
// again.
func (p *Plugins) SetUp(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) (path string, fsGroup bool, err error) {
	src, claim, err := p.source(ctx, client, pod, v)
	if err != nil {
		return "", false, err
	}
	d, err := p.driver(src.driver)
	if err != nil {
		return "", false, err
	}
	unique := src.uniqueName()
	p.mu.Lock()
	p.inUse[unique]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.inUse[unique]--; p.inUse[unique] == 0 {
			delete(p.inUse, unique)
		}
		p.mu.Unlock()
	}()

	info, err := client.StorageV1().CSIDrivers().Get(ctx, src.driver, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return "", false, fmt.Errorf("get CSIDriver %s: %w", src.driver, err)
	}
	if err != nil {
		info = nil // no CSIDriver: attach, no pod info, as the kubelet assumes
	}
	if err := lifecycleModeSupported(info, src); err != nil {
		return "", false, err
	}
	if info != nil && info.Spec.PodInfoOnMount != nil && *info.Spec.PodInfoOnMount {
		attrs := map[string]string{
			"csi.storage.k8s.io/pod.name":            pod.Name,
			"csi.storage.k8s.io/pod.namespace":       pod.Namespace,
			"csi.storage.k8s.io/pod.uid":             string(pod.UID),
			"csi.storage.k8s.io/serviceAccount.name": pod.Spec.ServiceAccountName,
			"csi.storage.k8s.io/ephemeral":           fmt.Sprint(src.ephemeral),
		}
		for k, v := range src.attributes {
			attrs[k] = v
		}
		src.attributes = attrs
	}
	var publishContext map[string]string
	if !src.ephemeral && (info == nil || info.Spec.AttachRequired == nil || *info.Spec.AttachRequired) {
		if publishContext, err = p.waitAttached(ctx, client, src); err != nil {
			return "", false, err
		}
	}

	lock := p.volumeLock(unique)
	lock.Lock()
	defer lock.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	data := volData{Driver: src.driver, Handle: src.handle, SpecName: src.specName, Volume: v.Name, Block: src.block}
	if src.claim != "" {
		data.ClaimNamespace, data.Claim = pod.Namespace, src.claim
	}
	var staged time.Duration
	if d.stages && !src.ephemeral {
		data.StagingPath = p.stagingPath(src.driver, src.handle, src.block)
		if err := os.MkdirAll(data.StagingPath, 0o750); err != nil {
			return "", false, err
		}
		if err := writeVolData(filepath.Dir(data.StagingPath), data); err != nil {
			return "", false, err
		}
		secrets, err := secret(ctx, client, src.stageSecret)
		if err != nil {
			return "", false, err
		}
		start := time.Now()
		_, err = d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
			VolumeId: src.handle, PublishContext: publishContext, StagingTargetPath: data.StagingPath,
			VolumeCapability: src.capability, Secrets: secrets, VolumeContext: src.attributes,
		})
		staged = time.Since(start)
		p.observe(d.name, "NodeStageVolume", start, err)
		if err != nil {
			return "", false, fmt.Errorf("MountVolume.MountDevice failed: NodeStageVolume: %w", err)
		}
	}
	dir := p.dir(pod.UID, src.specName, src.block)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", false, err
	}
	// Written first, so that a publish cut short is still undone.
	if err := writeVolData(dir, data); err != nil {
		return "", false, err
	}
	secrets, err := secret(ctx, client, src.publishSecret)
	if err != nil {
		return "", false, err
	}
	target := target(dir, src.block)
	start := time.Now()
	_, err = d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: src.handle, PublishContext: publishContext, StagingTargetPath: data.StagingPath,
		TargetPath: target, VolumeCapability: src.capability, Readonly: src.readOnly,
		Secrets: secrets, VolumeContext: src.attributes,
	})
	published := time.Since(start)
	p.observe(d.name, "NodePublishVolume", start, err)
	if err != nil {
		return "", false, fmt.Errorf("NodePublishVolume: %w", err)
	}
	p.log.Info(MountedMessage, "driver", d.name, "volume", src.handle, "pod", pod.Namespace+"/"+pod.Name,
		"stage", staged, "publish", published)
	if claim != nil {
		if err := p.expand(ctx, client, d, src, claim, data.StagingPath, target); err != nil {
			return "", false, err
		}
	}
	return target, fsGroupApplies(info, src, pod), nil
}

// fsGroupApplies reports whether pod's fsGroup owns the files of the
// volume of src, as the kubelet decides it from the fsGroupPolicy of the
// driver's CSIDriver info (nil if it has none): never for a read-only
// volume or a block device; always for File; never for None; for ReadWriteOnceWithFSType,
// the default, when the volume has a file system type and is
// ReadWriteOnce, as an inline volume always is.
func fsGroupApplies(info *storagev1.CSIDriver, src *source, pod *corev1.Pod) bool {
	if pod.Spec.SecurityContext == nil || pod.Spec.SecurityContext.FSGroup == nil || src.readOnly || src.block {
		return false
	}
	policy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	if info != nil && info.Spec.FSGroupPolicy != nil {
		policy = *info.Spec.FSGroupPolicy
	}
	switch policy {
	case storagev1.FileFSGroupPolicy:
		return true
	case storagev1.NoneFSGroupPolicy:
		return false
	}
	return src.fsType != "" && (src.ephemeral || src.readWriteOnce)
}

// lifecycleModeSupported checks that the driver of info, nil if it has no
// CSIDriver, supports src's lifecycle: an inline volume needs a CSIDriver
// that says Ephemeral, a persistent one a driver that does not leave
// Persistent out.
func lifecycleModeSupported(info *storagev1.CSIDriver, src *source) error {
	mode := storagev1.VolumeLifecyclePersistent
	if src.ephemeral {
		mode = storagev1.VolumeLifecycleEphemeral
	}
	var modes []storagev1.VolumeLifecycleMode
	if info != nil {
		modes = info.Spec.VolumeLifecycleModes
	}
	if len(modes) == 0 {
		modes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	}
	if !slices.Contains(modes, mode) {
		return fmt.Errorf("volume mode %q not supported by driver %s (only supports %v)", mode, src.driver, modes)
	}
	return nil
}

// source finds the driver and handle of v, and how to mount it, and the
// claim it mounts, if any.
func (p *Plugins) source(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) (*source, *claim, error) {
	if v.CSI != nil {
		fsType := ptr.Deref(v.CSI.FSType, "")
		src := &source{
			driver: v.CSI.Driver, specName: v.Name, ephemeral: true,
			// The kubelet's handle of an inline volume: unique to the pod.
			handle:     fmt.Sprintf("csi-%x", sha256.Sum256([]byte(string(pod.UID)+v.Name))),
			readOnly:   ptr.Deref(v.CSI.ReadOnly, false),
			attributes: v.CSI.VolumeAttributes,
			capability: capability(corev1.ReadWriteOnce, false, fsType, nil),
			fsType:     fsType,
		}
		if asDevice(pod, v.Name) {
			return nil, nil, fmt.Errorf("volume %s is an inline CSI volume, a file system, but is specified in volumeDevices", v.Name)
		}
		if r := v.CSI.NodePublishSecretRef; r != nil {
			src.publishSecret = &corev1.SecretReference{Namespace: pod.Namespace, Name: r.Name}
		}
		return src, nil, nil
	}
	c, err := claimOf(ctx, client, pod, v)
	if err != nil {
		return nil, nil, err
	}
	pv := c.pv
	if pv.Spec.CSI == nil {
		return nil, nil, fmt.Errorf("PV %s: only CSI persistent volumes are supported", pv.Name)
	}
	block := ptr.Deref(pv.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) == corev1.PersistentVolumeBlock
	if block != asDevice(pod, v.Name) {
		mode, in := corev1.PersistentVolumeFilesystem, "volumeDevices"
		if block {
			mode, in = corev1.PersistentVolumeBlock, "volumeMounts"
		}
		return nil, nil, fmt.Errorf("volume %s has volumeMode %s, but is specified in %s", v.Name, mode, in)
	}
	mode := corev1.ReadWriteOnce
	if len(pv.Spec.AccessModes) > 0 {
		mode = pv.Spec.AccessModes[0]
	}
	cs := pv.Spec.CSI
	return &source{
		driver: cs.Driver, handle: cs.VolumeHandle, specName: pv.Name, claim: c.pvc.Name,
		readOnly:      c.readOnly || cs.ReadOnly,
		capability:    capability(mode, block, cs.FSType, pv.Spec.MountOptions),
		block:         block,
		attributes:    cs.VolumeAttributes,
		stageSecret:   cs.NodeStageSecretRef,
		publishSecret: cs.NodePublishSecretRef,
		fsType:        cs.FSType,
		readWriteOnce: slices.Contains(pv.Spec.AccessModes, corev1.ReadWriteOnce),
	}, c, nil
}

// claim is the bound claim of a pod's volume and its PersistentVolume.
type claim struct {
	pvc      *corev1.PersistentVolumeClaim
	pv       *corev1.PersistentVolume
	readOnly bool // the pod mounts it read-only
}

// claimOf reads the claim of v, a PersistentVolumeClaim or a generic
// ephemeral volume of pod, and its volume; it is an error that the claim
// is not bound, or not the pod's own for an ephemeral volume.
func claimOf(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) (*claim, error) {
	var name string
	readOnly := false
	switch {
	case v.PersistentVolumeClaim != nil:
		name, readOnly = v.PersistentVolumeClaim.ClaimName, v.PersistentVolumeClaim.ReadOnly
	case v.Ephemeral != nil:
		name = pod.Name + "-" + v.Name
	default:
		return nil, errors.New("not a CSI volume")
	}
	pvc, err := client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("error processing PVC %s/%s: %w", pod.Namespace, name, err)
	}
	if v.Ephemeral != nil && !metav1.IsControlledBy(pvc, pod) {
		return nil, fmt.Errorf("error processing PVC %s/%s: PVC was not created for pod %s/%s (pod is not owner)", pod.Namespace, name, pod.Namespace, pod.Name)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("error processing PVC %s/%s: PVC is not bound", pod.Namespace, name)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get PV %s of PVC %s/%s: %w", pvc.Spec.VolumeName, pod.Namespace, name, err)
	}
	return &claim{pvc: pvc, pv: pv, readOnly: readOnly}, nil
}

// asDevice reports whether a container of pod has the volume name in its
// volumeDevices, as a raw block device.
func asDevice(pod *corev1.Pod, name string) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if slices.ContainsFunc(c.VolumeDevices, func(d corev1.VolumeDevice) bool { return d.Name == name }) {
				return true
			}
		}
	}
	return false
}

// capability is the CSI capability of a volume of the access mode: a
// block device, or a file system of fsType mounted with flags.
func capability(mode corev1.PersistentVolumeAccessMode, block bool, fsType string, flags []string) *csipb.VolumeCapability {
	m := csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	switch mode {
	case corev1.ReadOnlyMany:
		m = csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case corev1.ReadWriteMany:
		m = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	case corev1.ReadWriteOncePod:
		m = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	}
	access := &csipb.VolumeCapability_AccessMode{Mode: m}
	if block {
		return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}, AccessMode: access}
	}
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: access,
	}
}

// secret reads the Secret that ref names, as the CSI calls take it.
func secret(ctx context.Context, client kubernetes.Interface, ref *corev1.SecretReference) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

// attachPoll is how often waitAttached reads the VolumeAttachment, and
// attachWait how long it waits before SetUp fails, to be tried again.
const (
	attachPoll = 500 * time.Millisecond
	attachWait = 30 * time.Second
)

// waitAttached waits for the attach/detach controller and the driver's
// external attacher to attach src to the node, and returns the
// VolumeAttachment's publish context.
func (p *Plugins) waitAttached(ctx context.Context, client kubernetes.Interface, src *source) (map[string]string, error) {
	name := fmt.Sprintf("csi-%x", sha256.Sum256([]byte(src.handle+src.driver+p.cfg.NodeName)))
	deadline := time.Now().Add(attachWait)
	for {
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		why := "the VolumeAttachment is not made yet"
		switch {
		case err == nil && va.Status.Attached:
			return va.Status.AttachmentMetadata, nil
		case err == nil && va.Status.AttachError != nil:
			why = "the driver said: " + va.Status.AttachError.Message
		case err == nil:
			why = "not attached yet"
		case !apierrors.IsNotFound(err):
			why = err.Error()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("AttachVolume.Attach of volume %s to the node: timed out waiting for VolumeAttachment %s: %s", src.handle, name, why)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(attachPoll):
		}
	}
}

// volumeLock serializes the staging and unstaging of one volume.
func (p *Plugins) volumeLock(unique string) *sync.Mutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.locks[unique]
	if l == nil {
		l = &sync.Mutex{}
		p.locks[unique] = l
	}
	return l
}

// TearDown unpublishes the CSI volumes of the pod uid, and unstages those
// no other pod on the node uses. A volume whose driver is not registered
// or fails stays mounted, and the error says which: the caller keeps the
// pod's directory and tries again later.
func (p *Plugins) TearDown(ctx context.Context, uid types.UID) error {
	var errs []error
	for _, block := range []bool{false, true} {
		root := p.root(uid, block)
		ents, err := os.ReadDir(root)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var failed bool
		for _, e := range ents {
			if err := p.tearDown(ctx, uid, filepath.Join(root, e.Name()), block); err != nil {
				failed = true
				errs = append(errs, fmt.Errorf("UnmountVolume.TearDown failed for volume %q pod %q: %w", e.Name(), uid, err))
			}
		}
		if !failed {
			if err := os.Remove(root); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// tearDown unpublishes the volume published from dir, a block device's
// if block, then unstages it if no other pod uses it.
func (p *Plugins) tearDown(ctx context.Context, uid types.UID, dir string, block bool) error {
	data, err := readVolData(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// Never published: SetUp stopped before it wrote vol_data.json.
		return removeEmpty(target(dir, block), dir)
	}
	if err != nil {
		return err
	}
	d, err := p.driver(data.Driver)
	if err != nil {
		return err
	}
	unique := "kubernetes.io/csi/" + data.Driver + "^" + data.Handle
	lock := p.volumeLock(unique)
	lock.Lock()
	defer lock.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	start := time.Now()
	_, err = d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: data.Handle, TargetPath: target(dir, block)})
	p.observe(d.name, "NodeUnpublishVolume", start, err)
	if err != nil {
		return fmt.Errorf("NodeUnpublishVolume: %w", err)
	}
	if err := removeEmpty(filepath.Join(dir, volDataFile)); err != nil {
		return err
	}
	if err := removeEmpty(target(dir, block), dir); err != nil {
		return err
	}
	if data.StagingPath == "" {
		return nil
	}
	if p.publishedElsewhere(data, uid) {
		return nil
	}
	start = time.Now()
	_, err = d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: data.Handle, StagingTargetPath: data.StagingPath})
	p.observe(d.name, "NodeUnstageVolume", start, err)
	if err != nil {
		return fmt.Errorf("UnmountDevice: NodeUnstageVolume: %w", err)
	}
	parent := filepath.Dir(data.StagingPath)
	return removeEmpty(data.StagingPath, filepath.Join(parent, volDataFile), parent)
}

// publishedElsewhere reports whether a pod other than uid has the volume
// of data published.
func (p *Plugins) publishedElsewhere(data volData, uid types.UID) bool {
	for _, f := range p.volDataFiles() {
		if filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(f))))) == string(uid) {
			continue
		}
		other, err := readVolData(filepath.Dir(f))
		if err == nil && other.Driver == data.Driver && other.Handle == data.Handle {
			return true
		}
	}
	return false
}

// InUse lists the volumes mounted, or being mounted, on the node by their
// unique names, as the Node reports them in status.volumesInUse for the
// attach/detach controller not to detach them.
func (p *Plugins) InUse() []corev1.UniqueVolumeName {
	seen := map[string]bool{}
	p.mu.Lock()
	for u := range p.inUse {
		seen[u] = true
	}
	p.mu.Unlock()
	for _, f := range p.volDataFiles() {
		if d, err := readVolData(filepath.Dir(f)); err == nil {
			seen["kubernetes.io/csi/"+d.Driver+"^"+d.Handle] = true
		}
	}
	out := make([]corev1.UniqueVolumeName, 0, len(seen))
	for _, u := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, corev1.UniqueVolumeName(u))
	}
	return out
}

func writeVolData(dir string, d volData) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, volDataFile), b, 0o600)
}

func readVolData(dir string) (volData, error) {
	var d volData
	b, err := os.ReadFile(filepath.Join(dir, volDataFile))
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%s: %w", filepath.Join(dir, volDataFile), err)
	}
	return d, nil
}

// removeEmpty removes each path, a file or an empty directory, in turn;
// one already gone is no error. It never removes what a directory still
// holds: a mount the driver left stays, and says so.
func removeEmpty(paths ...string) error {
	for _, path := range paths {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
