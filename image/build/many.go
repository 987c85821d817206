package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sync/errgroup"
)

// BuildAll builds an image for each machine config NAME.yaml in the
// directory o.Config into the directory o.Output: NAME plus the format's
// extension (.efi with UKI) and NAME.manifest.json. The images share
// everything but their STATE partition (and their UKI, where the configs'
// kernel arguments or modules differ). Every config is validated before
// anything is built: one invalid config builds none. It returns the
// images' paths.
func BuildAll(ctx context.Context, o Options) ([]string, error) {
	o = o.withDefaults()
	stage := stager(o.Progress)
	stage("validate machine configs in " + o.Config)
	paths, err := filepath.Glob(filepath.Join(o.Config, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s holds no machine config (*.yaml): `cairn config gen` writes one", o.Config)
	}
	var configs []*nodeConfig
	var errs []error
	for _, p := range paths {
		c, err := readConfig(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		configs = append(configs, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Output, 0o755); err != nil {
		return nil, err
	}
	b, err := newBuilder(ctx, o, stage)
	if err != nil {
		return nil, err
	}
	defer b.close()

	ext := b.format.Ext()
	if o.UKI {
		ext = ".efi"
	}
	outs := make([]string, len(configs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, c := range configs {
		name := strings.TrimSuffix(filepath.Base(c.path), ".yaml")
		outs[i] = filepath.Join(o.Output, name+ext)
		g.Go(func() error {
			// Only the shared stages are shown, once, and each image when done.
			if _, err := b.image(gctx, c, outs[i], filepath.Join(o.Output, name+".manifest.json"), func(line string) {
				if !strings.HasPrefix(line, "write disk") && !strings.HasPrefix(line, "convert to") {
					stage(line)
				}
			}); err != nil {
				return fmt.Errorf("%s: %w", c.path, err)
			}
			stage("done: " + outs[i])
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return outs, nil
}
