package virtual

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metatable "k8s.io/apimachinery/pkg/api/meta/table"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
)

// Table is the `kubectl get` table of a computed resource: its columns,
// and the cells of one object's row given its name and age.
type Table struct {
	Columns []metav1.TableColumnDefinition
	Row     func(obj runtime.Object, name, age string) []interface{}
}

var _ rest.TableConvertor = Table{}

// ConvertToTable implements rest.TableConvertor for one object or a list.
func (t Table) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{ColumnDefinitions: t.Columns}
	if m, err := meta.ListAccessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	} else if m, err := meta.CommonAccessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	}
	var err error
	table.Rows, err = metatable.MetaToTableRow(obj, func(obj runtime.Object, _ metav1.Object, name, age string) ([]interface{}, error) {
		return t.Row(obj, name, age), nil
	})
	return table, err
}
