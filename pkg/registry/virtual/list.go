package virtual

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// blockTimeout is how long a LIST waits for the Store to reach a version it
// has not reached yet (one another replica issued, whose member events are
// still on their way here) before it answers "too large resource version",
// as the Kubernetes watch cache does.
var blockTimeout = 3 * time.Second

// tooLargeRetrySeconds is the Retry-After of that answer.
const tooLargeRetrySeconds = 1

// ListOptions select what a LIST returns and from which version, following
// the Kubernetes API conventions for resourceVersion and
// resourceVersionMatch. The API machinery has already refused the invalid
// combinations (a match without a resourceVersion, Exact with "0").
type ListOptions struct {
	Namespace string
	// Match selects the objects listed; nil selects every one (and lets
	// the Store decode only the page it returns).
	Match                func(Object) bool
	ResourceVersion      string
	ResourceVersionMatch metav1.ResourceVersionMatch
	// Limit asks for pages of at most that many objects, except with
	// resourceVersion "0", which (as from the Kubernetes watch cache) gets
	// everything at once. With a limit, a resourceVersion other than "0"
	// and no match asks for that exact version.
	Limit int64
	// Continue is the token of the previous page.
	Continue string
}

// ListWithOptions serves a LIST:
//   - resourceVersion "" (most recent) or "0" (any): the current state.
//   - NotOlderThan (or no match and no limit): the current state once it
//     covers resourceVersion, waiting up to blockTimeout, else 504 with the
//     ResourceVersionTooLarge cause that makes clients relist.
//   - Exact (or no match with a limit): the state at resourceVersion,
//     rebuilt from the history; 410 Gone when the history no longer reaches
//     back that far or the version was issued by another replica or an
//     earlier run, whose exact states this Store never had.
//
// With a limit, the objects come in pages (see page.go).
func (s *Store) ListWithOptions(ctx context.Context, opts ListOptions) (page, string, error) {
	if opts.Continue != "" {
		tok, err := decodeContinue(opts.Continue)
		if err != nil {
			return page{}, "", apierrors.NewBadRequest(err.Error())
		}
		v, err := ParseVersion(tok.ResourceVersion)
		if err != nil {
			return page{}, "", apierrors.NewBadRequest("invalid continue token: " + err.Error())
		}
		entries, err := s.stateAt(opts.Namespace, v, tok.ResourceVersion)
		if err != nil {
			return page{}, "", err
		}
		pg, err := s.pageOf(entries, opts.Match, tok.ResourceVersion, &tok, opts.Limit)
		return pg, tok.ResourceVersion, err
	}
	if opts.ResourceVersion == "0" {
		entries, rv := s.current(opts.Namespace)
		pg, err := s.pageOf(entries, opts.Match, rv, nil, 0)
		return pg, rv, err
	}
	if opts.ResourceVersion == "" {
		entries, rv := s.current(opts.Namespace)
		pg, err := s.pageOf(entries, opts.Match, rv, nil, opts.Limit)
		return pg, rv, err
	}
	v, err := ParseVersion(opts.ResourceVersion)
	if err != nil {
		return page{}, "", apierrors.NewBadRequest(err.Error())
	}
	if err := s.waitFor(ctx, v); err != nil {
		return page{}, "", err
	}
	exact := opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact ||
		(opts.ResourceVersionMatch == "" && opts.Limit > 0)
	if !exact {
		entries, rv := s.current(opts.Namespace)
		pg, err := s.pageOf(entries, opts.Match, rv, nil, opts.Limit)
		return pg, rv, err
	}
	entries, err := s.stateAt(opts.Namespace, v, opts.ResourceVersion)
	if err != nil {
		return page{}, "", err
	}
	rv := v.String()
	pg, err := s.pageOf(entries, opts.Match, rv, nil, opts.Limit)
	return pg, rv, err
}

// current returns the entries of namespace ("" for all) and the current
// resourceVersion.
func (s *Store) current(namespace string) ([]*entry, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.entriesIn(namespace), s.version.String()
}

// pageOf decodes the page of entries (listed at rv) that starts at start
// (nil: the first) and holds at most limit objects (0: all) that match
// (nil: every object). Without a selector only the page is decoded; with
// one, every entry is, to know which match. Entries never change: they are
// decoded outside the lock.
func (s *Store) pageOf(entries []*entry, match func(Object) bool, rv string, start *continueToken, limit int64) (page, error) {
	if match == nil {
		keep, next, remaining := paginate(entries, (*entry).objectKey, rv, start, limit)
		items, err := s.decodeAll(keep, nil)
		return page{items: items, next: next, remaining: remaining}, err
	}
	objs, err := s.decodeAll(entries, match)
	if err != nil {
		return page{}, err
	}
	items, next, remaining := paginate(objs, objectKeyOfObject, rv, start, limit)
	return page{items: items, next: next, remaining: remaining}, nil
}

// waitFor waits until the Store's version covers v, for at most
// blockTimeout.
func (s *Store) waitFor(ctx context.Context, v Version) error {
	timer := time.NewTimer(blockTimeout)
	defer timer.Stop()
	for {
		s.mu.RLock()
		covered := s.version.Covers(v)
		if v[epochComponent] != s.epoch {
			// Another replica's stamps are its clock's.
			covered = s.version.coversMembers(v)
		}
		advanced, current := s.advanced, s.version.String()
		s.mu.RUnlock()
		if covered {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return apierrors.NewTimeoutError(fmt.Sprintf("waiting for resource version %s: %v", v.String(), ctx.Err()), tooLargeRetrySeconds)
		case <-timer.C:
			return tooLargeResourceVersion(v, current)
		}
	}
}

// tooLargeResourceVersion is the answer of the Kubernetes storage layer
// (k8s.io/apiserver/pkg/storage.NewTooLargeResourceVersionError) for a
// version the server has not reached: 504 Timeout with the
// ResourceVersionTooLarge cause, which client-go reflectors answer by
// relisting from the most recent version.
func tooLargeResourceVersion(want Version, current string) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %s, current: %s (this server has not yet seen every member change that version includes)", want.String(), current), tooLargeRetrySeconds)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{
		Type:    metav1.CauseTypeResourceVersionTooLarge,
		Message: "Too large resource version",
	}}
	return err
}

// stateAt returns the entries of namespace as they were at v, rebuilt
// by undoing, newest first, the changes v does not cover. v must be this
// Store's own and reach back no further than the history.
func (s *Store) stateAt(namespace string, v Version, rv string) ([]*entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if v[epochComponent] != s.epoch {
		return nil, apierrors.NewResourceExpired("resource version " + rv + " was issued by another replica or an earlier run of the server, which cannot serve its exact state; list without resourceVersionMatch=Exact")
	}
	// Undoing the changes v does not cover gives the state after the last
	// change it covers.
	first, ok := s.firstUncovered(v)
	if !ok || !v.Covers(s.historyStart) {
		return nil, apierrors.NewResourceExpired("too old resource version: " + rv + " (the server keeps a limited history; relist)")
	}

	state := map[objectKey]*entry{}
	for _, e := range s.entriesIn(namespace) {
		state[e.objectKey()] = e
	}
	for i := len(s.history) - 1; i >= first; i-- {
		c := s.history[i]
		if namespace != "" && c.obj.namespace != namespace {
			continue
		}
		switch c.typ {
		case watch.Added:
			delete(state, c.obj.objectKey())
		case watch.Modified, watch.Deleted:
			state[c.obj.objectKey()] = c.prev
		}
	}
	out := make([]*entry, 0, len(state))
	for _, e := range state {
		out = append(out, e)
	}
	return out, nil
}
