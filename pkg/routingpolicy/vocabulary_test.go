package routingpolicy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestThePolicySyntaxIsReadOnlyHere holds the rest of mci to this
// package's vocabulary: no code outside it spells the syntax's own words
// (so none parses a policy by hand), and routingpolicy.Parse is called only
// where a policy's text is read: the sidecar's routing table (annotations
// and labels), its flag, and mci-apiserver's exports and imports.
func TestThePolicySyntaxIsReadOnlyHere(t *testing.T) {
	words := []string{"prefix-cache", "in-flight", "kv-cache", "affinity-margin", "queue-margin", "home-bound", "two-choices", "max-score", "local-first"}
	readers := []string{"cmd/mci-sidecar/app", "pkg/imports", "pkg/routetable"}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	fset := token.NewFileSet()
	var spelled []string
	parsers := map[string]bool{}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata" || rel == filepath.Join("pkg", "routingpolicy") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if v, err := strconv.Unquote(n.Value); err == nil && n.Kind == token.STRING && slices.Contains(words, v) {
					spelled = append(spelled, fset.Position(n.Pos()).String())
				}
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "routingpolicy" && n.Sel.Name == "Parse" {
					parsers[filepath.ToSlash(filepath.Dir(rel))] = true
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found mci's sources")
	assert.Empty(t, spelled, "the policy syntax spelled outside pkg/routingpolicy")
	for dir := range parsers {
		assert.Contains(t, readers, dir, "routingpolicy.Parse called where no policy's text is read")
	}
}
