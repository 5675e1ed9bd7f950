package conformance

// The data path (Extended): a request sent to a Gateway of the importing
// cluster is served by a model server of an exporting cluster. Serving
// models is not something a portable suite can set up (images,
// accelerators, a gateway implementation), so the operator names a data
// path that runs (--datapath-*); the suite reads objects and sends
// requests, and creates nothing for it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

const (
	reqDataPath = "Proposal, Workflow 3 (routing): an HTTPRoute in the importing cluster names the InferencePoolImport as a backendRef, " +
		"and its Gateway sends a request to a model server of an exporting cluster, chosen through that cluster's Endpoint Picker"
	reqDataPathSpread = "Proposal, InferencePoolImport: the import stands for the pools of every exporting cluster, so the importing " +
		"cluster's Gateway sends requests to each of them (the implementation chooses how many to which)"
	// dataPathRequests bounds the requests the spread test sends.
	dataPathRequests = 60
)

func dataPathTests() []Test {
	return []Test{{
		Name:        "a request sent through a Gateway of the importing cluster is answered by a model server of an exporting cluster",
		Requirement: reqDataPath,
		Label:       Extended,
		Run:         testDataPath,
	}, {
		Name:        "requests sent through the importing cluster's Gateway reach every exporting cluster of the import",
		Requirement: reqDataPathSpread,
		Label:       Extended,
		Run:         testDataPathSpread,
	}}
}

// dataPathFixture is the data path the runner named, checked against the
// import it routes to.
type dataPathFixture struct {
	DataPath
	importer  *Cluster
	exporters []string
	client    *http.Client
}

// newDataPathFixture skips the test where no data path was named, and
// fails it where the import the route sends to is not served with
// exporting clusters other than the importer.
func newDataPathFixture(t *T) *dataPathFixture {
	dp := t.suite.cfg.DataPath
	if dp.URL == "" {
		t.Skipf("no --datapath-url: the runner named no Gateway and model servers to send requests through")
	}
	d := &dataPathFixture{DataPath: dp, client: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}}
	for _, c := range t.Clusters() {
		if c.Context == dp.Context {
			d.importer = c
		}
	}
	if d.importer == nil {
		t.Fatalf("--datapath-context %q is not one of the clusters under test", dp.Context)
	}
	ns, name, _ := strings.Cut(dp.Import, "/")
	f := &fixture{t: t, ns: ns}
	f.eventually("the Gateway's cluster serves the import "+dp.Import+" of another member", func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(d.importer, name)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("%s's import %s: %v (served: %t)", d.importer.Name, dp.Import, err, imp != nil)
		}
		d.exporters = exportingClusters(imp)
		ok := len(d.exporters) > 0 && !slices.Contains(d.exporters, d.importer.Name)
		return ok, fmt.Sprintf("exported by [%s]", strings.Join(d.exporters, ", "))
	})
	return d
}

// send sends one completion request through the Gateway and returns the
// cluster that served it ("" when no served-by header was named), or why
// the answer is not a model server's.
func (d *dataPathFixture) send(ctx context.Context) (cluster string, err error) {
	body, _ := json.Marshal(map[string]any{"model": d.Model, "prompt": "Say hello", "max_tokens": 8})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(d.URL, "/")+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
	}
	var completion struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(b, &completion); err != nil || len(completion.Choices) == 0 {
		return "", fmt.Errorf("HTTP 200 without a completion's choices (%v): %.200s", err, b)
	}
	if d.ServedByHeader == "" {
		return "", nil
	}
	served := resp.Header.Get(d.ServedByHeader)
	cluster, _, ok := strings.Cut(served, "/")
	if !ok {
		return "", fmt.Errorf("response header %s is %q, not <cluster>/<server>", d.ServedByHeader, served)
	}
	return cluster, nil
}

func testDataPath(t *T) {
	d := newDataPathFixture(t)
	f := &fixture{t: t}
	f.eventually("a request through "+d.URL+" is answered by a model server of "+strings.Join(d.exporters, " or "), func(ctx context.Context) (bool, string) {
		cluster, err := d.send(ctx)
		switch {
		case err != nil:
			return false, err.Error()
		case d.ServedByHeader != "" && !slices.Contains(d.exporters, cluster):
			return false, fmt.Sprintf("served by %q, which does not export %s", cluster, d.Import)
		}
		return true, ""
	})
}

func testDataPathSpread(t *T) {
	d := newDataPathFixture(t)
	if d.ServedByHeader == "" {
		t.Skipf("no --datapath-served-by-header: the suite cannot tell which cluster served a request")
	}
	if len(d.exporters) < 2 {
		t.Skipf("the import %s has %d exporting cluster(s): needs 2", d.Import, len(d.exporters))
	}
	seen := map[string]int{}
	failed, firstErr := 0, ""
	for i := 0; i < dataPathRequests && len(seen) < len(d.exporters); i++ {
		cluster, err := d.send(t.Context())
		if err != nil {
			if failed++; failed == 1 {
				firstErr = err.Error()
			}
			continue
		}
		if !slices.Contains(d.exporters, cluster) {
			t.Fatalf("a request was served by %q, which does not export %s (exporters: %s)", cluster, d.Import, strings.Join(d.exporters, ", "))
		}
		seen[cluster]++
	}
	if len(seen) < len(d.exporters) {
		t.Fatalf("%d requests reached %v of the exporters [%s]; %d failed, the first with: %s", dataPathRequests, seen, strings.Join(d.exporters, ", "), failed, firstErr)
	}
	if failed > 0 {
		t.Errorf("%d of the requests failed, the first with: %s", failed, firstErr)
	}
}
