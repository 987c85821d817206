// Command hostpathcsi is a CSI driver for tests, in the manner of the
// upstream csi-driver-host-path (whose module the Go proxy here does not
// serve): each volume is a directory under -data-dir, bind-mounted at the
// staging path by NodeStageVolume and from there at the target path by
// NodePublishVolume. Its controller service creates and deletes those
// directories and "attaches" by answering ControllerPublishVolume, so
// that the upstream external-provisioner and external-attacher drive it.
// It serves every service on one socket, -endpoint, and logs each call.
//
// A block volume (volumeMode Block) is a file, <data-dir>/<volume>.img,
// attached to a loop device when staged; the device node is bind-mounted
// at <staging>/dev, and from there at the target path when published.
//
// NodeExpandVolume records the size asked for beside the volume's
// directory, in <data-dir>/<volume>.capacity.
//
// Inline (ephemeral) volumes are directories under -data-dir/ephemeral,
// made by NodePublishVolume and removed by NodeUnpublishVolume. Their
// volume attributes make the driver misbehave, for tests: fail=true
// fails NodePublishVolume, hang=true holds it until the caller gives up.
//
// Run privileged in a pod, with the kubelet directory mounted at the same
// path with Bidirectional propagation, for its mounts to reach the node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"github.com/u-root/u-root/pkg/mount/loop"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func main() {
	name := flag.String("name", "hostpath.csi.cairn.test", "the driver's name")
	endpoint := flag.String("endpoint", "", "the socket to serve on")
	nodeID := flag.String("nodeid", "", "the node's ID")
	dataDir := flag.String("data-dir", "/csi-data-dir", "where the volumes' directories are")
	attach := flag.Bool("attach-required", true, "whether volumes are attached (ControllerPublishVolume) before they are staged, as the driver's CSIDriver says")
	flag.Parse()
	if err := run(*name, *endpoint, *nodeID, *dataDir, *attach); err != nil {
		log.Fatal(err)
	}
}

func run(name, endpoint, nodeID, dataDir string, attach bool) error {
	if endpoint == "" || nodeID == "" {
		return errors.New("-endpoint and -nodeid are needed")
	}
	if err := os.MkdirAll(filepath.Dir(endpoint), 0o750); err != nil {
		return err
	}
	os.Remove(endpoint)
	l, err := net.Listen("unix", endpoint)
	if err != nil {
		return err
	}
	d := &driver{name: name, nodeID: nodeID, dataDir: dataDir, attach: attach}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		log.Printf("%s %v: err=%v", info.FullMethod, req, err)
		return resp, err
	}))
	csipb.RegisterIdentityServer(s, d)
	csipb.RegisterControllerServer(s, d)
	csipb.RegisterNodeServer(s, d)
	log.Printf("driver %s on node %s serving %s", name, nodeID, endpoint)
	return s.Serve(l)
}

type driver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer
	csipb.UnimplementedNodeServer
	name, nodeID, dataDir string
	attach                bool
}

// topologyKey is the driver's topology: each node its own segment.
const topologyKey = "topology.hostpath.csi.cairn.test/node"

func (d *driver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: d.name, VendorVersion: "0.1.0"}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: []*csipb.PluginCapability{{
		Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (d *driver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

func (d *driver) volumeDir(id string) (string, error) {
	if !filepath.IsLocal(id) || filepath.Base(id) != id {
		return "", status.Errorf(codes.InvalidArgument, "volume ID %q", id)
	}
	return filepath.Join(d.dataDir, id), nil
}

func (d *driver) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	dir, err := d.volumeDir(req.Name)
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(req.VolumeCapabilities, func(c *csipb.VolumeCapability) bool { return c.GetBlock() != nil }) {
		if err := makeImage(dir+".img", req.GetCapacityRange().GetRequiredBytes()); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{VolumeId: req.Name, CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
}

func (d *driver) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	dir, err := d.volumeDir(req.VolumeId)
	if err != nil {
		return nil, err
	}
	for _, path := range []string{dir, dir + ".img", dir + ".capacity"} {
		if err := os.RemoveAll(path); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csipb.DeleteVolumeResponse{}, nil
}

func (d *driver) ControllerPublishVolume(_ context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	if req.NodeId != d.nodeID {
		return nil, status.Errorf(codes.NotFound, "node %q: this driver knows only %q", req.NodeId, d.nodeID)
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: map[string]string{"attachedTo": req.NodeId}}, nil
}

func (d *driver) ControllerUnpublishVolume(context.Context, *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{VolumeCapabilities: req.VolumeCapabilities}}, nil
}

func (d *driver) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	rpc := func(t csipb.ControllerServiceCapability_RPC_Type) *csipb.ControllerServiceCapability {
		return &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}}
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: []*csipb.ControllerServiceCapability{
		rpc(csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME),
		rpc(csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME),
	}}, nil
}

