package simulator

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFaultErrorAnswers500AtOnceAndLiftsOnSwitch(t *testing.T) {
	s, srv := start(t, Options{Latency: 50 * time.Millisecond})
	body := `{"model":"` + base + `","prompt":"hi"}`

	resp, b := post(t, t.Context(), srv.URL+"/admin/fault", `{"fault":"error"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	began := time.Now()
	resp, b = post(t, t.Context(), srv.URL+"/v1/completions", body)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", b)
	assert.Less(t, time.Since(began), 50*time.Millisecond, "an error sink answers before the request's latency")
	assert.Equal(t, "sim-a", resp.Header.Get(InstanceHeader), "the failing instance still says who it is")

	resp, _ = post(t, t.Context(), srv.URL+"/admin/fault", `{"fault":""}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, FaultNone, s.Fault())
	resp, b = post(t, t.Context(), srv.URL+"/v1/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "lifted, it serves again: %s", b)
}

func TestFaultHangHoldsTheFirstByteUntilLifted(t *testing.T) {
	s, srv := start(t, Options{Latency: -1})
	require.NoError(t, s.SetFault(FaultHang))
	done := make(chan int, 1)
	go func() {
		resp, _ := post(t, t.Context(), srv.URL+"/v1/completions", `{"model":"`+base+`","prompt":"hi"}`)
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		t.Fatalf("a hung server answered %d", code)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, s.SetFault(FaultNone))
	select {
	case code := <-done:
		assert.Equal(t, http.StatusOK, code, "a held request is served once the hang is lifted")
	case <-time.After(5 * time.Second):
		t.Fatal("the held request was not released")
	}
}

func TestFaultRefusesUnknownKinds(t *testing.T) {
	s, srv := start(t, Options{})
	resp, b := post(t, t.Context(), srv.URL+"/admin/fault", `{"fault":"explode"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	resp, b = post(t, t.Context(), srv.URL+"/admin/fault", `{"kind":"error"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "unknown fields are refused: %s", b)
	assert.Equal(t, FaultNone, s.Fault())
}
