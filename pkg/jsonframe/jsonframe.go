// Package jsonframe reads a stream of JSON values, a Kubernetes watch's
// events, one value at a time, keeping nothing between them.
//
// apimachinery's JSON framer finds where a value ends by decoding it with
// an encoding/json Decoder, whose buffer grows to the largest value read
// (and up to twice that) and is kept for the stream's life. A reader of a
// thousand members has two watches open to each at any time, and those
// buffers were about 3.5 KiB a member. This framer scans the bytes as
// they are read into the caller's buffer instead (client-go's streaming
// decoder, which keeps its own) and holds only what one read returned
// past the end of a value, until it is asked for the next. It finds
// where a value ends and no more: whether the value is valid JSON is the
// serializer's to say, as it decodes the frame.
package jsonframe

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// Framer is a runtime.Framer for JSON values written one after another.
// Its writer is apimachinery's: a JSON value needs no framing to write.
var Framer runtime.Framer = framer{}

type framer struct{}

func (framer) NewFrameReader(r io.ReadCloser) io.ReadCloser { return &reader{r: r} }

func (framer) NewFrameWriter(w io.Writer) io.Writer { return json.Framer.NewFrameWriter(w) }

// NegotiatedSerializer is ns with Framer in place of its JSON streams'
// framer; everything else is ns's.
func NegotiatedSerializer(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	infos := slices.Clone(ns.SupportedMediaTypes())
	for i := range infos {
		if infos[i].MediaType != runtime.ContentTypeJSON || infos[i].StreamSerializer == nil {
			continue
		}
		stream := *infos[i].StreamSerializer
		stream.Framer = Framer
		infos[i].StreamSerializer = &stream
	}
	return negotiated{NegotiatedSerializer: ns, infos: infos}
}

type negotiated struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// ErrNotAnObject is returned for a stream whose next value is not a JSON
// object or array: a watch sends objects only.
var ErrNotAnObject = errors.New("a frame of a JSON stream is an object or an array")

// reader returns one value of the stream per Read, with the blanks before
// it, or io.ErrShortBuffer with as much of it as the buffer holds, the
// rest to the next Reads (as runtime.Framer's readers do).
type reader struct {
	r io.ReadCloser
	// pending is what a read returned past the end of the last value:
	// the start of the next. nil when there is none.
	pending []byte
	scan    scanner
}

func (r *reader) Read(data []byte) (int, error) {
	n := 0
	for n < len(data) {
		var got int
		var err error
		if len(r.pending) > 0 {
			got = copy(data[n:], r.pending)
			if r.pending = r.pending[got:]; len(r.pending) == 0 {
				r.pending = nil
			}
		} else {
			got, err = r.r.Read(data[n:])
		}
		end, scanErr := r.scan.feed(data[n : n+got])
		if scanErr != nil {
			return 0, scanErr
		}
		if end >= 0 {
			if past := data[n+end : n+got]; len(past) > 0 {
				r.pending = append(slices.Clone(past), r.pending...)
			}
			r.scan = scanner{}
			return n + end, nil
		}
		n += got
		if err == io.EOF {
			if r.scan.started {
				return 0, io.ErrUnexpectedEOF
			}
			// Blanks after the last value.
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
	}
	return n, io.ErrShortBuffer
}

func (r *reader) Close() error { return r.r.Close() }

// scanner follows a JSON value through the bytes fed to it, across reads.
type scanner struct {
	started  bool
	depth    int
	inString bool
	escaped  bool
}

// feed scans b and returns the index in it just past the end of the
// value, or -1 when the value goes on past b.
func (s *scanner) feed(b []byte) (int, error) {
	for i, c := range b {
		switch {
		case s.inString:
			switch {
			case s.escaped:
				s.escaped = false
			case c == '\\':
				s.escaped = true
			case c == '"':
				s.inString = false
			}
		case c == ' ', c == '\t', c == '\n', c == '\r':
		case !s.started && c != '{' && c != '[':
			return -1, fmt.Errorf("%w, not one starting with %q", ErrNotAnObject, c)
		case c == '{', c == '[':
			s.started = true
			s.depth++
		case c == '}', c == ']':
			if s.depth--; s.depth == 0 {
				return i + 1, nil
			}
		case c == '"':
			s.inString = true
		}
	}
	return -1, nil
}
