package stage2

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
)

// The kernel arguments that give a node whose STATE holds no machine
// config its first one, fetched once its network is up: a generic image
// built with them (`image build --generic --kernel-arg …`) serves every
// machine that can reach the URL.
const (
	configURLArg    = "cairn.config.url"
	configSHA256Arg = "cairn.config.sha256"
)

// configSource is where the kernel command line says a first machine
// config comes from.
type configSource struct{ url, sha256 string }

// configSourceFrom reads cairn.config.url and cairn.config.sha256 from a
// kernel command line.
func configSourceFrom(cmdline string) configSource {
	var src configSource
	for _, arg := range strings.Fields(cmdline) {
		name, value, _ := strings.Cut(arg, "=")
		switch name {
		case configURLArg:
			src.url = value
		case configSHA256Arg:
			src.sha256 = strings.ToLower(value)
		}
	}
	return src
}

// check refuses a source whose config could be changed on its way
// unseen: plain HTTP needs the digest, and a digest is 64 hex digits.
func (src configSource) check() error {
	u, err := url.Parse(src.url)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", configURLArg, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s=%s: want an http or https URL", configURLArg, src.url)
	case src.sha256 != "" && (len(src.sha256) != 64 || strings.Trim(src.sha256, "0123456789abcdef") != ""):
		return fmt.Errorf("%s=%s: want the SHA-256 of the config, 64 hex digits", configSHA256Arg, src.sha256)
	case u.Scheme == "http" && src.sha256 == "":
		return fmt.Errorf("%s=%s is plain HTTP: give the config's digest with %s=, or serve it over HTTPS", configURLArg, src.url, configSHA256Arg)
	}
	return nil
}

// errRefused marks a fetched config that is not taken: fetching it again
// would not help.
var errRefused = errors.New("refused")

// fetchFirstBootConfig fetches the machine config of src into statePath
// and firstBootPath, unless STATE has a config at statePath already; it
// reports whether it wrote one. While the network comes up it tries
// again, for up to wait. A config whose digest differs or that does not
// validate is written nowhere: the error says why, with the field paths.
func fetchFirstBootConfig(ctx context.Context, src configSource, statePath, firstBootPath string, wait time.Duration) (bool, error) {
	if has, err := stateHasConfig(statePath); has || err != nil {
		return false, err
	}
	if err := src.check(); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var data []byte
	for {
		var err error
		if data, err = fetchConfig(ctx, src); err == nil {
			break
		}
		if errors.Is(err, errRefused) {
			return false, err
		}
		slog.Warn("fetching the machine config, trying again", "url", src.url, "err", err)
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%s: no config after %s: %w", src.url, wait, err)
		case <-time.After(2 * time.Second):
		}
	}
	if err := keepFirstBootConfig(data, statePath, firstBootPath); err != nil {
		return false, err
	}
	return true, nil
}

// fetchConfig makes one request for src's config and checks it.
func fetchConfig(ctx context.Context, src configSource) ([]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, src.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", src.url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", src.url, err)
	}
	if sum := sha256.Sum256(data); src.sha256 != "" && hex.EncodeToString(sum[:]) != src.sha256 {
		return nil, fmt.Errorf("%w: the config at %s has the SHA-256 %x, not %s's %s", errRefused, src.url, sum, configSHA256Arg, src.sha256)
	}
	if _, err := machineconfig.Parse(data); err != nil {
		return nil, fmt.Errorf("%w: the config at %s: %w", errRefused, src.url, err)
	}
	return data, nil
}
