package virtual

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// A LIST with a limit is served in pages, as the Kubernetes API does: each
// page ends with a continue token holding the version of the first page
// and the namespace/name to resume from, and the next page lists the exact
// state at that version (rebuilt from the history), so the pages together
// are one consistent snapshot. A token whose version has left the history
// answers 410 Gone, as an etcd compaction does upstream.

// continueToken is the content of a LIST continue token.
type continueToken struct {
	// ResourceVersion is the version every page lists.
	ResourceVersion string `json:"rv"`
	// Namespace and Name are the first object of the next page.
	Namespace string `json:"ns,omitempty"`
	Name      string `json:"name"`
}

func (t continueToken) encode() string {
	data, err := json.Marshal(t)
	if err != nil {
		// A struct of strings always marshals.
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(data)
}

func decodeContinue(s string) (continueToken, error) {
	var t continueToken
	data, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(data, &t)
	}
	if err == nil && (t.ResourceVersion == "" || t.Name == "") {
		err = fmt.Errorf("incomplete token")
	}
	if err != nil {
		return continueToken{}, fmt.Errorf("invalid continue token (it must come from the previous page of this LIST): %v", err)
	}
	return t, nil
}

// page is one page of a LIST.
type page struct {
	items []Object
	// next is the continue token of the following page, "" on the last.
	next string
	// remaining counts the objects after this page.
	remaining int64
}

// paginate returns the page of items (at most limit: limit <= 0 means
// all) that starts at the first item not before start (nil: the first),
// of items listed at version rv, with the continue token of the next page
// ("" on the last) and how many items follow. keyOf gives an item's
// namespace and name; items are sorted by them.
func paginate[T any](items []T, keyOf func(T) objectKey, rv string, start *continueToken, limit int64) (pg []T, next string, remaining int64) {
	slices.SortFunc(items, func(a, b T) int { return compareKeys(keyOf(a), keyOf(b)) })
	if start != nil {
		from := objectKey{start.Namespace, start.Name}
		items = items[sort.Search(len(items), func(i int) bool { return compareKeys(keyOf(items[i]), from) >= 0 }):]
	}
	if limit <= 0 || int64(len(items)) <= limit {
		return items, "", 0
	}
	first := keyOf(items[limit])
	return items[:limit], continueToken{ResourceVersion: rv, Namespace: first.namespace, Name: first.name}.encode(), int64(len(items)) - limit
}

// compareKeys orders by namespace, then name.
func compareKeys(a, b objectKey) int {
	if c := strings.Compare(a.namespace, b.namespace); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

func objectKeyOfObject(o Object) objectKey { return objectKey{o.GetNamespace(), o.GetName()} }
