package epptransport

import (
	"fmt"
	"strings"
)

// SecretTokenKey (optional) of an EPP credentials Secret is a bearer token
// the sidecar sends with its scrapes of the EPP's /metrics, for EPPs that
// require one (upstream EPPs do by default). It takes precedence over the
// sidecar's own token file.
const SecretTokenKey = "token"

// metricsToken returns the token of the credentials Secret of a metrics
// URL, and the Secret's name; "" when the URL has no Secret or the Secret no
// token. A missing Secret is not this function's to report: forTarget
// fails the scrape first.
func (c *Credentials) MetricsToken(target string) (token, secret string, err error) {
	if c == nil {
		return "", "", nil
	}
	c.mu.RLock()
	tg, ok := c.targets[target]
	c.mu.RUnlock()
	// The pool's Secret, whether the port is reached over TLS or not.
	ref := tg.transport.Secret
	if !ok || ref.Name == "" {
		return "", "", nil
	}
	if !c.isSynced() {
		return "", ref.String(), fmt.Errorf("the sidecar has not listed the Secrets of EPP credentials yet (Secret %s)", ref)
	}
	lister := c.listers[ref.Namespace]
	if lister == nil {
		return "", ref.String(), nil
	}
	s, err := lister.Get(ref.Name)
	if err != nil {
		return "", ref.String(), nil
	}
	return strings.TrimSpace(string(s.Data[SecretTokenKey])), ref.String(), nil
}
