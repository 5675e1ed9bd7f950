package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// MaxMetadataBytes bounds the /metadata body Metadata reads. Seed 002's
// metadata is a model card and transport details: kilobytes, not megabytes.
const MaxMetadataBytes = 1 << 20

// DefaultMetadataTimeout bounds a Metadata call made with a nil client (ctx
// may bound it further).
const DefaultMetadataTimeout = 10 * time.Second

var defaultMetadataClient = &http.Client{Timeout: DefaultMetadataTimeout}

// ErrNoMetadata means an instance answers 404 at /metadata: it publishes no
// seed 002 metadata (a plain vLLM server, say).
var ErrNoMetadata = errors.New("the instance serves no /metadata")

// Metadata fetches an instance's metadata: GET <baseURL>/metadata, which
// must answer 200 with a JSON object of at most MaxMetadataBytes. baseURL is
// the instance's scheme, address and port (http://10.1.2.3:8000); a nil
// client means one with DefaultMetadataTimeout. Values are decoded as
// encoding/json decodes into any (numbers are float64). Errors from the transport
// are wrapped, so errors.Is(err, context.DeadlineExceeded) tells a timeout
// of ctx; a 404 wraps ErrNoMetadata, a body that is not one JSON object
// ErrInvalidMetadata.
func Metadata(ctx context.Context, client *http.Client, baseURL string) (map[string]any, error) {
	if client == nil {
		client = defaultMetadataClient
	}
	url := strings.TrimSuffix(baseURL, "/") + MetadataPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", baseURL, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", baseURL, err)
	}
	defer func() { _ = resp.Body.Close() }()

	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMetadataBytes+1))
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: reading the body: %w", baseURL, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("metadata of %s: %w: GET %s answered %s", baseURL, ErrNoMetadata, url, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metadata of %s: GET %s answered %s: %s", baseURL, url, resp.Status, snippet(body))
	}
	if len(body) > MaxMetadataBytes {
		return nil, fmt.Errorf("metadata of %s: body larger than %d bytes", baseURL, MaxMetadataBytes)
	}
	md, err := decodeMetadata(body)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", baseURL, err)
	}
	return md, nil
}

// decodeMetadata decodes a /metadata body: one JSON object, nothing after
// it but white space. An error wraps ErrInvalidMetadata.
func decodeMetadata(body []byte) (map[string]any, error) {
	var md map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&md); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %w (body starts %s)", ErrInvalidMetadata, err, snippet(body))
	}
	if md == nil {
		return nil, fmt.Errorf("%w: not a JSON object: null", ErrInvalidMetadata)
	}
	// What follows the object must be white space: Decoder.More would
	// miss a stray closing bracket.
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, fmt.Errorf("%w: trailing data after the JSON object: %s", ErrInvalidMetadata, snippet(rest))
	}
	return md, nil
}

// snippet quotes the start of a body for an error message.
func snippet(body []byte) string {
	const n = 200
	s := strings.TrimSpace(string(body))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return fmt.Sprintf("%q", s)
}