// bind bind-mounts from at to, unless to is mounted already, read-only if
// asked.
func bind(from, to string, readOnly bool) error {
	if err := os.MkdirAll(to, 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted, err := mountinfo.Mounted(to); err != nil || mounted {
		return err
	}
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		return status.Errorf(codes.Internal, "bind %s at %s: %v", from, to, err)
	}
	if readOnly {
		if err := unix.Mount("", to, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return status.Errorf(codes.Internal, "remount %s read-only: %v", to, err)
		}
	}
	return nil
}

// unbind unmounts path if it is mounted, and removes it.
func unbind(path string) error {
	mounted, err := mountinfo.Mounted(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if err := unix.Unmount(path, 0); err != nil {
			return status.Errorf(codes.Internal, "unmount %s: %v", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

func (d *driver) NodeStageVolume(_ context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	dir, err := d.volumeDir(req.VolumeId)
	if err != nil {
		return nil, err
	}
	// Attached first, when its CSIDriver says so: the publish context is
	// ControllerPublishVolume's.
	if d.attach && req.PublishContext["attachedTo"] != d.nodeID {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not attached to %s: publish context %v", req.VolumeId, d.nodeID, req.PublishContext)
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return &csipb.NodeStageVolumeResponse{}, stageBlock(dir+".img", req.StagingTargetPath)
	}
	// A pre-provisioned volume (a PersistentVolume made by hand) is made
	// when first staged.
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeStageVolumeResponse{}, bind(dir, req.StagingTargetPath, false)
}

func (d *driver) NodeUnstageVolume(_ context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	if dev := filepath.Join(req.StagingTargetPath, "dev"); exists(dev) {
		return &csipb.NodeUnstageVolumeResponse{}, unstageBlock(dev)
	}
	return &csipb.NodeUnstageVolumeResponse{}, unbind(req.StagingTargetPath)
}

// blockImageSize is the size of a block volume made without one.
const blockImageSize = 1 << 20

// makeImage makes the file of a block volume, of size bytes, unless it is
// there.
func makeImage(path string, size int64) error {
	if exists(path) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	defer f.Close()
	if err := f.Truncate(max(size, blockImageSize)); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// stageBlock attaches the volume's file to a free loop device and
// bind-mounts the device node at staging/dev, unless it is there.
func stageBlock(image, staging string) error {
	dev := filepath.Join(staging, "dev")
	if mounted, _ := mountinfo.Mounted(dev); mounted {
		return nil
	}
	if err := makeImage(image, blockImageSize); err != nil {
		return err
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	loopDev, err := loop.FindDevice()
	if err != nil {
		return status.Errorf(codes.Internal, "find a free loop device: %v", err)
	}
	// A container's /dev has the host's devices of when it started: a
	// loop device made since is made here too.
	if !exists(loopDev) {
		var n int
		fmt.Sscanf(loopDev, "/dev/loop%d", &n)
		if err := unix.Mknod(loopDev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
			return status.Errorf(codes.Internal, "make %s: %v", loopDev, err)
		}
	}
	if err := loop.SetFile(loopDev, image); err != nil {
		return status.Errorf(codes.Internal, "attach %s to %s: %v", image, loopDev, err)
	}
	if err := bindFile(loopDev, dev); err != nil {
		loop.ClearFile(loopDev)
		return err
	}
	return nil
}

// unstageBlock unmounts the device node at dev and detaches its loop
// device from the volume's file.
func unstageBlock(dev string) error {
	if err := loop.ClearFile(dev); err != nil {
		return status.Errorf(codes.Internal, "detach the loop device at %s: %v", dev, err)
	}
	return unbind(dev)
}

// bindFile bind-mounts the file (a device node) from at to, a file made
// for it, unless to is mounted already.
func bindFile(from, to string) error {
	if mounted, _ := mountinfo.Mounted(to); mounted {
		return nil
	}
	f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	f.Close()
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		return status.Errorf(codes.Internal, "bind %s at %s: %v", from, to, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (d *driver) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	if req.VolumeContext["csi.storage.k8s.io/ephemeral"] == "true" {
		return d.publishEphemeral(ctx, req)
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		dev := filepath.Join(req.StagingTargetPath, "dev")
		if mounted, err := mountinfo.Mounted(dev); err != nil || !mounted {
			return nil, status.Errorf(codes.FailedPrecondition, "block volume %s is not staged at %s (%v)", req.VolumeId, dev, err)
		}
		return &csipb.NodePublishVolumeResponse{}, bindFile(dev, req.TargetPath)
	}
	if mounted, err := mountinfo.Mounted(req.StagingTargetPath); err != nil || !mounted {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s (%v)", req.VolumeId, req.StagingTargetPath, err)
	}
	return &csipb.NodePublishVolumeResponse{}, bind(req.StagingTargetPath, req.TargetPath, req.Readonly)
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if err := unbind(req.TargetPath); err != nil {
		return nil, err
	}
	dir, err := d.volumeDir(req.VolumeId)
	if err != nil {
		return nil, err
	}
	ephemeral := filepath.Join(d.dataDir, "ephemeral", filepath.Base(dir))
	if err := os.RemoveAll(ephemeral); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// publishEphemeral makes an inline volume's directory and mounts it at
// the target path, or misbehaves as its attributes say.
func (d *driver) publishEphemeral(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	switch {
	case req.VolumeContext["fail"] == "true":
		return nil, status.Error(codes.Internal, "told to fail")
	case req.VolumeContext["hang"] == "true":
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	dir, err := d.volumeDir(req.VolumeId)
	if err != nil {
		return nil, err
	}
	dir = filepath.Join(d.dataDir, "ephemeral", filepath.Base(dir))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodePublishVolumeResponse{}, bind(dir, req.TargetPath, req.Readonly)
}

func (d *driver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	rpc := func(t csipb.NodeServiceCapability_RPC_Type) *csipb.NodeServiceCapability {
		return &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}}
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: []*csipb.NodeServiceCapability{
		rpc(csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME),
		rpc(csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS),
		rpc(csipb.NodeServiceCapability_RPC_EXPAND_VOLUME),
	}}, nil
}

// NodeExpandVolume "grows" a published or staged volume: a directory has
// no size of its own, so the size asked for is written beside it, in
// <data-dir>/<volume>.capacity, for tests to read.
func (d *driver) NodeExpandVolume(_ context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	dir, err := d.volumeDir(req.VolumeId)
	if err != nil {
		return nil, err
	}
	if mounted, err := mountinfo.Mounted(req.VolumePath); err != nil || !mounted {
		return nil, status.Errorf(codes.NotFound, "volume %s is not mounted at %s (%v)", req.VolumeId, req.VolumePath, err)
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	if err := os.WriteFile(dir+".capacity", []byte(strconv.FormatInt(size, 10)), 0o644); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// NodeGetVolumeStats tells what the filesystem of a published volume,
// the data directory's, holds.
func (d *driver) NodeGetVolumeStats(_ context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(req.VolumePath, &st); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", req.VolumePath, err)
	}
	bs := int64(st.Bsize)
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

func (d *driver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{
		NodeId: d.nodeID, MaxVolumesPerNode: 100,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{topologyKey: d.nodeID}},
	}, nil
}
