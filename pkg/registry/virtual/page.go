package virtual

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
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

// paginate returns the page of limit objects (limit <= 0: all) that starts
// at the first object not before start (nil: the first), of objs listed at
// version rv.
func paginate(objs []Object, rv string, start *continueToken, limit int64) page {
	sortObjects(objs)
	if start != nil {
		objs = objs[sort.Search(len(objs), func(i int) bool {
			ns, name := objs[i].GetNamespace(), objs[i].GetName()
			return ns > start.Namespace || (ns == start.Namespace && name >= start.Name)
		}):]
	}
	if limit <= 0 || int64(len(objs)) <= limit {
		return page{items: objs}
	}
	first := objs[limit]
	return page{
		items:     objs[:limit],
		next:      continueToken{ResourceVersion: rv, Namespace: first.GetNamespace(), Name: first.GetName()}.encode(),
		remaining: int64(len(objs)) - limit,
	}
}
