package containers

import (
	"context"
	"fmt"

	"github.com/cairn-os/cairn/api/machine"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// List reports every containerd namespace with its containers (and their
// tasks' status) and images.
func List(ctx context.Context, socket string) ([]*machine.ContainerNamespace, error) {
	c, err := containerd.New(socket)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd: %w", err)
	}
	defer c.Close()
	names, err := c.NamespaceService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var out []*machine.ContainerNamespace
	for _, name := range names {
		nctx := namespaces.WithNamespace(ctx, name)
		ns := &machine.ContainerNamespace{Name: name}
		ctrs, err := c.Containers(nctx)
		if err != nil {
			return nil, fmt.Errorf("list containers in %s: %w", name, err)
		}
		for _, ctr := range ctrs {
			info, err := ctr.Info(nctx, containerd.WithoutRefreshedMetadata)
			if err != nil {
				continue // removed meanwhile
			}
			mc := &machine.Container{Id: ctr.ID(), Image: info.Image}
			if task, err := ctr.Task(nctx, nil); err == nil {
				mc.Pid = task.Pid()
				if st, err := task.Status(nctx); err == nil {
					mc.Status = string(st.Status)
				}
			}
			ns.Containers = append(ns.Containers, mc)
		}
		imgs, err := c.ImageService().List(nctx)
		if err != nil {
			return nil, fmt.Errorf("list images in %s: %w", name, err)
		}
		for _, im := range imgs {
			ns.Images = append(ns.Images, &machine.Image{Name: im.Name, Digest: im.Target.Digest.String(), Size: im.Target.Size})
		}
		out = append(out, ns)
	}
	return out, nil
}
