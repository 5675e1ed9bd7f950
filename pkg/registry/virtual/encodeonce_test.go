package virtual

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference"
)

// TestWatchersShareOneEncodingPerChange: however many watchers send a
// change, the API server's encoder runs once per serialization, and what
// it is given is a copy it may change.
func TestWatchersShareOneEncodingPerChange(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns1", "a", nil, "cluster-a")
	s := startStore(t, r)
	o, _, _ := s.Get("ns1", "a")

	var watchers []watch.Interface
	for range 3 {
		w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: o.GetResourceVersion()})
		require.NoError(t, err)
		defer w.Stop()
		watchers = append(watchers, w)
	}
	r.set("ns1", "a", nil, "cluster-a", "cluster-c")
	notifyPool(s, "cluster-c", "ns1", "a", 10)

	encodes := 0
	encode := func(obj runtime.Object, w io.Writer) error {
		encodes++
		imp := obj.(*inference.InferencePoolImport)
		raw, err := json.Marshal(imp)
		imp.Name = "changed by the encoder"
		if err != nil {
			return err
		}
		_, err = w.Write(raw)
		return err
	}
	var outputs []string
	var last runtime.CacheableObject
	for _, w := range watchers {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-t.Context().Done():
			t.Fatal("no event")
		}
		co, ok := ev.Object.(runtime.CacheableObject)
		require.True(t, ok, "a live change reaches the API server as a CacheableObject, got %T", ev.Object)
		var buf bytes.Buffer
		require.NoError(t, co.CacheEncode("json", encode, &buf))
		outputs = append(outputs, buf.String())
		last = co
	}
	assert.Equal(t, 1, encodes, "one encoding for three watchers")
	assert.Equal(t, outputs[0], outputs[1])
	assert.Equal(t, outputs[0], outputs[2])
	assert.Contains(t, outputs[0], "cluster-c")

	// Another serialization (a different media type or version) encodes
	// again, once.
	for range 2 {
		var buf bytes.Buffer
		require.NoError(t, last.CacheEncode("yaml", encode, &buf))
	}
	assert.Equal(t, 2, encodes)

	got, _, _ := s.Get("ns1", "a")
	assert.Equal(t, "a", got.GetName(), "the encoder changed only its copy")
}
