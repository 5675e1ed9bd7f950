package codeshape

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxFuncLines bounds a function of the routing packages, from its func
// line to its closing brace: a rule is read as a whole or not at all.
const maxFuncLines = 60

// routingPackages are the packages whose functions maxFuncLines bounds.
var routingPackages = []string{"pkg/clusterscore", "pkg/routetable", "pkg/promptprefix", "pkg/routingpolicy",
	"pkg/sidecar", "pkg/responserelay", "pkg/eppprobe", "pkg/eppanswer", "pkg/scheduling", "pkg/epp"}

// TestRoutingFunctionsAreShort lists every function (tests aside) of the
// routing packages over maxFuncLines lines.
func TestRoutingFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()
	var long []string
	for _, dir := range routingPackages {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, dir)
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := end.Line - start.Line + 1; n > maxFuncLines {
					long = append(long, fmt.Sprintf("%s:%d %s: %d lines", filepath.ToSlash(filepath.Join(dir, filepath.Base(path))), start.Line, fd.Name.Name, n))
				}
			}
		}
	}
	assert.Empty(t, long, "functions over %d lines", maxFuncLines)
}
