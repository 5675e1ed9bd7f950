package virtual

import (
	"fmt"
	"sync"
	"unique"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/mci-dev/mci/pkg/compact"
)

// entry is an object as the Store keeps it: encoded and compressed
// (package compact), with its namespace and name in the clear for the
// indexes. A Store holds one per computed object and its history shares
// them, so the objects of a large ClusterSet cost about a tenth of their
// size as Go values (imports: under 100 bytes of encoding each, against
// 1.3 to 2.5 KiB); each read decodes a fresh copy, which the caller owns.
type entry struct {
	namespace, name string
	data            string
}

func (e *entry) key() string { return key(e.namespace, e.name) }

// codecs are the codecs of the Stores of a process, one per kind: Stores
// of one kind share a dictionary and the compressors that hold it (a
// compressor is most of a megabyte, and a process serving many Stores of
// one kind, as the member mock does, would otherwise make one per
// encoding once the garbage collector empties their pools).
var codecs sync.Map // kind: *compact.Codec

func codecFor(kind string) *compact.Codec {
	c, _ := codecs.LoadOrStore(kind, compact.New())
	return c.(*compact.Codec)
}

// objectKey is an object's namespace and name: the key of the Store's
// objects, sharing the strings of their entries (a namespace/name string
// per object cost as much as its encoding).
type objectKey struct{ namespace, name string }

func (e *entry) objectKey() objectKey { return objectKey{e.namespace, e.name} }

// objectKeyOf is the objectKey of a namespace/name key.
func objectKeyOf(k string) objectKey {
	ns, name := splitKey(k)
	return objectKey{ns, name}
}

// encode keeps o as an entry. Namespaces are few and every object repeats
// one: they are interned.
//
// The resourceVersion stays in the encoding: kept apart, as a string per
// recomputation, it cost more than its compressed bytes when objects
// change a few at a time (a fleet's pools created one by one).
func (s *Store) encode(o Object) (*entry, error) {
	data, err := s.codec.Encode(o)
	if err != nil {
		return nil, err
	}
	return &entry{namespace: unique.Make(o.GetNamespace()).Value(), name: o.GetName(), data: data}, nil
}

// entriesIn returns the entries of namespace ("" for all).
func (s *Store) entriesIn(namespace string) []*entry {
	out := make([]*entry, 0, len(s.objects))
	for k, e := range s.objects {
		if namespace == "" || k.namespace == namespace {
			out = append(out, e)
		}
	}
	return out
}

// decode returns the object e keeps. It fails only if the Store's own
// encoding does not decode, which is a bug: the request that reads it
// fails with an internal error that says so, rather than miss the object.
func (s *Store) decode(e *entry) (Object, error) {
	o := s.newFunc()
	if err := s.codec.Decode(e.data, o); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("object %s as this server keeps it: %w", e.key(), err))
	}
	return o, nil
}

// decodeAll decodes entries whose objects match (nil: every one).
func (s *Store) decodeAll(entries []*entry, match func(Object) bool) ([]Object, error) {
	out := make([]Object, 0, len(entries))
	for _, e := range entries {
		o, err := s.decode(e)
		if err != nil {
			return nil, err
		}
		if match == nil || match(o) {
			out = append(out, o)
		}
	}
	return out, nil
}
