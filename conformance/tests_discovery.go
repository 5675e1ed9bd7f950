package conformance

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// What a client finds about imports: the schema kubectl explain reads, the
// table kubectl get prints.

const (
	reqOpenAPI = "Upstream apix/v1alpha1 InferencePoolImport is published with its schema (a CRD's openAPIV3Schema): " +
		"the cluster's OpenAPI v3 describes it, status.controllers included, which kubectl explain and server-side apply read"
	reqTable = "Kubernetes API (kubectl get): every resource answers a list as a meta.k8s.io/v1 Table, one row per object and a Name column"
)

func discoveryTests() []Test {
	return []Test{
		{
			Name:        "the cluster's OpenAPI v3 describes InferencePoolImport with status.controllers",
			Requirement: reqOpenAPI,
			Label:       Required,
			Run:         testOpenAPI,
		},
		{
			Name:        "kubectl get answers a Table with a Name column and a row per import",
			Requirement: reqTable,
			Label:       Required,
			Run:         testTable,
		},
	}
}

func testOpenAPI(t *T) {
	for _, c := range t.Clusters() {
		rc := c.Kube.Discovery().RESTClient()
		body, err := rc.Get().AbsPath("/openapi/v3").DoRaw(t.Context())
		if err != nil {
			t.Fatalf("%s: GET /openapi/v3: %v", c.Name, err)
		}
		var index struct {
			Paths map[string]struct {
				ServerRelativeURL string `json:"serverRelativeURL"`
			} `json:"paths"`
		}
		if err := json.Unmarshal(body, &index); err != nil {
			t.Fatalf("%s: /openapi/v3 does not decode: %v", c.Name, err)
		}
		path, ok := index.Paths["apis/"+importsGVR.Group+"/"+importsGVR.Version]
		if !ok {
			t.Errorf("%s: /openapi/v3 has no apis/%s", c.Name, importsGVR.GroupVersion())
			continue
		}
		body, err = rc.Get().RequestURI(path.ServerRelativeURL).DoRaw(t.Context())
		if err != nil {
			t.Fatalf("%s: GET %s: %v", c.Name, path.ServerRelativeURL, err)
		}
		var doc struct {
			Components struct {
				Schemas map[string]map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("%s: the OpenAPI of %s does not decode: %v", c.Name, importsGVR.GroupVersion(), err)
		}
		schemas := doc.Components.Schemas
		var found bool
		for _, s := range schemas {
			if !hasGVK(s, importsGVR.Group, importsGVR.Version, "InferencePoolImport") {
				continue
			}
			found = true
			status := property(schemas, s, "status")
			if status == nil {
				t.Errorf("%s: the InferencePoolImport schema has no status", c.Name)
				continue
			}
			controllers := property(schemas, status, "controllers")
			if controllers == nil {
				t.Errorf("%s: the InferencePoolImport schema has no status.controllers", c.Name)
				continue
			}
			if typ, _ := controllers["type"].(string); typ != "array" {
				t.Errorf("%s: status.controllers is of type %q, want array", c.Name, typ)
			}
		}
		if !found {
			t.Errorf("%s: no schema of the OpenAPI of %s is InferencePoolImport", c.Name, importsGVR.GroupVersion())
		}
	}
}

// hasGVK says whether an OpenAPI schema is that of the kind.
func hasGVK(schema map[string]any, group, version, kind string) bool {
	gvks, _ := schema["x-kubernetes-group-version-kind"].([]any)
	for _, g := range gvks {
		m, _ := g.(map[string]any)
		if m["group"] == group && m["version"] == version && m["kind"] == kind {
			return true
		}
	}
	return false
}

// property is the schema of a property, through $ref and allOf.
func property(schemas map[string]map[string]any, schema map[string]any, name string) map[string]any {
	schema = resolve(schemas, schema)
	props, _ := schema["properties"].(map[string]any)
	p, _ := props[name].(map[string]any)
	if p == nil {
		return nil
	}
	return resolve(schemas, p)
}

func resolve(schemas map[string]map[string]any, schema map[string]any) map[string]any {
	for range 8 {
		if ref, ok := schema["$ref"].(string); ok {
			schema = schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
			continue
		}
		if all, ok := schema["allOf"].([]any); ok && len(all) == 1 {
			if m, ok := all[0].(map[string]any); ok {
				schema = m
				continue
			}
		}
		break
	}
	return schema
}

func testTable(t *T) {
	f, a, b := importedPool(t)
	f.exportPool(a, "second")
	f.eventually("the second pool is imported", f.importWith(b, "second", a.Name))
	body, err := b.Kube.Discovery().RESTClient().Get().AbsPath(importsAPIPath, "namespaces", f.ns, "inferencepoolimports").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(f.ctx())
	if err != nil {
		t.Fatalf("%s: a Table of the imports: %v", b.Name, err)
	}
	var table struct {
		Kind              string `json:"kind"`
		APIVersion        string `json:"apiVersion"`
		ColumnDefinitions []struct {
			Name string `json:"name"`
		} `json:"columnDefinitions"`
		Rows []struct {
			Cells []any `json:"cells"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("%s: the Table does not decode: %v", b.Name, err)
	}
	if table.Kind != "Table" || table.APIVersion != "meta.k8s.io/v1" {
		t.Fatalf("%s: asked for a Table, got %s %s", b.Name, table.APIVersion, table.Kind)
	}
	var columns []string
	for _, c := range table.ColumnDefinitions {
		columns = append(columns, c.Name)
	}
	at := slices.Index(columns, "Name")
	if at < 0 {
		t.Fatalf("%s: the Table's columns %v have no Name", b.Name, columns)
	}
	var rows []string
	for _, r := range table.Rows {
		if len(r.Cells) != len(columns) {
			t.Errorf("%s: a row has %d cells for %d columns", b.Name, len(r.Cells), len(columns))
			continue
		}
		rows = append(rows, fmt.Sprint(r.Cells[at]))
	}
	slices.Sort(rows)
	if want := []string{"pool", "second"}; !slices.Equal(rows, want) {
		t.Errorf("%s: the Table's rows name %v, want %v", b.Name, rows, want)
	}
}
