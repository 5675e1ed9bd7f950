package clusterset

import (
	"bytes"
	"io"
	"os"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// captureKlog sends klog's output to a buffer the test reads, until the
// test ends. klog writes under its own lock while the Cache's goroutines
// may still log as the test ends, hence the buffer's own lock.
func captureKlog(t *testing.T) *syncBuffer {
	t.Helper()
	logged := &syncBuffer{}
	klog.LogToStderr(false)
	// A line goes to its severity's output and every lower one's: the
	// INFO one has each line once.
	klog.SetOutput(io.Discard)
	klog.SetOutputBySeverity("INFO", logged)
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return logged
}

// syncBuffer is a bytes.Buffer that the logger and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
