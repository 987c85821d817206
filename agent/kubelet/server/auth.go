package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// How long reviews are cached: the kubelet's defaults, so that a stream
// of requests costs the API server one review, and a change of RBAC counts
// within minutes.
const (
	tokenTTL        = 2 * time.Minute
	tokenDeniedTTL  = 10 * time.Second
	allowedTTL      = 5 * time.Minute
	deniedTTL       = 30 * time.Second
	reviewTimeout   = 10 * time.Second
	cacheMaxEntries = 4096
)

// errUnauthenticated is for a request without credentials that count.
var errUnauthenticated = errors.New("no valid client certificate or bearer token")

// auth authenticates and authorizes the requests.
type auth struct {
	client    kubernetes.Interface
	node      string
	tokens    cache[*authenticationv1.UserInfo] // nil: the token was refused
	decisions cache[decision]
}

// decision is a SubjectAccessReview's answer.
type decision struct {
	allowed bool
	reason  string
}

func newAuth(client kubernetes.Interface, node string) *auth {
	return &auth{client: client, node: node}
}

// wrap lets a request through to h once it is authenticated (401 if not)
// and authorized (403 with the reason if not).
func (a *auth) wrap(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := a.authenticate(r)
		if err != nil {
			if !errors.Is(err, errUnauthenticated) {
				log.Warn("kubelet server: cannot authenticate a request", "path", r.URL.Path, "err", err)
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := verbOf(r.Method)
		subs := subresources(r.URL.Path)
		d, err := a.authorize(r.Context(), u, verb, subs)
		if err != nil {
			log.Warn("kubelet server: cannot authorize a request", "path", r.URL.Path, "user", u.Username, "err", err)
			http.Error(w, "cannot authorize the request: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if !d.allowed {
			msg := fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource=%s)", u.Username, verb, subs[len(subs)-1])
			if d.reason != "" {
				msg += ": " + d.reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// authenticate returns the user of a verified client certificate, or of
// a bearer token as TokenReview says.
func (a *auth) authenticate(r *http.Request) (*authenticationv1.UserInfo, error) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		c := r.TLS.VerifiedChains[0][0]
		return &authenticationv1.UserInfo{Username: c.Subject.CommonName, Groups: c.Subject.Organization}, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return nil, errUnauthenticated
	}
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if u, ok := a.tokens.get(key); ok {
		if u == nil {
			return nil, errUnauthenticated
		}
		return u, nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), reviewTimeout)
	defer cancel()
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		a.tokens.put(key, nil, tokenDeniedTTL)
		return nil, errUnauthenticated
	}
	u := tr.Status.User
	a.tokens.put(key, &u, tokenTTL)
	return &u, nil
}

// authorize asks whether u may verb the Node's subresources: the first
// allowed one lets the request through, else the last one's answer
// counts.
func (a *auth) authorize(ctx context.Context, u *authenticationv1.UserInfo, verb string, subs []string) (decision, error) {
	var d decision
	for _, sub := range subs {
		key := strings.Join([]string{u.Username, u.UID, strings.Join(u.Groups, ","), fmt.Sprint(u.Extra), verb, sub}, "\x00")
		if cached, ok := a.decisions.get(key); ok {
			d = cached
		} else {
			var err error
			if d, err = a.review(ctx, u, verb, sub); err != nil {
				return d, err
			}
			ttl := deniedTTL
			if d.allowed {
				ttl = allowedTTL
			}
			a.decisions.put(key, d, ttl)
		}
		if d.allowed {
			return d, nil
		}
	}
	return d, nil
}

// review makes the SubjectAccessReview of u doing verb on the Node's
// subresource sub.
func (a *auth) review(ctx context.Context, u *authenticationv1.UserInfo, verb, sub string) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: "", Version: "v1", Resource: "nodes", Subresource: sub, Name: a.node,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return decision{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return decision{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}, nil
}

// verbOf is the API verb of an HTTP method, as the kubelet maps them.
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(method)
}

// subresources are the Node subresources that authorize a path, the
// narrowest first: /healthz and /pods are also allowed by nodes/proxy,
// which allows everything, as with the kubelet's fine-grained
// authorization.
func subresources(path string) []string {
	under := func(prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }
	switch {
	case under("/healthz"):
		return []string{"healthz", "proxy"}
	case under("/pods"):
		return []string{"pods", "proxy"}
	case under("/stats"):
		return []string{"stats"}
	case under("/metrics"):
		return []string{"metrics"}
	case under("/logs"):
		return []string{"log"}
	}
	return []string{"proxy"}
}

// cache keeps values for a while.
type cache[V any] struct {
	mu sync.Mutex
	m  map[string]cached[V]
}

type cached[V any] struct {
	v       V
	expires time.Time
}

func (c *cache[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || time.Now().After(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// put keeps v for ttl; when the cache is full, the expired entries go,
// and if none expired, everything does.
func (c *cache[V]) put(key string, v V, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.m == nil {
		c.m = map[string]cached[V]{}
	}
	if len(c.m) >= cacheMaxEntries {
		for k, e := range c.m {
			if now.After(e.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= cacheMaxEntries {
			clear(c.m)
		}
	}
	c.m[key] = cached[V]{v: v, expires: now.Add(ttl)}
}
