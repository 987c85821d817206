package pods

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// keyring holds the registry credentials of a pod's imagePullSecrets, by
// the registry they are for.
type keyring []keyringEntry

// keyringEntry is one credential of a docker config: its key parsed into
// host (whose DNS labels may be globs such as *.example.com), port and
// repository path prefix.
type keyringEntry struct {
	host, port, path string
	wildcard         bool
	auth             *criv1.AuthConfig
}

// dockerAuth is a credential in a docker config file; auth, when set, is
// base64 of user:password.
type dockerAuth struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
}

// parseKeyring reads the docker configs of secrets — kubernetes.io/
// dockerconfigjson and kubernetes.io/dockercfg; other types are not
// credentials and are skipped. A secret that does not parse is an error;
// the others are still read.
func parseKeyring(secrets []*corev1.Secret) (keyring, error) {
	var k keyring
	var errs []error
	for _, s := range secrets {
		var auths map[string]dockerAuth
		var err error
		switch s.Type {
		case corev1.SecretTypeDockerConfigJson:
			var cfg struct {
				Auths map[string]dockerAuth `json:"auths"`
			}
			err = json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg)
			auths = cfg.Auths
		case corev1.SecretTypeDockercfg:
			err = json.Unmarshal(s.Data[corev1.DockerConfigKey], &auths)
		default:
			continue
		}
		if err == nil {
			var entries keyring
			entries, err = keyringEntries(auths)
			k = append(k, entries...)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pull secret %s/%s: %w", s.Namespace, s.Name, err))
		}
	}
	return k, errors.Join(errs...)
}

func keyringEntries(auths map[string]dockerAuth) (keyring, error) {
	var out keyring
	for _, key := range slices.Sorted(maps.Keys(auths)) {
		a := auths[key]
		auth := &criv1.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("auth of %s: %w", key, err)
			}
			user, pass, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("auth of %s is not user:password", key)
			}
			auth.Username, auth.Password = user, pass
		}
		e, err := parseKey(key)
		if err != nil {
			return nil, err
		}
		e.auth = auth
		out = append(out, e)
	}
	return out, nil
}

// parseKey parses a docker config key: [scheme://]host[:port][/path].
// Docker Hub's index URL, https://index.docker.io/v1/, means all of
// docker.io, the registry of image names without a host.
func parseKey(key string) (keyringEntry, error) {
	s := key
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	hostport, p, _ := strings.Cut(s, "/")
	u, err := url.Parse("//" + hostport)
	if err != nil || u.Hostname() == "" {
		return keyringEntry{}, fmt.Errorf("registry %q is not host[:port][/path]", key)
	}
	e := keyringEntry{host: strings.ToLower(u.Hostname()), port: u.Port(), path: strings.Trim(p, "/")}
	if e.host == "index.docker.io" || e.host == "registry-1.docker.io" {
		e.host = "docker.io"
	}
	if e.host == "docker.io" && (e.path == "v1" || e.path == "v2") {
		e.path = ""
	}
	e.wildcard = strings.Contains(e.host, "*")
	return e, nil
}

// lookup returns the credentials for image, the most specific first: the
// longest repository path, then an exact host before a glob.
func (k keyring) lookup(image string) []*criv1.AuthConfig {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return nil
	}
	u, err := url.Parse("//" + reference.Domain(named))
	if err != nil {
		return nil
	}
	host, port, repo := strings.ToLower(u.Hostname()), u.Port(), reference.Path(named)
	var matches keyring
	for _, e := range k {
		if e.port == port && hostMatches(e.host, host) && (e.path == "" || repo == e.path || strings.HasPrefix(repo, e.path+"/")) {
			matches = append(matches, e)
		}
	}
	slices.SortStableFunc(matches, func(a, b keyringEntry) int {
		if c := cmp.Compare(len(b.path), len(a.path)); c != 0 {
			return c
		}
		switch {
		case a.wildcard == b.wildcard:
			return 0
		case b.wildcard:
			return -1
		}
		return 1
	})
	out := make([]*criv1.AuthConfig, len(matches))
	for i, e := range matches {
		out[i] = e.auth
	}
	return out
}

// hostMatches matches a host against a pattern label by label, each label
// of the pattern a glob (*.example.com matches a.example.com, not
// example.com nor a.b.example.com).
func hostMatches(pattern, host string) bool {
	pl, hl := strings.Split(pattern, "."), strings.Split(host, ".")
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if ok, err := path.Match(pl[i], hl[i]); !ok || err != nil {
			return false
		}
	}
	return true
}
