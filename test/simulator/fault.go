package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// Fault is how the server answers completion requests, switched at run
// time (POST /admin/fault) so that a test can make a running model server
// fail as a real one does, without restarting it or its pod's address.
type Fault string

const (
	// FaultNone serves requests.
	FaultNone Fault = ""
	// FaultError answers every completion request 500 at once, before
	// reading it: an error sink, which looks idle and fast.
	FaultError Fault = "error"
	// FaultHang holds every completion request before its first byte
	// until the fault is lifted (then serves it) or the client goes away.
	FaultHang Fault = "hang"
)

// faultState is the current Fault and, while it is FaultHang, the channel
// closed when it is lifted.
type faultState struct {
	mu     sync.Mutex
	fault  Fault
	lifted chan struct{}
}

// SetFault switches the server's fault; lifting a hang releases the
// requests it held.
func (s *Server) SetFault(f Fault) error {
	switch f {
	case FaultNone, FaultError, FaultHang:
	default:
		return fmt.Errorf("simulator: unknown fault %q (want %q, %q or none)", f, FaultError, FaultHang)
	}
	s.fault.mu.Lock()
	defer s.fault.mu.Unlock()
	if s.fault.fault == FaultHang && f != FaultHang {
		close(s.fault.lifted)
	}
	if f == FaultHang && s.fault.fault != FaultHang {
		s.fault.lifted = make(chan struct{})
	}
	s.fault.fault = f
	return nil
}

// Fault is the server's current fault.
func (s *Server) Fault() Fault {
	s.fault.mu.Lock()
	defer s.fault.mu.Unlock()
	return s.fault.fault
}

// applyFault applies the current fault to a completion request: it
// reports whether the request was answered (an error sink) or abandoned
// (the client left while it hung); false lets it be served.
func (s *Server) applyFault(ctx context.Context, w http.ResponseWriter) bool {
	s.fault.mu.Lock()
	f, lifted := s.fault.fault, s.fault.lifted
	s.fault.mu.Unlock()
	switch f {
	case FaultError:
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{
			"message": "simulated server error (fault " + string(FaultError) + ")", "type": "server_error", "code": http.StatusInternalServerError,
		}})
		return true
	case FaultHang:
		select {
		case <-lifted:
			return false
		case <-ctx.Done():
			return true
		}
	}
	return false
}

type faultBody struct {
	Fault Fault `json:"fault"`
}

// adminFault reads (GET) or sets (POST {"fault":"error"|"hang"|""}) the
// fault.
func (s *Server) adminFault(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		var b faultBody
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			writeError(w, http.StatusBadRequest, "fault: %v", err)
			return
		}
		if err := s.SetFault(b.Fault); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
	}
	writeJSON(w, http.StatusOK, faultBody{Fault: s.Fault()})
}
