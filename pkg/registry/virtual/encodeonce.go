package virtual

import (
	"bytes"
	"io"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// encodedOnce carries one change's object to every watcher. It implements
// runtime.CacheableObject, so the API server's watch handler encodes the
// whole watch event once per serialization (media type, version, event
// type) and writes the same bytes to every watcher that uses it, instead of
// converting and encoding the object once per watcher: with hundreds of
// watches that encoding was most of the cost of an event. The Kubernetes
// watch cache does the same for the objects it sends.
//
// It wraps only what goes to live watchers; the history keeps the bare
// objects, so the encodings are garbage once every watcher has sent them.
type encodedOnce struct {
	Object

	mu             sync.Mutex
	serializations map[runtime.Identifier]*serialization
}

type serialization struct {
	once sync.Once
	raw  []byte
	err  error
}

func newEncodedOnce(o Object) *encodedOnce { return &encodedOnce{Object: o} }

// CacheEncode implements runtime.CacheableObject.
func (e *encodedOnce) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	e.mu.Lock()
	if e.serializations == nil {
		e.serializations = map[runtime.Identifier]*serialization{}
	}
	s, ok := e.serializations[id]
	if !ok {
		s = &serialization{}
		e.serializations[id] = s
	}
	e.mu.Unlock()

	s.once.Do(func() {
		var buf bytes.Buffer
		// A copy, as the watch cache encodes one: an encoder may set
		// fields (the kind, say) on what it is given, and the object is
		// shared with LIST responses and other serializations.
		s.err = encode(e.Object.DeepCopyObject(), &buf)
		s.raw = buf.Bytes()
	})
	if s.err != nil {
		return s.err
	}
	_, err := w.Write(s.raw)
	return err
}

// GetObject implements runtime.CacheableObject: a copy the caller may
// change.
func (e *encodedOnce) GetObject() runtime.Object { return e.Object.DeepCopyObject() }

var _ runtime.CacheableObject = &encodedOnce{}
